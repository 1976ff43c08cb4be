r"""``widthscope grow-target``: the compute-to-target benchmark run end to end (:func:`run_target`).

Cells (one per seed, :func:`widthscope.growth.target.run_target_cell`) run through the resumable grid
(:func:`widthscope.sweeps.grid.run_grid`: ``OUT/cells/<id>.json`` written atomically, a rerun skips
finished cells, ``OUT/results.jsonl`` is the view of the finished rows). When every cell is done,
``OUT/comparison.jsonl`` (:func:`widthscope.growth.target_compare.compare`) and ``OUT/summary.json``
(the answer, the suite, the options that repeat the run) are written.

Command line (:mod:`widthscope.cli.grow_target`)::

    widthscope grow-target --quick --out /tmp/gt          # the tiny suite (minutes on one core)
    widthscope grow-target --out widthscope-results/grow-target
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .._io import atomic_write_json, atomic_write_text
from ..errors import WidthscopeError
from ..sweeps.grid import cell_id, run_grid
from .options import GrowTargetOptions, with_keywords
from .target import OPERATORS, run_target_cell, target_cells
from .target_compare import answer, compare
from .target_plan import read_suite_file

__all__ = ["run_target", "target_out_dir", "COLUMNS"]

# the table's columns (CLI and docs)
COLUMNS = (
    "run",
    "reached",
    "seeds",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "vs_continue",
    "vs_continue_lo",
    "vs_continue_hi",
    "reached_before_growth",
    "grown_at",
    "forced",
    "final_loss",
    "verdict",
    "verdict_continue",
)


def target_out_dir(out: str | Path | None = None, *, quick: bool = False, suite_file: str | None = None) -> Path:
    """``out``, or ``widthscope-results/grow-target[-quick | -<suite file stem>]``."""
    tail = f"-{Path(suite_file).stem}" if suite_file else ("-quick" if quick else "")
    return Path(out or f"widthscope-results/grow-target{tail}")


def suite_cells(opts: GrowTargetOptions) -> list[dict[str, Any]]:
    if opts.suite_file is not None:
        plan = read_suite_file(opts.suite_file)
        name = f"file:{Path(opts.suite_file).name}"
        seeds = plan["seeds"] if opts.seeds is None else opts.seeds
        cells = [
            {"kind": "grow_target_cell", "suite": name, **s, "seed": int(seed)}
            for s in plan["suites"]
            for seed in seeds
        ]
    else:
        cells = target_cells(opts.suite, opts.seeds)
    for c in cells:
        if opts.steps is not None:
            c["steps"], c["tokens_per_param"] = opts.steps, None
        if opts.tokens_per_param is not None:
            c["tokens_per_param"] = opts.tokens_per_param
        if opts.decay is not None:
            c["decay"] = opts.decay
        if opts.operators is not None:
            c["operators"] = tuple(opts.operators)
        if opts.schedules is not None:
            c["schedules"] = tuple(opts.schedules)
    return cells


def run_target(
    out: str | Path | None = None, options: GrowTargetOptions | None = None, **keywords: Any
) -> dict[str, Any]:
    """Run (or resume) the benchmark into ``out`` (default :func:`target_out_dir`). Keywords named
    like :class:`~widthscope.growth.options.GrowTargetOptions` fields override ``options``.

    Returns ``rows``, ``table`` (one row per run label), ``summary`` and ``complete``."""
    opts = with_keywords("run_target", options, GrowTargetOptions, keywords)
    out_dir = target_out_dir(out, quick=opts.quick, suite_file=opts.suite_file)
    grid = suite_cells(opts)
    record = {"grow_target": opts.to_dict()}
    ids = {cell_id(c) for c in grid}
    foreign = [p.stem for p in (out_dir / "cells").glob("*.json") if p.stem not in ids]
    if foreign:
        raise WidthscopeError(
            f"{out_dir} holds {len(foreign)} finished cell(s) of another grow-target run (suite, seeds, "
            "steps, operators or schedules differ); pass a new --out, or the options of that run"
        )
    t0 = time.perf_counter()
    res = run_grid(
        grid, run_target_cell, out_dir, desc=f"grow-target {opts.suite}", record=lambda c: {"options": record}
    )
    rows = [r for r in res.rows if r.get("cell_id") in ids]
    done = {r["cell_id"] for r in rows}
    if not ids <= done:  # pragma: no cover - run_grid finishes every cell of an unsharded run
        return {"rows": rows, "table": [], "summary": {}, "complete": False}
    table = compare(rows)
    atomic_write_text(out_dir / "comparison.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in table))
    settings = []
    for c in grid:
        s = {k: v for k, v in c.items() if k not in ("seed", "kind", "suite")}
        if s not in settings:
            settings.append(s)
    summary = {
        "suite": grid[0]["suite"],
        "settings": settings,
        "operators": {o: OPERATORS[o] for o in settings[0]["operators"]},
        "seeds": sorted({int(c["seed"]) for c in grid}),
        "answer": answer(table),
        "budget_flops": sorted({float(r["budget_flops"]) for r in rows if r["run"] == "scratch"}),
        "seconds_this_call": time.perf_counter() - t0,
        "seconds_cells_total": sum({r["cell_id"]: r["seconds_cell"] for r in rows}.values()),
        "ran": len(res.done),
        "resumed": len(res.skipped),
        "options": record,
    }
    atomic_write_json(out_dir / "summary.json", summary)
    return {"rows": rows, "table": table, "summary": summary, "complete": True}
