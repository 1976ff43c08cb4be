"""The cost plan of a compute-to-target run (``grow-target --plan``): before any cell trains.

:func:`plan_target` takes the settings of :func:`widthscope.growth.target_bench.run_target` (the
built-in suite, or ``--suite-file``) and returns a :class:`~widthscope.growth.bench_plan.SuitePlan`:
one :class:`~widthscope.probe.cost_plan.TrainPlan` per suite setting (its cells: one per seed).
Per setting, as :func:`widthscope.growth.target.run_target_cell` trains it:

1. every model is counted on the ``meta`` device (no weights, no arithmetic) by
   :func:`widthscope.probe.cost.count_step` on one sequence and on the run's batch: the target
   (from scratch; also what ``stack_copy``, ``stack_zero`` and ``widen`` grow into, the same
   shapes), the small models (half the depth, half the width) and ``zero_block``'s grown model
   (the small-depth model with zero blocks: grown for real, since the operator reads weights, then
   moved to ``meta``, while the small model has at most :data:`REAL_LIMIT` parameters; beyond,
   counted as the target, with a note);
2. stages: **scratch** (``steps`` steps: its budget ``B = steps ×`` the target's step FLOPs),
   **continue-depth/width** (the small model to ``cap · B`` FLOPs: exact, it never stops early) and
   one stage per **operator** (each schedule a run, from the earliest fraction of ``B`` it can grow
   at, to ``cap · B``: an upper bound, since a growth run stops once it reaches the target loss);
3. with ``time_run`` (the default), where the suite's device is here, each distinct model's step is
   timed in the cell's own loop (:func:`widthscope.probe.cost_plan.time_loop`, one torch thread as
   the cells run), one held-out evaluation of each model and one growth signal of each small model
   are timed and counted as the run evaluates (``evals`` per ``B``), and the data loading.

The counts agree with the benchmark's own budget: a stage's FLOPs per step are
``FlopCounterMode``'s count of the same step (:func:`widthscope.growth.target.model_flops`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from ..errors import WidthscopeError
from ..probe.cost import count_step
from ..probe.cost_plan import TrainPlan, TrainStage, device_memory, stage_of, time_loop
from ..train import resolve_device
from .bench_plan import SuitePlan, start_up
from .options import GrowTargetOptions, with_keywords
from .schedule import SCHEDULES
from .suite import reproducible
from .target import OPERATORS, _Context, _grow_once, _measure, _model, _start, _train_until
from .target_bench import _cells
from .target_plan import meta_llama

__all__ = ["plan_target", "REAL_LIMIT"]

REAL_LIMIT = 20_000_000  # zero_block's grown model is built for real up to this many parameters of the small model


class _Ctx:
    """What :func:`widthscope.growth.target._grow_once` reads of a cell's context."""

    def __init__(self, cell: Mapping[str, Any]):
        self.cell = cell


def _zero_grown(cell: Mapping[str, Any], device: str) -> nn.Module:
    """``zero_block``'s grown model: the small-depth model with zero blocks up to the target's depth."""
    shapes = _shapes(cell)
    torch.manual_seed(int(cell["seed"]))
    small = _model({**cell, "device": device}, *shapes["depth"])
    return _grow_once(_Ctx(cell), "zero_block", small, shapes["target"][1], int(cell["seed"])).model  # type: ignore[arg-type]


def _models(cell: Mapping[str, Any], ops: list[str]) -> tuple[dict[str, nn.Module], list[str]]:
    """The distinct models of a cell, for counting: ``target``, ``depth``/``width`` (the small
    models a kind grows from) and ``zero_block`` (its grown model)."""
    shapes = _shapes(cell)
    models = {"target": meta_llama(cell, *shapes["target"])}
    kinds = {OPERATORS[o] for o in ops}
    for kind in sorted(kinds):
        models[kind] = meta_llama(cell, *shapes[kind])
    notes = []
    if "zero_block" in ops:
        small_n = sum(p.numel() for p in models["depth"].parameters())
        if small_n <= REAL_LIMIT:  # grown for real (the operator reads weights), counted on meta
            models["zero_block"] = _zero_grown(cell, "cpu").to("meta")
        else:
            models["zero_block"] = models["target"]
            notes.append(
                f"zero_block's grown model counted as the target (its small model has {small_n:,} parameters, "
                f"over {REAL_LIMIT:,}: the operator needs real weights)"
            )
    return models, notes


def _shapes(cell: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(width, depth) of the target and of the small models each kind grows from."""
    W, D, w, d = (int(cell[k]) for k in ("width", "depth", "small_width", "small_depth"))
    return {"target": (W, D), "depth": (W, d), "width": (w, D)}


def _batch(model: nn.Module, cell: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence and the run's batch of token ids (at least two) on the model's device (meta or real)."""
    dev = next(model.parameters()).device
    ids = torch.zeros(max(2, int(cell["batch_size"])), int(cell["seq_len"]), dtype=torch.long, device=dev)
    return ids[:1], ids


def _earliest(name: str) -> float:
    """The earliest fraction of ``B`` a schedule can grow at."""
    s = SCHEDULES[name]
    return s.fractions[0] if s.kind == "fixed" else s.earliest


def _stages(cell: Mapping[str, Any], runs: int, models: Mapping[str, nn.Module]) -> tuple[list[TrainStage], dict]:
    """The cell's stages (``runs`` = seeds) and, per stage, which model it trains and its runs' evaluations."""
    counts = {k: count_step(m, _batch(m, cell)) for k, m in models.items()}
    bs = int(cell["batch_size"])
    step = {k: (c["flops_forward"] + c["flops_backward"]) * bs for k, c in counts.items()}
    B, cap, evals = int(cell["steps"]) * step["target"], float(cell["cap"]), int(cell["evals"])
    kw: dict[str, Any] = dict(batch_size=bs, optimizer="adamw")
    W, D, w, d = (int(cell[k]) for k in ("width", "depth", "small_width", "small_depth"))
    stages = [
        stage_of(
            f"scratch (target {W} x {D})", counts["target"], models["target"], runs=runs, steps=int(cell["steps"]), **kw
        )
    ]
    which = {stages[0].name: ("target", runs * (evals + 1))}
    for kind, shape in (("depth", f"{W} x {d}"), ("width", f"{w} x {D}")):
        if kind in models:
            n = math.ceil(cap * B * (1 - 1e-12) / step[kind])
            stages.append(
                stage_of(
                    f"continue-{kind} (small {shape}, to cap x B)", counts[kind], models[kind], runs=runs, steps=n, **kw
                )
            )
            which[stages[-1].name] = (kind, runs * (math.ceil(cap * evals) + 1))
    scheds = list(cell["schedules"])
    for op in cell["operators"]:
        key = "zero_block" if op == "zero_block" else "target"
        bounds = [math.ceil((cap - _earliest(s)) * B / step[key]) for s in scheds]
        name = f"{op} (grown, {len(scheds)} schedules; until the target loss)"
        stages.append(
            stage_of(
                name,
                counts[key],
                models[key],
                runs=runs * len(scheds),
                steps=math.ceil(sum(bounds) / len(bounds)),
                bound=True,
                **kw,
            )
        )
        which[name] = (key, runs * sum(math.ceil((cap - _earliest(s)) * evals) + 1 for s in scheds))
    return stages, which


def _timed(
    cell: Mapping[str, Any], stages: list[TrainStage], which: dict, models: Mapping[str, nn.Module], runs: int
) -> tuple[list[TrainStage], list[tuple[str, float]]]:
    """Each distinct model's step timed in the cell's loop on the suite's device, its evaluations
    and the small models' growth signals timed and counted, the data loading."""
    seed, device = int(cell["seed"]), str(cell.get("device", "cpu"))
    with reproducible(1):
        t0 = time.perf_counter()
        ctx = _Context(cell)
        load = time.perf_counter() - t0
        ctx.grid = math.inf  # no evaluation inside the timed loops but the last
        shapes = _shapes(cell)
        real: dict[str, nn.Module] = {}
        for k in models:
            torch.manual_seed(seed)
            real[k] = _zero_grown(cell, device) if k == "zero_block" else _model(cell, *shapes[k])

        def loop(model: nn.Module) -> Callable[[int], Any]:
            f = ctx.step_flops(model)
            return lambda k: _train_until(ctx, _start(ctx, copy.deepcopy(model), seed), k * f)

        step_s = {k: time_loop(loop(m))[1] for k, m in real.items()}
        eval_s = {}
        for k, m in real.items():
            t0 = time.perf_counter()
            ctx.eval_loss(m)
            eval_s[k] = time.perf_counter() - t0
        signal = 0.0
        kinds = {SCHEDULES[s].kind for s in cell["schedules"]} & {"certificate", "misalignment"}
        for k in ("depth", "width"):
            for kind in kinds if k in real else ():
                t0 = time.perf_counter()
                _measure(ctx, real[k], kind)
                signal += (time.perf_counter() - t0) * math.ceil(float(cell["cap"]) * int(cell["evals"]))
    out = [dataclasses.replace(s, step_s=step_s[which[s.name][0]]) for s in stages]
    n_eval = sum(n * eval_s[which[s.name][0]] for s in stages for n in [which[s.name][1]])
    return out, [
        ("held-out evaluations", n_eval),
        ("growth signals (at most every evaluation of the small run)", signal * runs),
        ("data (load + split)", load * runs),
    ]


def _missing(device: str) -> str | None:
    """Why the suite's ``device`` cannot run here (:func:`widthscope.train.resolve_device`), or None."""
    try:
        resolve_device(device)
    except WidthscopeError as exc:
        return str(exc).split(";")[0]
    return None


def _setting_plan(cell: Mapping[str, Any], runs: int, time_run: bool) -> TrainPlan:
    ops = list(cell["operators"])
    models, notes = _models(cell, ops)
    stages, which = _stages(cell, runs, models)
    device = str(cell.get("device", "cpu"))
    missing = _missing(device)
    other_s: list[tuple[str, float]] = []
    predicted = None
    if time_run and missing is None:
        stages, other_s = _timed(cell, stages, which, models, runs)
        predicted = sum(s.train_s or 0.0 for s in stages) + sum(v for _, v in other_s)
    elif time_run:
        notes.append(f"not timed (counts only): the suite trains on {missing}")
    target = models["target"]
    weights = {k: sum(p.numel() * p.element_size() for p in m.parameters()) for k, m in models.items()}
    n_seq = int(cell["n_train"]) + int(cell["n_eval"]) + 2 * int(cell["n_signal"])
    small = max((weights[k] for k in ("depth", "width") if k in weights), default=0)
    free, source = device_memory(device) if missing is None else (None, f"unknown: {missing}")
    notes += [
        f"{runs} seed(s); B = {int(cell['steps'])} x the target's step = {stages[0].flops / max(1, runs):.3g} FLOPs",
        "growth runs stop when they reach the target loss: their steps (and time) are upper bounds",
    ]
    return TrainPlan(
        command=f"grow-target {int(cell['width'])} x {int(cell['depth'])}",
        model=f"llama width {int(cell['width'])} depth {int(cell['depth'])}",
        dtype=str(next(target.parameters()).dtype).removeprefix("torch."),
        dtype_source="the suite's models",
        counted_on="meta",
        parameters=sum(p.numel() for p in target.parameters()),
        weight_bytes=weights["target"],
        stages=tuple(stages),
        device=device,
        memory_bytes=free,
        memory_source=source,
        other_bytes=(
            ("data (token ids)", 8 * n_seq * int(cell["seq_len"])),
            ("the scratch run (model + AdamW state)", 3 * weights["target"]),
            ("schedule snapshots (small model + AdamW state)", 3 * small * len(cell["schedules"])),
        ),
        other_s=tuple(other_s),
        predicted_s=predicted,
        notes=tuple(notes),
    )


def plan_target(options: GrowTargetOptions | None = None, *, time_run: bool = True, **keywords: Any) -> SuitePlan:
    """The cost plan of ``run_target(out, options)`` (every cell): nothing trained, nothing written.
    Keywords named like :class:`~widthscope.growth.options.GrowTargetOptions` fields override
    ``options``. See the module docstring."""
    opts = with_keywords("plan_target", options, GrowTargetOptions, keywords)
    grid = _cells(opts)
    groups: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for c in grid:
        key = {k: v for k, v in c.items() if k not in ("seed", "kind")}
        for k, cs in groups:
            if k == key:
                cs.append(c)
                break
        else:
            groups.append((key, [c]))
    start = start_up()
    plans = [_setting_plan(cs[0], len(cs), time_run) for _, cs in groups]
    notes = ["FLOPs as FlopCounterMode counts them (matmuls, attention): the benchmark's own budget count"]
    notes.append("time: the process's own start (imports) is not in the prediction")
    if not time_run:
        notes.append("no time predicted (--plan-no-time)")
    return SuitePlan(
        other_s=(("start-up (first optimizer)", start),) if time_run else (),
        command="grow-target",
        suite=str(grid[0]["suite"]),
        cells=len(grid),
        plans=tuple(plans),
        notes=tuple(notes),
    )
