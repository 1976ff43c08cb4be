r"""Growth benchmark: grow a block at *every* candidate point, judge the criteria against it, and
judge growth itself against the equal-compute alternatives a practitioner has.

For each model of a suite and each seed (one resumable cell, :func:`widthscope.sweep.grid.run_grid`,
run at one thread with deterministic algorithms, :func:`reproducible`):

1. split the held-out pool (seeded permutation) into a *ranking* half and evaluation quarters
   ``A`` and ``B``; train the model to a plateau on the ranking half (:func:`train_to_plateau`;
   the planted teacher–student cases use the student as built);
2. compute every criterion of :func:`widthscope.probe.growth.point_criteria` at every point;
3. at every point, grow the block with each learning rate of a grid (block seed 0), keep the one
   with the lowest ranking-half loss, grow block seeds 1, 2 with it, grow the GradMax block (its
   ``W_in`` = the top eigenvectors it scores), and grow-then-train-all; in the same FLOPs
   (:func:`widthscope.grow.step_flops`), train the original model whole (continue training,
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

import copy
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from .._io import atomic_write_json, progress
from ..errors import WidthscopeError

# the judgement of the rows lives in grow_compare (the report reads it too); re-exported here
from .compare import (  # noqa: F401
    BASELINES,
    BUDGETS,
    COST_ORDER,
    CRITERIA_COLUMNS,
    GROW_NAME,
    METRICS,
    _argmax,
    _rng,
    compare,
    pooled_interval,
    t_interval,
    wilson,
    winner,
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
    "reproducible",
    "train_to_plateau",
    "t_interval",
    "pooled_interval",
    "wilson",
]

BLOCK_LRS = (1e-3, 3e-3, 1e-2)  # the block's learning-rate grid (chosen per point on the ranking half)
CONTINUE_LRS = (3e-4, 1e-3, 3e-3)  # the grid for training all parameters (continue, train-all)
BLOCK_SEEDS = (0, 1, 2)
# base training: AdamW at base_lr (linear warm-up over the first eval), held-out ranking-half loss every
# `eval_every` steps; stop when the best of the last `patience` evals improves on the best before them
# by less than `tol` (relative), or at `max_steps`; the best evaluated state is kept.
_PLATEAU = dict(eval_every=50, patience=3, tol=0.01)
_LLAMA = dict(
    family="llama",
    data="text",
    depth=4,
    seq_len=32,
    base_lr=3e-3,
    max_steps=1500,
    batch_size=16,
    long=30,
    n_train=1024,
    n_test=1024,
    n_probe=128,
    scratch=False,
    block_lrs=(3e-3, 1e-2, 3e-2),
    continue_lrs=(1e-4, 3e-4, 1e-3),
)
_MLP = dict(
    family="mlp",
    width=64,
    data="digits",
    depth=4,
    base_lr=3e-3,
    max_steps=3000,
    batch_size=32,
    long=160,
    n_probe=256,
    scratch=True,
    block_lrs=(3e-4, 1e-3, 3e-3),
)
_RESNET = dict(
    family="resnet20",
    width=0.25,
    data="digits-images",
    base_lr=3e-3,
    max_steps=1000,
    batch_size=32,
    long=30,
    n_probe=128,
    scratch=False,
    block_lrs=(3e-4, 1e-3, 3e-3),
)
# planted blocks: the grown block (width = point width, W_in seed 0) is never the teacher's block
# (W_in seed 7, hidden 8 / seed 5, hidden 16), so no criterion is handed the answer
_TEACHER = dict(
    family="teacher",
    width=24,
    depth=4,
    missing=2,
    teacher_hidden=8,
    teacher_seed=7,
    max_steps=0,
    batch_size=32,
    long=160,
    n_train=512,
    n_test=512,
    n_probe=256,
    scratch=False,
    block_lrs=(3e-3, 1e-2, 3e-2),
    continue_lrs=(1e-3, 3e-3, 1e-2),
)
_TEACHER_LAST = {
    **_TEACHER,
    "model": "teacher-last",
    "depth": 3,
    "missing": 2,
    "teacher_hidden": 16,
    "teacher_seed": 5,
    "damp": 0.3,
}
# cheap cells first: a run cut short still has every planted case and the MLP
SUITES: dict[str, list[dict[str, Any]]] = {
    "full": [
        {**_TEACHER, "model": "teacher-student"},
        _TEACHER_LAST,
        {**_MLP, "model": "mlp-64"},
        *({**_LLAMA, "model": f"llama-{w}", "width": w} for w in (16, 32)),
        {**_RESNET, "model": "resnet20-0.25"},
    ],
    "quick": [
        {
            **_LLAMA,
            "model": "llama-16",
            "width": 16,
            "depth": 3,
            "seq_len": 16,
            "max_steps": 100,
            "long": 10,
            "n_train": 256,
            "n_test": 256,
            "n_probe": 64,
        },
        {**_MLP, "model": "mlp-32", "width": 32, "depth": 3, "max_steps": 200, "long": 20, "n_probe": 128},
        {**_TEACHER, "model": "teacher-student", "long": 30},
        {**_TEACHER_LAST, "long": 30},
    ],
}
SEEDS = {"full": (0, 1, 2, 3, 4), "quick": (0, 1, 2)}


def cells(suite: str = "full", seeds: Sequence[int] | None = None, *, M: int = 32, K: int = 32) -> list[dict[str, Any]]:
    if suite not in SUITES:
        raise WidthscopeError(f"unknown growth suite {suite!r}; choose one of {', '.join(SUITES)}")
    seeds = SEEDS[suite] if seeds is None else tuple(seeds)
    return [
        {
            "block_lrs": BLOCK_LRS,
            "continue_lrs": CONTINUE_LRS,
            "block_seeds": BLOCK_SEEDS,
            **_PLATEAU,
            **spec,
            "seed": int(s),
            "M": M,
            "K": K,
        }
        for spec in SUITES[suite]
        for s in seeds
    ]


# ----------------------------------------------------------------------------- reproducibility
@contextmanager
def reproducible(threads: int = 1) -> Iterator[dict[str, Any]]:
    """One torch thread and deterministic algorithms inside; the previous settings restored after.

    Yields what else could make a rerun on another machine differ (recorded in every row): the CPU
    kernel family torch dispatches to (``torch.backends.cpu.get_cpu_capability()``), the versions
    of torch, numpy, transformers and Python, and the thread count."""
    from .._env import environment

    prev = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    env = environment()
    try:
        yield env
    finally:
        torch.set_num_threads(prev[0])
        torch.use_deterministic_algorithms(prev[1], warn_only=prev[2])


# ----------------------------------------------------------------------------- models
def teacher_student(
    seed: int,
    *,
    width: int = 24,
    depth: int = 4,
    missing: int = 2,
    hidden: int | None = None,
    block_seed: int = 0,
    n_train: int = 512,
    n_test: int = 256,
    in_dim: int = 8,
    out_dim: int = 4,
    teacher_seed: int | None = None,
    damp: float | None = None,
) -> tuple[nn.Module, tuple[Any, Any], str]:
    """A student MLP that lacks exactly one residual block (at ``blocks.{missing}``) of its teacher.

    The teacher *is* the student plus a block ``z + W* φ(W_in norm(z))`` at that point (hidden width
    ``hidden``, ``W_in`` from ``teacher_seed``, default ``block_seed``), so a block grown there can
    imitate it directly, while a block at any other point must act through the student's tanh
    layers. Targets are the teacher's outputs (regression, per-example squared error). The
    benchmark gives the teacher a block that the grown block is *not* (another seed and width).
    ``damp``: the linear maps of ``blocks.1 … blocks.{missing}`` scaled by it (the construction of
    ``tests/test_grow.py``: changes before the planted last block reach the output only weakly).
    """
    from ..models import build
    from ..probe.intervene import block_of, insert

    gen = torch.Generator().manual_seed(1000 + int(seed))
    torch.manual_seed(1000 + int(seed))
    student = build("mlp", width, in_dim=in_dim, out_dim=out_dim, depth=depth, activation="tanh").double().eval()
    if damp is not None:
        with torch.no_grad():
            for i in range(1, missing + 1):
                student.get_parameter(f"blocks.{i}.linear.weight").mul_(damp)
    # widthscope_config/_points: plain attributes build() sets; nn.Module.__getattr__ is typed Tensor | Module
    teacher = build(**student.widthscope_config).double().eval()  # type: ignore[arg-type]
    teacher.load_state_dict(student.state_dict())
    point = f"blocks.{missing}"
    insert(teacher, point, "block", hidden=hidden or width, seed=block_seed if teacher_seed is None else teacher_seed)
    with torch.no_grad():
        w = block_of(teacher, point).w_out
        w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * 0.6)
    x = torch.randn(n_train + n_test, in_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = teacher(x)
    return student, ((x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])), point


def train_to_plateau(
    model: nn.Module,
    train: Any,
    monitor: Any,
    *,
    lr: float,
    batch_size: int,
    seed: int,
    eval_every: int,
    patience: int,
    tol: float,
    max_steps: int,
) -> dict[str, Any]:
    """AdamW (weight decay 0, gradient clipping at norm 1, linear warm-up over the first
    ``eval_every`` steps, then constant ``lr``) on mini-batches drawn with replacement by a dedicated
    ``torch.Generator(seed)``; the mean loss on ``monitor`` every ``eval_every`` steps.

    Plateau rule: stop once ``min(last patience evals) > (1 − tol) · min(evals before them)`` (the
    relative held-out improvement over the last ``patience`` evals is below ``tol``), or at
    ``max_steps``. The best evaluated state is restored (early stopping), so a model that starts to
    overfit is kept at its best held-out loss. Train mode (BatchNorm batch statistics) while
    stepping; the model is left in eval mode."""
    from ..probe.intervene import batch_size_of, index_batch, mean_loss, per_example_losses

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    n = batch_size_of(train)
    hist: list[float] = []
    best, best_state, best_step, step, plateau = math.inf, None, 0, 0, False
    model.train()
    while step < max_steps and not plateau:
        for _ in range(min(eval_every, max_steps - step)):
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / eval_every)
            loss = per_example_losses(
                model,
                index_batch(train, torch.randint(0, n, (min(batch_size, n),), generator=gen)),
                batch_size=batch_size,
                grad=True,
            ).mean()
            if not torch.isfinite(loss):
                raise WidthscopeError(f"base training diverged at step {step} (loss {float(loss)}); lower base_lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
        v = mean_loss(model, monitor, batch_size=64)
        hist.append(v)
        if v < best:
            best, best_step, best_state = v, step, copy.deepcopy(model.state_dict())
        plateau = len(hist) > patience and min(hist[-patience:]) > (1 - tol) * min(hist[:-patience])
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return {
        "base_steps": step,
        "base_best_step": best_step,
        "base_plateau": plateau,
        "base_monitor_loss": best,
        "base_history": hist,
    }


def _build(cell: Mapping[str, Any], depth: int) -> nn.Module:
    from ..models import build

    if cell["data"] == "text":
        return build("llama", cell["width"], depth=depth, max_seq_len=cell["seq_len"])
    if cell["data"] == "digits-images":
        return build("resnet20", cell["width"], in_channels=1, num_classes=10)
    return build("mlp", cell["width"], in_dim=64, out_dim=10, depth=depth, activation="tanh")


def _data(cell: Mapping[str, Any]) -> tuple[Any, Any, str | None, nn.Module | None]:
    """(train, test) pooled examples; for the teacher cases also the answer and the student."""
    from ..data import load

    seed = int(cell["seed"])
    if cell["family"] == "teacher":
        model, (tr, te), point = teacher_student(
            seed,
            width=cell["width"],
            depth=cell["depth"],
            missing=cell["missing"],
            hidden=cell["teacher_hidden"],
            teacher_seed=cell["teacher_seed"],
            damp=cell.get("damp"),
            n_train=cell["n_train"],
            n_test=cell["n_test"],
        )
        return tr, te, point, model
    if cell["data"] == "text":
        split = load(
            "text",
            n_train=cell["n_train"],
            n_test=cell["n_test"],
            seed=seed,
            seq_len=cell["seq_len"],
            max_bytes=400_000,
        )
        return split.train[0], split.test[0], None, None  # token ids: the LM loss predicts the sequence itself
    split = load("digits", seed=seed)
    tr, te = tuple(split.train), tuple(split.test)
    if cell["data"] == "digits-images":  # 8×8 grey images for the ResNet
        tr, te = (tr[0].view(-1, 1, 8, 8), tr[1]), (te[0].view(-1, 1, 8, 8), te[1])
    return tr, te, None, None


def _splits(cell: Mapping[str, Any], test: Any) -> dict[str, Any]:
    """The held-out pool split by a seeded permutation: ``rank`` (half: criteria, base-training
    plateau, learning-rate choice), ``A`` and ``B`` (a quarter each: the oracle chooses on ``A``;
    every reported gain is measured on ``B``)."""
    from ..probe.intervene import batch_size_of, index_batch

    n = batch_size_of(test)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(cell["seed"])))
    a, b = n // 2, n // 2 + n // 4
    return {
        "rank": index_batch(test, perm[:a].sort().values),
        "A": index_batch(test, perm[a:b].sort().values),
        "B": index_batch(test, perm[b:].sort().values),
    }


# ----------------------------------------------------------------------------- one cell
def _trainable(model: nn.Module, params: Sequence[nn.Parameter] | None) -> list[nn.Parameter]:
    ids = None if params is None else {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(ids is None or id(p) in ids)
    return [p for p in model.parameters() if p.requires_grad]


def _grown(
    model: nn.Module, point: str, width: int, hidden: int | None, block_seed: int, w_in: torch.Tensor | None = None
) -> tuple[nn.Module, list[nn.Parameter]]:
    """A copy of ``model`` with a zero-``W_out`` block at ``point`` and the block's parameters."""
    from ..probe.intervene import block_of, insert

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
        from ..probe.intervene import mean_loss

        snap = self.snaps.get(step)
        if snap is None:
            return math.nan
        with torch.no_grad():
            for p, v in zip(self.params, snap):
                p.copy_(v)
        return mean_loss(self.model, data, batch_size=64)


def _fit(
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
    from ..probe.intervene import mean_loss
    from .pipeline import _train_new

    wanted = sorted({int(k) for k in at if 0 < int(k) <= steps})
    fit = _Fit(model, params)

    def after(k: int) -> None:
        if k in wanted:
            fit.snaps[k] = [p.detach().clone() for p in params]
            if rank is not None:
                fit.rank[k] = mean_loss(model, rank, batch_size=64)

    _trainable(model, params)
    try:
        _train_new(
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
    model = _build(cell, cell["depth"]) if cell["family"] != "resnet20" else _build(cell, 0)
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
    from ..probe.intervene import index_batch, mean_loss
    from .pipeline import step_flops

    torch.manual_seed(int(cell["seed"]) + 7919)
    m = _build(cell, cell["depth"] + 1)
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
    from ..probe.growth import point_criteria
    from ..probe.intervene import batch_size_of, index_batch, mean_loss
    from .pipeline import step_flops

    t0 = time.perf_counter()
    seed, M, K, bs = int(cell["seed"]), int(cell["M"]), int(cell["K"]), int(cell["batch_size"])
    train, test, answer, student = _data(cell)
    sp = _splits(cell, test)
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
        cont_runs[lr] = _fit(
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
        runs[lr] = _fit(g, prm, train, steps=long, at=(long,), lr=lr, batch_size=bs, seed=seed, rank=sp["rank"])
    lr_b = _pick_lr(runs, long)
    fits = [runs[lr_b]]
    for s in bseeds[1:]:
        g, prm = _grown(model, p, c["width"], None, s)
        fits.append(_fit(g, prm, train, steps=long, at=(long,), lr=lr_b, batch_size=bs, seed=seed))
    g, gprm = _grown(model, p, c["width"], None, bseeds[0], w_in=gm_rows)
    gm = _fit(g, gprm, train, steps=long, at=(long,), lr=lr_b, batch_size=bs, seed=seed)
    lr_c = _pick_lr(cont_runs, n_cont)
    g, _ = _grown(model, p, c["width"], None, bseeds[0])
    ta = _fit(g, list(g.parameters()), train, steps=n_all, at=(n_all,), lr=lr_c, batch_size=bs, seed=seed)
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
    """Run (or resume) the suite into ``out_dir``; write ``comparison.jsonl`` and ``summary.json``.

    ``shard=(k, n)`` runs every ``n``-th cell from the ``k``-th (processes or machines sharing
    ``out_dir``); the comparison is written once every cell is finished (``complete`` in the result)."""
    import json

    from .._io import atomic_write_text
    from ..sweep.grid import cell_id, run_grid

    grid = cells(suite, seeds, M=M, K=K)
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
    }
    atomic_write_json(out_dir / "summary.json", summary)
    return {"rows": res.rows, "table": table, "summary": summary, "complete": True}


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
            pick[n] = rs[_argmax(v, _rng(s, n, "long"))[0]]["point"]
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
    *,
    quick: bool = False,
    seeds: Sequence[int] | None = None,
    M: int = 32,
    K: int = 32,
    shard: str | None = None,
) -> dict[str, Any] | None:
    """What ``widthscope grow-bench`` does, from explicit settings: :func:`benchmark` of the quick
    or full suite into ``out`` (default :func:`bench_out_dir`), shard ``shard`` (``"k/n"``; default:
    one shard per ``torchrun`` rank, else the whole suite). Under torchrun, rank 0 waits for every
    rank's cells and reruns unsharded (every cell done); the other ranks get ``None``."""
    suite = "quick" if quick else "full"
    for nm, v in (("M", M), ("K", K)):
        if v < 4:
            raise WidthscopeError(f"--{nm} {v}: must be >= 4 (the unbiased estimators need 4)")
    from ..sweep.grid import finish_after_ranks, shard_for_run

    which = shard_for_run(shard)
    out_dir = bench_out_dir(out, quick=quick)
    res = benchmark(out_dir, suite=suite, seeds=seeds, M=M, K=K, shard=which)
    final: dict[str, Any] = {}
    # under torchrun: wait for every rank's cells, then rank 0 reruns unsharded (all cells done) and reports
    if not finish_after_ranks(shard, lambda: final.update(benchmark(out_dir, suite=suite, seeds=seeds, M=M, K=K))):
        if not final:
            return None  # not rank 0
        res = final
    return res
