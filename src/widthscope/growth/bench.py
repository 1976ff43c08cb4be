r"""Growth benchmark: grow a block at *every* candidate point, judge the criteria against it, and
judge growth itself against the equal-compute alternatives a practitioner has.

For each model of a suite and each seed (one resumable cell, :func:`widthscope.sweeps.grid.run_grid`,
run at one thread with deterministic algorithms, :func:`reproducible`):

1. split the held-out pool (seeded permutation) into a *ranking* half and evaluation quarters
   ``A`` and ``B``; train the model to a plateau on the ranking half (:func:`train_to_plateau`;
   the planted teacher–student cases use the student as built);
2. compute every criterion of :func:`widthscope.probe.growth.point_criteria` at every point;
3. at every point, grow the block with each learning rate of a grid (block seed 0), keep the one
   with the lowest ranking-half loss, grow block seeds 1, 2 with it, grow the GradMax block (its
   ``W_in`` = the top eigenvectors it scores), and grow-then-train-all; in the same FLOPs
   (:func:`widthscope.growth.step_flops`), train the original model whole (continue training,
   lr grid chosen on the ranking half). Gains (loss before − after, > 0 is better) on ``B``.

:func:`compare` turns the rows into Spearman, top-1 hit, regret and the gain beside the
continue-training and train-all gains per criterion and baseline (random, last, middle, oracle
chosen on ``A`` and scored on ``B``, the block-seed reproducibility ceiling), per model and overall,
with intervals over model seeds; :func:`winner` picks ``grow``'s default.

Command line (:mod:`widthscope.cli.grow_bench`, over :func:`run_bench`)::

    widthscope grow-bench --quick --out /tmp/gb         # a few minutes on one core
    widthscope grow-bench --out widthscope-results/growth   # the documented suite (resumable)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._io import atomic_write_json, atomic_write_text
from ..errors import WidthscopeError
from ..sweeps.grid import cell_id, finish_after_ranks, run_grid, shard_for_run
from .cell import run_cell

# the judgement of the rows lives in grow.compare (the report reads it too); re-exported here
from .compare import (  # noqa: F401
    BASELINES,
    BUDGETS,
    COST_ORDER,
    CRITERIA_COLUMNS,
    GROW_NAME,
    METRICS,
    compare,
    pooled_interval,
    random_argmax,
    seeded_rng,
    t_interval,
    wilson,
    winner,
)
from .options import GrowBenchOptions, with_keywords

# the suite and one cell live in grow.suite / grow.cell; re-exported here (their names are bench's API)
from .suite import (  # noqa: F401
    BLOCK_LRS,
    BLOCK_SEEDS,
    CONTINUE_LRS,
    SEEDS,
    SUITES,
    cells,
    reproducible,
    teacher_student,
    train_to_plateau,
)

__all__ = [
    "SUITES",
    "cells",
    "run_cell",
    "compare",
    "winner",
    "benchmark",
    "teacher_student",
    "run_bench",
    "bench_out_dir",
    "CRITERIA_COLUMNS",
    "BASELINES",
    "GrowBenchOptions",
    "reproducible",
    "train_to_plateau",
    "t_interval",
    "pooled_interval",
    "wilson",
]


def benchmark(
    out_dir: str | Path,
    *,
    suite: str = "full",
    seeds: Sequence[int] | None = None,
    M: int = 32,
    K: int = 32,
    show: bool = True,
    shard: tuple[int, int] = (1, 1),
) -> dict[str, Any]:
    """Run (or resume) the suite into ``out_dir``; write ``comparison.jsonl`` and ``summary.json``
    (with ``options``: ``{"grow_bench": ...}``, the :class:`~widthscope.growth.options.GrowBenchOptions`
    of the run, which ``grow-bench --config summary.json`` repeats).

    ``shard=(k, n)`` runs every ``n``-th cell from the ``k``-th (processes or machines sharing
    ``out_dir``); the comparison is written once every cell is finished (``complete`` in the result)."""
    grid = cells(suite, seeds, M=M, K=K)
    opts = GrowBenchOptions(quick=suite == "quick", seeds=None if seeds is None else tuple(seeds), M=M, K=K)
    record = {"grow_bench": opts.to_dict()}  # what made it: GrowBenchOptions.from_dict repeats it (--config)
    # load_rows reads every cell file in out_dir: cells of another suite/seeds/M/K would be mixed in
    ids = {cell_id(c) for c in grid}
    foreign = [p.stem for p in (Path(out_dir) / "cells").glob("*.json") if p.stem not in ids]
    if foreign:
        raise WidthscopeError(
            f"{out_dir} holds {len(foreign)} finished cell(s) of another growth benchmark "
            "(suite, seeds, M or K differ); pass a new --out, or the options of that run"
        )
    t0 = time.perf_counter()
    # one progress line per cell (the grid's bar); the per-point bars inside a cell only with show
    res = run_grid(grid, lambda c, d: run_cell(c, d, show=False), out_dir, desc=f"grow-bench {suite}", shard=shard)
    out_dir = Path(out_dir)
    done = {r["cell_id"] for r in res.rows}
    if not ids <= done:
        return {
            "rows": res.rows,
            "table": [],
            "summary": {},
            "complete": False,
            "finished": len(done & ids),
            "cells": len(ids),
            "options": record,
        }
    table = compare(res.rows)
    atomic_write_text(out_dir / "comparison.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in table))
    summary = {
        "suite": suite,
        "M": M,
        "K": K,
        "cells": len(grid),
        "ran": len(res.done),
        "resumed": len(res.skipped),
        "seconds_this_call": time.perf_counter() - t0,
        "seconds_cells_total": sum({r["cell_id"]: r["seconds_cell"] for r in res.rows}.values()),
        "winner_long": winner(table, "long"),
        "teacher_student": _teacher_picks(res.rows),
        "options": record,
    }
    atomic_write_json(out_dir / "summary.json", summary)
    return {"rows": res.rows, "table": table, "summary": summary, "complete": True, "options": record}


def _teacher_picks(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per planted-block seed: the missing point, the realised best and each criterion's pick
    (ties broken as in :func:`compare`)."""
    out: dict[str, dict[str, Any]] = {}
    for m, s in sorted({(str(r["model"]), int(r["seed"])) for r in rows if r.get("answer")}):
        rs = sorted(
            [r for r in rows if r.get("answer") and r["model"] == m and int(r["seed"]) == s],
            key=lambda r: r["point_index"],
        )
        pick = {}
        for n, c in CRITERIA_COLUMNS.items():
            raw = np.array([float(r[c]) if r.get(c) is not None else math.nan for r in rs])
            v = np.where(np.isfinite(raw), raw, -np.inf)
            pick[n] = rs[random_argmax(v, seeded_rng(s, n, "long"))[0]]["point"]
        out[f"{m} seed {s}"] = {
            "model": m,
            "seed": s,
            "answer": rs[0]["answer"],
            "best_long": max(rs, key=lambda r: r["gain_long"])["point"],
            **pick,
        }
    return out


# ----------------------------------------------------------------------------- the command's run
def bench_out_dir(out: str | Path | None = None, *, quick: bool = False) -> Path:
    """``out``, or the default results folder ``widthscope-results/growth[-quick]``."""
    return Path(out or f"widthscope-results/growth{'-quick' if quick else ''}")


def run_bench(
    out: str | Path | None = None,
    options: GrowBenchOptions | None = None,
    *,
    shard: str | None = None,
    **keywords: Any,
) -> dict[str, Any] | None:
    """What ``widthscope grow-bench`` does, from typed settings: :func:`benchmark` of the quick or
    full suite into ``out`` (default :func:`bench_out_dir`), shard ``shard`` (``"k/n"``; default:
    one shard per ``torchrun`` rank, else the whole suite). Under torchrun, rank 0 waits for every
    rank's cells and reruns unsharded (every cell done); the other ranks get ``None``.

    ``options``: a :class:`~widthscope.growth.options.GrowBenchOptions` (default
    ``GrowBenchOptions()``); keywords named like its fields (``quick``, ``seeds``, ``M``, ``K``)
    override them; any other keyword is refused, naming it."""
    opts = with_keywords("run_bench", options, GrowBenchOptions, keywords)
    which = shard_for_run(shard)
    out_dir = bench_out_dir(out, quick=opts.quick)

    def once(part: tuple[int, int] = (1, 1)) -> dict[str, Any]:
        return benchmark(out_dir, suite=opts.suite, seeds=opts.seeds, M=opts.M, K=opts.K, shard=part)

    res = once(which)
    final: dict[str, Any] = {}
    # under torchrun: wait for every rank's cells, then rank 0 reruns unsharded (all cells done) and reports
    if not finish_after_ranks(shard, lambda: final.update(once())):
        if not final:
            return None  # not rank 0
        res = final
    return res
