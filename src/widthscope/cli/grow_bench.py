"""``widthscope grow-bench``: the command line of :func:`widthscope.growth.bench.run_bench` (``--plan``:
:func:`widthscope.planning.plan_bench`); prints the comparison and writes its table/plot."""

from __future__ import annotations

import argparse

from .._io import format_table
from ..growth.bench import bench_out_dir, run_bench
from ..growth.options import GrowBenchOptions
from ..planning import plan_bench
from ..report.growth import write_report
from .args import add_config, add_options, add_plan, add_threads, config_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, GrowBenchOptions, skip=("seeds", "M", "K"))
    p.add_argument(
        "--out",
        default=None,
        help="results directory (default widthscope-results/growth[-quick]); "
        "finished cells are kept and a rerun resumes",
    )
    add_options(p, GrowBenchOptions, skip=("quick",))
    add_config(
        p,
        "grow-bench",
        what="repeat a run: the options recorded in a grow-bench summary.json (its "
        "'options'); options given here override them",
    )
    p.add_argument("--no-report", action="store_true", help="skip the table/plot (PNG) of the comparison")
    add_threads(p)
    p.add_argument(
        "--shard",
        default=None,
        help="run shard k of n (k/n) into a shared --out; under torchrun "
        "one shard per rank. The comparison is written when every cell is finished",
    )
    add_plan(p, "one training step of each model")


def run(args: argparse.Namespace) -> int:
    base = config_options(GrowBenchOptions, args.config, "grow-bench")
    opts = GrowBenchOptions.from_args(args, base)
    suite = opts.suite
    if args.plan or args.plan_no_time:  # every cell of the suite (a --shard runs a part of them)
        print(plan_bench(opts, time_run=not args.plan_no_time).table(), flush=True)
        if args.shard:
            print(f"note: the plan covers every cell; --shard {args.shard} runs a part of them")
        return 0
    out = bench_out_dir(args.out, quick=opts.quick)
    res = run_bench(out, opts, shard=args.shard)
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
            "budget criterion spearman hit norm_regret norm_regret_lo norm_regret_hi gain continue train_all "
            "advantage advantage_lo advantage_hi ties nan cost_steps".split(),
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
        for f in write_report(res["rows"], res["table"], out):
            print(f"wrote {f}")
    print(f"results: {out / 'results.jsonl'}, {out / 'comparison.jsonl'}, {out / 'summary.json'}")
    return 0
