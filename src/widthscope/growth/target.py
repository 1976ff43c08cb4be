r"""``widthscope grow-target`` (docs/growth.md): does growing a small model reach the held-out loss of
the full-size model trained from scratch for the budget ``B`` with less compute (FLOPs)?

One cell per seed (:func:`run_target_cell`): the scratch run, each small model continued alone, and
each operator grown from the small model where each schedule says, all to the target or ``cap · B``.
:func:`run_target` runs the cells resumably; :func:`read_suite_file` and :func:`plan_cost` read and
price other suites.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from .. import _args
from .._io import atomic_write_json, read_toml
from ..data import load
from ..errors import WidthscopeError
from ..models import build
from ..probe.collect import EvalMode
from ..registry import GROWTH_OPERATORS
from ..sweeps.grid import run_grid
from .operators import Growth, stack_depth, widen, zero_block
from .options import GrowTargetOptions, with_keywords
from .schedule import SCHEDULES, Schedule, alignment_signal
from .suite import own_cells, reproducible, write_table
from .target_compare import answer, compare

__all__ = [
    "TARGET_SUITES",
    "OPERATORS",
    "COLUMNS",
    "target_cells",
    "run_target_cell",
    "run_target",
    "target_out_dir",
    "suite_cells",
    "read_suite_file",
    "plan_cost",
    "spent_fractions",
    "model_flops",
    "meta_step_flops",
    "reach_flops",
    "budget_steps",
]

# the learning-rate multiplier at fraction x of the run's compute, ending at `final`
_DECAYS: dict[str, Callable[[float, float], float]] = {
    "none": lambda x, final: 1.0,
    "cosine": lambda x, final: final + (1 - final) * 0.5 * (1 + math.cos(math.pi * x)),
    "linear": lambda x, final: final + (1 - final) * (1 - x),
}
DECAYS = tuple(_DECAYS)

# operator name -> the axis it grows ("depth" or "width"): a live view of GROWTH_OPERATORS
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
    tokens_per_param=20.0,  # overrides steps
    decay="cosine",
    final_lr=0.1,
    evals=20,
    cap=1.0,
    n_train=32768,
    n_eval=512,
    n_signal=32,
    max_bytes=4_000_000,
    operators=tuple(OPERATORS),
    schedules=("fixed@0.1", "fixed@0.25", "plateau<0.01", "certificate>0.5"),
)
TARGET_SUITES: dict[str, dict[str, Any]] = {
    "full": _BASE,
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
        "depth": 2,
        "small_depth": 1,
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
_ENDS = ("", "_lo", "_hi")
COLUMNS = (
    *("run", "reached", "seeds"),
    *(f"{name}{end}" for name in ("speedup", "vs_continue") for end in _ENDS),
    *("reached_before_growth", "grown_at", "forced", "final_loss", "verdict", "verdict_continue"),
)


def target_cells(suite: str = "full", seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One cell per seed: the suite's settings, flat, with ``suite`` and ``seed``."""
    if suite not in TARGET_SUITES:
        raise WidthscopeError(f"unknown grow-target suite {suite!r}; choose one of {', '.join(TARGET_SUITES)}")
    seeds = TARGET_SEEDS[suite] if seeds is None else tuple(int(s) for s in seeds)
    return [{"kind": "grow_target_cell", "suite": suite, **TARGET_SUITES[suite], "seed": s} for s in seeds]


def ffn_width(width: int) -> int:
    return max(32, 32 * round(8 * width / 3 / 32))  # the rule of models.lm.build_llama


def target_model(cell: Mapping[str, Any], width: int, depth: int, *, meta: bool = False) -> nn.Module:
    """The suite's LLaMA-style decoder (full multi-head attention) on the cell's device or ``meta``."""
    hd = int(cell["head_dim"])
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = build(
            "llama",
            width,
            depth=depth,
            max_seq_len=cell["seq_len"],
            heads=width // hd,
            kv_heads=width // hd,
            head_dim=hd,
            ffn=ffn_width(width),
        )
    return model if meta else model.to(cell.get("device", "cpu"))


def _signature(model: nn.Module) -> tuple:
    return tuple((n, tuple(p.shape)) for n, p in model.named_parameters())


def _counted(cache: dict[tuple, int], key: tuple, work: Callable[[], Any]) -> int:
    """The FLOPs of ``work()`` by ``FlopCounterMode``, counted once per ``key``."""
    if key not in cache:
        fc = FlopCounterMode(display=False)
        with fc:
            work()
        cache[key] = int(fc.get_total_flops())
    return cache[key]


def model_flops(model: nn.Module, batch: torch.Tensor, cache: dict[tuple, int] | None = None) -> int:
    """FLOPs of one training step (forward and backward of the LM loss on ``batch``), cached per
    model shape in ``cache``."""

    def step() -> None:
        model(batch, labels=batch).loss.backward()
        model.zero_grad(set_to_none=True)

    return _counted({} if cache is None else cache, (_signature(model), tuple(batch.shape)), step)


def meta_step_flops(settings: Mapping[str, Any], width: int, depth: int) -> tuple[int, int]:
    """(FLOPs of one training step, parameters) of the suite's model, counted on ``meta``."""
    m = target_model(settings, width, depth, meta=True)
    x = torch.zeros(int(settings["batch_size"]), int(settings["seq_len"]), dtype=torch.long, device="meta")
    return model_flops(m, x), sum(p.numel() for p in m.parameters())


def budget_steps(cell: Mapping[str, Any], params: int) -> int:
    """Steps of the budget: ``tokens_per_param`` × ``params`` ÷ tokens per step, else ``steps``."""
    tpp = cell.get("tokens_per_param")
    if tpp is None:
        return int(cell["steps"])
    return max(1, round(float(tpp) * params / (int(cell["batch_size"]) * int(cell["seq_len"]))))


def lr_factor(decay: str, fraction: float, final: float) -> float:
    """The learning-rate multiplier after warm-up at ``fraction`` of the run's compute.

    >>> lr_factor("cosine", 0.0, 0.1), lr_factor("cosine", 1.0, 0.1), lr_factor("linear", 0.5, 0.0)
    (1.0, 0.1, 0.5)
    """
    return _DECAYS[decay](min(max(fraction, 0.0), 1.0), final)


def reach_flops(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """FLOPs at which ``curve`` (``[(flops, loss), ...]``) first reaches ``target``, interpolated linearly."""
    prev = None
    for f, loss in curve:
        if loss <= target:
            if prev is None:
                return float(f)
            pf, pl = prev
            return float(pf + (f - pf) * (pl - target) / (pl - loss))
        prev = (f, loss)
    return None


@dataclasses.dataclass
class _Run:
    """A run in progress: model, optimiser, batch generator, FLOPs, held-out curve and growth events."""

    model: nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator
    flops: float = 0.0
    step: int = 0
    since: int = 0  # steps since the start or the last growth (warm-up)
    curve: list[list[float]] = dataclasses.field(default_factory=list)
    history: list[float] = dataclasses.field(default_factory=list)  # losses since the last growth
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
        ns, ne = int(cell["n_signal"]), int(cell["n_eval"])
        sizes: dict[str, Any] = {k: int(cell[k]) for k in ("n_train", "seed", "seq_len", "max_bytes")}
        split = load("text", n_test=ne + 2 * ns, **sizes)
        device = torch.device(cell.get("device", "cpu"))
        self.train = split.train[0].to(device)
        test = split.test[0].to(device)
        self.eval = test[:ne]
        self.sig_train = (self.train[:ns], self.train[:ns])
        self.sig_test = (test[ne : ne + ns],) * 2
        self.flop_cache: dict[tuple, int] = {}
        self.probe = self.train[: int(cell["batch_size"])]
        self.budget = 0.0  # B: set by the scratch run
        self.grid = 0.0  # B / evals

    def step_flops(self, model: nn.Module) -> int:
        return model_flops(model, self.probe, self.flop_cache)

    def eval_losses(self, model: nn.Module) -> torch.Tensor:
        """The held-out loss of each evaluation sequence."""
        out = []
        with EvalMode(model), torch.no_grad():
            for i in range(0, len(self.eval), 64):
                xb = self.eval[i : i + 64]
                logits = model(xb).logits[:, :-1].float()
                ce = nn.functional.cross_entropy(logits.transpose(1, 2), xb[:, 1:], reduction="none")
                out.append(ce.mean(dim=1))
        return torch.cat(out).double()

    def eval_loss(self, model: nn.Module) -> float:
        return float(self.eval_losses(model).mean())


def start_run(ctx: CellContext, model: nn.Module, seed: int, horizon: float) -> _Run:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ctx.cell["lr"], weight_decay=0.0)
    loss = ctx.eval_loss(model)
    return _Run(
        model, opt, torch.Generator().manual_seed(int(seed)), curve=[[0.0, loss]], history=[loss], horizon=horizon
    )


def train_until(ctx: CellContext, run: _Run, limit: float, on_eval: Callable[[_Run], bool] | None = None) -> None:
    """Train until ``run.flops`` reaches ``limit``, evaluating at each grid point; ``on_eval(run)``
    returning True stops the run."""
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


def grow_stack_copy(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """G_stack to ``size`` layers (not function-preserving)."""
    return stack_depth(model, depth=size, mode="copy")


def grow_stack_zero(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """G_stack with each copy's writing maps zeroed (function-preserving)."""
    return stack_depth(model, depth=size, mode="zero")


def grow_zero_block(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """Zero-initialised residual blocks at the top free block outputs, up to ``size`` blocks deep."""
    have = [p for p in model.widthscope_points if not hasattr(model.get_submodule(p), "widthscope_insert")]
    new = size - model.widthscope_config.get("blocks", 0) - model.config.num_hidden_layers
    points = list(reversed(have))[:new]
    g = zero_block(model, points, hidden=ffn_width(int(cell["width"])), seed=seed)
    grown: Any = g.model
    grown.widthscope_config["blocks"] = model.widthscope_config.get("blocks", 0) + len(points)
    return g


def grow_widen(model: Any, size: int, *, cell: Mapping[str, Any], seed: int) -> Growth:
    """Masked width growth to hidden size ``size`` (function-preserving)."""
    return widen(model, size, ffn=ffn_width(size), seed=seed)


def _grow_run(ctx: CellContext, run: _Run, op: str, size: int, info: dict[str, Any]) -> None:
    """Grow ``run``'s model by operator ``op`` (fresh AdamW, re-warm-up), recording the event."""
    seed = int(ctx.cell["seed"]) + len(run.events)
    g = GROWTH_OPERATORS.get(op)(run.model, size, cell=ctx.cell, seed=seed)
    run.model = g.model
    run.model.train()
    run.opt = torch.optim.AdamW(run.model.parameters(), lr=ctx.cell["lr"], weight_decay=0.0)
    run.since = 0
    run.history = run.history[-1:]
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


def measure_signal(ctx: CellContext, model: Any, kind: str) -> float:
    point = f"model.layers.{model.config.num_hidden_layers // 2}"
    n = len(ctx.sig_train[0])
    return alignment_signal(model, point, ctx.sig_train, ctx.sig_test, kind=kind, M=n, K=n, seed=int(ctx.cell["seed"]))


def _due(ctx: CellContext, sched: Schedule, run: _Run, stage: int) -> tuple[dict[str, Any], float]:
    """Whether growth ``stage`` is due on ``run`` now, with the signal value; and the FLOPs the
    signal measurements cost."""
    value: list[float] = []
    cost = 0.0

    def measure() -> float:
        nonlocal cost
        key = ("signal", sched.kind, _signature(run.model))
        cost += _counted(ctx.flop_cache, key, lambda: measure_signal(ctx, run.model, sched.kind))
        value.append(measure_signal(ctx, run.model, sched.kind))
        return value[-1]

    frac = run.flops / ctx.budget
    due = sched.due(stage, frac, run.history, measure if sched.signal else None)
    return {"due": due, "fraction": frac, "forced": sched.forced(frac), "signal": value[-1] if value else None}, cost


def _small_prefix(
    ctx: CellContext, kind: str, schedules: Sequence[Schedule]
) -> tuple[_Run, dict[str, tuple[_Run, dict[str, Any]]]]:
    """The continue-small run to ``cap · B`` and, per schedule, the snapshot where it says grow."""
    cell = ctx.cell
    seed = int(cell["seed"])
    torch.manual_seed(seed + (101 if kind == "depth" else 202))
    size = {"width": int(cell["width"]), "depth": int(cell["depth"]), kind: int(cell[f"small_{kind}"])}
    run = start_run(ctx, target_model(cell, size["width"], size["depth"]), seed + 1, float(cell["cap"]) * ctx.budget)
    snaps: dict[str, tuple[_Run, dict[str, Any]]] = {}
    charged = {s.name: 0.0 for s in schedules}

    def on_eval(r: _Run) -> bool:
        for s in schedules:
            if s.name in snaps:
                continue
            d, cost = _due(ctx, s, r, 0)
            charged[s.name] += cost
            if d["due"]:
                snap = r.snapshot()
                snap.flops += charged[s.name]
                snap.signal_flops = charged[s.name]
                snaps[s.name] = (snap, d)
        return False

    train_until(ctx, run, float(cell["cap"]) * ctx.budget, on_eval)
    return run, snaps


def _grown_run(ctx: CellContext, op: str, sched: Schedule, start: tuple[_Run, dict[str, Any]], target: float) -> _Run:
    """Grow the snapshot by ``op``, train on to the target or the cap, growing again at later stages
    when due (sizes evenly between the small and the target model's)."""
    cell = ctx.cell
    axis = OPERATORS[op]
    small, end = int(cell[f"small_{axis}"]), int(cell[axis])
    multiple = 1 if axis == "depth" else int(cell["head_dim"])
    sizes = [
        int(multiple * round((small + (end - small) * k / sched.stages) / multiple)) for k in range(1, sched.stages)
    ] + [end]
    run = start[0].snapshot()
    _grow_run(ctx, run, op, sizes[0], {**start[1], "flops": run.flops, "step": run.step})

    def on_eval(r: _Run) -> bool:
        if r.history[-1] <= target:
            return True
        stage = len(r.events)
        if stage < len(sizes) and r.events[-1]["size"] < sizes[stage]:
            d, cost = _due(ctx, sched, r, stage)
            r.flops += cost
            r.signal_flops += cost
            if d["due"]:
                _grow_run(ctx, r, op, sizes[stage], {**d, "flops": r.flops, "step": r.step})
        return False

    train_until(ctx, run, float(cell["cap"]) * ctx.budget, on_eval)
    return run


def _row(ctx: CellContext, r: _Run, target: float, ref: float | None, t0: float, **labels: Any) -> dict[str, Any]:
    """The result row of run ``r``, labelled by ``run`` (and ``small``, ``operator``, ``schedule``)."""
    reach = reach_flops(r.curve, target)
    cap = float(ctx.cell["cap"]) * ctx.budget
    return {
        "kind": "grow_target",
        **{k: labels.get(k) for k in ("run", "small", "operator", "schedule")},
        "target_loss": target,
        "budget_flops": ctx.budget,
        "cap_flops": cap,
        "reached": reach is not None,
        "reach_flops": reach,
        # censored: the speed-up is at most F_scratch / (cap · B), entered at that bound
        "speedup": None if ref is None else ref / (reach if reach is not None else cap),
        "final_loss": r.curve[-1][1],
        "flops": r.flops,
        "signal_flops": r.signal_flops,
        "steps": r.step,
        "parameters": sum(p.numel() for p in r.model.parameters()),
        "events": r.events,
        "grown_at": r.events[0]["fraction"] if r.events else None,
        "forced": any(e.get("forced") for e in r.events),
        "curve": r.curve,
        "seconds": time.perf_counter() - t0,
    }


def run_target_cell(cell: Mapping[str, Any], _cell_dir: Any = None) -> list[dict[str, Any]]:
    """Every run of one seed (scratch, continue-small, operator × schedule): one row each."""
    with reproducible(1) as env:
        return _cell_rows(cell, env)


def _cell_rows(cell: Mapping[str, Any], env: Mapping[str, Any]) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    _check_settings({k: v for k, v in cell.items() if k not in ("kind", "suite", "seed")}, "grow-target cell")
    ctx = CellContext(cell)
    seed = int(cell["seed"])
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
    rows = [_row(ctx, scratch, target, ref, t0, run="scratch")]
    schedules = [SCHEDULES[s] for s in cell["schedules"]]
    for kind in ("depth", "width"):
        ops = [o for o in cell["operators"] if OPERATORS[o] == kind]
        if not ops:
            continue
        t1 = time.perf_counter()
        cont, snaps = _small_prefix(ctx, kind, schedules)
        rows.append(_row(ctx, cont, target, ref, t1, run=f"continue-{kind}", small=kind))
        for op in ops:
            for s in schedules:
                t1 = time.perf_counter()
                run = _grown_run(ctx, op, s, snaps[s.name], target)
                labels = dict(run=f"{op}/{s.name}", small=kind, operator=op, schedule=s.name)
                rows.append(_row(ctx, run, target, ref, t1, **labels))
    for r in rows:
        r.update(budget, seconds_cell=time.perf_counter() - t0, **env)
    return rows


_KNOWN = set(TARGET_SUITES["full"]) | {"device"}
_TOP = {"device", "seeds", "sustained_flops", "defaults", "suite", "note"}
_HINT = "see configs/grow-target-paper.toml"


def _check_settings(s: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(s) - _KNOWN)
    if unknown:
        raise WidthscopeError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    for key in ("width", "depth", "head_dim", "small_depth", "small_width", "seq_len", "batch_size", "steps", "evals"):
        _args.integer(where, key, s[key], lo=1)
    hd = s["head_dim"]
    if s["width"] % hd or s["small_width"] % hd or s["small_width"] >= s["width"]:
        raise WidthscopeError(
            f"{where}: width {s['width']} and small_width {s['small_width']} must be multiples of head_dim {hd}, "
            "small_width below width"
        )
    if not s["small_depth"] < s["depth"]:
        raise WidthscopeError(f"{where}: need small_depth < depth, got {s['small_depth']} and {s['depth']}")
    tpp = s["tokens_per_param"]
    _args.number(where, "tokens_per_param", tpp, 0, 1e6, lo_open=True, hi_open=True, optional=True)
    _args.choice(where, "decay", s["decay"], DECAYS)
    _args.number(where, "final_lr", s["final_lr"], 0, 1)
    bad = [o for o in s["operators"] if o not in OPERATORS] + [c for c in s["schedules"] if c not in SCHEDULES]
    if bad:
        raise WidthscopeError(f"{where}: unknown operator/schedule {bad}; known {list(OPERATORS)}, {list(SCHEDULES)}")


def read_suite_file(path: str | Path) -> dict[str, Any]:
    """``{"suites": [settings, ...], "seeds", "sustained_flops", "path"}`` from a suite file; every
    problem is one line naming the file."""
    raw = read_toml(path, "grow-target suite file", _HINT)
    where = f"grow-target suite file {str(path)!r}"
    extra = sorted(set(raw) - _TOP)
    if extra:
        raise WidthscopeError(f"{where}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(_TOP))}")
    entries = raw.get("suite")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise WidthscopeError(f"{where}: give at least one [[suite]] table; {_HINT}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise WidthscopeError(f"{where}: [defaults] must be a table")
    suites = []
    for i, e in enumerate(entries):
        given = {**defaults, **e}
        s = {**TARGET_SUITES["full"], "device": raw.get("device", "cpu"), **given}
        if "steps" in given and "tokens_per_param" not in given:
            s["tokens_per_param"] = None  # a suite that gives steps sets its budget in steps
        s["operators"], s["schedules"] = tuple(s["operators"]), tuple(s["schedules"])
        _check_settings(s, f"{where} [[suite]] {i + 1}")
        suites.append(s)
    seeds = raw.get("seeds", [0, 1, 2, 3, 4])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(v, int) and v >= 0 for v in seeds):
        raise WidthscopeError(f"{where}: seeds must be a list of whole numbers >= 0")
    flops = _args.number(where, "sustained_flops", raw.get("sustained_flops"), 0, lo_open=True, optional=True)
    return {"suites": suites, "seeds": tuple(seeds), "sustained_flops": flops, "path": str(path)}


def spent_fractions(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per run label, the mean over seeds of the FLOPs spent as a fraction of ``B``."""
    acc: dict[str, list[float]] = {}
    for r in rows:
        if r.get("kind") == "grow_target":
            acc.setdefault(str(r["run"]), []).append(float(r["flops"]) / float(r["budget_flops"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def plan_cost(plan: Mapping[str, Any], fractions: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per suite of ``plan``: sizes, budget, and the FLOPs and GPU-hours of all its seeds,
    predicted (each run at its fraction of ``B`` in ``fractions``, else ``cap · B``) and at most."""
    out = []
    for s in plan["suites"]:
        f_t, p_t = meta_step_flops(s, s["width"], s["depth"])
        steps = budget_steps(s, p_t)
        budget = float(steps) * f_t
        labels = ["scratch"]
        labels += [f"continue-{k}" for k in sorted({OPERATORS[o] for o in s["operators"]})]
        labels += [f"{o}/{c}" for o in s["operators"] for c in s["schedules"]]
        cap = float(s["cap"])
        predicted = sum(fractions.get(lab, 1.0 if lab == "scratch" else cap) for lab in labels) * budget
        upper = (1.0 + cap * (len(labels) - 1)) * budget
        n = len(plan["seeds"])
        sus = plan.get("sustained_flops")
        out.append(
            {
                **{k: s[k] for k in ("width", "depth", "small_width", "small_depth")},
                "parameters": p_t,
                "parameters_small_depth": meta_step_flops(s, s["width"], s["small_depth"])[1],
                "parameters_small_width": meta_step_flops(s, s["small_width"], s["depth"])[1],
                "step_flops": f_t,
                "steps": steps,
                "tokens": steps * s["batch_size"] * s["seq_len"],
                "budget_flops": budget,
                "runs_per_seed": len(labels),
                "seeds": n,
                "flops_predicted": n * predicted,
                "flops_upper": n * upper,
                "gpu_hours_predicted": None if sus is None else n * predicted / sus / 3600,
                "gpu_hours_upper": None if sus is None else n * upper / sus / 3600,
            }
        )
    return out


def target_out_dir(out: str | Path | None = None, *, quick: bool = False, suite_file: str | None = None) -> Path:
    """``out``, or ``widthscope-results/grow-target[-quick | -<suite file stem>]``."""
    tail = f"-{Path(suite_file).stem}" if suite_file else ("-quick" if quick else "")
    return Path(out or f"widthscope-results/grow-target{tail}")


def suite_cells(opts: GrowTargetOptions) -> list[dict[str, Any]]:
    """The cells of ``opts``: its suite's or its suite file's, with its overrides."""
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
            c["tokens_per_param"] = None
        for key in ("steps", "tokens_per_param", "decay", "operators", "schedules"):
            value = getattr(opts, key)
            if value is not None:
                c[key] = value
    return cells


def run_target(
    out: str | Path | None = None, options: GrowTargetOptions | None = None, **keywords: Any
) -> dict[str, Any]:
    """Run (or resume) the benchmark into ``out``; keywords override ``options``' fields. Returns
    ``rows``, ``table`` (one row per run label), ``summary`` and ``complete``."""
    opts = with_keywords("run_target", options, GrowTargetOptions, keywords)
    out_dir = target_out_dir(out, quick=opts.quick, suite_file=opts.suite_file)
    grid = suite_cells(opts)
    record = {"grow_target": opts.to_dict()}
    ids = own_cells(out_dir, grid, "grow-target run (suite, seeds, steps, operators or schedules differ)")
    t0 = time.perf_counter()
    res = run_grid(
        grid, run_target_cell, out_dir, desc=f"grow-target {opts.suite}", record=lambda c: {"options": record}
    )
    rows = [r for r in res.rows if r.get("cell_id") in ids]
    table = compare(rows)
    write_table(out_dir, table)
    every = [{k: v for k, v in c.items() if k not in ("seed", "kind", "suite")} for c in grid]
    settings = [s for i, s in enumerate(every) if s not in every[:i]]
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
