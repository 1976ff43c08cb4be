"""``widthscope activations``: the command line of :func:`widthscope.linearization.activations.run_audit`."""

from __future__ import annotations

import argparse

from ..linearization.activations import ActivationsOptions, run_audit
from .args import add_config, add_options, add_threads, config_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config(parser, "activations")
    add_options(parser, ActivationsOptions)
    add_threads(parser)
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="also write the table as JSON (with the options that made it)"
    )


def run(args: argparse.Namespace) -> int:
    base = config_options(ActivationsOptions, args.config, "activations")
    opts = ActivationsOptions.from_args(args, base)
    run_audit(opts, json_out=args.json)
    return 0
