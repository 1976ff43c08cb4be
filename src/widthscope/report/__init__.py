"""Plots and a self-contained HTML report from results (CLI ``widthscope report``, :mod:`widthscope.cli.report`).

:func:`report` reads each results directory (its ``cells/``, else its ``results.jsonl``) or certify
JSON file and writes PNGs, ``report.html`` (plus the pages of :mod:`widthscope.report.suite` for a
model suite) and the settings (``report.json``) into its out folder. Python::

    from widthscope.report import report
    page = report(["widthscope-results/demo/llama"], out_dir="/tmp/rep")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from .. import _io  # _io.check_space looked up at call time (tests replace it)
from .._io import Skipped, atomic_write_json, read_jsonl, record_skips, refuse_skips, skip_lines, warn_skips
from ..errors import WidthscopeError
from .html import build_report
from .options import RECORD, ReportOptions

__all__ = ["load_results", "report", "ReportOptions"]


# The row kinds widthscope writes; a row without a kind is an alignment row with M and K.
ROW_KINDS = tuple(
    "alignment intervention correlation slope linearization growth growth_bench growth_compare monitor".split()
)


def _ours(row: Any) -> bool:
    if not isinstance(row, dict):
        return False
    kind = row.get("kind")
    return kind in ROW_KINDS if kind is not None else ("M" in row and "K" in row)


def _only_ours(got: list[Any], p: Path, notes: list[str] | None) -> list[dict[str, Any]]:
    """Rows widthscope wrote; a source with none is refused, foreign rows among ours are noted."""
    ours = [r for r in got if _ours(r)]
    if got and not ours:
        kinds = sorted({str(r.get("kind")) for r in got if isinstance(r, dict) and "kind" in r})[:3]
        raise WidthscopeError(
            f"{p} holds {len(got)} row(s) but none widthscope wrote (no 'kind' "
            f"{'/'.join(ROW_KINDS[:3])}/...{'; it has kind ' + ', '.join(kinds) if kinds else ''}): "
            "pass a sweep's --out folder, its results.jsonl, or certify .json files"
        )
    if len(ours) < len(got) and notes is not None:
        notes.append(f"{p}: {len(got) - len(ours)} row(s) that widthscope did not write were left out")
    return ours


def _held_by_damaged(p: Path, found: Sequence[Skipped]) -> str | None:
    """A note when ``p/results.jsonl`` still holds rows of cell files found damaged: they are not lost."""
    ids = {Path(s.path).stem for s in found}
    res = p / "results.jsonl"
    if not ids or not res.is_file():
        return None
    held = sum(1 for r in read_jsonl(res, problems=[]) if r.get("cell_id") in ids)
    if not held:
        return None
    return (
        f"{res} still holds {held} row(s) of the {len(ids)} damaged cell file(s) (not used here: the report "
        f"reads cells/); `widthscope repair {p}` keeps them in its backup, rerunning the sweep computes them again"
    )


def load_results(
    dirs: Sequence[str | os.PathLike], notes: list[str] | None = None, problems: list[Skipped] | None = None
) -> list[dict[str, Any]]:
    """Rows (each with ``source``) of every results directory, ``.jsonl`` or certify ``.json`` file given.
    Foreign rows are left out with a line in ``notes``; a damaged line or cell file is skipped into
    ``problems`` (else logged on stderr); a damaged certify file is refused. Nothing is written."""
    from ..sweeps.grid import load_rows  # noqa: PLC0415  start-up time: torch
    from .certify_series import series_rows  # noqa: PLC0415  start-up time: torch

    rows: list[dict[str, Any]] = []
    # Certify files are read together (at the first one's place), checked against each other as one series.
    jsons = [d for d in dirs if Path(d).suffix == ".json" and not Path(d).is_dir()]
    pending = jsons
    for d in dirs:
        p = Path(d)
        if d in jsons:
            rows.extend(series_rows(pending))
            pending = []
            continue
        if p.is_file() and p.suffix == ".jsonl":
            got = read_jsonl(p, problems)
        elif p.is_dir():
            if (p / "cells").is_dir():
                found: list[Skipped] = []
                got = load_rows(p, rebuild=False, problems=found)  # never rewrite an input
                held = _held_by_damaged(p, found)
                if held and notes is not None:
                    notes.append(held)
                record_skips(found, problems)
            else:
                got = read_jsonl(p / "results.jsonl", problems)
            if not got and not (p / "results.jsonl").exists() and not (p / "cells").is_dir():
                raise WidthscopeError(
                    f"{str(p)!r} has neither results.jsonl nor cells/: pass the directory a "
                    f"sweep wrote (its --out), e.g. widthscope-results/<name>"
                )
        elif p.exists():
            raise WidthscopeError(
                f"{str(p)!r} is a {p.suffix or 'suffix-less'} file, not results: pass the --out "
                "folder of a sweep, a results.jsonl file, or certify .json files"
            )
        else:
            raise WidthscopeError(
                f"results directory {str(p)!r} does not exist: pass the --out folder of a "
                f"sweep (or a results.jsonl file, or certify .json files)"
            )
        got = _only_ours(got, p, notes)
        for r in got:
            r.setdefault("source", str(p))
        rows.extend(got)
    from ..stats import vacuous_rule  # noqa: PLC0415  start-up time: torch

    for r in rows:  # rows written before the vacuous rule read as new ones do
        if r.get("kind") == "alignment":
            vacuous_rule(vacuous_rule(r, "one_"), "two_")
    return rows


# How many skipped lines/files the page lists one by one (stderr: the first few, then a count).
PAGE_SKIPS = 50
_STRICT_FIX = (
    "rebuild a results folder with `widthscope repair DIR` (it keeps a backup), or drop --strict "
    "to skip the damaged part with a note"
)


def report(
    results: Sequence[str | os.PathLike] | str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    notes: Sequence[str] = (),
    strict: bool = False,
    options: ReportOptions | None = None,
) -> Path:
    """Build the report of one or more results (see the module docstring); return ``report.html``'s path.
    ``notes`` head the page; ``strict`` refuses damaged input; ``options`` replaces ``out_dir``, ``title``
    and ``strict``."""
    from .certify_series import describe  # noqa: PLC0415  start-up time: torch
    from .suite import write_pages  # noqa: PLC0415  start-up time: torch

    if options is None:
        options = ReportOptions(out=None if out_dir is None else str(out_dir), title=title, strict=strict)
    out_dir, title, strict = options.out, options.title, options.strict

    dirs = [results] if isinstance(results, (str, os.PathLike)) else list(results)
    if not dirs:
        raise WidthscopeError("no results directory given: pass at least one sweep --out folder")
    notes = list(notes)
    problems: list[Skipped] = []
    rows = load_results(dirs, notes, problems)
    if problems:
        if strict:
            raise refuse_skips(problems, _STRICT_FIX)
        if not rows:
            raise WidthscopeError(
                f"no readable rows in {', '.join(map(str, dirs))}: {len(problems)} damaged "
                f"line(s)/file(s), first {problems[0]}; rerun the sweep, or restore the "
                "results from a copy"
            )
        warn_skips(problems, "widthscope report")
        notes[:0] = [
            f"damaged input: {len(problems)} line(s)/file(s) were skipped, each named below; "
            "`widthscope report --strict` refuses such input, `widthscope repair DIR` rebuilds a "
            "results folder keeping a backup"
        ] + skip_lines(problems, PAGE_SKIPS)
    if not rows:
        raise WidthscopeError(f"no finished rows in {', '.join(map(str, dirs))}: run (or resume) the sweep first")
    first = Path(dirs[0])
    # A certify file's report goes beside it (a file cannot hold a folder).
    out = Path(out_dir) if out_dir is not None else (first.parent if first.is_file() else first) / "report"
    if title is None:
        title = "widthscope report: " + ", ".join(Path(d).name for d in dirs)
    _io.check_space(out / "report.html", 2_000_000 + 10_000 * len(rows), "the report (figures and page)")
    named = describe(rows)  # certify files: which model/data/width each one is
    page = build_report(rows, out, title=title, sources=[named.get(str(Path(d)), str(d)) for d in dirs], notes=notes)
    pages = write_pages(rows, out)  # a model suite: its width series and over-training pages
    atomic_write_json(
        out / RECORD,
        {
            "options": options.replace(out=str(out)).to_dict(),
            "results": [str(d) for d in dirs],
            "pages": [page.name, *(p.name for p in pages)],
        },
    )
    return page
