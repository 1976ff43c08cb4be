"""``widthscope grow-target``: the command line of :func:`widthscope.growth.target_bench.run_target`.

A thin adapter: the options are generated from :class:`~widthscope.growth.options.GrowTargetOptions`
(:mod:`widthscope.cli.args`; ``--config`` starts from the options a previous run's
``summary.json`` recorded); ``run`` prints the table (speed-up to the from-scratch loss per operator
and schedule, beside the continue-small baselines) and the answer. ``--plan`` prints the run's cost
plan (:func:`widthscope.planning.plan_target`) instead, and trains and writes nothing.
"""

from __future__ import annotations

import argparse

import torch

from .._io import format_table
from ..growth.options import GrowTargetOptions
from ..growth.target_bench import COLUMNS, run_target, target_out_dir
from ..planning import SUITE_PLAN_HELP, plan_target
from .args import add_config, add_options, config_options, options_from_args
from .grow import PLAN_NO_TIME_HELP

__all__ = ["add_arguments", "run"]


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
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (each cell runs at one)")
    p.add_argument(
        "--plan",
        action="store_true",
        help=SUITE_PLAN_HELP.format(timed="one training step of each distinct model"),
    )
    p.add_argument("--plan-no-time", action="store_true", help=PLAN_NO_TIME_HELP)


def run(args: argparse.Namespace) -> int:
    base = config_options(GrowTargetOptions, args.config, "grow_target", "grow-target") if args.config else None
    opts = options_from_args(GrowTargetOptions, args, base)
    if args.threads is not None:
        torch.set_num_threads(max(1, int(args.threads)))
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
    print(
        f"\nreaches the from-scratch loss with >= {a['threshold']}x less compute: {a['verdict']} "
        f"(best {a['best']}: {a['best_speedup']:.3g}x [{a['best_lo']:.3g}, {a['best_hi']:.3g}])"
        if a["best"] is not None and a["best_lo"] is not None
        else f"\nreaches the from-scratch loss with >= {a['threshold']}x less compute: {a['verdict']}"
    )
    for label, f in a.get("crossover", {}).items():
        if label in a["crossover_beyond"]:
            where = "beyond B in most seeds: no growth headline"
        else:
            where = "-" if f is None else f"{f:.2f} B (mean over the seeds where it lies within B)"
        print(f"the from-scratch target overtakes {label} at: {where}")
    print(f"results: {out / 'results.jsonl'}, {out / 'comparison.jsonl'}, {out / 'summary.json'}")
    return 0
