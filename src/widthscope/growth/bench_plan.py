"""The cost plan of a growth benchmark run (``grow-bench --plan``): before any cell trains.

:func:`plan_bench` takes the settings of :func:`widthscope.growth.bench.run_bench` and returns a
:class:`SuitePlan`: one :class:`~widthscope.probe.cost_plan.TrainPlan` per model of the suite (its
cells: one per seed), and the run in total. Per model, as :func:`widthscope.growth.cell.run_cell`
trains it:

1. the cell's data and model are built as the cell builds them (untrained: base training is the
   work being planned); parameters and weight bytes at the model's dtype;
2. the training stages, each counted on one example and on the cell's batch
   (:func:`widthscope.probe.cost.count_step`): base training to a plateau (at most ``max_steps``:
   an upper bound, early stopping ends it sooner); the new block at every point for each learning
   rate of the grid and the other block seeds (FLOPs: the mean over points, memory: the largest);
   the GradMax block; the original model trained whole for the same FLOPs (one run per learning
   rate of the grid, as long as the longest point needs); grow-then-train-all at every point (the
   steps that cost what the block's steps cost there); a model of the grown size from scratch
   where the suite has it;
3. with ``time_run`` (the default) each stage's own training loop is timed at 2 and 6 steps on
   one torch thread (the cells' setting; the slope is the step time), the criteria at the middle
   point (scaled to every point), one held-out evaluation of each size and the data loading;
   predicted time = steps x step time + the loops' fixed cost + criteria + evaluations + loading,
   every seed.

:class:`SuitePlan` (also :func:`widthscope.growth.target_plan.plan_target`'s result) holds the
per-model plans with ``to_dict()`` and ``table()``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from .._io import format_table, human_size
from ..probe import collect
from ..probe.cost import count_pass, count_step
from ..probe.cost_plan import TrainPlan, TrainStage, device_memory, seconds_text, stage_of, tensor_bytes, time_loop
from ..probe.growth import point_criteria
from ..probe.interventions import batch_size_of, index_batch, mean_loss
from .cell import _fit, _grown
from .options import GrowBenchOptions, with_keywords
from .suite import _build, _data, _splits, cells, reproducible, train_to_plateau

__all__ = ["SuitePlan", "plan_bench", "tensor_bytes", "merge_counts", "start_up", "GRADMAX_K"]

GRADMAX_K = 8  # run_cell's gradmax_k: the GradMax block's hidden width (at most the point's width)


@dataclasses.dataclass(frozen=True)
class SuitePlan:
    """What a benchmark of several models will cost: one :class:`TrainPlan` per model (or suite
    setting), the cells running one after the other. ``predicted_s`` is the sum of the plans' and
    of ``other_s`` (``None`` when any plan is untimed); the run's memory is the largest plan's."""

    command: str
    suite: str
    cells: int
    plans: tuple[TrainPlan, ...]
    other_s: tuple[tuple[str, float], ...] = ()  # timed once for the whole run: (what, seconds)
    notes: tuple[str, ...] = ()

    @property
    def train_flops(self) -> int:
        return sum(p.train_flops for p in self.plans)

    @property
    def predicted_s(self) -> float | None:
        got = [p.predicted_s for p in self.plans]
        if any(v is None for v in got):
            return None
        return sum(v or 0.0 for v in got) + sum(v for _, v in self.other_s)

    @property
    def peak_bytes(self) -> int:
        return max((p.peak_bytes for p in self.plans), default=0)

    @property
    def max_batch(self) -> int | None:
        fits = [p.max_batch for p in self.plans if p.max_batch is not None]
        return min(fits) if fits else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "suite": self.suite,
            "cells": self.cells,
            "plans": [p.to_dict() for p in self.plans],
            "other_s": dict(self.other_s),
            "notes": list(self.notes),
            "train_flops": self.train_flops,
            "predicted_s": self.predicted_s,
            "peak_bytes": self.peak_bytes,
            "max_batch": self.max_batch,
        }

    def table(self) -> str:
        """Each model's plan (``TrainPlan.table``), then one row per model and the total."""

        rows = [
            {
                "model": p.model,
                "parameters": f"{p.parameters:,}",
                "weights": human_size(p.weight_bytes),
                "dtype": p.dtype,
                "training FLOPs": f"{p.train_flops:.3g}",
                "run memory": human_size(p.peak_bytes),
                "largest batch that fits": p.max_batch,
                "predicted wall time": seconds_text(p.predicted_s),
            }
            for p in self.plans
        ]
        rows += [{"model": f"timed: {what}", "predicted wall time": seconds_text(v)} for what, v in self.other_s]
        rows.append(
            {
                "model": f"total ({self.cells} cells)",
                "training FLOPs": f"{self.train_flops:.3g}",
                "run memory": human_size(self.peak_bytes),
                "largest batch that fits": self.max_batch,
                "predicted wall time": seconds_text(self.predicted_s),
            }
        )
        parts = [p.table() for p in self.plans]
        parts.append(format_table(rows, list(rows[0]), title=f"{self.command} ({self.suite}): the run in total"))
        return "\n\n".join(parts) + "".join(f"\nnote: {n}" for n in self.notes)


def merge_counts(counts: Sequence[Mapping[str, Any]], weights: Sequence[float] | None = None) -> tuple[dict, int]:
    """One stage's counts from the same step at several points: FLOPs their (``weights``-weighted)
    mean, memory the largest (which point runs is not known before the run). Also the index of the
    largest, whose model the stage describes."""
    w = list(weights) if weights is not None else [1.0] * len(counts)
    worst = max(range(len(counts)), key=lambda i: counts[i]["activation_bytes_per_example"])
    merged = dict(counts[worst])
    for k in ("flops_forward", "flops_backward"):
        merged[k] = round(sum(c[k] * wi for c, wi in zip(counts, w)) / sum(w))
    merged["fixed_bytes"] = max(c["fixed_bytes"] for c in counts)
    return merged, worst


class _Model:
    """One model of the suite as its first cell builds it: data, splits, the untrained model, points."""

    def __init__(self, cell: Mapping[str, Any]):
        self.cell = cell
        t0 = time.perf_counter()
        self.train, test, self.answer, student = _data(cell)
        self.load_s = time.perf_counter() - t0
        self.sp = _splits(cell, test)
        if student is not None:
            self.model = student
        else:
            torch.manual_seed(int(cell["seed"]))
            self.model = _build(cell, cell["depth"]) if cell["family"] != "resnet20" else _build(cell, 0)
        self.model.eval()
        self.points: list[str] = list(self.model.widthscope_points)  # type: ignore[arg-type]
        n = batch_size_of(self.train)
        self.bs = min(int(cell["batch_size"]), n)
        self.one = index_batch(self.train, slice(0, 1))
        self.batch = index_batch(self.train, slice(0, max(2, self.bs)))
        got = collect(self.model, [self.one], points=self.points, progress=False)
        self.widths = {p: int(v.shape[1]) for p, v in got.items()}
        self.data_bytes = tensor_bytes((self.train, test))

    def grown(self, point: str, hidden: int | None = None) -> tuple[nn.Module, list[nn.Parameter]]:
        """A copy with the block at ``point`` (``hidden``: a GradMax block of that many rows)."""
        w = self.widths[point]
        w_in = None if hidden is None else torch.randn(hidden, w, generator=torch.Generator().manual_seed(0))
        return _grown(self.model, point, w, None, 0, w_in=w_in)

    def fit(self, make: Callable[[], tuple[nn.Module, list[nn.Parameter]]], lr: float) -> Callable[[int], Any]:
        """``run(steps)``: the cell's training loop (``_fit``) on a fresh model from ``make``."""
        seed = int(self.cell["seed"])
        return lambda k: _fit(*make(), self.train, steps=k, at=(), lr=lr, batch_size=self.bs, seed=seed)

    def plateau(self, depth: int) -> Callable[[int], Any]:
        """``run(steps)``: base training of a copy of a fresh model of ``depth``, its one evaluation on
        two examples (the evaluations are counted apart, at their own size)."""
        c = self.cell
        m = self.model if c["family"] == "teacher" else _build(c, depth if c["family"] != "resnet20" else 0)
        monitor = index_batch(self.sp["rank"], slice(0, 2))

        def run(k: int) -> None:
            train_to_plateau(
                copy.deepcopy(m),
                self.train,
                monitor,
                lr=c["base_lr"],
                batch_size=self.bs,
                seed=int(c["seed"]),
                eval_every=10**9,
                patience=c["patience"],
                tol=c["tol"],
                max_steps=k,
            )

        return run


def _all(m: nn.Module) -> tuple[nn.Module, list[nn.Parameter]]:
    c = copy.deepcopy(m)
    return c, list(c.parameters())


Loop = tuple[Callable[[int], Any], int]  # run(steps), and how many trainings one call runs


def _stages(m: _Model, runs: int) -> tuple[list[TrainStage], list[Loop]]:
    """The cell's training stages (``runs`` = seeds) and, per stage, its timed loop."""
    c, model, bs, P = m.cell, m.model, m.bs, len(m.points)
    lrs, clrs, seeds = tuple(c["block_lrs"]), tuple(c["continue_lrs"]), tuple(c["block_seeds"])
    long, pair = int(c["long"]), (m.one, m.batch)
    kw: dict[str, Any] = dict(batch_size=bs, optimizer="adamw")
    out: list[TrainStage] = []
    loops: list[Loop] = []
    if int(c["max_steps"]) > 0 and c["family"] != "teacher":
        base = count_step(model, pair)
        out.append(
            stage_of(
                "base training (to a plateau)", base, model, runs=runs, steps=int(c["max_steps"]), bound=True, **kw
            )
        )
        loops.append((m.plateau(int(c.get("depth", 0))), 1))
    blocks, gm, alls = [], [], []
    for p in m.points:
        g, prm = m.grown(p)
        blocks.append((count_step(g, pair, params=prm), g))
        alls.append((count_step(g, pair), g))
        g2, prm2 = m.grown(p, min(GRADMAX_K, m.widths[p]))
        gm.append((count_step(g2, pair, params=prm2), g2))
    orig = count_step(model, pair)
    f_orig = orig["flops_forward"] + orig["flops_backward"]
    f_block = [b["flops_forward"] + b["flops_backward"] for b, _ in blocks]
    f_all = [a["flops_forward"] + a["flops_backward"] for a, _ in alls]
    n_cont = [max(1, round(long * fb / f_orig)) for fb in f_block]
    n_all = [max(1, round(long * fb / fa)) for fb, fa in zip(f_block, f_all)]
    ends = sorted({0, P - 1})  # per-point loops are timed at the first and the last point

    def at_ends(make: Callable[[str], tuple[nn.Module, list[nn.Parameter]]], lr: float) -> Loop:
        fits = [m.fit(functools.partial(make, m.points[j]), lr) for j in ends]
        return (lambda k: [f(k) for f in fits]), len(ends)

    merged, i = merge_counts([b for b, _ in blocks])
    name = f"new block ({len(lrs)} learning rates + {len(seeds) - 1} block seeds, every point)"
    out.append(stage_of(name, merged, blocks[i][1], runs=runs * P * (len(lrs) + len(seeds) - 1), steps=long, **kw))
    loops.append(at_ends(m.grown, lrs[0]))
    merged, i = merge_counts([g for g, _ in gm])
    out.append(
        stage_of(
            f"GradMax block (hidden {GRADMAX_K} at most, every point)",
            merged,
            gm[i][1],
            runs=runs * P,
            steps=long,
            **kw,
        )
    )
    loops.append(at_ends(lambda p: m.grown(p, min(GRADMAX_K, m.widths[p])), lrs[0]))
    name = "continue (original, all parameters, same FLOPs)"
    out.append(stage_of(name, orig, model, runs=runs * len(clrs), steps=max(n_cont), **kw))
    loops.append((m.fit(lambda: _all(model), clrs[0]), 1))
    merged, i = merge_counts([a for a, _ in alls], n_all)
    name = "grow-then-train-all (every point, same FLOPs)"
    out.append(stage_of(name, merged, alls[i][1], runs=runs * P, steps=max(1, round(sum(n_all) / P)), **kw))
    loops.append(at_ends(lambda p: _all(m.grown(p)[0]), clrs[0]))
    if c.get("scratch"):
        torch.manual_seed(0)
        big = _build(c, int(c["depth"]) + 1)
        name = "scratch (grown size, to a plateau)"
        out.append(stage_of(name, count_step(big, pair), big, runs=runs, steps=int(c["max_steps"]), bound=True, **kw))
        loops.append((m.plateau(int(c["depth"]) + 1), 1))
    return out, loops


def _timed(
    m: _Model, stages: list[TrainStage], loops: list[Loop], runs: int
) -> tuple[list[TrainStage], list[tuple[str, float]]]:
    """Each stage's loop timed (per-point loops: the first and the last point, averaged), the
    criteria, the evaluations and the loading; every cost per seed times ``runs``."""
    c, out, fixed = m.cell, [], 0.0
    lrs = tuple(c["block_lrs"])
    with reproducible(1):
        for s, (run, per) in zip(stages, loops):
            f, step = time_loop(run)
            fixed += f / per * s.runs
            out.append(dataclasses.replace(s, step_s=step / per))
        mid = m.points[len(m.points) // 2]
        probe = index_batch(m.train, slice(0, min(int(c["n_probe"]), batch_size_of(m.train))))
        t0 = time.perf_counter()
        point_criteria(
            m.model,
            mid,
            probe,
            m.sp["rank"],
            M=int(c["M"]),
            K=int(c["K"]),
            eta=float(lrs[len(lrs) // 2]),
            block_seed=0,
            hidden=None,
            batch_size=64,
            gradmax_k=GRADMAX_K,
            keep_gradmax_rows=True,
        )
        criteria = (time.perf_counter() - t0) * len(m.points)
        evals = {}
        for h in ("rank", "B"):
            t0 = time.perf_counter()
            mean_loss(m.model, m.sp[h], batch_size=64)
            evals[h] = time.perf_counter() - t0
    P, clrs = len(m.points), len(c["continue_lrs"])
    plateau = math.ceil(int(c["max_steps"]) / int(c["eval_every"])) * (2 if c.get("scratch") else 1)
    n_rank = plateau + P * len(lrs) + clrs * P  # plateau checks, the lr grid's choice, the continue runs' choice
    n_quarter = 3 + P * 16  # before; per point: 7 trained blocks and the continue run, on A and B
    return out, [
        ("training loops' fixed cost", fixed),
        ("criteria (timed at the middle point)", criteria * runs),
        ("held-out evaluations", (n_rank * evals["rank"] + n_quarter * evals["B"]) * runs),
        ("data (load + split)", m.load_s * runs),
    ]


def _model_plan(cell: Mapping[str, Any], runs: int, time_run: bool) -> TrainPlan:
    m = _Model(cell)
    stages, loops = _stages(m, runs)
    weights = sum(p.numel() * p.element_size() for p in m.model.parameters())
    probe_peak = count_pass(m.model, m.one, m.points)["peak_bytes"] * min(64, int(cell["n_probe"]))
    other_s: list[tuple[str, float]] = []
    predicted = None
    if time_run:
        stages, other_s = _timed(m, stages, loops, runs)
        predicted = sum(s.train_s or 0.0 for s in stages) + sum(v for _, v in other_s)
    free, source = device_memory("cpu")
    notes = [f"{runs} seed(s), {len(m.points)} points ({', '.join(m.points)})"]
    if any(s.bound for s in stages):
        notes.append("training to a plateau stops early: its steps (and time) are upper bounds")
    return TrainPlan(
        command=f"grow-bench {cell['model']}",
        model=str(cell["model"]),
        dtype=str(next(m.model.parameters()).dtype).removeprefix("torch."),
        dtype_source="the suite's model",
        counted_on="loaded",
        parameters=sum(p.numel() for p in m.model.parameters()),
        weight_bytes=weights,
        stages=tuple(stages),
        device="cpu",
        memory_bytes=free,
        memory_source=source,
        other_bytes=(
            ("data pools", m.data_bytes),
            (f"the model + {len(cell['continue_lrs'])} continue copies", weights * (1 + len(cell["continue_lrs"]))),
        ),
        phases=(("criteria: a probed batch of 64", probe_peak),),
        other_s=tuple(other_s),
        predicted_s=predicted,
        notes=tuple(notes),
    )


def plan_bench(options: GrowBenchOptions | None = None, *, time_run: bool = True, **keywords: Any) -> SuitePlan:
    """The cost plan of ``run_bench(out, options)`` (every cell, no shard): nothing trained, nothing
    written. Keywords named like :class:`~widthscope.growth.options.GrowBenchOptions` fields override
    ``options``. See the module docstring."""
    opts = with_keywords("plan_bench", options, GrowBenchOptions, keywords)
    grid = cells(opts.suite, opts.seeds, M=opts.M, K=opts.K)
    models: dict[str, list[dict[str, Any]]] = {}
    for cell in grid:
        models.setdefault(str(cell["model"]), []).append(cell)
    start = start_up()
    plans = [_model_plan(group[0], len(group), time_run) for group in models.values()]
    notes = ["FLOPs as FlopCounterMode counts them (matmuls, convolutions, attention)"]
    notes.append("time: the process's own start (imports) is not in the prediction")
    if not time_run:
        notes.append("no time predicted (--plan-no-time)")
    return SuitePlan(
        command="grow-bench",
        suite=opts.suite,
        cells=len(grid),
        plans=tuple(plans),
        other_s=(("start-up (first optimizer)", start),) if time_run else (),
        notes=tuple(notes),
    )


def start_up() -> float:
    """Seconds of a process's first optimizer (it imports ``torch._dynamo``): once per run, and out
    of the timed steps that follow."""
    t0 = time.perf_counter()
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])
    return time.perf_counter() - t0
