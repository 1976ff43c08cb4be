"""``widthscope grow-target``: the command line of :func:`widthscope.growth.target.run_target`
(``--plan``: :func:`widthscope.planning.plan_target`); prints the speed-up table and the answer."""

from __future__ import annotations

import argparse

from .._io import format_table
from ..growth.options import GrowTargetOptions
from ..growth.target import COLUMNS, run_target, target_out_dir
from ..planning import plan_target
from .args import add_config, add_options, add_plan, add_threads, config_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, GrowTargetOptions)
    p.add_argument(
        "--out",
        default=None,
        help="results directory (default widthscope-results/grow-target[-quick]); finished seeds are kept "
        "and a rerun resumes",
    )
    add_config(
        p,
        "grow-target",
        what="repeat a run: the options recorded in a grow-target summary.json (its 'options'); "
        "options given here override them",
    )
    add_threads(p, "torch CPU threads (each cell runs at one)")
    add_plan(p, "one training step of each distinct model")


def run(args: argparse.Namespace) -> int:
    base = config_options(GrowTargetOptions, args.config, "grow-target")
    opts = GrowTargetOptions.from_args(args, base)
    if args.plan or args.plan_no_time:
        print(plan_target(opts, time_run=not args.plan_no_time).table(), flush=True)
        return 0
    out = target_out_dir(args.out, quick=opts.quick, suite_file=opts.suite_file)
    res = run_target(out, opts)
    print(
        format_table(
            res["table"],
            list(COLUMNS),
            title=f"grow-target ({res['summary']['suite']}): speed-up = FLOPs of the from-scratch target to its "
            "final held-out loss / FLOPs of the run to the same loss (geometric mean over seeds, 95% t "
            "interval; a run that never reached it enters at its budget bound)",
        )
    )
    a = res["summary"]["answer"]
    best = a["best"] is not None and a["best_lo"] is not None
    best_words = (
        f" (best {a['best']}: {a['best_speedup']:.3g}x [{a['best_lo']:.3g}, {a['best_hi']:.3g}])" if best else ""
    )
    print(f"\nreaches the from-scratch loss with >= {a['threshold']}x less compute: {a['verdict']}{best_words}")
    for label, f in a.get("crossover", {}).items():
        if label in a["crossover_beyond"]:
            where = "beyond B in most seeds: no growth headline"
        else:
            where = "-" if f is None else f"{f:.2f} B (mean over the seeds where it lies within B)"
        print(f"the from-scratch target overtakes {label} at: {where}")
    print(f"results: {out / 'results.jsonl'}, {out / 'comparison.jsonl'}, {out / 'summary.json'}")
    return 0
