"""Measure every NTK method at a set of shapes and fit the seconds per unit of each cost term
(:data:`widthscope.linear.cost.FIT`).

Shapes (:func:`shapes`): the points of ``ntk_auto_grid.py`` whose fastest path took under 1.5 s in its
run before this fit (where the paths lie close together and the choice is decided), and off-grid shapes (width
128, other ``n``) so that the fit is not only of the grid's points. Per shape, every method (``auto``'s
candidates that fit) computes the full kernel ``Θ(x, x)`` (float32, one thread) in ``--reps`` interleaved
rounds, the order rotated; a method whose first round took over ``--drop-factor`` × that round's fastest,
or whose estimate is over ``--max-seconds``, gets no more rounds (its one time is kept: it still informs the
fit). Recorded per shape and method: the terms of :func:`widthscope.linear.cost.terms` (from ``info``) and
the times. (The rows measured before issue 32 also held a ``fwd`` term, a measured forward pass's wall time
times the calls; the choice has no timed term since, and ``--drop-terms fwd`` removed it from the rows.)

``--fit``: the coefficients θ ≥ 0 of every method at once, least squares of ``log(Σ_k θ_k t_k) + c_s − log s``
over every measured (shape, method) with a free offset ``c_s`` per shape (:func:`fit`: the choice depends on
the ratios between methods at one shape); written to the results file with each estimate over its
measured time, and printed in the form of ``FIT``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/ntk_auto_fit.py [--reps 3]   # measure (resumes; --redo to start over)
    python benchmarks/ntk_auto_fit.py --fit                         # fit and print FIT
    python benchmarks/ntk_auto_fit.py --drop-terms fwd --fit        # remove a term from the rows, then fit
    OMP_NUM_THREADS=1 python benchmarks/ntk_auto_fit.py --recount --fit   # the rows' terms again, then fit

``--recount``: times nothing; the ``mem`` term of every recorded row is counted again by the current probe
(the shape's model and input rebuilt as the measurement built them, auto's choice made without a kernel:
``ntk_auto_grid.choice``; :func:`recount`), the times kept. Issue 32: the probe counted the whole batch's
storage of its one-example view ``x[:1]``, so ``mem`` grew with ``n`` (``mlp-64``: 2560 bytes at n = 8,
131584 at n = 512, against 768 for one example alone); the rows' ``mem`` terms were recounted so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ntk_auto_grid import VOCAB, build, grid, key  # noqa: E402
from widthscope._io import atomic_write_json  # noqa: E402
from widthscope.linear import ntk  # noqa: E402
from widthscope.linear.cost import FIT  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "ntk-auto-fit-cpu.json"
ORDER = ("per_example", "jacobian", "structured")  # the fit's order: structured uses per_example's
# the fit's starting point (the terms' seconds of the cost model before the fit; its result depends on it a
# little: some terms trade off against each other at these shapes)
START = {
    "per_example": {"fixed": 1e-3, "pass": 2.5e-11, "write": 1.4e-8, "contract": 6.8e-11, "call": 2e-3, "op": 8.7e-5},
    "jacobian": {"fixed": 1e-3, "pass": 1.1e-10, "write": 1.1e-10, "contract": 1.1e-10, "call": 2e-3, "op": 8.7e-5},
    "structured": {"fixed": 1e-3, "pass": 1.1e-10, "gram": 6.8e-11, "out": 2e-3, "op": 8.7e-5, "block": 5e-4},
}
for _m in START:
    START[_m].update(mem=1e-10)


# the grid points whose fastest path took under 1.5 s in the grid run before this fit (code rev 2)
GRID_POINTS = (
    "mlp/64/1/8 mlp/64/1/64 mlp/64/1/512 mlp/64/10/8 mlp/64/10/64 mlp/256/1/8 mlp/256/1/64 mlp/256/1/512 "
    "mlp/256/10/8 mlp/256/10/64 mlp/1024/1/8 mlp/1024/1/64 mlp/1024/10/8 mlp/1024/10/64 llama/64/1/8 "
    "llama/64/1/32 llama/64/10/8 llama/256/1/8 llama/256/10/8 gpt2/64/1/8 gpt2/64/10/8 gpt2/256/1/8 "
    "encoder/64/1/8 encoder/64/1/64 encoder/64/10/8 encoder/256/1/8 encoder/256/10/8 encoder/1024/1/8"
).split()


def shapes() -> list[tuple[str, int, int, int]]:
    """The grid points of :data:`GRID_POINTS`, then off-grid shapes."""
    pts = [p for p in grid() if key(*p) in GRID_POINTS]
    pts += [("mlp", 128, k, n) for k in (1, 10) for n in (16, 128)]
    pts += [("llama", 128, k, n) for k in (1, 10) for n in (8, 16)]
    pts += [("gpt2", 128, k, 8) for k in (1, 10)] + [("gpt2", 64, 1, 16)]
    pts += [("encoder", 128, k, n) for k in (1, 10) for n in (8, 32)]
    return pts


def measure_shape(arch: str, width: int, k: int, n: int, reps: int, drop: float, max_s: float) -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = build(arch, width, k)
    model = model.eval()
    x = inputs(n)
    ntk(model, x[:2])
    info: dict = {}
    ntk(model, x, info=info)
    costs = info["costs"]
    run = [m for m in ORDER if m in costs and costs[m]["fits"] and "terms" in costs[m]]
    row: dict[str, Any] = {"arch": arch, "width": width, "outputs": k, "n": n, "auto_choice": info["method"]}
    row["terms"] = {m: costs[m]["terms"] for m in run}
    row["generic_terms"] = costs.get("structured", {}).get("generic_terms")
    row["estimated_s"] = {m: costs[m]["seconds"] for m in run}
    row["skipped"] = {m: "estimate over --max-seconds" for m in run if costs[m]["seconds"] > max_s}
    run = [m for m in run if m not in row["skipped"]]
    for m in run:
        ntk(model, x[:2], method=m)  # warm-up
    times: dict[str, list[float]] = {m: [] for m in run}
    for r in range(reps):
        order = run[r % len(run) :] + run[: r % len(run)]
        for m in order:
            t0 = time.perf_counter()
            ntk(model, x, method=m)
            times[m].append(time.perf_counter() - t0)
        if r == 0:
            fastest = min(v[0] for v in times.values())
            run = [m for m in run if times[m][0] <= drop * fastest]
    row.update(all_seconds=times, seconds={m: statistics.median(v) for m, v in times.items()}, loadavg=os.getloadavg())
    return row


def recount(rows: dict[str, dict]) -> dict[str, tuple[float, float]]:
    """The ``mem`` term of every recorded row counted again with the current probe (module docstring,
    ``--recount``): ``mem`` is ``pass`` with the probe's saved bytes ``S`` in place of its FLOPs ``F`` for
    every method, so ``mem = pass · S / F``, which keeps the chunking the row was timed with. Every other
    term is compared with the current code's count; where the current code plans other chunks (its memory
    planning no longer counts the saved bytes), the recorded terms are kept, since they describe what was
    timed, and the row says so under ``recount_notes``. Returns, per row, the recorded ``S`` and the new."""
    from ntk_auto_grid import choice
    from widthscope.linear import probes

    change = {}
    for name, r in rows.items():
        torch.manual_seed(0)
        model, inputs = build(r["arch"], r["width"], r["outputs"])
        model, x = model.eval(), inputs(r["n"])
        costs = choice(model, x)["costs"]
        pr = probes.peek(model, x[:1], ("measure", 1))
        if pr is probes.MISSING:
            raise SystemExit(f"recount: {name}: the choice left no probe in the cache")
        new = {m: costs[m]["terms"] for m in r["terms"]}
        gen = costs.get("structured", {}).get("generic_terms")
        if (r.get("generic_terms") is None) != (gen is None):
            raise SystemExit(f"recount: {name}: the structured path's uncovered remainder appeared or vanished")
        pairs = [(m, r["terms"][m], new[m]) for m in r["terms"]]
        pairs += [("generic", r["generic_terms"], gen)] if gen is not None else []
        notes = {}
        for what, old, now in pairs:
            if set(old) != set(now):
                raise SystemExit(f"recount: {name} {what}: terms {sorted(old)} recorded, {sorted(now)} counted")
            change[name] = (old["mem"] * pr.flops / old["pass"], pr.saved)
            old["mem"] = old["pass"] * pr.saved / pr.flops
            moved = [k for k in old if k != "mem" and not np.isclose(now[k], old[k], rtol=1e-9, atol=0.0)]
            if not moved and not np.isclose(now["mem"], old["mem"], rtol=1e-9, atol=0.0):
                raise SystemExit(f"recount: {name} {what}: mem {old['mem']} from pass·S/F, {now['mem']} counted")
            if moved:
                notes[what] = (
                    f"counted now: {', '.join(f'{k} {now[k]:.4g} (recorded {old[k]:.4g})' for k in moved)}; "
                    "the recorded terms kept (the chunks it was timed with)"
                )
        if notes:
            r["recount_notes"] = notes
    return change


def _estimate(coef: dict[str, dict[str, float]], row: dict, m: str) -> float:
    est = sum(coef[m].get(k, 0.0) * v for k, v in row["terms"][m].items())
    if m == "structured" and row.get("generic_terms"):
        est += sum(coef["per_example"].get(k, 0.0) * v for k, v in row["generic_terms"].items())
    return est


def fit(rows: dict[str, dict]) -> dict[str, dict[str, float]]:
    """θ ≥ 0 (all methods at once) minimising the squared log error of every method's estimate at every
    shape, up to a factor per shape (what one machine's load or one model's Python overhead does to all
    methods alike, and which does not change the choice), the factors pulled weakly towards 1; the better of
    two starting points."""
    idx = [(m, k) for m in ORDER for k in FIT[m]]
    names = [n for n in rows if rows[n].get("seconds")]

    def unpack(z: np.ndarray) -> dict[str, dict[str, float]]:
        coef: dict[str, dict[str, float]] = {m: {} for m in ORDER}
        for i, (m, k) in enumerate(idx):
            coef[m][k] = float(np.exp(z[i]))
        return coef

    def resid(z: np.ndarray) -> np.ndarray:
        coef, offset = unpack(z), z[len(idx) :]
        out = [
            np.log(_estimate(coef, rows[n], m) + 1e-12) + offset[i] - np.log(s)
            for i, n in enumerate(names)
            for m, s in rows[n]["seconds"].items()
        ]
        return np.concatenate([out, 0.3 * offset])

    # two starts, the lower optimum kept: START, and each term alone explaining an equal share of the median
    # time (from START only, a coefficient pushed towards 0 early can stay stuck there: a flat direction)
    balanced = []
    for m, k in idx:
        q = [
            rows[n]["seconds"][m] / rows[n]["terms"][m][k] / len(FIT[m])
            for n in names
            if m in rows[n]["seconds"] and rows[n]["terms"][m].get(k, 0) > 0
        ]
        balanced.append(float(np.log(np.median(q))) if q else float(np.log(START[m][k])))
    starts = [[np.log(START[m][k]) for m, k in idx], balanced]
    sols = [least_squares(resid, np.array(z0 + [0.0] * len(names))) for z0 in starts]
    z = min(sols, key=lambda sol: sol.cost).x
    return {m: {k: float(f"{v:.3g}") for k, v in c.items()} for m, c in unpack(z).items()}


def residuals(rows: dict[str, dict], coef: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per shape and method, the fitted estimate over the measured time."""
    return {n: {m: round(_estimate(coef, r, m) / s, 3) for m, s in r["seconds"].items()} for n, r in rows.items()}


def regret(rows: dict[str, dict], coef: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per shape, the measured time of the method the fitted estimates pick over the fastest measured."""
    out = {}
    for n, r in rows.items():
        sec = r["seconds"]
        pick = min(sec, key=lambda m: _estimate(coef, r, m))
        out[n] = round(sec[pick] / min(sec.values()), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--drop-factor", type=float, default=6.0)
    ap.add_argument("--max-seconds", type=float, default=6.0)
    ap.add_argument("--fit", action="store_true", help="fit the coefficients from the recorded rows")
    ap.add_argument("--redo", action="store_true", help="measure every shape again")
    ap.add_argument("--drop-terms", default="", help="comma-separated terms to remove from every recorded row")
    ap.add_argument("--recount", action="store_true", help="count the recorded rows' terms again (no timing)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    path = Path(args.out)
    res = json.loads(path.read_text()) if path.exists() else {}
    rows: dict[str, dict] = res.setdefault("rows", {})
    if args.drop_terms:
        drop = args.drop_terms.split(",")
        for r in rows.values():
            for t in (*r["terms"].values(), r.get("generic_terms") or {}):
                for k in drop:
                    t.pop(k, None)
        res["dropped_terms"] = sorted({*res.get("dropped_terms", []), *drop})
        atomic_write_json(path, res)
    if args.recount:
        torch.set_num_threads(1)
        change = recount(rows)
        rec = res.setdefault("recounted", {"saved_bytes": {}})
        rec.update(
            date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
            why="issue 32: the probe's saved bytes counted the whole batch's storage of its view x[:1]",
            terms=["mem"],
        )
        for k, (old, new) in change.items():  # [as first recorded, now]: a second recount keeps the first
            rec["saved_bytes"][k] = [rec["saved_bytes"].get(k, [round(old)])[0], round(new)]
        atomic_write_json(path, res)
        q = [new / old for old, new in rec["saved_bytes"].values()]
        print(f"recounted {len(change)} rows; saved bytes now / as first recorded {min(q):.3g}–{max(q):.3g}")
    if args.fit:
        coef = fit(rows)
        res.update(fit=coef, fit_ratio=residuals(rows, coef), fit_regret=regret(rows, coef))
        worst = max(res["fit_regret"].items(), key=lambda kv: kv[1])
        print(f"worst pick over the fastest measured: {worst[1]} at {worst[0]}", file=sys.stderr)
        atomic_write_json(path, res)
        print("FIT = " + json.dumps(coef, indent=4))
        return 0
    torch.set_num_threads(1)
    res.update(command="OMP_NUM_THREADS=1 python benchmarks/ntk_auto_fit.py", torch=torch.__version__)
    for pt in shapes():
        name = key(*pt)
        if name in rows and not args.redo:
            continue
        t0 = time.perf_counter()
        rows[name] = measure_shape(*pt, args.reps, args.drop_factor, args.max_seconds)
        res["date"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
        atomic_write_json(path, res)
        print(f"{name}: {rows[name]['seconds']} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    assert VOCAB  # the grid's vocabulary: shapes with k = VOCAB are vocabulary heads
    sys.exit(main())
