"""The cost plan of a ``widthscope linearize`` sweep (``linearize --plan``): before any cell trains.

:func:`plan_linearize` takes the sweep config (as :func:`widthscope.linearization.run.run_sweep`)
and returns a :class:`~widthscope.probe.cost_plan.TrainPlan` with one stage per width (its cells:
seeds x alphas, each ``train.steps`` steps of the network and its linearization side by side):

- parameters, weight bytes at the config's dtype, optimizer state (``sgd``: none; ``adam(w)``: two
  moments), activation memory per example and the largest batch that fits (a training step of
  the network counted on one example and on the run's batch by :func:`widthscope.probe.cost.count_step`; the
  linear model is a second copy of the weights with the same shapes, so the stage's memory counts
  the weights, the optimizer state and the activations twice);
- the memory of a cell beyond its steps (:func:`cell_bytes`): one cell of the widest width run
  for one step and counted (:func:`~widthscope.probe.cost.live_peak`): the frozen kernel, its
  eigenbasis and predictions, the kernel drift's kernels, the correlations; held beside it, the
  data. With ``time_run`` the cell, and loading the data, are also measured as the run is
  (the resident peak in a fresh process, :func:`~widthscope.probe.resident.resident_peak`, before
  anything else runs) and the larger taken, the label saying which. The run's memory is the
  larger of that cell and the largest step, + the data;
- FLOPs per training example of the network's step (``FlopCounterMode``); the linear model's step
  (a Jacobian-vector product, or the kernel form) is in the timed cell, not in the FLOPs;
- with ``time_run`` (the default) one whole cell of each width is run and timed (its logs
  included: the deviation, the kernel drift and the kernel prediction at every logged step; a
  cell's cost depends on the width, not on the seed or alpha), and the derivative correlations are
  timed once per width on the untrained model and counted per seed. Predicted time = cells x cell
  time + correlations + loading the data. A cell whose loss diverges stops early
  (``on_nonfinite="stop"``): the steps, and the time, are an upper bound.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Mapping

import torch

from ..linear.correlation import correlation_summary, parse_correlation_name
from ..models import build
from ..probe.cost import count_step, live_peak
from ..probe.cost_plan import TrainPlan, TrainStage, device_memory, stage_of
from ..probe.resident import larger, resident_peak
from .config import make_cells, validate_config
from .run import _DATA_CACHE, _data, run_cell

__all__ = ["plan_linearize"]


def _model(cfg: Mapping[str, Any], width: int, in_dim: int, k: int) -> torch.nn.Module:
    m = cfg["model"]
    torch.manual_seed(0)
    return build(
        "mlp",
        width,
        in_dim=in_dim,
        out_dim=k,
        depth=m["depth"],
        activation=m["activation"],
        parametrization=m["parametrization"],
        sigma_w=m["sigma_w"],
    ).to(getattr(torch, cfg["train"]["dtype"]))


def _stage(cfg: Mapping[str, Any], width: int, cells: list[dict[str, Any]], time_run: bool) -> tuple[TrainStage, float]:
    """One width's stage and the seconds of its cells beyond their steps (logs, correlations)."""
    (X, Y), _, k, _ = _data(cfg)
    tr = cfg["train"]
    bs = int(tr["batch_size"]) or X.shape[0]
    model = _model(cfg, width, X.shape[1], k)
    target = Y if tr["loss"] == "mse" else Y.long()
    counted = count_step(model, ((X[:1], target[:1]), (X[:bs], target[:bs])), _loss(tr["loss"]))
    counted = {**counted, "activation_bytes_per_example": 2 * counted["activation_bytes_per_example"]}
    counted["fixed_bytes"] = 2 * counted["fixed_bytes"]
    optimizer = "adamw" if tr["optimizer"] in ("adam", "adamw") else "sgd"
    stage = stage_of(
        f"width {width} (network + linearization)",
        counted,
        model,
        runs=len(cells),
        steps=int(tr["steps"]),
        batch_size=bs,
        optimizer=optimizer,
        bound=True,
    )
    stage = _doubled(stage)
    if not time_run:
        return stage, 0.0
    plain = next((c for c in cells if not c["correlations"]), cells[0])
    t0 = time.perf_counter()
    run_cell(cfg, {**plain, "correlations": False})
    cell_s = time.perf_counter() - t0
    with_corr = [c for c in cells if c["correlations"]]
    corr_s = _time_correlations(cfg, model, X) if with_corr else 0.0
    step = cell_s / max(1, int(tr["steps"]))  # the whole cell, logs included, spread over its steps
    return dataclasses.replace(stage, step_s=step), len(with_corr) * corr_s


def _time_correlations(cfg: Mapping[str, Any], model: torch.nn.Module, X: torch.Tensor) -> float:
    """The derivative correlations one cell measures (on the untrained model: the same cost)."""
    c, eta0 = cfg["correlations"], cfg["train"]["eta0"]
    t0 = time.perf_counter()
    for name in c["measure"]:
        D, d = parse_correlation_name(name)
        correlation_summary(model, X, D=D, d=d, n_tuples=c["n_tuples"], eta=eta0, output=c["output"], seed=0)
    return time.perf_counter() - t0


def cell_bytes(cfg: Mapping[str, Any], cell: Mapping[str, Any]) -> int:
    """One cell's memory: the cell run for one step (logged at 0 and 1) and counted
    (:func:`~widthscope.probe.cost.live_peak`): the network's copy and its optimizer, the linear model
    or the frozen kernel ``Θ₀(X ∪ X_t, X)`` with its eigenbasis and kernel predictions, the kernel
    drift's kernels on the probe set, the derivative correlations where the cell measures them. A
    cell's memory does not grow with its steps (its rows are a few numbers per logged step)."""
    return live_peak(_one_step(cfg, cell))[1]


def _one_step(cfg: Mapping[str, Any], cell: Mapping[str, Any]) -> Any:
    short = {**cfg, "train": {**cfg["train"], "steps": 1, "log_steps": [0, 1]}}
    return functools.partial(run_cell, short, cell)


def _load_uncached(cfg: Mapping[str, Any]) -> Any:
    """Loading the data as the run loads it: not from the cache (the measurement's warm-up fills it)."""
    _DATA_CACHE.clear()
    return _data(cfg)


def _doubled(stage: TrainStage) -> TrainStage:
    """The linear model: a second set of weights (and optimizer state) of the same shapes."""
    return dataclasses.replace(stage, weight_bytes=2 * stage.weight_bytes, trainable_bytes=2 * stage.trainable_bytes)


def _loss(name: str) -> Any:
    if name == "mse":
        return lambda out, y: ((out - y) ** 2).sum(-1)
    return None  # cross-entropy: the default classification loss


def plan_linearize(config: Mapping[str, Any], *, time_run: bool = True) -> TrainPlan:
    """The cost plan of ``run_sweep(config, ...)`` (every cell, no shard): nothing written. See the
    module docstring."""
    cfg = validate_config(config)
    cells = make_cells(cfg)
    widest = max(int(w) for w in cfg["widths"])  # the cells' memory grows with the width
    at = [c for c in cells if c["width"] == widest]
    cell = next((c for c in at if c["correlations"]), at[0])
    # measured first: where a work falls back to a forked child, this process's heap is not yet in pieces
    loaded = resident_peak(functools.partial(_load_uncached, cfg)) if time_run else None
    # warmed up on the narrowest width: the same code runs, and what the widest shapes add on first use
    # (the kernels' cached buffers) is counted, as in the run
    narrow = {**cell, "width": min(int(w) for w in cfg["widths"])}
    measured = resident_peak(_one_step(cfg, cell), warm=_one_step(cfg, narrow)) if time_run else None
    t0 = time.perf_counter()
    (X, Y), (Xt, Yt), _, words = _data(cfg)
    load_s = time.perf_counter() - t0
    stages, fixed = [], 0.0
    for w in cfg["widths"]:
        stage, f = _stage(cfg, int(w), [c for c in cells if c["width"] == int(w)], time_run)
        stages.append(stage)
        fixed += f
    data_bytes = sum(t.numel() * t.element_size() for t in (X, Y, Xt, Yt))
    cell_b, how = cell_bytes(cfg, cell), "counted at one step"
    held = [("data", data_bytes)]
    notes: list[str] = []
    if measured is not None:  # measured as the run is measured: the resident peak of the cell's step
        cell_b, how = larger(cell_b, measured)
        how = "measured on one step" if how == "measured" else "counted at one step"
    phases = [(f"one cell at width {widest} ({how})", cell_b)]
    if loaded is not None and loaded.peak is not None:  # loading's own peak beyond the tensors it keeps
        phases.insert(0, ("loading the data (measured)", max(0, loaded.peak - data_bytes)))
    elif loaded is not None:
        notes.append(f"memory counted, not measured: {loaded.why}")
    free, source = device_memory("cpu")
    largest = max(stages, key=lambda s: s.weight_bytes)
    predicted = sum(s.train_s or 0.0 for s in stages) + fixed + load_s if time_run else None
    notes += [
        f"{len(cells)} cells ({len(cfg['widths'])} widths x {len(cfg['seeds'])} seeds x "
        f"{len(cfg['train']['alphas'])} alphas) on {words}",
        "steps are an upper bound: a diverging cell stops early",
    ]
    if not time_run:
        notes.append("no time predicted (--plan-no-time)")
    return TrainPlan(
        command="linearize",
        model=f"mlp depth {cfg['model']['depth']}, widths {', '.join(str(w) for w in cfg['widths'])}",
        dtype=str(cfg["train"]["dtype"]),
        dtype_source="the config's train.dtype",
        counted_on="loaded",
        parameters=largest.parameters,
        weight_bytes=largest.weight_bytes // 2,
        stages=tuple(stages),
        device="cpu",
        memory_bytes=free,
        memory_source=source,
        other_bytes=tuple(held),
        phases=tuple(phases),
        other_s=(("data", load_s), ("correlations", fixed)) if time_run else (),
        predicted_s=predicted,
        notes=tuple(notes),
    )
