"""Benchmark of widthscope.stats: moment forms and misalignment resampling.

Moments: the dual (Gram) form, the primal (moment) form and a naive baseline that forms the
explicit covariance with ``torch.cov`` and evaluates the plug-in formulas
(``‖x̄‖², x̄ᵀΣ̂x̄, ‖Σ̂‖_F²``), for n ∈ {256, 1024, 4096} × d ∈ {64, 512, 2048}; a combination
is skipped when a method would exceed a flop budget. Misalignment: R = 1000 draws of
M = K ∈ {16, 64, 128} from pools of 1024 vectors of dimension 512, via the cross-Gram
(what the library does) versus recomputing the two means from the vectors for the same
draws (vectorised too, so the baseline is fair). Times are medians of ``repeats`` runs
after one warm-up; ratios are against the baseline of the same run.

Usage::

    python benchmarks/bench_stats.py            # full table (about a minute on one core)
    python benchmarks/bench_stats.py --quick    # small sizes only
    python benchmarks/bench_stats.py --device cuda --threads 0

``run(quick) -> list[dict]`` is what the suite runner calls.
"""
from __future__ import annotations

import sys
from pathlib import Path

import argparse
from typing import Any, Callable

import torch

from widthscope._io import format_table
from widthscope.stats import misalignment_from_gram, moments
from widthscope.stats.resample import _draw_indices

# Skip a (method, n, d) whose multiply-adds exceed this (keeps the full run near a minute).
_MAX_MACS = 4e10

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import markdown_table, median_time  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    return median_time(fn, repeats, sync=lambda: _sync(device))


def _naive(X: torch.Tensor) -> tuple[float, float, float]:
    mean = X.mean(0)
    cov = torch.cov(X.T)
    return float(mean @ mean), float(mean @ cov @ mean), float((cov * cov).sum())


def bench_moments(quick: bool, repeats: int, device: torch.device) -> list[dict]:
    ns = (256, 1024) if quick else (256, 1024, 4096)
    ds = (64, 512) if quick else (64, 512, 2048)
    rows = []
    g = torch.Generator().manual_seed(0)
    for n in ns:
        for d in ds:
            X = (torch.randn(n, d, generator=g, dtype=torch.float64) + 0.1).to(device)
            cost = {"naive": n * d * d, "dual": n * n * d, "primal": n * d * d}
            runs = {"naive": lambda: _naive(X), "dual": lambda: moments(X, method="dual"),
                    "primal": lambda: moments(X, method="primal")}
            times = {k: _median_time(f, repeats, device) for k, f in runs.items() if cost[k] <= _MAX_MACS}
            base = times.get("naive")
            auto = moments(X).method
            for k, t in times.items():
                rows.append({"bench": "moments", "n": n, "d": d, "method": k, "median_s": t,
                             "speedup_vs_naive": (base / t) if base else None,
                             "auto_choice": k == auto, "device": device.type})
            for k in runs:
                if k not in times:
                    rows.append({"bench": "moments", "n": n, "d": d, "method": k, "median_s": None,
                                 "speedup_vs_naive": None, "auto_choice": k == auto,
                                 "device": device.type, "note": "skipped (flop budget)"})
    return rows


def _means_baseline(Xa, Xb, I, J, M, K) -> int:
    count = 0
    chunk = max(1, (1 << 22) // ((M + K) * Xa.shape[1]))
    for s in range(0, I.shape[0], chunk):
        mu = Xa[I[s:s + chunk, :M]].mean(1)
        gk = Xb[J[s:s + chunk, :K]].mean(1)
        count += int(((mu * gk).sum(1) <= 0).sum())
    return count


def bench_misalignment(quick: bool, repeats: int, device: torch.device) -> list[dict]:
    n, d, R = 1024, 512, 1000
    g = torch.Generator().manual_seed(1)
    Xa = (torch.randn(n, d, generator=g, dtype=torch.float64) + 0.02).to(device)
    Xb = (torch.randn(n, d, generator=g, dtype=torch.float64) + 0.02).to(device)
    rows = []
    C = Xa @ Xb.T
    sizes = (16, 64) if quick else (16, 64, 128)
    total_separate = 0.0
    for MK in sizes:
        def via_gram():
            return misalignment_from_gram(Xa @ Xb.T, M=MK, K=MK, draws=R, seed=0)

        def via_precomputed():
            return misalignment_from_gram(C, M=MK, K=MK, draws=R, seed=0)

        def via_means():
            gen = torch.Generator().manual_seed(0)
            I = _draw_indices(n, MK, R, gen).to(device)
            J = _draw_indices(n, MK, R, gen).to(device)
            return _means_baseline(Xa, Xb, I, J, MK, MK)

        assert via_gram().count == via_means()  # same draws, same answer
        t_means = _median_time(via_means, repeats, device)
        t_gram = _median_time(via_gram, repeats, device)
        t_pre = _median_time(via_precomputed, repeats, device)
        total_separate += t_pre
        for method, t in (("means from vectors", t_means), ("cross-Gram, incl. forming it", t_gram),
                          ("cross-Gram, precomputed", t_pre)):
            rows.append({"bench": "misalignment", "n": n, "d": d, "M=K": MK, "draws": R,
                         "method": method, "median_s": t, "speedup_vs_means": t_means / t,
                         "device": device.type})
    pairs = [(m, m) for m in sizes]
    t_all = _median_time(lambda: misalignment_from_gram(C, pairs=pairs, draws=R, seed=0), repeats, device)
    rows.append({"bench": "misalignment", "n": n, "d": d, "M=K": "+".join(map(str, sizes)), "draws": R,
                 "method": "all pairs in one call (precomputed)", "median_s": t_all,
                 "speedup_vs_means": None, "speedup_vs_separate_calls": total_separate / t_all,
                 "device": device.type})
    return rows


def run(quick: bool = True, *, repeats: int = 3, device: str = "cpu") -> list[dict]:
    """Run both benchmarks; returns one dict per (setting, method)."""
    dev = torch.device(device)
    return bench_moments(quick, repeats, dev) + bench_misalignment(quick, repeats, dev)


def markdown(rows: list[dict]) -> str:
    """The rows as two markdown tables."""
    out = []
    mom = [r for r in rows if r["bench"] == "moments"]
    mis = [r for r in rows if r["bench"] == "misalignment"]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    if mom:
        out += ["| n | d | method | median time (s) | speed-up vs naive | auto picks |",
                "|---:|---:|---|---:|---:|:---:|"]
        out += [f"| {r['n']} | {r['d']} | {r['method']} | {f(r['median_s'], '.4g')} | "
                f"{f(r['speedup_vs_naive'], '.2f')} | {'yes' if r['auto_choice'] else ''} |" for r in mom]
        out.append("")
    if mis:
        out += ["| M = K | draws | pool n, d | method | median time (s) | speed-up vs means |",
                "|---:|---:|---|---|---:|---:|"]
        for r in mis:
            sp = f(r['speedup_vs_means'], '.2f')
            if r.get("speedup_vs_separate_calls") is not None:
                sp = f"{r['speedup_vs_separate_calls']:.2f} vs separate calls"
            out.append(f"| {r['M=K']} | {r['draws']} | {r['n']}, {r['d']} | {r['method']} | "
                       f"{f(r['median_s'], '.4g')} | {sp} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per setting (median)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = leave default)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = run(args.quick, repeats=max(3, args.repeats), device=args.device)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}\n")
    print(markdown(rows))
    print()
    print(format_table([{k: v for k, v in r.items() if k != "bench"} for r in rows if r["bench"] == "moments"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
