"""``widthscope repair DIR [--dry-run]``: the command line of :func:`widthscope.repair.repair`.

A thin adapter: the folder and ``--dry-run`` go to :func:`~widthscope.repair.repair`, which
prints what it did.
"""

from __future__ import annotations

import argparse

from ..repair import repair

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="a results folder (the --out of sweep, linearize or grow-bench)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be repaired; change nothing")


def run(args: argparse.Namespace) -> int:
    repair(args.results, dry_run=args.dry_run)
    return 0
