"""``widthscope linearize``: the command line of :func:`widthscope.linear.sweep.run_file`.

A thin adapter: the config path, ``--out`` and ``--shard`` go to the sweep as arguments.
"""

from __future__ import annotations

import argparse

from ..linear.sweep import run_file  # torch and the sweep load with the command, before signals act

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="TOML config (see configs/linearize-demo.toml)")
    parser.add_argument("--out", default=None, help="results directory (default runs/<config name>)")
    parser.add_argument("--shard", default=None, help="run shard k of n (k/n); cells are split round-robin")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run_file(args.config, out=args.out, shard=args.shard)
    return 0
