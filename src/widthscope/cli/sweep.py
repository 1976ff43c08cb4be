"""``widthscope sweep CONFIG.toml [--out DIR] [--shard k/n] [--dry-run | --plan]`` (or ``--config FILE``):
the command line of :func:`widthscope.sweeps.run.run_sweep_file` (docs/sweeps.md)."""

from __future__ import annotations

import argparse

from ..errors import WidthscopeError
from ..sweeps.run import run_sweep_file
from .args import add_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="TOML sweep config: [sweep] + [[family]], or a [suite] of checkpoints (docs/sweeps.md, configs/); "
        "or give --config",
    )
    parser.add_argument(
        "--config",
        dest="config_file",
        default=None,
        metavar="FILE",
        help="the sweep to run: a TOML config (as the positional CONFIG), or a finished sweep's results folder or "
        "its sweep.json (repeats that run: its recorded config, the same cells; --out elsewhere to rerun them)",
    )
    parser.add_argument("--out", default=None, help="results directory (default: [sweep].out_dir)")
    parser.add_argument(
        "--shard",
        default=None,
        metavar="k/n",
        help="run only cells k-1, k-1+n, ... of the grid (for several processes/machines)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the grid, what is finished and the cost plan (per model and in total, counted without "
        "weights); run nothing, write nothing",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="--dry-run, and time one cell's parts per distinct model (a suite's weights are loaded) to predict "
        "the wall time per cell and in total, with the process's fixed costs",
    )
    add_threads(parser, "torch CPU threads (overrides [sweep].threads); 1 is best on busy machines")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars inside cells")


def run(args: argparse.Namespace) -> int:
    if args.config is not None and args.config_file is not None:
        raise WidthscopeError(
            f"sweep: the config is given twice ({args.config!r} and --config {args.config_file!r}); give one"
        )
    config = args.config if args.config is not None else args.config_file
    if config is None:
        raise WidthscopeError("sweep: no config; give a TOML file (widthscope sweep CONFIG.toml) or --config FILE")
    run_sweep_file(
        config,
        out=args.out,
        shard=args.shard,
        dry_run=args.dry_run,
        threads=args.threads,
        show_progress=not args.no_progress,
        plan=args.plan,
    )
    return 0
