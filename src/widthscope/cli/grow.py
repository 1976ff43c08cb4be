"""``widthscope grow``: the command line of :func:`widthscope.growth.pipeline.run_grow` (``--plan``:
:func:`widthscope.planning.plan_grow`); prints its tables."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from .._io import format_table
from ..growth.options import GROW_POOLS, GrowOptions
from ..growth.pipeline import run_grow
from ..planning import plan_grow
from .args import add_config, add_options, add_plan, config_options
from .inputs import add_arguments as add_inputs
from .inputs import spec_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_inputs(
        p,
        model_required=True,
        n_train=None,
        n_test=None,
        n_train_help=f"{GROW_POOLS[0]}, capped at what the data has",
        n_test_help=f"{GROW_POOLS[1]}, capped at what the data has",
    )
    add_config(p, "grow")
    add_options(p, GrowOptions)
    p.add_argument("--out", default=None, help="write the results as JSON (atomically) to this path")
    add_plan(p, "one step of each training stage")


def _print_tables(res: dict[str, Any], opts: GrowOptions) -> None:
    """The candidates, the certification line, the growth rows and the equal-FLOPs comparison."""
    criterion, M, K, steps = opts.criterion, opts.M, opts.K, opts.steps
    cols = ["rank", "point", "score", "p_improve", "MK_needed_0.1", "MK_needed_0.05", "MK_needed_0.01"]
    cols += (
        ["d_align", "expectation", "b_exact", "b_align"]
        if criterion == "bias"
        else ["ls_gain", "block_gain", "gradmax", "certified_gain", "block_d_align", "block_b_exact", "predicted_gain"]
    )
    print(
        format_table(
            res["candidates"],
            cols,
            title=f"candidate points ranked by {criterion} (certificate at M={M}, "
            f"K={K}; p_improve = 1 - B_exact; MK_needed_* = M=K for B_exact <= delta)",
        )
    )
    print(res["certification"])
    print(res["criterion_note"])
    print()
    print(
        format_table(
            res["growth"],
            "role rank point loss_before loss_after delta steps flops predicted_gain predicted_first_step "
            "new_parameters".split(),
            title=f"growth: block trained {steps} steps "
            f"({'all parameters' if opts.train_all else 'new block only'})"
            + ("; continue = the original model trained for the same FLOPs" if opts.compare else ""),
        )
    )
    cont = [g for g in res["growth"] if g["role"] == "continue"]
    if cont:
        d = res["growth"][0]["delta"] - cont[0]["delta"]
        print(
            f"growing at {res['growth'][0]['point']} vs training the original {cont[0]['steps']} more steps "
            f"(same FLOPs): held-out loss {res['growth'][0]['loss_after']:.4f} vs {cont[0]['loss_after']:.4f} "
            f"({'lower after growing' if d < 0 else 'lower after training longer'} by {abs(d):.4f}; one run, "
            "so not a test: the seed intervals are grow-bench's, docs/interventions.md §5)"
        )


def run(args: argparse.Namespace) -> int:
    base = config_options(GrowOptions, args.config, "grow")
    opts = GrowOptions.from_args(args, base)
    builtin = args.model == "builtin"
    spec = None if builtin else spec_from_args(args, "grow", seed=opts.seed)

    pools = dict(n_train=args.n_train if builtin else None, n_test=args.n_test if builtin else None)
    if args.plan or args.plan_no_time:
        print(plan_grow(spec, opts, **pools, dtype=args.dtype, time_run=not args.plan_no_time).table(), flush=True)
        return 0
    report = functools.partial(_print_tables, opts=opts)
    run_grow(spec, opts, **pools, dtype=args.dtype, out=args.out, show=True, say=print, report=report)
    if args.out:
        print(f"\nwrote {args.out}")
    return 0
