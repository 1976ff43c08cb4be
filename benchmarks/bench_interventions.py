"""Cost of certify's default bias interventions relative to the probe: the full path vs the cached prefix.

4-layer LLaMA-style model (widthscope ``llama`` family, byte vocabulary), ``n`` train and ``n``
held-out sequences, ``M = K`` up to 128, certify's default step sizes (``steps``: 4, the decades
of step RMS 1e-4…0.1 of the activation's) at every block output, with ``μ_M``, ``g_K``, the held-out loss and the activation scale
reused from the probe (as certify runs them). Per repetition, back to back in one process:

* ``probe_s``: :func:`widthscope.probe.collect` of both pools (what certify measures anyway),
  the held-out one recording the outputs before every point for the first ``K`` examples
  (:func:`widthscope.probe.prefix.keep_prefix`, as certify does);
* ``full_s``: the interventions with ``prefix="full"`` — each chunk of held-out examples stacked
  once per step through the whole network (the path before the cached prefix);
* ``cached_s``: the default ``prefix="auto"`` with the probe's record — only the modules after
  the point run, once per step (plus the check: 3 full forwards per point);
* ``cached9_s``: the same with the 9 half-decade steps up to 1 of ``intervene``'s own default (the
  grid certify used before), for the cost of the finer grid.

Times are medians over the repetitions, ratios medians of the per-repetition ratios (lower is
better); ``max_diff`` is the largest ``|ΔL_cached − ΔL_full| / L`` over all points and steps;
``capture`` says where the cached path's prefix outputs came from.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table  # noqa: E402


def _interventions(model, points, tr, te, qa, qb, M, K, prefix, kept, n_etas, top):
    from widthscope.probe.interventions import intervene

    t0 = time.perf_counter()
    rows = {p: intervene(model, p, tr, te, M=M, K=K, progress=False, prefix=prefix, n_etas=n_etas, max_rel_step=top,
                         reuse={"train": qa[p], "test": qb[p], "test_losses": qb.losses,
                                "act_sq": qa.act_sq[p], "width": qa.widths[p], "prefix": kept})
            for p in points}
    return time.perf_counter() - t0, rows


def run(quick: bool = False, widths: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    from widthscope.options import DEFAULT_MAX_REL_STEP, DEFAULT_N_ETAS
    from widthscope.models import build
    from widthscope.probe import collect, insertion_points
    from widthscope.probe.batches import as_examples, to_batches
    from widthscope.probe.prefix import keep_prefix

    sizes = [(64, 64, 64)] if quick else [(128, 64, 256), (256, 128, 256)]
    sizes = [sz for sz in sizes if widths is None or sz[0] in widths]
    repeats = 1 if quick else 3
    rows = []
    for width, seq_len, n in sizes:
        torch.manual_seed(0)
        model = build("llama", width, depth=4, max_seq_len=seq_len).eval()
        ids = torch.randint(0, 256, (2 * n, seq_len))
        tr, te = to_batches(ids[:n], 32), to_batches(ids[n:], 32)
        points = insertion_points(model)
        M = K = min(128, n)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        t: dict[str, list[float]] = {"probe": [], "full": [], "cached": [], "cached9": []}
        diff, paths, capture = 0.0, set(), set()
        for rep in range(repeats):
            t0 = time.perf_counter()
            qa = collect(model, tr, points=points, progress=False)
            with keep_prefix(model, points, as_examples(te[:3]), K) as kept:
                qb = collect(model, te, points=points, progress=False)
            t["probe"].append(time.perf_counter() - t0)
            capture.add("probe" if all(kept.covers(p, K) for p in points) else f"per chunk ({kept.reason})")
            top = DEFAULT_MAX_REL_STEP
            runs = [("full", "full", DEFAULT_N_ETAS, top), ("cached", "auto", DEFAULT_N_ETAS, top),
                    ("cached9", "auto", 9, 1.0)]
            got = {}
            for name, prefix, E, hi in (runs if rep % 2 == 0 else runs[::-1]):  # alternate against drift
                s, got[name] = _interventions(model, points, tr, te, qa, qb, M, K, prefix, kept, E, hi)
                t[name].append(s)
            for p in points:
                for a, b in zip(got["full"][p], got["cached"][p]):
                    diff = max(diff, abs(a["actual"] - b["actual"]) / abs(a["loss_before"]))
                    paths.add(b["prefix"])
                paths.update(b["prefix"] for b in got["cached9"][p])
        med = {k: statistics.median(v) for k, v in t.items()}

        def ratio(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(t[a], t[b]))

        rows.append({"width": width, "seq_len": seq_len, "n": n, "points": len(points), "M=K": M,
                     "steps": DEFAULT_N_ETAS, "threads": torch.get_num_threads(), "load": load,
                     "load_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
                     "repeats": repeats, "probe_s": med["probe"], "full_s": med["full"],
                     "cached_s": med["cached"], "cached9_s": med["cached9"],
                     "full/probe": ratio("full", "probe"), "cached/probe": ratio("cached", "probe"),
                     "cached9/probe": ratio("cached9", "probe"), "cached/full": ratio("cached", "full"),
                     "max_diff": diff, "path": ",".join(sorted(paths)), "capture": ",".join(sorted(capture))})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def rng(v: list[float]) -> str:
        lo, hi = f"{min(v):.2f}", f"{max(v):.2f}"  # two decimals: 1.02 is not "1"
        return lo if lo == hi else f"{lo}–{hi}"

    def span(key: str) -> str:
        return rng([r[key] for r in rows])

    r0 = rows[-1]
    L, K, E = r0["points"], r0["M=K"], r0["steps"]
    share = (L - 1) / (2 * L)  # block passes after the point, summed over points, over L·L
    floor = [share * r["full/probe"] for r in rows]
    return markdown_table(rows, note=(
        f"`cached` runs only the modules after each point, once per step, on the outputs before it "
        f"that the held-out probe recorded (`capture`): {span('cached/full')}× the full path's time "
        f"here, the same ΔL (`max_diff`), and **{span('cached/probe')}× the probe** with certify's "
        f"default {E} steps (the decades of step RMS 1e-4…0.1 of the activation's; "
        f"{span('cached9/probe')}× with the 9 half-decade steps up to 1, the grid before). "
        f"The floor is the measurement itself: over the L = {L} points the blocks after the point are "
        f"(L − 1)/(2L) = {share:.3g} of the full path's block passes ({E * K * L * (L - 1) // 2} of "
        f"{E * K * L * L} at K = {K}), i.e. {share:.3g} × full/probe = "
        f"{rng(floor)}× the probe; the rest is the heads and the check (3 full "
        "forwards per point). Fewer steps (`--n-etas`, `--etas`) or held-out examples (`--K`) cut it "
        "linearly; `--interventions none` removes it."))


if __name__ == "__main__":
    print(markdown(run(quick="--quick" in sys.argv)))
