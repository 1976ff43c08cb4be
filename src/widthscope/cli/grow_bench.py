"""``widthscope grow-bench``: the command line of :func:`widthscope.grow.bench.run_bench`.

A thin adapter: ``--seeds`` is read into a tuple, the options go to the benchmark as keyword
arguments; ``run`` prints the overall comparison, the default rule it picks and the planted
cases, and (unless ``--no-report``) writes the table/plot of :mod:`widthscope.report.growth`.
"""

from __future__ import annotations

import argparse

from .._io import format_table
from ..errors import WidthscopeError
from ..grow.bench import bench_out_dir, run_bench

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the small suite (a few minutes on one core)")
    p.add_argument(
        "--out",
        default=None,
        help="results directory (default widthscope-results/growth[-quick]); "
        "finished cells are kept and a rerun resumes",
    )
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--M", type=int, default=32, help="train samples of the certificates (default 32)")
    p.add_argument("--K", type=int, default=32, help="held-out samples of the certificates (default 32)")
    p.add_argument("--no-report", action="store_true", help="skip the table/plot (PNG) of the comparison")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--shard",
        default=None,
        help="run shard k of n (k/n) into a shared --out; under torchrun "
        "one shard per rank. The comparison is written when every cell is finished",
    )


def _seeds(text: str | None) -> tuple[int, ...] | None:
    from ..validate import int_list

    if text is None:
        return None
    seeds = tuple(int_list(text, "--seeds") or ())  # a list: text is not None
    if any(s < 0 for s in seeds):
        raise WidthscopeError(f"--seeds {text!r}: give at least one seed >= 0, e.g. 0,1,2")
    return seeds


def run(args: argparse.Namespace) -> int:
    suite = "quick" if args.quick else "full"
    out = bench_out_dir(args.out, quick=args.quick)
    res = run_bench(out, quick=args.quick, seeds=_seeds(args.seeds), M=args.M, K=args.K, shard=args.shard)
    if res is None:
        return 0  # not rank 0 under torchrun
    if not res["complete"]:
        print(
            f"{res['finished']}/{res['cells']} cells finished in {out}; the comparison is written when every "
            "shard is done (rerun any shard, or without --shard, to finish)"
        )
        return 0
    sel = [r for r in res["table"] if r.get("kind") == "growth_compare" and r["model"] == "overall"]
    print(
        format_table(
            sel,
            [
                "budget",
                "criterion",
                "spearman",
                "hit",
                "norm_regret",
                "norm_regret_lo",
                "norm_regret_hi",
                "gain",
                "continue",
                "train_all",
                "advantage",
                "advantage_lo",
                "advantage_hi",
                "ties",
                "nan",
                "cost_steps",
            ],
            title=f"growth benchmark ({suite}): overall, mean over models of the mean over seeds "
            "(gains in nats on evaluation half B; continue/train_all: same FLOPs)",
        )
    )
    s = res["summary"]
    w = s["winner_long"]
    print(f"\ndefault rule: {w['criterion']} (grow --criterion {w['grow_name']}): {w['why']}")
    for key, t in s["teacher_student"].items():
        print(
            f"{key}: missing {t['answer']}, realised best {t['best_long']}, {w['criterion']} picks {t[w['criterion']]}"
        )
    if not args.no_report:
        from ..report.growth import write_report

        for f in write_report(res["rows"], res["table"], out):
            print(f"wrote {f}")
    print(f"results: {out / 'results.jsonl'}, {out / 'comparison.jsonl'}, {out / 'summary.json'}")
    return 0
