"""A training run's cost plan (``grow --plan``, ``grow-bench --plan``, ``grow-target --plan``,
``linearize --plan``): what each kind of training step costs, how often it runs, what fits.

A :class:`TrainStage` is one kind of training step (a model, its trainable parameters, an
optimizer, a batch size) counted once by :func:`widthscope.probe.cost.count_step` and, with
timing, timed once (:func:`time_steps`); a :class:`TrainPlan` is the run: its stages, the other
work timed or counted beside them (probes, evaluations, loading), the device's free memory, the
largest batch that fits and the predicted wall time. Both are frozen dataclasses with ``to_dict()``;
``TrainPlan.table()`` is what the commands print.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from .._io import format_table, human_size
from .cost import losses, optimizer_bytes

__all__ = [
    "tensor_bytes",
    "seconds_text",
    "TrainStage",
    "TrainPlan",
    "device_memory",
    "max_batch",
    "time_steps",
    "time_loop",
    "stage_of",
]


def tensor_bytes(data: Any) -> int:
    """Bytes of the tensors in ``data`` (nested tuples, lists, mappings), each storage once."""
    seen: dict[int, int] = {}
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        elif isinstance(x, Mapping):
            stack.extend(x.values())
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
    return sum(seen.values())


def seconds_text(v: float | None) -> str:
    """A plan table's seconds ("-" where nothing was timed)."""
    return "-" if v is None else f"{v:.3g} s"


@dataclasses.dataclass(frozen=True)
class TrainStage:
    """One kind of training step and how often it runs. Bytes are bytes, FLOPs per example
    (``FlopCounterMode``: matmuls, convolutions, attention), times seconds."""

    name: str
    runs: int  # how many separate trainings of this kind
    steps: int  # steps of each (an upper bound where ``bound``)
    batch_size: int
    optimizer: str  # "adamw", "adam", "sgd", "sgd-momentum"
    parameters: int  # of the model trained
    trainable: int
    weight_bytes: int
    trainable_bytes: int
    flops_forward: int
    flops_backward: int
    activation_bytes_per_example: int  # the step's live peak per example (saved tensors, transients)
    fixed_bytes: int  # the step's live peak that does not grow with the batch (weight gradients, ...)
    step_s: float | None = None
    bound: bool = False  # steps is an upper bound (early stopping)

    @property
    def flops_per_example(self) -> int:
        return self.flops_forward + self.flops_backward

    @property
    def optimizer_bytes(self) -> int:
        return optimizer_bytes(self.optimizer, self.trainable_bytes)

    @property
    def batch_bytes(self) -> int:
        """Activation + gradient memory of one step at ``batch_size``."""
        return self.activation_bytes_per_example * self.batch_size + self.fixed_bytes

    @property
    def step_bytes(self) -> int:
        """Weights + optimizer state + one step's activations and gradients."""
        return self.weight_bytes + self.optimizer_bytes + self.batch_bytes

    @property
    def flops(self) -> int:
        """Every step of every run."""
        return self.runs * self.steps * self.batch_size * self.flops_per_example

    @property
    def train_s(self) -> float | None:
        return None if self.step_s is None else self.runs * self.steps * self.step_s

    def max_batch(self, free: int | None) -> int | None:
        """The largest batch whose step fits in ``free`` bytes."""
        if free is None or self.activation_bytes_per_example <= 0:
            return None
        room = free - self.weight_bytes - self.optimizer_bytes - self.fixed_bytes
        return max(0, room // self.activation_bytes_per_example)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(
            flops_per_example=self.flops_per_example,
            optimizer_bytes=self.optimizer_bytes,
            batch_bytes=self.batch_bytes,
            step_bytes=self.step_bytes,
            flops=self.flops,
            train_s=self.train_s,
        )
        return d


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What a training command will cost. ``other_s``: the work beside the training steps, each
    timed (probes, evaluations, loading: ``(what, seconds)``); ``other_bytes``: memory held beside
    the steps (data pools, pooled samples, a second copy of the model: ``(what, bytes)``);
    ``predicted_s`` = the stages' steps x step time + ``other_s``; ``None`` without timing."""

    command: str
    model: str
    dtype: str
    dtype_source: str
    counted_on: str  # "meta" (no weights read) or "loaded"
    parameters: int
    weight_bytes: int
    stages: tuple[TrainStage, ...]
    device: str
    memory_bytes: int | None
    memory_source: str
    other_bytes: tuple[tuple[str, int], ...] = ()
    phases: tuple[tuple[str, int], ...] = ()  # memory of the work between the steps (probes): (what, bytes)
    other_s: tuple[tuple[str, float], ...] = ()
    predicted_s: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        """The run's memory as planned: the largest step or other phase, plus what is held beside it."""
        largest = max([s.step_bytes for s in self.stages] + [b for _, b in self.phases], default=self.weight_bytes)
        return largest + sum(b for _, b in self.other_bytes)

    @property
    def max_batch(self) -> int | None:
        """The largest batch that fits every stage (beside what is held)."""
        if self.memory_bytes is None:
            return None
        free = self.memory_bytes - sum(b for _, b in self.other_bytes)
        fits = [m for m in (s.max_batch(free) for s in self.stages) if m is not None]
        return min(fits) if fits else None

    @property
    def train_flops(self) -> int:
        return sum(s.flops for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stages"] = [s.to_dict() for s in self.stages]
        d["other_bytes"] = dict(self.other_bytes)
        d["phases"] = dict(self.phases)
        d["other_s"] = dict(self.other_s)
        d["notes"] = list(self.notes)
        d.update(peak_bytes=self.peak_bytes, max_batch=self.max_batch, train_flops=self.train_flops)
        return d

    def table(self) -> str:
        """The plan as the terminal shows it (``widthscope._io.format_table``): the stages, then the run."""

        stages = [
            {
                "stage": s.name,
                "runs x steps": f"{s.runs} x {s.steps}{' (at most)' if s.bound else ''}",
                "batch": s.batch_size,
                "optimizer": s.optimizer,
                "trainable": f"{s.trainable:,} of {s.parameters:,}",
                "FLOPs/example": f"{s.flops_per_example:.3g}",
                "optimizer state": human_size(s.optimizer_bytes),
                "activations/example": human_size(s.activation_bytes_per_example),
                "step memory": human_size(s.step_bytes),
                "one step": seconds_text(s.step_s),
                "all steps": seconds_text(s.train_s),
            }
            for s in self.stages
        ]
        rows: list[tuple[str, Any]] = [
            ("model", self.model),
            ("dtype assumed", f"{self.dtype} ({self.dtype_source})"),
            ("counted on", "the meta device (no weights read)" if self.counted_on == "meta" else "the loaded model"),
            ("parameters", f"{self.parameters:,}"),
            ("weights", human_size(self.weight_bytes)),
        ]
        rows += [(f"held beside the steps: {what}", human_size(b)) for what, b in self.other_bytes]
        rows += [(f"between the steps: {what}", human_size(b)) for what, b in self.phases]
        rows += [(f"timed: {what}", seconds_text(v)) for what, v in self.other_s]
        rows += [
            ("run memory (largest step or phase + held)", human_size(self.peak_bytes)),
            (f"memory ({self.memory_source})", None if self.memory_bytes is None else human_size(self.memory_bytes)),
            ("largest batch that fits", self.max_batch),
            ("training FLOPs (all steps)", f"{self.train_flops:.3g}"),
            ("predicted wall time", None if self.predicted_s is None else seconds_text(self.predicted_s)),
        ]
        first = format_table(stages, list(stages[0]) if stages else ["stage"], title=f"training stages: {self.command}")
        second = format_table([{"what": k, "plan": v} for k, v in rows], ["what", "plan"], title="cost plan")
        return first + "\n\n" + second + "".join(f"\nnote: {n}" for n in self.notes)


def device_memory(device: torch.device | str) -> tuple[int | None, str]:
    """Free memory of the run's device: CUDA ``mem_get_info``, else ``MemAvailable``."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device}"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    return None, "unknown (no /proc/meminfo)"


def max_batch(free: int | None, resident: int, held: int, per_example: int) -> int | None:
    """The largest batch whose ``per_example`` bytes fit in ``free`` beside ``resident`` weights and
    ``held`` bytes (None where free memory or the per-example cost is unknown)."""
    if free is None or per_example <= 0:
        return None
    return max(0, (free - resident - held) // per_example)


def _optimizer(name: str, params: Sequence[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name in ("adam", "adamw"):
        return torch.optim.AdamW(list(params), lr=lr, weight_decay=0.0)
    return torch.optim.SGD(list(params), lr=lr, momentum=0.9 if name == "sgd-momentum" else 0.0)


def time_steps(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable | None = None,
    *,
    trainable: Callable[[nn.Module], Sequence[nn.Parameter]] | None = None,
    optimizer: str = "adamw",
    lr: float = 1e-6,
    repeats: int = 3,
) -> float:
    """Seconds of one training step (forward, backward, optimizer step; eval mode) on ``batch``: the
    best of ``repeats`` after one warm-up step, on a copy of ``model`` (the caller's weights stay).
    ``trainable(copy)`` picks the parameters trained (default: all)."""
    work = copy.deepcopy(model)
    params = list(work.parameters()) if trainable is None else list(trainable(work))
    ids = {id(p) for p in params}
    for p in work.parameters():
        p.requires_grad_(id(p) in ids)
    work.eval()
    opt = _optimizer(optimizer, params, lr)
    best = math.inf
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        losses(work, batch, loss_fn).mean().backward()
        opt.step()
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


def time_loop(run: Callable[[int], Any], small: int = 2, large: int = 6, min_s: float = 0.2) -> tuple[float, float]:
    """``(fixed_s, step_s)`` of a training loop ``run(steps)`` (the caller's own loop, on a copy):
    timed at ``small`` and ``large`` steps after a one-step warm-up; the step time is the slope,
    what is left of the small run is the loop's fixed cost (evaluations, set-up). Python's per-step
    overhead (batch indexing, checks, the optimizer's bookkeeping) is in the slope, which a bare
    forward/backward (:func:`time_steps`) misses on small models. Where the ``large`` run takes
    less than ``min_s`` seconds, it is timed again at as many steps as fill ``min_s`` (at most 50x
    ``large``): a slope over a few milliseconds is mostly the clock's and the machine's noise."""
    run(1)
    got = []
    for k in (small, large):
        t0 = time.perf_counter()
        run(k)
        got.append(time.perf_counter() - t0)
    if got[1] < min_s:
        large = min(50 * large, max(large + 1, math.ceil(large * min_s / max(got[1], 1e-6))))
        t0 = time.perf_counter()
        run(large)
        got[1] = time.perf_counter() - t0
    step = max(0.0, (got[1] - got[0]) / (large - small))
    return max(0.0, got[0] - small * step), step


def stage_of(name: str, counted: dict[str, Any], model: nn.Module, **fields: Any) -> TrainStage:
    """A :class:`TrainStage` from :func:`widthscope.probe.cost.count_step`'s counts of ``model``."""
    return TrainStage(
        name=name,
        parameters=sum(p.numel() for p in model.parameters()),
        trainable=counted["trainable"],
        weight_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        trainable_bytes=counted["trainable_bytes"],
        flops_forward=counted["flops_forward"],
        flops_backward=counted["flops_backward"],
        activation_bytes_per_example=counted["activation_bytes_per_example"],
        fixed_bytes=counted["fixed_bytes"],
        **fields,
    )
