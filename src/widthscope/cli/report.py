"""``widthscope report RESULTS_DIR [RESULTS_DIR ...] [--out DIR] [--open] [--strict]``: the command
line of :func:`widthscope.report.report`.

A thin adapter: the options go to :func:`~widthscope.report.report` as arguments; ``run`` prints
the page's path and, with ``--open``, opens it in a browser.
"""

from __future__ import annotations

import argparse
import webbrowser

from ..report import report

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="+",
        help="results directories (a sweep's --out), results.jsonl files, or "
        "the .json files of several `widthscope certify` runs (a width series)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default: FIRST_RESULTS_DIR/report; for a certify .json first: its folder/report)",
    )
    parser.add_argument("--title", default=None, help="page title")
    parser.add_argument("--open", action="store_true", help="open the page in a browser afterwards")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse damaged input (a torn or non-JSON line, "
        "a damaged cell file) with one error line, exit 2, instead of skipping it with a note",
    )


def run(args: argparse.Namespace) -> int:
    page = report(args.results, args.out, title=args.title, strict=args.strict)
    print(f"report: {page}")
    print(f"figures: {page.parent}/*.png")
    if args.open:
        webbrowser.open(page.resolve().as_uri())
    return 0
