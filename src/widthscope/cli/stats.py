"""``widthscope stats``: the command line of :func:`widthscope.certify.samples.run_stats`.

A thin adapter: it reads the comma lists ``--M`` / ``--K`` (with the command line's messages),
passes the settings to the pipeline as keyword arguments and prints the tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..certify.samples import run_stats

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("samples", nargs="?", default=None, help="a samples file written by certify --save-samples")
    p.add_argument("--train", default=None, help="train sample matrices (.npy/.npz/.pt), with --test")
    p.add_argument("--test", default=None, help="held-out sample matrices (.npy/.npz/.pt), with --train")
    p.add_argument(
        "--point",
        default=None,
        help="the point(s) to compute, comma list (default: every point of the file); also names the "
        "point of a single .npy/.pt matrix",
    )
    p.add_argument("--M", default=None, help="train sample sizes, comma list (default: the saved ones)")
    p.add_argument("--K", default=None, help="held-out sample sizes, comma list (default: K = M)")
    p.add_argument("--draws", type=int, default=None, help="misalignment resamples (default: saved, else 1000)")
    p.add_argument("--seed", type=int, default=None, help="resampling seed (default: saved, else 0)")
    p.add_argument("--estimator", choices=("unbiased", "plugin"), default=None)
    p.add_argument("--out", default=None, help="JSON output path (default: print the tables only)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a samples file with damaged optional metadata "
        "(notes, recorded interventions) instead of skipping it with a note",
    )


def run(args: argparse.Namespace) -> int:
    from ..certify.per_point import tables
    from ..validate import int_list

    # --out writable and --draws >= 1: widthscope.validate (cli.main), before this runs
    Ms, Ks = int_list(args.M, "--M"), int_list(args.K, "--K")

    def report(res: dict[str, Any]) -> None:
        print(tables(res))

    run_stats(
        args.samples,
        train=args.train,
        test=args.test,
        point=args.point,
        M=Ms,
        K=Ks,
        draws=args.draws,
        seed=args.seed,
        estimator=args.estimator,
        out=args.out,
        strict=bool(getattr(args, "strict", False)),
        report=report,
    )
    if args.out:
        print(f"\nwrote {Path(args.out)}")  # as atomic_write_json names it
    return 0
