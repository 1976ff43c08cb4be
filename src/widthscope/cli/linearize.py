"""``widthscope linearize``: the command line of :func:`widthscope.linearization.run.run_linearize`
(the sweep: a TOML ``CONFIG``, or ``--config`` a finished run's ``slopes.json``/``linearize_config.json``)."""

from __future__ import annotations

import argparse

from ..errors import WidthscopeError
from ..linearization.config import load_toml
from ..linearization.run import LinearizeOptions, run_file, run_linearize
from ..planning import plan_linearize
from ..validate import check_path_length
from .args import add_config, add_options, add_plan, add_threads, config_options, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="TOML config (see configs/linearize-demo.toml); or repeat a run with --config",
    )
    add_config(
        parser,
        "linearize",
        dest="recorded",
        what="repeat a run instead of reading a TOML CONFIG (give one of them): the sweep recorded in "
        "its slopes.json ('options') or linearize_config.json; --shard given here overrides",
    )
    parser.add_argument("--out", default=None, help="results directory (default runs/<config name>)")
    add_options(parser, LinearizeOptions)
    add_threads(parser)
    add_plan(parser, "one cell of each width")


def _recorded(path: str) -> LinearizeOptions | None:
    """The options ``--config`` names: a results file's ``"options"``, or a sweep config itself."""
    check_path_length("--config", path)
    block = load_config(path)
    if "linearize" not in block and "widths" in block:  # linearize_config.json: the sweep config
        try:
            return LinearizeOptions(sweep=block)
        except WidthscopeError as exc:
            raise type(exc)(f"--config {path!r}: {exc}") from None
    return config_options(LinearizeOptions, path, "linearize")


def run(args: argparse.Namespace) -> int:
    if args.config is not None and args.recorded is not None:
        raise WidthscopeError(
            "linearize: give a TOML CONFIG or --config (a recorded run), not both: the sweep comes from one of them"
        )
    if args.config is None and args.recorded is None:
        raise WidthscopeError(
            "linearize: give a TOML CONFIG (see configs/linearize-demo.toml), or --config with the "
            "slopes.json or linearize_config.json of an earlier run"
        )
    recorded = None if args.recorded is None else LinearizeOptions.from_args(args, _recorded(args.recorded))
    if args.plan or args.plan_no_time:  # the whole sweep's plan (every cell, no shard)
        sweep = load_toml(args.config) if recorded is None else recorded.sweep
        print(plan_linearize(sweep or {}, time_run=not args.plan_no_time).table(), flush=True)
    elif recorded is None:
        run_file(args.config, out=args.out, shard=args.shard)
    else:
        run_linearize(recorded, out=args.out)
    return 0
