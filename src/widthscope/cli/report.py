"""``widthscope report RESULTS_DIR ...``: the command line of :func:`widthscope.report.report`
(``--config``: the options a report recorded in its ``report.json``)."""

from __future__ import annotations

import argparse
import webbrowser

from ..errors import WidthscopeError
from ..report import report
from ..report.options import ReportOptions
from .args import add_options, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="+",
        help="results directories (a sweep's --out), results.jsonl files, or "
        "the .json files of several `widthscope certify` runs (a width series)",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="REPORT_JSON",
        help="start from the options a report recorded (its report.json); options given here override them",
    )
    add_options(parser, ReportOptions)


def _base(path: str | None) -> ReportOptions:
    """The options every flag not given takes: ``--config``'s recorded ones, else the defaults."""
    if path is None:
        return ReportOptions()
    try:
        return ReportOptions.from_dict(load_config(path))
    except TypeError:  # a value of the wrong type: the dataclass named it; anything else is not ours
        raise
    except WidthscopeError as exc:
        raise WidthscopeError(f"--config {path!r}: {exc} (pass the report.json a report wrote)") from None


def run(args: argparse.Namespace) -> int:
    opts = ReportOptions.from_args(args, _base(args.config))
    page = report(args.results, options=opts)
    print(f"report: {page}")
    print(f"figures: {page.parent}/*.png")
    for extra in ("width-series.html", "over-training.html"):
        if (page.parent / extra).is_file():
            print(f"{extra.split('.')[0]}: {page.parent / extra}")
    if opts.open:
        webbrowser.open(page.resolve().as_uri())
    return 0
