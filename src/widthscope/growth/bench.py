r"""Growth benchmark (``widthscope grow-bench``; docs/interventions.md §5): grow a block at every
point of a trained model, beside training the original for the same FLOPs, and judge the criteria
(:mod:`widthscope.growth.compare`) against the realised gains.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from .._io import atomic_write_json, progress
from ..errors import WidthscopeError
from ..probe.batches import batch_size_of, index_batch
from ..probe.blocks import block_of
from ..probe.growth import point_criteria
from ..probe.insert import insert
from ..probe.steps import mean_loss
from ..sweeps.grid import finish_after_ranks, run_grid, shard_for_run
from .block import first_batch, step_flops, train_new_block, trainable
from .compare import compare, teacher_picks, winner
from .options import GrowBenchOptions, with_keywords
from .suite import build_model, cell_data, cells, own_cells, reproducible, split_held_out, train_to_plateau, write_table

__all__ = ["run_cell", "benchmark", "run_bench", "bench_out_dir", "GrowBenchOptions"]


def _grown(
    model: nn.Module, point: str, width: int, block_seed: int, w_in: torch.Tensor | None = None
) -> tuple[nn.Module, list[nn.Parameter]]:
    """A copy of ``model`` with a block at ``point`` (``W_in`` given or seeded), and its parameters."""
    g = copy.deepcopy(model)
    insert(g, point, "block", width=width, hidden=None if w_in is None else int(w_in.shape[0]), seed=block_seed)
    blk = block_of(g, point)
    if w_in is not None:
        with torch.no_grad():
            blk.w_in.copy_(w_in.to(blk.w_in.dtype))
    return g, list(blk.parameters())


class _Fit:
    """A finished training run: its parameters' values after each wanted step (``None``: diverged)
    and the ranking-half loss there."""

    def __init__(self, model: nn.Module, params: list[nn.Parameter]):
        self.model, self.params = model, params
        self.snaps: dict[int, list[torch.Tensor] | None] = {}
        self.rank: dict[int, float] = {}

    def loss(self, step: int, data: Any) -> float:
        """Mean loss on ``data`` of the parameters as they were after ``step`` steps (NaN: diverged)."""
        snap = self.snaps.get(step)
        if snap is None:
            return math.nan
        with torch.no_grad():
            for p, v in zip(self.params, snap):
                p.copy_(v)
        return mean_loss(self.model, data, batch_size=64)


def fit_block(
    model: nn.Module,
    params: list[nn.Parameter],
    train: Any,
    *,
    steps: int,
    at: Sequence[int],
    lr: float,
    batch_size: int,
    seed: int,
    rank: Any = None,
) -> _Fit:
    """Train ``params`` for ``steps``, keeping their values (and the loss on ``rank``) after each
    step count in ``at``; a diverged run gives NaN losses."""
    wanted = sorted({int(k) for k in at if 0 < int(k) <= steps})
    fit = _Fit(model, params)

    def after(k: int) -> None:
        if k in wanted:
            fit.snaps[k] = [p.detach().clone() for p in params]
            if rank is not None:
                fit.rank[k] = mean_loss(model, rank, batch_size=64)

    trainable(model, params)
    opts: dict[str, Any] = dict(steps=steps, lr=lr, batch_size=batch_size, seed=seed, loss_fn=None)
    try:
        train_new_block(model, params, train, show_progress=False, after_step=after, **opts)
    except WidthscopeError:  # diverged
        for k in wanted:
            fit.snaps.setdefault(k, None)
            fit.rank.setdefault(k, math.nan)
    trainable(model)
    return fit


def _pick_lr(runs: Mapping[float, _Fit], step: int) -> float:
    """The learning rate with the lowest ranking-half loss at ``step`` (ties: the smaller lr)."""
    return min(runs, key=lambda lr: (v if math.isfinite(v := runs[lr].rank[step]) else math.inf, lr))


def _plateau(
    cell: Mapping[str, Any], train: Any, sp: Mapping[str, Any], depth: int, seed: int
) -> tuple[nn.Module, dict[str, Any]]:
    """A model of the cell with ``depth`` blocks, trained to a plateau on the ranking half."""
    torch.manual_seed(seed)
    model = build_model(cell, depth)
    rule = {k: cell[k] for k in ("eval_every", "patience", "tol", "max_steps")}
    info = train_to_plateau(
        model, train, sp["rank"], lr=cell["base_lr"], batch_size=cell["batch_size"], seed=seed, **rule
    )
    return model, info


def run_cell(cell: Mapping[str, Any], _cell_dir: Path | None = None, *, show: bool = False) -> list[dict[str, Any]]:
    """Criteria and realised gains at every point of one (model, seed), one row per point."""
    with reproducible(1) as env:
        return _run_cell(cell, show, env)


def _run_cell(cell: Mapping[str, Any], show: bool, env: Mapping[str, Any]) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    seed, M, K, bs = int(cell["seed"]), int(cell["M"]), int(cell["K"]), int(cell["batch_size"])
    train, test, answer, student = cell_data(cell)
    sp = split_held_out(cell, test)
    if student is not None:
        model, base = student, {"base_steps": 0, "base_plateau": None}
    else:
        model, base = _plateau(cell, train, sp, cell.get("depth", 0), seed)
    n_tr = batch_size_of(train)
    pick = torch.randperm(n_tr, generator=torch.Generator().manual_seed(seed + 1))[: min(int(cell["n_probe"]), n_tr)]
    probe = index_batch(train, pick.sort().values)
    batch = first_batch(train, bs)
    points = list(model.widthscope_points)  # type: ignore[arg-type]
    lrs, clrs, bseeds = tuple(cell["block_lrs"]), tuple(cell["continue_lrs"]), tuple(cell["block_seeds"])
    long = int(cell["long"])
    t_base = time.perf_counter() - t0
    kw = dict(eta=float(lrs[len(lrs) // 2]), block_seed=bseeds[0], hidden=None, batch_size=64, gradmax_k=8)
    crit = [point_criteria(model, p, probe, sp["rank"], M=M, K=K, keep_gradmax_rows=True, **kw) for p in points]
    t_crit = time.perf_counter() - t0 - t_base
    before = {k: mean_loss(model, d) for k, d in sp.items()}
    trainable(model)
    f_orig = step_flops(model, batch)
    f_block, f_all = [], []  # a step training the block, and the grown model whole
    for p, c in zip(points, crit):
        g, prm = _grown(model, p, c["width"], bseeds[0])
        trainable(g, prm)
        f_block.append(step_flops(g, batch))
        trainable(g)
        f_all.append(step_flops(g, batch))
    # equal compute: steps of the alternatives that cost what `long` block steps cost at each point
    n_cont = [max(1, round(long * fb / f_orig)) for fb in f_block]
    n_all = [max(1, round(long * fb / fa)) for fb, fa in zip(f_block, f_all)]
    fit = dict(train=train, steps=long, at=(long,), batch_size=bs, seed=seed)
    cont_runs = {}
    for lr in clrs:
        cont = copy.deepcopy(model)
        whole = {**fit, "steps": max(n_cont), "at": n_cont}
        cont_runs[lr] = fit_block(cont, list(cont.parameters()), lr=lr, rank=sp["rank"], **whole)
    rows = []
    desc = f"grow-bench {cell['model']} s{seed}"
    for i, (p, c) in enumerate(progress(list(zip(points, crit)), desc=desc, disable=None if show else True)):
        gm_rows = c.pop("gradmax_rows")
        runs = {lr: fit_block(*_grown(model, p, c["width"], bseeds[0]), lr=lr, rank=sp["rank"], **fit) for lr in lrs}
        lr_b = _pick_lr(runs, long)
        fits = [runs[lr_b], *(fit_block(*_grown(model, p, c["width"], s), lr=lr_b, **fit) for s in bseeds[1:])]
        gm = fit_block(*_grown(model, p, c["width"], bseeds[0], w_in=gm_rows), lr=lr_b, **fit)
        lr_c = _pick_lr(cont_runs, n_cont[i])
        g, _ = _grown(model, p, c["width"], bseeds[0])
        ta = fit_block(g, list(g.parameters()), **{**fit, "steps": n_all[i], "at": (n_all[i],)}, lr=lr_c)
        row = {
            **{k: v for k, v in c.items() if k not in ("M", "K", "width")},
            "kind": "growth_bench",
            "point_width": c["width"],
            "point_index": i,
            "n_points": len(points),
            "answer": answer,
            "neg_bias_b_exact": -c["bias_b_exact"],
            "neg_block_b_exact": -c["block_b_exact"],
            "lr_block": lr_b,
            "lr_continue": lr_c,
            "lr_block_rank_loss": {str(k): v.rank[long] for k, v in runs.items()},
            "flops_orig_step": f_orig,
            "flops_block_step": f_block[i],
            "flops_all_step": f_all[i],
            "steps_continue": n_cont[i],
            "steps_all": n_all[i],
            "gradmax_hidden": int(gm_rows.shape[0]),
            "new_parameters": sum(q.numel() for q in fits[0].params),
        }
        for h, tag in (("A", "_A"), ("B", "")):
            row[f"loss_before{tag}"] = before[h]
            row[f"gain_long{tag}_seeds"] = [before[h] - f.loss(long, sp[h]) for f in fits]
            row[f"gain_long{tag}"] = float(np.mean(row[f"gain_long{tag}_seeds"]))
            row[f"gain_gradmax_long{tag}"] = before[h] - gm.loss(long, sp[h])
            row[f"gain_continue_long{tag}"] = before[h] - cont_runs[lr_c].loss(n_cont[i], sp[h])
            row[f"gain_all_long{tag}"] = before[h] - ta.loss(n_all[i], sp[h])
        row["loss_long"] = before["B"] - row["gain_long"]
        rows.append(row)
    scratch = {}
    if cell.get("scratch"):  # the grown size from scratch, by the same plateau rule
        m, info = _plateau(cell, train, sp, cell["depth"] + 1, seed + 7919)
        f = step_flops(m, index_batch(train, slice(0, bs)))
        scratch = {
            "scratch_loss_B": mean_loss(m, sp["B"]),
            "scratch_loss_A": mean_loss(m, sp["A"]),
            "scratch_steps": info["base_steps"],
            "scratch_flops": info["base_steps"] * f,
            "scratch_plateau": info["base_plateau"],
        }
    times = dict(seconds_base=t_base, seconds_criteria=t_crit, seconds_cell=time.perf_counter() - t0)
    for r in rows:
        r.update(base, **scratch, base_history=base.get("base_history"), **times, **env)
    return rows


def benchmark(out_dir: Path, opts: GrowBenchOptions, shard: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """Run (or resume) shard ``(k, n)`` of the suite into ``out_dir``; once every cell is finished,
    write ``comparison.jsonl`` and ``summary.json``."""
    suite, M, K = opts.suite, opts.M, opts.K
    grid = cells(suite, opts.seeds, M=M, K=K)
    record = {"grow_bench": opts.to_dict()}
    ids = own_cells(out_dir, grid, "growth benchmark (suite, seeds, M or K differ)")
    t0 = time.perf_counter()
    res = run_grid(grid, lambda c, d: run_cell(c, d, show=False), out_dir, desc=f"grow-bench {suite}", shard=shard)
    done = {r["cell_id"] for r in res.rows}
    out = {"rows": res.rows, "options": record}
    if not ids <= done:
        return {**out, "table": [], "summary": {}, "complete": False, "finished": len(done & ids), "cells": len(ids)}
    table = compare(res.rows)
    write_table(out_dir, table)
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
        "teacher_student": teacher_picks(res.rows),
        "options": record,
    }
    atomic_write_json(out_dir / "summary.json", summary)
    return {**out, "table": table, "summary": summary, "complete": True}


def bench_out_dir(out: str | Path | None = None, *, quick: bool = False) -> Path:
    """``out``, or ``widthscope-results/growth[-quick]``."""
    return Path(out or f"widthscope-results/growth{'-quick' if quick else ''}")


def run_bench(
    out: str | Path | None = None, options: GrowBenchOptions | None = None, *, shard: str | None = None, **keywords: Any
) -> dict[str, Any] | None:
    """``widthscope grow-bench``: :func:`benchmark` into ``out``, shard ``"k/n"`` (default one per
    ``torchrun`` rank; rank 0 then finishes unsharded, the other ranks get ``None``)."""
    opts = with_keywords("run_bench", options, GrowBenchOptions, keywords)
    out_dir = bench_out_dir(out, quick=opts.quick)
    res = benchmark(out_dir, opts, shard_for_run(shard))
    final: dict[str, Any] = {}
    if not finish_after_ranks(shard, lambda: final.update(benchmark(out_dir, opts))):
        if not final:
            return None  # not rank 0
        res = final
    return res
