"""``widthscope repair DIR [--dry-run]``: the command line of :func:`widthscope.repair.repair`
(``--config``: a JSON file ``{"repair": {"dry_run": true}}``; repair records no options itself)."""

from __future__ import annotations

import argparse

from ..repair import RepairOptions, repair
from .args import add_config, add_options, config_options


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
    base = config_options(RepairOptions, args.config, "repair")
    opts = RepairOptions.from_args(args, base)
    repair(args.results, dry_run=opts.dry_run)
    return 0
