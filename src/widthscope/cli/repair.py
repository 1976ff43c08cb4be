"""``widthscope repair DIR [--dry-run]``: the command line of :func:`widthscope.repair.repair`.

A thin adapter: the settings are generated from :class:`~widthscope.repair.RepairOptions`
(:mod:`widthscope.cli.args`), over the options of a ``--config`` JSON file; the folder and the
settings go to :func:`~widthscope.repair.repair`, which prints what it did. Repair writes no
results file of its own, so nothing records its options: ``--config`` reads a JSON file
``{"repair": {"dry_run": true}}`` (or any JSON whose ``"options"`` holds ``"repair"``).
"""

from __future__ import annotations

import argparse

from ..repair import RepairOptions, repair
from .args import add_config, add_options, config_options, options_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="a results folder (the --out of sweep, linearize or grow-bench)")
    add_config(
        parser,
        "repair",
        what='the options of a JSON file {"repair": {"dry_run": true}} (repair records none itself); '
        "options given here override them",
    )
    add_options(parser, RepairOptions)


def run(args: argparse.Namespace) -> int:
    base = config_options(RepairOptions, args.config, "repair", "repair") if args.config else None
    opts = options_from_args(RepairOptions, args, base)
    repair(args.results, dry_run=opts.dry_run)
    return 0
