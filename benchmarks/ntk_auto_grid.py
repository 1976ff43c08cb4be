"""NTK ``method="auto"`` against every method and the plain ``vmap(jacrev)`` reference over a grid of shapes.

Grid (:func:`grid`): four architectures (the widthscope MLP, the widthscope LLaMA, transformers' GPT-2 and
``nn.TransformerEncoder``) at widths 64–1024, outputs 1 / 10 / the vocabulary (64, language models only)
and n = 8–512 examples (smaller n at larger widths: the machine has 2 shared cores). A language model's
``k`` outputs are the first ``k`` logits mean-pooled over the 16 positions; the encoder's and the MLP's a
``Linear(width, k)`` head.

Per grid point the full kernel ``Θ(x, x)`` (float32, one thread) is timed for every ``ntk`` method
(``structured``, ``per_example``, ``jacobian``, ``products``), for ``auto`` and for :func:`ntk_auto.vmap_jacrev`
in interleaved rounds (``--reps``; ``--small-reps`` where the fastest path took under ``--small-seconds`` in
round 1, where the load's noise is largest against the differences; the order rotated each round); the median
per callable is recorded with
every round's time and the 1-minute load average at the row's start and end. Not run, and recorded as such
with the reason: a callable whose estimate (the cost model's; ``vmap_jacrev``: twice ``per_example``'s) is
over ``--skip-factor`` × the best estimate, or over ``--max-seconds`` (never the best estimate's). A callable
whose first round took over ``--drop-factor`` × that round's fastest gets no more rounds (it cannot be the
fastest; its one time is kept), except in a short row (``--small-reps``),
where every path runs every round. A callable that fails is recorded with its error.

``auto_ratio``: per round, auto's time over the fastest callable's (``vmap_jacrev`` included), median over
rounds; ``choice_ratio`` the same for the method auto chose (its probe overhead apart). ``--rerun-misses``
times again (``--reps`` rounds) every row whose ``auto_ratio`` is over 1.25, keeping the first run under
``first_run``: it separates a loaded moment from a wrong choice.

``--choice-only``: times nothing; for every recorded row it makes auto's choice again with the current code
(:func:`choice`: the probes and the estimates, no kernel) and writes it beside the row's timings under
``rechosen`` (``auto_choice``, ``reason``, ``estimated_s``, ``code_rev`` and ``choice_ratio``: the ratio of
:func:`ratios` for that method from the row's recorded times, ``None`` where that method was not timed).
The choice has no timed term (issue 32), so it is the one a timed run of the same code would make.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/ntk_auto_grid.py [--quick] [--reps 3] [--small-reps 9] [--rerun-misses]
    OMP_NUM_THREADS=1 python benchmarks/ntk_auto_grid.py --choice-only   # the current choice beside the timings
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ntk_auto import vmap_jacrev  # noqa: E402  (the plain torch.func reference)

OUT = ROOT / "benchmarks" / "results" / "ntk-auto-grid-cpu.json"
METHODS = ("structured", "per_example", "jacobian", "products")
VOCAB = 64
MISS = 1.25
# 3: the code committed with the table (the checks' forward passes cached per model and parameter values, the
# seconds priced by the fitted terms of linear/cost.py). Rev 2: the run before (35 of 41 within 1.25×).
# Rev 4: no timed term in the choice (issue 32; the rows of rev 3 carry its choice under "rechosen").
# Rev 5: the probe's saved bytes of one example, not of the batch its view x[:1] lies in, and the fit's mem
# term recounted and refitted so (issue 32). Rev 6: memory planned with the saved activations (they were set to 0)
# and 5 Jacobian copies (3 and 4 before), the measured peaks (issue 32; "rechosen" holds rev 6's choice).
CODE_REV = 6


class LMHead(nn.Module):
    """A causal LM's first ``k`` logits, mean-pooled over positions (``k = vocab``: all of them)."""

    def __init__(self, lm: nn.Module, k: int):
        super().__init__()
        self.lm, self.k = lm, k

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.lm(ids).logits.mean(1)
        return out if self.k == out.shape[1] else out[:, : self.k]


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` (2 layers, 4 heads, no dropout) on 8 input features, mean-pooled, ``k`` outputs."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.inp = nn.Linear(8, d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.inp(x)).mean(1))


def _gpt2(width: int) -> nn.Module:
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=width,
        n_layer=2,
        n_head=4,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=1,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(cfg)


def build(arch: str, width: int, k: int) -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """The model of a grid point and its input builder ``n → x``."""
    from widthscope.models import build as ws_build

    if arch == "mlp":
        return ws_build("mlp", width, in_dim=64, out_dim=k, depth=2), lambda n: torch.randn(n, 64)
    if arch == "encoder":
        return Encoder(width, k), lambda n: torch.randn(n, 16, 8)
    lm = ws_build("llama", width, depth=2, vocab_size=VOCAB) if arch == "llama" else _gpt2(width)
    return LMHead(lm, k), lambda n: torch.randint(0, VOCAB, (n, 16))


def grid(quick: bool = False) -> list[tuple[str, int, int, int]]:
    """(arch, width, outputs, n) of every point."""
    if quick:
        return [("mlp", 16, 1, 4), ("mlp", 16, 3, 6)]
    pts: list[tuple[str, int, int, int]] = []
    for w, ns in ((64, (8, 64, 512)), (256, (8, 64, 512)), (1024, (8, 64))):
        pts += [("mlp", w, k, n) for k in (1, 10) for n in ns]
    for w, ns in ((64, (8, 32)), (256, (8,)), (1024, (8,))):  # no vocabulary head at 1024: minutes a call
        pts += [("llama", w, k, n) for k in (1, 10, VOCAB) for n in ns if not (w == 1024 and k == VOCAB)]
    for w, ns in ((64, (8,)), (256, (8,))):
        pts += [("gpt2", w, k, n) for k in (1, 10, VOCAB) for n in ns]
    for w, ns in ((64, (8, 64)), (256, (8,)), (1024, (8,))):
        pts += [("encoder", w, k, n) for k in (1, 10) for n in ns]
    return pts


def key(arch: str, width: int, k: int, n: int) -> str:
    return f"{arch}/{width}/{'vocab' if k == VOCAB and arch in ('llama', 'gpt2') else k}/{n}"


class _Chosen(Exception):
    """Stops :func:`choice`'s ``ntk`` call once the method is chosen."""


def choice(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """The ``info`` of ``ntk(model, x)`` (``method``, ``reason``, ``costs``) without the kernel: the call runs
    its checks, probes and estimates and is stopped when the method is chosen, before any kernel work."""
    from widthscope.linear import empirical, ntk

    real = empirical._choose_method

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise _Chosen(real(*args, **kwargs))

    info: dict[str, Any] = {}
    empirical._choose_method = stop
    try:
        ntk(model, x, info=info)
    except _Chosen:
        pass
    finally:
        empirical._choose_method = real
    if "method" not in info:
        raise RuntimeError("ntk_auto_grid.choice: ntk returned without choosing a method")
    return info


def rechoose(r: dict[str, Any]) -> dict[str, Any]:
    """The current code's choice at row ``r``'s point (:func:`choice`), with its ratio from ``r``'s recorded
    times (``None`` where the chosen method was not timed)."""
    torch.manual_seed(0)
    model, inputs = build(r["arch"], r["width"], r["outputs"])
    info = choice(model.eval(), inputs(r["n"]))
    m = info["method"]
    timed = m in r["all_seconds"]
    return {
        "code_rev": CODE_REV,
        "auto_choice": m,
        "reason": info["reason"],
        "estimated_s": {k: c["seconds"] for k, c in info["costs"].items() if c["fits"]},
        "choice_ratio": ratios({**r, "auto_choice": m}).get("choice_ratio") if timed else None,
    }


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def row(
    arch: str,
    width: int,
    k: int,
    n: int,
    reps: int,
    skip_factor: float,
    drop_factor: float,
    max_seconds: float,
    small: tuple[int, float] = (3, 0.0),
) -> dict[str, Any]:
    from widthscope.linear import ntk

    torch.manual_seed(0)
    model, inputs = build(arch, width, k)
    model = model.eval()
    x = inputs(n)
    out: dict[str, Any] = {
        "arch": arch,
        "width": width,
        "outputs": k,
        "n": n,
        "code_rev": CODE_REV,
        "params": sum(p.numel() for p in model.parameters()),
        "loadavg_start": os.getloadavg(),
        "skipped": {},
        "failed": {},
        "dropped": {},
    }
    ntk(model, x[:2])  # one-time costs (imports, dispatch caches) are not compared
    info: dict = {}
    t_first, K_auto = _timed(lambda: ntk(model, x, info=info))
    out.update(auto_choice=info["method"], reason=info["reason"], auto_first_call_s=t_first)
    est = {m: c["seconds"] for m, c in info["costs"].items() if c["fits"]}
    if "per_example" in est:
        est["vmap_jacrev"] = 2 * est["per_example"]  # the same passes, no symmetry, one einsum per parameter
    out["estimated_s"] = est
    best_est = min(est.values())
    run: dict[str, Callable[[], Any]] = {"auto": lambda: ntk(model, x)}
    for m in (*METHODS, "vmap_jacrev"):
        if m not in est:
            out["skipped"][m] = "not a candidate here (over the memory budget, or no forward-mode AD)"
        elif est[m] > skip_factor * best_est or (est[m] > max_seconds and est[m] > best_est):
            out["skipped"][m] = (
                f"estimate {est[m]:.3g} s > {skip_factor:g} × best estimate {best_est:.3g} s or > {max_seconds:g} s"
            )
        else:
            fn = (
                (lambda: vmap_jacrev(model, x, budget=2e9))
                if m == "vmap_jacrev"
                else (lambda m=m: ntk(model, x, method=m))
            )
            try:
                if m == "vmap_jacrev":
                    vmap_jacrev(model, x[:2])
                else:
                    ntk(model, x[:2], method=m)  # warm-up; a failing method is found here
                run[m] = fn
            except (RuntimeError, NotImplementedError) as exc:  # recorded in the row, not hidden
                out["failed"][m] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    times: dict[str, list[float]] = {m: [] for m in run}
    diffs: dict[str, float] = {}
    scale = float(K_auto.abs().max()) or 1.0
    r = 0
    while r < reps:
        order = list(run)
        order = order[r % len(order) :] + order[: r % len(order)]
        for m in order:
            t, K = _timed(run[m])
            times[m].append(t)
            if r == 0:
                diffs[m] = float((K - K_auto).abs().max()) / scale
            del K
        if r == 0:  # a callable far slower than this round's fastest cannot be the fastest: no more rounds
            fastest = min(v[0] for v in times.values())
            short = fastest < small[1] and small[0] > reps
            for m in list(run):  # (a short row keeps them all: milliseconds vary 3× from round to round)
                if m != "auto" and times[m][0] > drop_factor * fastest and not short:
                    out["dropped"][m] = f"{times[m][0]:.3g} s > {drop_factor:g} × fastest {fastest:.3g} s in round 1"
                    del run[m]
            if short:  # short kernels: more rounds against the load's noise
                reps = small[0]
        r += 1
    out.update(
        seconds={m: statistics.median(v) for m, v in times.items()},
        all_seconds=times,
        max_rel_diff_vs_auto=diffs,
        loadavg_end=os.getloadavg(),
    )
    out.update(ratios(out))
    return out


def ratios(r: dict[str, Any]) -> dict[str, Any]:
    """Per round, auto's time and its choice's time over the fastest callable of that round (``vmap_jacrev``
    included; a dropped callable's one time counts in round 1), medians over rounds; ``fastest``: the
    callable (not auto) with the smallest median."""
    t = r["all_seconds"]
    rounds = range(len(t["auto"]))
    paths = [m for m in t if m != "auto"]
    best = [min(t[m][i] for m in paths if i < len(t[m])) for i in rounds]
    choice = r["auto_choice"]
    med = {m: statistics.median(v) for m, v in t.items() if m != "auto"}
    out = {
        "fastest": min(med, key=med.__getitem__),
        "auto_ratio": statistics.median(t["auto"][i] / best[i] for i in rounds),
    }
    if choice in t and len(t[choice]) == len(t["auto"]):
        out["choice_ratio"] = statistics.median(t[choice][i] / best[i] for i in rounds)
    elif choice in t:  # the choice was dropped after round 1
        out["choice_ratio"] = t[choice][0] / best[0]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--small-reps", type=int, default=0, help="rounds of a short row (0: --reps)")
    ap.add_argument("--small-seconds", type=float, default=1.0)
    ap.add_argument("--skip-factor", type=float, default=8.0)
    ap.add_argument("--drop-factor", type=float, default=4.0)
    ap.add_argument("--max-seconds", type=float, default=15.0)
    ap.add_argument("--quick", action="store_true", help="a tiny grid (the test's)")
    ap.add_argument("--only", default="", help="comma-separated keys (arch/width/outputs/n) to run")
    ap.add_argument("--rerun-misses", action="store_true")
    ap.add_argument("--choice-only", action="store_true", help="time nothing: the current choice beside each row")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from widthscope._io import atomic_write_json

    path = Path(args.out)
    res = json.loads(path.read_text()) if path.exists() else {}
    only = set(filter(None, args.only.split(",")))
    if args.choice_only:
        for name, r in res.items():
            if not only or name in only:
                r["rechosen"] = rechoose(r)
                print(f"{name}: {r['auto_choice']} -> {r['rechosen']['auto_choice']}", file=sys.stderr, flush=True)
        atomic_write_json(path, res)
        return 0
    for pt in grid(args.quick):
        name = key(*pt)
        if only and name not in only:
            continue
        again = args.rerun_misses and name in res and res[name]["auto_ratio"] > MISS and "first_run" not in res[name]
        if name in res and not again:
            continue
        t0 = time.perf_counter()
        small = (args.small_reps, args.small_seconds)
        r = row(*pt, args.reps, args.skip_factor, args.drop_factor, args.max_seconds, small)
        if again:
            r["first_run"] = {
                k: res[name][k]
                for k in ("seconds", "all_seconds", "auto_ratio", "auto_choice", "loadavg_start", "loadavg_end")
                if k in res[name]
            }
        res[name] = r
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, res)
        print(
            f"{name}: auto={r['auto_choice']} fastest={r['fastest']} auto_ratio={r['auto_ratio']:.2f} "
            f"choice_ratio={r.get('choice_ratio', float('nan')):.2f} "
            f"{ {m: round(v, 4) for m, v in r['seconds'].items()} } ({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
