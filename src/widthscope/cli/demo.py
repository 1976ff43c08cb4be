"""``widthscope demo [--out DIR] [--quick]``: the command line of :func:`widthscope.demo.run_demo`.

A thin adapter: the options go to :func:`~widthscope.demo.run_demo` as keyword arguments.
"""

from __future__ import annotations

import argparse

from ..demo import run_demo
from ..errors import WidthscopeError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default=None, help="results folder (default widthscope-results/demo, or demo-quick with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke version")
    parser.add_argument("--no-linear", action="store_true", help="skip the linearization part")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars inside cells")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch CPU threads (default 1: these small models gain little from more, and "
        "busy cores make extra threads 10-20x slower)",
    )


def run(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        raise WidthscopeError(f"--threads must be >= 1 (got {args.threads})")
    run_demo(
        args.out, quick=args.quick, linear=not args.no_linear, show_progress=not args.no_progress, threads=args.threads
    )
    return 0
