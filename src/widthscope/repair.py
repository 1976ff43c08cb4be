"""``widthscope repair DIR``: rebuild ``results.jsonl`` from the readable cells (else its readable
lines), after moving damaged cells and the old file into ``DIR/backup/<date-time>/``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from ._io import Skipped, atomic_write_text, read_jsonl, unwritable
from .errors import WidthscopeError
from .options import Options, option


@dataclasses.dataclass(frozen=True)
class RepairOptions(Options):
    """The settings of ``widthscope repair`` (the folder is its argument, not a setting)."""

    dry_run: bool = option(False, help="say what would be repaired; change nothing")


def _plan(d: Path) -> dict[str, Any]:
    """What is damaged and what results.jsonl should hold; reads only."""
    from .sweeps.grid import RESULTS, load_rows  # noqa: PLC0415  start-up time: torch

    res = d / RESULTS
    cells = d / "cells"
    old_problems: list[Skipped] = []
    old = read_jsonl(res, old_problems) if res.is_file() else []
    cell_problems: list[Skipped] = []
    if cells.is_dir():
        rows = load_rows(d, rebuild=False, problems=cell_problems)
        n_cells = len(list(cells.glob("*.json"))) - len(cell_problems)
    else:
        rows, n_cells = old, None  # no cells to rebuild from: keep the readable lines
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)  # as the sweep writes it
    current = res.read_bytes() if res.is_file() else None
    return {
        "res": res,
        "old": old,
        "old_problems": old_problems,
        "cell_problems": cell_problems,
        "rows": rows,
        "n_cells": n_cells,
        "text": text,
        "changed": current != text.encode("utf-8"),
    }


def _describe(d: Path, plan: dict[str, Any], backup: Path, dry_run: bool) -> list[str]:
    cp, op = plan["cell_problems"], plan["old_problems"]
    head = f"repair {d}:"
    src = f"{plan['n_cells']} readable cell file(s)" if plan["n_cells"] is not None else "its readable lines"
    lines = [f"{head} damaged cell file {s.path}: {s.why}" for s in cp]
    lines += [f"{head} damaged line {s.path} line {s.line}: {s.why}" for s in op[:5]]
    if len(op) > 5:
        lines.append(f"{head} ... and {len(op) - 5} more damaged line(s) in results.jsonl")
    move, keep, rebuild = ("would move", "would keep", "would rebuild") if dry_run else ("moved", "kept", "rebuilt")
    if cp:
        lines.append(f"{head} {move} {len(cp)} damaged cell file(s) to {backup / 'cells'}")
    if plan["res"].is_file():
        lines.append(
            f"{head} {keep} the old results.jsonl ({len(plan['old'])} row(s), {len(op)} damaged "
            f"line(s)) as {backup / 'results.jsonl'}"
        )
    lines.append(f"{head} {rebuild} results.jsonl from {src}: {len(plan['rows'])} row(s)")
    if cp:
        ids = {Path(s.path).stem for s in cp}
        held = sum(1 for r in plan["old"] if r.get("cell_id") in ids)
        lines.append(
            f"{head} the old results.jsonl held {held} row(s) of the {len(cp)} damaged cell(s); rerun the "
            "sweep (same command) to compute those cell(s) again"
        )
    if dry_run:
        lines.append(f"{head} dry run: nothing was written")
    return lines


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    """The sweep's lock: never rewrite a folder a running sweep is writing."""
    from .sweeps.grid import lock_out_dir  # noqa: PLC0415  start-up time: torch

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(lock_out_dir(d, what="sweep or repair"))
        except WidthscopeError as exc:
            raise WidthscopeError(f"{str(exc).split('; wait')[0]}; repair it once that run has ended") from None
        yield


def repair(out_dir: str | os.PathLike, *, dry_run: bool = False) -> list[str]:
    """Repair the results folder ``out_dir``; print and return what it did."""
    from .sweeps.grid import new_backup_dir, set_aside  # noqa: PLC0415  start-up time: torch

    d = Path(out_dir)
    if not d.exists():
        raise WidthscopeError(f"results folder {str(d)!r} does not exist: pass the --out folder of a sweep")
    if not d.is_dir():
        hint = f" (its folder is {str(d.parent)!r})" if d.suffix in (".jsonl", ".json") else ""
        raise WidthscopeError(f"{str(d)!r} is a file: pass the results folder that a sweep wrote{hint}")
    if not (d / "cells").is_dir() and not (d / "results.jsonl").is_file():
        raise WidthscopeError(
            f"{str(d)!r} has neither results.jsonl nor cells/: nothing to repair; pass the --out folder of a sweep"
        )
    with contextlib.nullcontext() if dry_run else _locked(d):
        plan = _plan(d)
        if not plan["cell_problems"] and not plan["changed"]:
            src = f"{plan['n_cells']} readable cell file(s)" if plan["n_cells"] is not None else "its lines"
            lines = [
                f"repair {d}: nothing to repair: results.jsonl holds the {len(plan['rows'])} row(s) of {src}, "
                "no damaged file or line"
            ]
        else:
            backup = new_backup_dir(d)
            if not dry_run:
                if plan["res"].is_file():  # a copy first: results.jsonl is never missing, even if killed here
                    try:
                        backup.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(plan["res"], backup / "results.jsonl")
                    except OSError as exc:
                        raise unwritable(backup / "results.jsonl", exc) from None
                set_aside(d, [Path(s.path) for s in plan["cell_problems"]], backup)
                atomic_write_text(plan["res"], plan["text"])
            lines = _describe(d, plan, backup, dry_run)
    print(*lines, sep="\n")
    return lines
