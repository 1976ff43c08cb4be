"""Plots and a self-contained HTML report from results directories (CLI ``widthscope report``).

``widthscope report RESULTS_DIR [RESULTS_DIR ...] [--out DIR] [--open]`` reads each directory's
``results.jsonl`` (rebuilding it from ``cells/`` when that exists, see
:func:`widthscope.sweep.grid.load_rows`), writes PNGs and ``report.html`` into ``--out``
(default ``RESULTS_DIR/report``) and prints the page's path. Python::

    from widthscope.report import report
    page = report(["widthscope-results/demo/llama"], out_dir="/tmp/rep")
"""
from __future__ import annotations

import argparse
import os
import webbrowser
from pathlib import Path
from typing import Any, Sequence

from .._io import read_jsonl
from ..errors import WidthscopeError

__all__ = ["load_results", "report", "add_arguments", "run"]


def load_results(dirs: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Rows of every results directory (or ``.jsonl`` file) given; each row gets ``source``."""
    from ..sweep.grid import load_rows

    rows: list[dict[str, Any]] = []
    for d in dirs:
        p = Path(d)
        if p.is_file() and p.suffix == ".jsonl":
            got = read_jsonl(p)
        elif p.is_dir():
            got = load_rows(p) if (p / "cells").is_dir() else read_jsonl(p / "results.jsonl")
            if not got and not (p / "results.jsonl").exists() and not (p / "cells").is_dir():
                raise WidthscopeError(f"{str(p)!r} has neither results.jsonl nor cells/: pass the directory a "
                                      f"sweep wrote (its --out), e.g. widthscope-results/<name>")
        else:
            raise WidthscopeError(f"results directory {str(p)!r} does not exist: pass the --out folder of a "
                                  f"sweep (or a results.jsonl file)")
        for r in got:
            r.setdefault("source", str(p))
        rows.extend(got)
    return rows


def report(results: Sequence[str | os.PathLike] | str | os.PathLike, out_dir: str | os.PathLike | None = None,
           *, title: str | None = None) -> Path:
    """Build the report for one or more results directories; return the path of ``report.html``."""
    from .html import build_report

    dirs = [results] if isinstance(results, (str, os.PathLike)) else list(results)
    if not dirs:
        raise WidthscopeError("no results directory given: pass at least one sweep --out folder")
    rows = load_results(dirs)
    if not rows:
        raise WidthscopeError(f"no finished rows in {', '.join(map(str, dirs))}: run (or resume) the sweep first")
    out = Path(out_dir) if out_dir is not None else Path(dirs[0]) / "report"
    if title is None:
        title = "widthscope report: " + ", ".join(Path(d).name for d in dirs)
    return build_report(rows, out, title=title, sources=[str(d) for d in dirs])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="results directories (a sweep's --out) or results.jsonl files")
    parser.add_argument("--out", default=None, help="output folder (default: FIRST_RESULTS_DIR/report)")
    parser.add_argument("--title", default=None, help="page title")
    parser.add_argument("--open", action="store_true", help="open the page in a browser afterwards")


def run(args: argparse.Namespace) -> int:
    page = report(args.results, args.out, title=args.title)
    print(f"report: {page}")
    print(f"figures: {page.parent}/*.png")
    if args.open:
        webbrowser.open(page.resolve().as_uri())
    return 0
