"""One cell of the growth benchmark (:func:`run_cell`): a model of the suite at one seed, every
criterion at every point, the block grown at every point with its learning-rate grid and block
seeds, the GradMax block, grow-then-train-all, and the equal-compute baselines (continue training,
a model of the grown size from scratch). One row per point.
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

from .._io import progress
from ..errors import WidthscopeError
from ..probe.batches import batch_size_of, index_batch
from ..probe.blocks import block_of
from ..probe.growth import point_criteria
from ..probe.insert import insert
from ..probe.steps import mean_loss
from .block import step_flops, train_new_block
from .suite import build_model, cell_data, reproducible, split_held_out, train_to_plateau

__all__ = ["run_cell"]


def _trainable(model: nn.Module, params: Sequence[nn.Parameter] | None) -> list[nn.Parameter]:
    ids = None if params is None else {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(ids is None or id(p) in ids)
    return [p for p in model.parameters() if p.requires_grad]


def _grown(
    model: nn.Module, point: str, width: int, hidden: int | None, block_seed: int, w_in: torch.Tensor | None = None
) -> tuple[nn.Module, list[nn.Parameter]]:
    """A copy of ``model`` with a zero-``W_out`` block at ``point`` and the block's parameters."""
    g = copy.deepcopy(model)
    insert(g, point, "block", width=width, hidden=hidden if w_in is None else int(w_in.shape[0]), seed=block_seed)
    blk = block_of(g, point)
    if w_in is not None:
        with torch.no_grad():
            blk.w_in.copy_(w_in.to(blk.w_in.dtype))
    return g, list(blk.parameters())


class _Fit:
    """A finished training run: the trained copy, its trained parameters, their values after each
    wanted step count (``None`` after a divergence) and the ranking-half loss there."""

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
    """Train ``params`` (AdamW, eval mode, batches from ``Generator(seed)``) for ``steps``, keeping
    their values after each step count in ``at`` (and the loss on ``rank`` there, when given). A
    run that diverges gives NaN losses from then on (the learning-rate choice never picks it; the
    rows keep the NaN)."""
    wanted = sorted({int(k) for k in at if 0 < int(k) <= steps})
    fit = _Fit(model, params)

    def after(k: int) -> None:
        if k in wanted:
            fit.snaps[k] = [p.detach().clone() for p in params]
            if rank is not None:
                fit.rank[k] = mean_loss(model, rank, batch_size=64)

    _trainable(model, params)
    try:
        train_new_block(
            model,
            params,
            train,
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            loss_fn=None,
            show_progress=False,
            after_step=after,
        )
    except WidthscopeError:  # diverged
        for k in wanted:
            fit.snaps.setdefault(k, None)
            fit.rank.setdefault(k, math.nan)
    _trainable(model, None)
    return fit


def _pick_lr(runs: Mapping[float, _Fit], step: int) -> float:
    """The learning rate with the lowest ranking-half loss at ``step`` (ties: the smaller lr)."""

    def key(lr: float) -> tuple[float, float]:
        v = runs[lr].rank[step]
        return (v if math.isfinite(v) else math.inf, lr)

    return min(runs, key=key)


def _base(
    cell: Mapping[str, Any], train: Any, sp: Mapping[str, Any], student: nn.Module | None
) -> tuple[nn.Module, dict[str, Any]]:
    """The model growth starts from: the teacher's student as built, or a model trained to plateau."""
    if student is not None:
        return student, {"base_steps": 0, "base_plateau": None}
    torch.manual_seed(int(cell["seed"]))
    model = build_model(cell, cell["depth"]) if cell["family"] != "resnet20" else build_model(cell, 0)
    info = train_to_plateau(
        model,
        train,
        sp["rank"],
        lr=cell["base_lr"],
        batch_size=cell["batch_size"],
        seed=int(cell["seed"]),
        eval_every=cell["eval_every"],
        patience=cell["patience"],
        tol=cell["tol"],
        max_steps=cell["max_steps"],
    )
    return model, info


def _scratch(cell: Mapping[str, Any], train: Any, sp: Mapping[str, Any]) -> dict[str, Any]:
    """A model of the grown size (one more block) trained from scratch by the same plateau rule."""
    torch.manual_seed(int(cell["seed"]) + 7919)
    m = build_model(cell, cell["depth"] + 1)
    info = train_to_plateau(
        m,
        train,
        sp["rank"],
        lr=cell["base_lr"],
        batch_size=cell["batch_size"],
        seed=int(cell["seed"]) + 7919,
        eval_every=cell["eval_every"],
        patience=cell["patience"],
        tol=cell["tol"],
        max_steps=cell["max_steps"],
    )
    f = step_flops(m, index_batch(train, slice(0, cell["batch_size"])))
    return {
        "scratch_loss_B": mean_loss(m, sp["B"]),
        "scratch_loss_A": mean_loss(m, sp["A"]),
        "scratch_steps": info["base_steps"],
        "scratch_flops": info["base_steps"] * f,
        "scratch_plateau": info["base_plateau"],
    }


def run_cell(cell: Mapping[str, Any], _cell_dir: Path | None = None, *, show: bool = False) -> list[dict[str, Any]]:
    """Criteria and realised gains at every point of one (model, seed), with the equal-compute
    baselines. One row per point (see docs/interventions.md §5 for every column)."""
    with reproducible(1) as env:
        rows = _run_cell(cell, show)
    for r in rows:
        r.update(env)
    return rows


def _run_cell(cell: Mapping[str, Any], show: bool) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    seed, M, K, bs = int(cell["seed"]), int(cell["M"]), int(cell["K"]), int(cell["batch_size"])
    train, test, answer, student = cell_data(cell)
    sp = split_held_out(cell, test)
    model, base = _base(cell, train, sp, student)
    n_tr = batch_size_of(train)
    probe = index_batch(
        train,
        torch.randperm(n_tr, generator=torch.Generator().manual_seed(seed + 1))[: min(int(cell["n_probe"]), n_tr)]
        .sort()
        .values,
    )
    batch = index_batch(train, slice(0, min(bs, n_tr)))
    points = list(model.widthscope_points)  # type: ignore[arg-type]  # a plain attribute (see teacher_student)
    lrs, clrs, bseeds = tuple(cell["block_lrs"]), tuple(cell["continue_lrs"]), tuple(cell["block_seeds"])
    long = int(cell["long"])
    eta = float(lrs[len(lrs) // 2])
    t_base = time.perf_counter() - t0
    crit = [
        point_criteria(
            model,
            p,
            probe,
            sp["rank"],
            M=M,
            K=K,
            eta=eta,
            block_seed=bseeds[0],
            hidden=None,
            batch_size=64,
            gradmax_k=8,
            keep_gradmax_rows=True,
        )
        for p in points
    ]
    t_crit = time.perf_counter() - t0 - t_base
    before = {k: mean_loss(model, d) for k, d in sp.items()}
    _trainable(model, None)
    f_orig = step_flops(model, batch)
    # FLOPs of one block-training step at each point (what growth costs) and of training the grown model whole
    f_block, f_all = [], []
    for p, c in zip(points, crit):
        g, prm = _grown(model, p, c["width"], None, bseeds[0])
        _trainable(g, prm)
        f_block.append(step_flops(g, batch))
        _trainable(g, None)
        f_all.append(step_flops(g, batch))
    # equal compute: steps of the alternatives that cost what `long` block steps cost at each point
    n_cont = [max(1, round(long * fb / f_orig)) for fb in f_block]
    n_all = [max(1, round(long * fb / fa)) for fb, fa in zip(f_block, f_all)]
    cont_runs = {}
    for lr in clrs:
        cont = copy.deepcopy(model)
        cont_runs[lr] = fit_block(
            cont,
            list(cont.parameters()),
            train,
            steps=max(n_cont),
            at=n_cont,
            lr=lr,
            batch_size=bs,
            seed=seed,
            rank=sp["rank"],
        )
    rows = []
    for i, (p, c) in enumerate(
        progress(list(zip(points, crit)), desc=f"grow-bench {cell['model']} s{seed}", disable=None if show else True)
    ):
        rows.append(
            _point_row(
                cell,
                model,
                train,
                sp,
                p,
                c,
                i,
                len(points),
                before=before,
                lrs=lrs,
                bseeds=bseeds,
                cont_runs=cont_runs,
                n_cont=n_cont[i],
                n_all=n_all[i],
                flops=(f_orig, f_block[i], f_all[i]),
                answer=answer,
            )
        )
    scratch = _scratch(cell, train, sp) if cell.get("scratch") else {}
    for r in rows:
        r.update(
            base,
            **scratch,
            base_history=base.get("base_history"),
            seconds_base=t_base,
            seconds_criteria=t_crit,
            seconds_cell=time.perf_counter() - t0,
        )
    return rows


def _point_row(
    cell: Mapping[str, Any],
    model: nn.Module,
    train: Any,
    sp: Mapping[str, Any],
    p: str,
    c: dict[str, Any],
    i: int,
    n_points: int,
    *,
    before: Mapping[str, float],
    lrs: Sequence[float],
    bseeds: Sequence[int],
    cont_runs: Mapping[float, _Fit],
    n_cont: int,
    n_all: int,
    flops: tuple[int, int, int],
    answer: str | None,
) -> dict[str, Any]:
    """Grow at one point: the lr grid with block seed 0 (chosen on the ranking half), the other block
    seeds at the chosen lr, the GradMax block, grow-then-train-all, and the continue-training gains
    for this point's compute."""
    seed, bs, long = int(cell["seed"]), int(cell["batch_size"]), int(cell["long"])
    gm_rows = c.pop("gradmax_rows")
    runs = {}
    for lr in lrs:
        g, prm = _grown(model, p, c["width"], None, bseeds[0])
        runs[lr] = fit_block(g, prm, train, steps=long, at=(long,), lr=lr, batch_size=bs, seed=seed, rank=sp["rank"])
    lr_b = _pick_lr(runs, long)
    fits = [runs[lr_b]]
    for s in bseeds[1:]:
        g, prm = _grown(model, p, c["width"], None, s)
        fits.append(fit_block(g, prm, train, steps=long, at=(long,), lr=lr_b, batch_size=bs, seed=seed))
    g, gprm = _grown(model, p, c["width"], None, bseeds[0], w_in=gm_rows)
    gm = fit_block(g, gprm, train, steps=long, at=(long,), lr=lr_b, batch_size=bs, seed=seed)
    lr_c = _pick_lr(cont_runs, n_cont)
    g, _ = _grown(model, p, c["width"], None, bseeds[0])
    ta = fit_block(g, list(g.parameters()), train, steps=n_all, at=(n_all,), lr=lr_c, batch_size=bs, seed=seed)
    row = {
        **{k: v for k, v in c.items() if k not in ("M", "K", "width")},
        "kind": "growth_bench",
        "point_width": c["width"],
        "point_index": i,
        "n_points": n_points,
        "answer": answer,
        "neg_bias_b_exact": -c["bias_b_exact"],
        "neg_block_b_exact": -c["block_b_exact"],
        "lr_block": lr_b,
        "lr_continue": lr_c,
        "lr_block_rank_loss": {str(k): v.rank[long] for k, v in runs.items()},
        "flops_orig_step": flops[0],
        "flops_block_step": flops[1],
        "flops_all_step": flops[2],
        "steps_continue": n_cont,
        "steps_all": n_all,
        "gradmax_hidden": int(gm_rows.shape[0]),
        "new_parameters": sum(q.numel() for q in fits[0].params),
    }
    for h in ("A", "B"):
        tag = "" if h == "B" else "_A"
        row[f"loss_before{tag}"] = before[h]
        row[f"gain_long{tag}_seeds"] = [before[h] - f.loss(long, sp[h]) for f in fits]
        row[f"gain_long{tag}"] = float(np.mean(row[f"gain_long{tag}_seeds"]))
        row[f"gain_gradmax_long{tag}"] = before[h] - gm.loss(long, sp[h])
        row[f"gain_continue_long{tag}"] = before[h] - cont_runs[lr_c].loss(n_cont, sp[h])
        row[f"gain_all_long{tag}"] = before[h] - ta.loss(n_all, sp[h])
    row["loss_long"] = before["B"] - row["gain_long"]
    return row
