"""``widthscope grow``: the command line of :func:`widthscope.grow.pipeline.run_grow`.

A thin adapter: the input options come from :mod:`widthscope.cli.inputs` (an
:class:`~widthscope.data.spec.InputSpec` for a checkpoint, pool sizes 2048 / 512 capped at what
the data has when not given); ``run`` passes the growth settings to the pipeline as keyword
arguments and prints its tables.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..grow.pipeline import DEFAULT_CRITERION, run_grow
from .inputs import add_arguments as add_inputs
from .inputs import spec_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_inputs(
        p,
        model_required=True,
        n_train=None,
        n_test=None,
        n_train_help="2048, capped at what the data has",
        n_test_help="512, capped at what the data has",
    )
    p.add_argument("--points", default=None, help="comma-separated candidate points (default: all block outputs)")
    p.add_argument("--M", type=int, default=32, help="train samples of the certificate (default 32)")
    p.add_argument("--K", type=int, default=32, help="held-out samples of the certificate (default 32)")
    p.add_argument("--steps", type=int, default=200, help="training steps of the new block (default 200)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--eta", type=float, default=None, help="step size of the predicted gain (default --lr)")
    p.add_argument("--block-width", type=int, default=None, help="hidden width of the block (default: point width)")
    p.add_argument("--train-all", action="store_true", help="train every parameter, not only the new block")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also grow at the worst-ranked and a random point, and train "
        "the original model for the same FLOPs (is growing better than training longer?)",
    )
    from ..probe.growth import CRITERIA

    p.add_argument(
        "--criterion",
        choices=list(CRITERIA),
        default=DEFAULT_CRITERION,
        help=f"what ranks the points (default {DEFAULT_CRITERION}, the winner of `widthscope "
        "grow-bench`; bias = the old first-order gain of a bias step)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON (atomically) to this path")


def _print_tables(
    res: dict[str, Any], *, criterion: str, M: int, K: int, steps: int, train_all: bool, compare: bool
) -> None:
    """The candidates, the certification line, the growth rows and the equal-FLOPs comparison."""
    from .._io import format_table

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
    print()
    print(
        format_table(
            res["growth"],
            [
                "role",
                "rank",
                "point",
                "loss_before",
                "loss_after",
                "delta",
                "steps",
                "flops",
                "predicted_gain",
                "predicted_first_step",
                "new_parameters",
            ],
            title=f"growth: block trained {steps} steps "
            f"({'all parameters' if train_all else 'new block only'})"
            + ("; continue = the original model trained for the same FLOPs" if compare else ""),
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
    # Seeds, sizes, devices, data paths and outputs were checked by cli.checks.check_args (cli.main);
    # data options were refused for the built-in model by widthscope.validate.APPLIES.
    builtin = args.model == "builtin"
    spec = None if builtin else spec_from_args(args, "grow")  # the 2048/512 capped defaults live there

    def report(res: dict[str, Any]) -> None:
        _print_tables(
            res,
            criterion=args.criterion,
            M=args.M,
            K=args.K,
            steps=args.steps,
            train_all=args.train_all,
            compare=args.compare,
        )

    # show: a bar on a terminal, periodic lines in a log (widthscope._io.progress)
    run_grow(
        spec,
        n_train=args.n_train if builtin else None,
        n_test=args.n_test if builtin else None,
        dtype=args.dtype,
        points=args.points,
        M=args.M,
        K=args.K,
        steps=args.steps,
        lr=args.lr,
        eta=args.eta,
        block_width=args.block_width,
        train_all=args.train_all,
        compare=args.compare,
        batch_size=args.batch_size,
        seed=args.seed,
        criterion=args.criterion,
        out=args.out,
        show=True,
        say=print,
        report=report,
    )
    if args.out:
        print(f"\nwrote {args.out}")
    return 0
