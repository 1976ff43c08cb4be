"""``widthscope demo``: the command line of :func:`widthscope.demo.run_demo` and :func:`~widthscope.demo.plan_demo`."""

from __future__ import annotations

import argparse
from typing import Any

from .._env import torch_threads
from ..demo import DemoOptions, plan_demo, run_demo
from .args import add_config, add_options, add_plan, config_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default=None, help="results folder (default widthscope-results/demo, or demo-quick with --quick)"
    )
    add_config(
        parser,
        "demo",
        what="repeat a demo: the options recorded in its DIR/demo.json (or a JSON file "
        '{"demo": {...}}); options given here override them',
    )
    add_options(parser, DemoOptions)
    add_plan(parser, "a batch or a cell of each part")


def run(args: argparse.Namespace) -> int:
    base = config_options(DemoOptions, args.config, "demo")
    opts = DemoOptions.from_args(args, base)
    with torch_threads(opts.threads if args.threads is None else None):  # the default (or recorded) count
        kw: dict[str, Any] = dict(quick=opts.quick, linear=not opts.no_linear, threads=opts.threads)
        if args.plan or args.plan_no_time:
            plan_demo(args.out, time_run=not args.plan_no_time, **kw)
        else:
            run_demo(args.out, show_progress=not opts.no_progress, **kw)
    return 0
