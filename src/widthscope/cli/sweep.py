"""``widthscope sweep CONFIG.toml [--out DIR] [--shard k/n] [--dry-run]``: the command line of
:func:`widthscope.sweep.run.run_sweep_file`.

Runs (or resumes) an alignment width sweep (:mod:`widthscope.sweep.alignment`), or, for a config
with a ``[suite]`` table, certifies a suite of existing checkpoints at their revisions
(:mod:`widthscope.sweep.suite`); see docs/sweeps.md. A thin adapter: the options go to the sweep as
keyword arguments. Example::

    widthscope sweep configs/demo-mlp.toml --out /tmp/mlp-sweep
    widthscope sweep configs/demo-mlp.toml --out /tmp/mlp-sweep --shard 2/4   # a quarter of the grid
    widthscope sweep configs/pythia-suite.toml --out /tmp/pythia --dry-run    # cells, commits, cost estimate
"""

from __future__ import annotations

import argparse

from ..sweep.run import run_sweep_file

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", help="TOML sweep config: [sweep] + [[family]], or a [suite] of checkpoints (docs/sweeps.md, configs/)"
    )
    parser.add_argument("--out", default=None, help="results directory (default: [sweep].out_dir)")
    parser.add_argument(
        "--shard",
        default=None,
        metavar="k/n",
        help="run only cells k-1, k-1+n, ... of the grid (for several processes/machines)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the grid and what is finished; run nothing")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads (overrides [sweep].threads); 1 is best on busy machines",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars inside cells")


def run(args: argparse.Namespace) -> int:
    run_sweep_file(
        args.config,
        out=args.out,
        shard=args.shard,
        dry_run=args.dry_run,
        threads=args.threads,
        show_progress=not args.no_progress,
    )
    return 0
