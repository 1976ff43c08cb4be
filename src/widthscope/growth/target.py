r"""The compute-to-target benchmark: does training a small model, growing it and training on reach
the loss of the full-size model trained from scratch with less compute?

One cell per seed (:func:`run_target_cell`; resumable through :func:`widthscope.sweeps.grid.run_grid`):

1. **scratch**: the target model (LLaMA-style, e.g. width 64, depth 4) trained from scratch for
   ``steps`` steps; its budget ``B`` is ``steps`` × the FLOPs of one training step; its held-out loss
   is evaluated on a fixed FLOP grid (``B / evals``); the *target* is its final held-out loss.
2. **continue-small** (the practitioner's other baseline), for each small model (``depth``: half the
   layers; ``width``: half the width): trained alone up to ``cap · B`` FLOPs. The same run is the
   prefix of every growth run from that small model: its model, AdamW state and batch generator are
   kept at each evaluation where a schedule (:mod:`widthscope.growth.schedule`) says "grow".
3. **growth runs**: each operator (:mod:`widthscope.growth.operators`) × schedule, from that snapshot:
   grow (once, or at each stage of the schedule), train on with a fresh AdamW (re-warmed over
   ``rewarm`` steps), stop when the held-out loss first reaches the target or at ``cap · B``.

Every run's FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matrix products and
attention: forward and backward of one training step, counted once per model shape and multiplied
by the steps); the small model's FLOPs before growth count, and so do the signal measurements of
the certificate schedules. Evaluations are measurement and cost nothing. "FLOPs to reach" is the
first crossing of the target on the evaluation grid, linearly interpolated between the two
evaluations around it; a run that never reaches it is *censored* (``reached`` false) at ``cap · B``.
The per-seed speed-up is ``F_scratch / F_run`` (both first crossings of the same target on the same
held-out examples); the judgement over seeds is :func:`widthscope.growth.target_compare.compare`.

The budget: ``steps``, or ``tokens_per_param`` tokens per parameter of the target model (about 20
is compute-optimal). All runs of a cell use one torch thread and deterministic algorithms
(:func:`reproducible`), AdamW (weight decay 0, gradient clipping at norm 1), a linear warm-up, then
``decay``: ``"none"`` (constant), or ``"cosine"`` / ``"linear"`` down to ``final_lr`` × ``lr`` at the
end of the run's compute (``B`` for scratch, ``cap · B`` for the others; a grown run continues the
small run's schedule). The target is the from-scratch loss at ``B`` (annealed where ``decay`` is
set), the mean over ``n_eval`` held-out sequences, with its standard error (``target_se``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from ..data import load
from ..errors import WidthscopeError
from ..models import build
from ..registry import GROWTH_OPERATORS
from .operators import Growth, stack_depth, stack_order, widen, zero_block
from .schedule import SCHEDULES, Schedule, alignment_signal
from .suite import reproducible

__all__ = [
    "TARGET_SUITES",
    "OPERATORS",
    "DECAYS",
    "target_cells",
    "run_target_cell",
    "model_flops",
    "reach_flops",
    "budget_steps",
    "lr_factor",
]

DECAYS = ("none", "cosine", "linear")

# operator name -> which small model it grows ("depth": fewer layers, "width": narrower): a live view
# of widthscope.registry.GROWTH_OPERATORS (an operator registered later is in it too)
OPERATORS: Mapping[str, str] = GROWTH_OPERATORS.mapping("axis")
_BASE: dict[str, Any] = dict(
    width=32,
    depth=4,
    head_dim=16,
    small_depth=2,
    small_width=16,
    seq_len=64,
    batch_size=64,
    lr=3e-3,
    warmup=40,
    rewarm=10,
    steps=600,
    tokens_per_param=20.0,  # about compute-optimal for the target; overrides steps
    decay="cosine",
    final_lr=0.1,
    evals=20,
    cap=1.0,
    n_train=32768,
    n_eval=512,
    n_signal=32,
    max_bytes=4_000_000,
    operators=tuple(OPERATORS),  # the built-in operators (registered when this module loads)
    schedules=("fixed@0.1", "fixed@0.25", "plateau<0.01", "certificate>0.5"),
)
TARGET_SUITES: dict[str, dict[str, Any]] = {
    "full": _BASE,
    # the earlier suite: a fixed 240 steps (0.55 tokens per target parameter), constant learning rate
    "short": {
        **_BASE,
        "width": 64,
        "small_width": 32,
        "seq_len": 32,
        "batch_size": 16,
        "steps": 240,
        "tokens_per_param": None,
        "decay": "none",
        "n_train": 4096,
        "n_eval": 128,
        "max_bytes": 600_000,
        "schedules": ("fixed@0.25", "fixed@0.15+0.35", "plateau<0.01", "certificate>0.5"),
    },
    "quick": {
        **_BASE,
        "width": 32,
        "depth": 2,
        "small_depth": 1,
        "small_width": 16,
        "seq_len": 16,
        "batch_size": 8,
        "warmup": 4,
        "rewarm": 2,
        "steps": 24,
        "tokens_per_param": None,
        "decay": "none",
        "evals": 8,
        "n_train": 256,
        "n_eval": 32,
        "n_signal": 8,
        "max_bytes": 100_000,
        "schedules": ("fixed@0.25", "fixed@0.15+0.35", "certificate>0.5"),
    },
}
TARGET_SEEDS = {"full": (0, 1, 2, 3, 4), "short": (0, 1, 2, 3, 4), "quick": (0, 1)}


def target_cells(suite: str = "full", seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One cell per seed: the suite's settings, flat, with ``suite`` and ``seed``."""
    if suite not in TARGET_SUITES:
        raise WidthscopeError(f"unknown grow-target suite {suite!r}; choose one of {', '.join(TARGET_SUITES)}")
    seeds = TARGET_SEEDS[suite] if seeds is None else tuple(int(s) for s in seeds)
    return [{"kind": "grow_target_cell", "suite": suite, **TARGET_SUITES[suite], "seed": s} for s in seeds]


# ----------------------------------------------------------------------------- models and FLOPs
def ffn_width(width: int) -> int:
    return max(32, 32 * round(8 * width / 3 / 32))  # the rule of models.lm.build_llama


def target_model(cell: Mapping[str, Any], width: int, depth: int) -> nn.Module:
    """LLaMA-style decoder with heads of ``head_dim`` (full multi-head attention, so any width that
    is a multiple of the head dimension can be grown to)."""
    hd = int(cell["head_dim"])
    heads = width // hd
    model = build(
        "llama",
        width,
        depth=depth,
        max_seq_len=cell["seq_len"],
        heads=heads,
        kv_heads=heads,
        head_dim=hd,
        ffn=ffn_width(width),
    )
    return model.to(cell.get("device", "cpu"))


def _signature(model: nn.Module) -> tuple:
    return tuple((n, tuple(p.shape)) for n, p in model.named_parameters())


def model_flops(model: nn.Module, batch: torch.Tensor, cache: dict[tuple, int] | None = None) -> int:
    """FLOPs of one training step (forward and backward of the LM loss on ``batch``) of every
    parameter, by ``FlopCounterMode``; cached per model shape in ``cache``."""
    key = (_signature(model), tuple(batch.shape))
    if cache is not None and key in cache:
        return cache[key]
    fc = FlopCounterMode(display=False)
    with fc:
        loss = model(batch, labels=batch).loss
        loss.backward()
    model.zero_grad(set_to_none=True)
    flops = int(fc.get_total_flops())
    if cache is not None:
        cache[key] = flops
    return flops


def budget_steps(cell: Mapping[str, Any], params: int) -> int:
    """Training steps of the from-scratch budget: ``tokens_per_param`` × the target's ``params``
    (embeddings included) ÷ the tokens of one step, or ``steps`` where ``tokens_per_param`` is unset."""
    tpp = cell.get("tokens_per_param")
    if tpp is None:
        return int(cell["steps"])
    return max(1, round(float(tpp) * params / (int(cell["batch_size"]) * int(cell["seq_len"]))))


def lr_factor(decay: str, fraction: float, final: float) -> float:
    """The learning-rate multiplier after warm-up at ``fraction`` of the run's compute.

    >>> lr_factor("cosine", 0.0, 0.1), lr_factor("cosine", 1.0, 0.1), lr_factor("linear", 0.5, 0.0)
    (1.0, 0.1, 0.5)
    """
    x = min(max(fraction, 0.0), 1.0)
    if decay == "none":
        return 1.0
    if decay == "linear":
        return final + (1 - final) * (1 - x)
    if decay == "cosine":
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * x))
    raise WidthscopeError(f"grow-target: decay {decay!r}; choose one of {', '.join(DECAYS)}")


def reach_flops(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """FLOPs at which the held-out ``curve`` (``[(flops, loss), ...]``) first reaches ``target``,
    linearly interpolated between the evaluation before and the first one at or below it."""
    prev = None
    for f, loss in curve:
        if loss <= target:
            if prev is None or prev[1] <= loss:
                return float(f)
            pf, pl = prev
            return float(pf + (f - pf) * (pl - target) / (pl - loss))
        prev = (f, loss)
    return None


# ----------------------------------------------------------------------------- a training run
@dataclasses.dataclass
class _Run:
    """A run in progress: model, optimiser, batch generator, FLOPs spent, the held-out curve since
    the start and since the last growth, the growth events."""

    model: nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator
    flops: float = 0.0
    step: int = 0
    since: int = 0  # steps since the start or the last growth (warm-up)
    curve: list[list[float]] = dataclasses.field(default_factory=list)
    history: list[float] = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    next_eval: int = 1
    signal_flops: float = 0.0  # part of ``flops`` spent measuring a growth signal
    horizon: float = 0.0  # the FLOPs at which the learning-rate decay ends

    def snapshot(self) -> _Run:
        model = copy.deepcopy(self.model)
        opt = torch.optim.AdamW(model.parameters(), lr=self.opt.param_groups[0]["lr"], weight_decay=0.0)
        opt.load_state_dict(self.opt.state_dict())
        gen = torch.Generator().manual_seed(0)
        gen.set_state(self.gen.get_state())
        return dataclasses.replace(
            self,
            model=model,
            opt=opt,
            gen=gen,
            curve=[list(c) for c in self.curve],
            history=list(self.history),
            events=[dict(e) for e in self.events],
        )


class CellContext:
    """What every run of a cell shares: data, the evaluation grid, FLOP cache, settings."""

    def __init__(self, cell: Mapping[str, Any]):
        self.cell = cell
        seed = int(cell["seed"])
        split = load(
            "text",
            n_train=int(cell["n_train"]),
            n_test=int(cell["n_eval"]) + 2 * int(cell["n_signal"]),
            seed=seed,
            seq_len=int(cell["seq_len"]),
            max_bytes=int(cell["max_bytes"]),
        )
        device = torch.device(cell.get("device", "cpu"))
        self.train = split.train[0].to(device)
        test = split.test[0].to(device)
        ns = int(cell["n_signal"])
        # held-out examples: the evaluation set, and a disjoint pair of pools for the signals
        self.eval = test[: int(cell["n_eval"])]
        self.sig_train = (self.train[:ns], self.train[:ns])
        self.sig_test = (test[int(cell["n_eval"]) : int(cell["n_eval"]) + ns],) * 2
        self.flop_cache: dict[tuple, int] = {}
        self.probe = self.train[: int(cell["batch_size"])]
        self.budget = 0.0  # B: set by the scratch run
        self.grid = 0.0  # B / evals

    def step_flops(self, model: nn.Module) -> int:
        return model_flops(model, self.probe, self.flop_cache)

    def eval_losses(self, model: nn.Module) -> torch.Tensor:
        """The held-out loss of each evaluation sequence (mean over its predicted tokens)."""
        was = model.training
        model.eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(self.eval), 64):
                xb = self.eval[i : i + 64]
                logits = model(xb).logits[:, :-1].float()
                ce = nn.functional.cross_entropy(logits.transpose(1, 2), xb[:, 1:], reduction="none")
                out.append(ce.mean(dim=1))
        model.train(was)
        return torch.cat(out).double()

    def eval_loss(self, model: nn.Module) -> float:
        return float(self.eval_losses(model).mean())


def start_run(ctx: CellContext, model: nn.Module, seed: int, horizon: float) -> _Run:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ctx.cell["lr"], weight_decay=0.0)
    run = _Run(model, opt, torch.Generator().manual_seed(int(seed)), horizon=horizon)
    loss = ctx.eval_loss(model)
    run.curve.append([0.0, loss])
    run.history.append(loss)
    return run


def train_until(
    ctx: CellContext,
    run: _Run,
    limit: float,
    on_eval: Callable[[_Run], bool] | None = None,
) -> None:
    """Train until ``run.flops`` reaches ``limit``; at each grid point evaluate and call
    ``on_eval(run)`` (returning True stops the run)."""
    cell = ctx.cell
    lr, bs = float(cell["lr"]), int(cell["batch_size"])
    decay, final = str(cell.get("decay", "none")), float(cell.get("final_lr", 0.1))
    n = len(ctx.train)
    f_step = ctx.step_flops(run.model)
    while run.flops < limit * (1 - 1e-12):
        warm = int(cell["warmup"]) if not run.events else int(cell["rewarm"])
        for g in run.opt.param_groups:
            g["lr"] = lr * min(1.0, (run.since + 1) / max(warm, 1)) * lr_factor(decay, run.flops / run.horizon, final)
        idx = torch.randint(0, n, (bs,), generator=run.gen)
        xb = ctx.train[idx.to(ctx.train.device)]
        loss = run.model(xb, labels=xb).loss
        if not torch.isfinite(loss):
            raise WidthscopeError(f"grow-target: training diverged at step {run.step}; lower the learning rate")
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
        run.opt.step()
        run.flops += f_step
        run.step += 1
        run.since += 1
        if run.flops >= run.next_eval * ctx.grid * (1 - 1e-12) or run.flops >= limit * (1 - 1e-12):
            while run.next_eval * ctx.grid <= run.flops * (1 + 1e-12):
                run.next_eval += 1
            v = ctx.eval_loss(run.model)
            run.curve.append([run.flops, v])
            run.history.append(v)
            if on_eval is not None and on_eval(run):
                return
            f_step = ctx.step_flops(run.model)  # on_eval may have grown the model


# ----------------------------------------------------------------------------- growth steps
def _stage_sizes(start: int, end: int, stages: int, multiple: int) -> list[int]:
    """Sizes after each of ``stages`` growths from ``start`` to ``end`` (evenly, multiples of ``multiple``)."""
    out = []
    for k in range(1, stages + 1):
        v = start + (end - start) * k / stages
        out.append(int(multiple * round(v / multiple)))
    out[-1] = end
    return out


def grow_stack_copy(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """G_stack to ``size`` layers: the whole stack repeated, then its top ``size mod depth`` layers
    (``stack_order``; up to ``2 × depth``: the top ``size - depth`` layers copied on top; not
    function-preserving)."""
    return stack_depth(model, _stack_order(model, size), mode="copy")


def grow_stack_zero(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """G_stack with each copy's writing maps zeroed (function-preserving)."""
    return stack_depth(model, _stack_order(model, size), mode="zero")


def _stack_order(model: Any, size: int) -> list[int]:
    # up to 2d: the top (size - d) layers copied on top; beyond, whole repeats first
    return stack_order(model.config.num_hidden_layers, size, "stack")


def grow_zero_block(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """Zero-initialised residual blocks at the top free block outputs, up to ``size`` blocks deep."""
    have = [p for p in model.widthscope_points if not hasattr(model.get_submodule(p), "widthscope_insert")]
    new = size - model.widthscope_config.get("blocks", 0) - model.config.num_hidden_layers
    points = list(reversed(have))[:new]  # the top free block outputs
    g = zero_block(model, points, hidden=ffn_width(int(cell["width"])), seed=seed)
    grown: Any = g.model
    grown.widthscope_config["blocks"] = model.widthscope_config.get("blocks", 0) + len(points)
    return g


def grow_widen(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """Masked width growth to hidden size ``size`` (function-preserving)."""
    return widen(model, size, ffn=ffn_width(size), seed=seed)


def _grow_once(ctx: CellContext, op: str, model: Any, size: int, seed: int) -> Growth:
    """Grow ``model`` to ``size`` by the registered operator ``op`` (widthscope.registry.GROWTH_OPERATORS)."""
    return GROWTH_OPERATORS.get(op)(model, size, cell=ctx.cell, seed=seed)


def _grow_run(ctx: CellContext, run: _Run, op: str, size: int, info: dict[str, Any]) -> None:
    """Grow ``run``'s model in place of the run (fresh AdamW, re-warm-up), recording the event."""
    g = _grow_once(ctx, op, run.model, size, int(ctx.cell["seed"]) + len(run.events))
    run.model = g.model
    run.model.train()
    run.opt = torch.optim.AdamW(run.model.parameters(), lr=ctx.cell["lr"], weight_decay=0.0)
    run.since = 0
    run.history = [run.history[-1]] if run.history else []
    run.events.append(
        {
            **info,
            "operator": g.operator,
            "exact": g.exact,
            "size": size,
            "new_parameters": g.new_parameters,
            "parameters": sum(p.numel() for p in run.model.parameters()),
            "step_flops": ctx.step_flops(run.model),
        }
    )


# ----------------------------------------------------------------------------- the cell
def _signal_cost(ctx: CellContext, model: nn.Module, kind: str) -> int:
    """FLOPs of one signal measurement (forward and backward of both pools), cached per shape."""
    key = ("signal", kind, _signature(model))
    if key not in ctx.flop_cache:
        fc = FlopCounterMode(display=False)
        with fc:
            measure_signal(ctx, model, kind)
        ctx.flop_cache[key] = int(fc.get_total_flops())
    return ctx.flop_cache[key]


def measure_signal(ctx: CellContext, model: Any, kind: str) -> float:
    point = f"model.layers.{model.config.num_hidden_layers // 2}"
    n = len(ctx.sig_train[0])
    return alignment_signal(model, point, ctx.sig_train, ctx.sig_test, kind=kind, M=n, K=n, seed=int(ctx.cell["seed"]))


def _due(ctx: CellContext, sched: Schedule, run: _Run, stage: int, charge: Callable[[float], None]) -> dict[str, Any]:
    """Whether growth ``stage`` is due on ``run`` now; the signal value (and its FLOPs, charged)."""
    value: list[float] = []

    def measure() -> float:
        charge(_signal_cost(ctx, run.model, sched.kind))
        value.append(measure_signal(ctx, run.model, sched.kind))
        return value[-1]

    frac = run.flops / ctx.budget
    due = sched.due(stage, frac, run.history, measure if sched.kind in ("certificate", "misalignment") else None)
    return {"due": due, "fraction": frac, "forced": sched.forced(frac), "signal": value[-1] if value else None}


def _charge_to(charged: dict[str, float], name: str) -> Callable[[float], None]:
    def charge(flops: float) -> None:
        charged[name] += flops

    return charge


def _small_prefix(
    ctx: CellContext, kind: str, schedules: Sequence[Schedule]
) -> tuple[_Run, dict[str, tuple[_Run, dict[str, Any]]]]:
    """The continue-small run to ``cap · B`` and, per schedule, the snapshot where it says grow."""
    cell = ctx.cell
    seed = int(cell["seed"])
    torch.manual_seed(seed + (101 if kind == "depth" else 202))
    width = int(cell["width"]) if kind == "depth" else int(cell["small_width"])
    depth = int(cell["small_depth"]) if kind == "depth" else int(cell["depth"])
    run = start_run(ctx, target_model(cell, width, depth), seed + 1, float(cell["cap"]) * ctx.budget)
    snaps: dict[str, tuple[_Run, dict[str, Any]]] = {}
    charged = {s.name: 0.0 for s in schedules}

    def on_eval(r: _Run) -> bool:
        for s in schedules:
            if s.name in snaps:
                continue
            d = _due(ctx, s, r, 0, _charge_to(charged, s.name))
            if d["due"]:
                snap = r.snapshot()
                snap.flops += charged[s.name]
                snap.signal_flops = charged[s.name]
                snaps[s.name] = (snap, d)
        return False

    train_until(ctx, run, float(cell["cap"]) * ctx.budget, on_eval)
    return run, snaps


def _grown_run(ctx: CellContext, op: str, sched: Schedule, start: tuple[_Run, dict[str, Any]], target: float) -> _Run:
    """Grow the snapshot by ``op`` at the schedule's first stage, train on to the target or the cap,
    growing again at later stages when due."""
    cell = ctx.cell
    kind = OPERATORS[op]
    small, end = (
        (int(cell["small_depth"]), int(cell["depth"]))
        if kind == "depth"
        else (
            int(cell["small_width"]),
            int(cell["width"]),
        )
    )
    sizes = _stage_sizes(small, end, sched.stages, 1 if kind == "depth" else int(cell["head_dim"]))
    run = start[0].snapshot()
    _grow_run(ctx, run, op, sizes[0], {**start[1], "flops": run.flops, "step": run.step})

    def on_eval(r: _Run) -> bool:
        if r.history[-1] <= target:
            return True
        stage = len(r.events)
        if stage < len(sizes) and r.events[-1]["size"] < sizes[stage]:

            def charge(f: float) -> None:
                r.flops += f
                r.signal_flops += f

            d = _due(ctx, sched, r, stage, charge)
            if d["due"]:
                _grow_run(ctx, r, op, sizes[stage], {**d, "flops": r.flops, "step": r.step})
        return False

    train_until(ctx, run, float(cell["cap"]) * ctx.budget, on_eval)
    return run


def _row(ctx: CellContext, label: str, run: _Run, target: float, ref: float | None, **extra: Any) -> dict[str, Any]:
    reach = reach_flops(run.curve, target)
    cap = float(ctx.cell["cap"]) * ctx.budget
    return {
        "kind": "grow_target",
        "run": label,
        **extra,
        "target_loss": target,
        "budget_flops": ctx.budget,
        "cap_flops": cap,
        "reached": reach is not None,
        "reach_flops": reach,
        # censored: the speed-up is at most F_scratch / (cap · B), entered at that bound
        "speedup": None if ref is None else ref / (reach if reach is not None else cap),
        "final_loss": run.curve[-1][1],
        "flops": run.flops,
        "signal_flops": run.signal_flops,
        "steps": run.step,
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "events": run.events,
        "grown_at": run.events[0]["fraction"] if run.events else None,
        "forced": any(e.get("forced") for e in run.events),
        "curve": run.curve,
    }


def run_target_cell(cell: Mapping[str, Any], _cell_dir: Any = None) -> list[dict[str, Any]]:
    """Every run of one seed (scratch, continue-small, operator × schedule): one row each."""
    with reproducible(1) as env:
        rows = _run_target_cell(cell)
    for r in rows:
        r.update(env)
    return rows


def _run_target_cell(cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    ctx = CellContext(cell)
    seed = int(cell["seed"])
    unknown = [s for s in cell["schedules"] if s not in SCHEDULES] + [
        o for o in cell["operators"] if o not in OPERATORS
    ]
    if unknown:
        raise WidthscopeError(
            f"grow-target: unknown schedule/operator {unknown}; known {list(SCHEDULES)}, {list(OPERATORS)}"
        )
    torch.manual_seed(seed)
    big = target_model(cell, int(cell["width"]), int(cell["depth"]))
    params = sum(p.numel() for p in big.parameters())
    steps = budget_steps(cell, params)
    ctx.budget = float(steps * ctx.step_flops(big))
    ctx.grid = ctx.budget / int(cell["evals"])
    scratch = start_run(ctx, big, seed, ctx.budget)
    train_until(ctx, scratch, ctx.budget)
    final = ctx.eval_losses(scratch.model)
    target = float(final.mean())
    ref = reach_flops(scratch.curve, target)
    budget = {
        "budget_steps": steps,
        "target_parameters": params,
        "tokens_per_param": steps * int(cell["batch_size"]) * int(cell["seq_len"]) / params,
        "target_se": float(final.std() / math.sqrt(len(final))) if len(final) > 1 else None,
    }
    rows = [_row(ctx, "scratch", scratch, target, ref, small=None, operator=None, schedule=None)]
    rows[0]["seconds"] = time.perf_counter() - t0
    schedules = [SCHEDULES[s] for s in cell["schedules"]]
    for kind in ("depth", "width"):
        ops = [o for o in cell["operators"] if OPERATORS[o] == kind]
        if not ops:
            continue
        t1 = time.perf_counter()
        cont, snaps = _small_prefix(ctx, kind, schedules)
        rows.append(_row(ctx, f"continue-{kind}", cont, target, ref, small=kind, operator=None, schedule=None))
        rows[-1]["seconds"] = time.perf_counter() - t1
        for op in ops:
            for s in schedules:
                t1 = time.perf_counter()
                run = _grown_run(ctx, op, s, snaps[s.name], target)
                rows.append(_row(ctx, f"{op}/{s.name}", run, target, ref, small=kind, operator=op, schedule=s.name))
                rows[-1]["seconds"] = time.perf_counter() - t1
    for r in rows:
        r.update(budget, seconds_cell=time.perf_counter() - t0)
    return rows
