"""``widthscope stats``: the command line of :func:`widthscope.certification.samples.run_stats`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..certification.per_point import tables
from ..certification.samples import StatsOptions, run_stats
from .args import add_config, add_options, add_threads, config_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("samples", nargs="?", default=None, help="a samples file written by certify --save-samples")
    add_config(
        p,
        "stats",
        what="repeat a run: the options recorded in a stats results JSON (its 'options'; the samples "
        'file or matrices too, unless given here), or a JSON file {"stats": {...}}; options given here override them',
    )
    add_options(p, StatsOptions)
    p.add_argument("--out", default=None, help="JSON output path (default: print the tables only)")
    add_threads(p)


def run(args: argparse.Namespace) -> int:
    base = config_options(StatsOptions, args.config, "stats") or StatsOptions()
    base = base.sources(samples=args.samples, train=args.train, test=args.test)
    opts = StatsOptions.from_args(args, base)
    run_stats(
        opts.samples,
        M=None if opts.M is None else list(opts.M),
        K=None if opts.K is None else list(opts.K),
        out=args.out,
        report=lambda res: print(tables(res)),
        **{k: getattr(opts, k) for k in ("train", "test", "point", "draws", "seed", "estimator", "strict")},
    )
    if args.out:
        print(f"\nwrote {Path(args.out)}")  # as atomic_write_json names it
    return 0
