"""The cost plan of a sweep's ``--dry-run``: per distinct model and in total, without reading weights.

Each distinct model of the grid is counted once (an alignment family at one width; a suite's
checkpoint, keyed by its ``config.json``, so the revisions of one architecture count once):

* an alignment family is built on the *meta* device (no memory, no weights) with the data-dependent
  sizes read from its split; one probed example is counted as the probe runs it
  (:func:`widthscope.probe.cost.count_pass`: FLOPs forward and backward to the points, the live
  peak per example), and one training example as training runs it (forward, loss, backward to every
  parameter, :class:`torch.utils.flop_counter.FlopCounterMode`) times ``steps x batch_size``;
* a suite's checkpoint is planned by :func:`widthscope.planning.plan_certify` with
  ``time_run=False``: its architecture from ``config.json`` on the meta device, so a checkpoint
  whose weights are missing or damaged still plans.

A cell's FLOPs: the probe (``n_train + n_test`` examples per probe condition and length, forward and
backward) + the interventions' forwards (a whole forward each: an upper bound, the bias steps rerun
only the network after the point) + the training (alignment sweeps). The total sums the cells of
this shard that are not finished. The largest batch that fits: the device's free memory less the
resident weights and the pooled float64 samples, over the probe's peak per example.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from .. import models, probe
from .._io import format_table, human_size
from ..certification.run import device_memory
from ..errors import WidthscopeError
from ..options import CertifyOptions, CertifyRunOptions
from ..planning import Plan, plan_certify, time_statistics
from ..probe import resolve_points
from ..probe.batches import batch_size_of
from ..probe.cost import count_pass
from ..probe.insert import channel_dim
from ..probe.losses import logits_of
from .cell import _cell_monitor, cell_options
from .config import _where
from .pools import _batches, _load_split, _model_options, _probe_pools, probe_conditions, probe_lengths
from .schema import LM_DATASETS, FamilySpec, SweepConfig

__all__ = ["ModelCost", "alignment_costs", "suite_costs", "print_costs"]


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """What every cell of one distinct model costs; ``None`` where it could not be counted (``note``)."""

    label: str  # "family @ width" or the checkpoint
    cells: int  # cells of this shard with this model
    left: int  # of them not finished
    parameters: int | None = None
    weight_bytes: int | None = None
    dtype: str | None = None
    flops_forward: int | None = None  # one probed example
    flops_backward: int | None = None  # one probed example, to the points
    peak_bytes_per_example: int | None = None  # the probe pass's live peak
    sample_bytes: int | None = None  # pooled float64 samples of one cell
    probe_examples: int = 0  # probed examples of one cell (every condition and length)
    intervention_forwards: int = 0  # example-forwards of the interventions of one cell
    train_flops: int | None = None  # one cell's training (alignment sweeps)
    max_batch: int | None = None
    cell_s: float | None = None  # --plan: one cell's predicted wall time on this machine
    note: str | None = None

    @property
    def flops_per_example(self) -> int | None:
        if self.flops_forward is None or self.flops_backward is None:
            return None
        return self.flops_forward + self.flops_backward

    @property
    def cell_flops(self) -> int | None:
        """One cell: probe + interventions (a whole forward each) + training."""
        per = self.flops_per_example
        if per is None or self.flops_forward is None:
            return None
        return per * self.probe_examples + self.flops_forward * self.intervention_forwards + (self.train_flops or 0)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(flops_per_example=self.flops_per_example, cell_flops=self.cell_flops)
        return d


def _steps(options: CertifyOptions) -> int:
    return len(options.etas) if options.etas is not None else options.n_etas


def _interventions(options: CertifyOptions, points: int) -> int:
    """Example-forwards of a cell's interventions: each step over the largest ``K``, per point."""
    if options.kind not in ("bias", "block"):
        return 0
    return points * _steps(options) * max(k for _, k in options.pairs)


# ----------------------------------------------------------------------------- alignment sweeps
def _example(split: Any, model: torch.nn.Module) -> Any:
    """One training example as the probe and the training take it, on the model's device."""
    where = next(iter(p.device for p in model.parameters()))
    X, y = split.train[0][:1], split.train[1][:1]
    if split.task == "lm":
        return X.to(where)
    return X.to(where), y.to(where)


def _train_flops(model: torch.nn.Module, batch: Any, lm: bool) -> int:
    """FLOPs of one training example: forward, the loss, the backward to every parameter."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    try:
        with FlopCounterMode(display=False) as fc, torch.enable_grad():
            if lm:
                logits = logits_of(model(batch))
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            else:
                loss = F.cross_entropy(logits_of(model(batch[0])), batch[1])
            loss.backward()
        return int(fc.get_total_flops())
    finally:
        for p, f in zip(params, flags):
            p.grad = None
            p.requires_grad_(f)


def _build(fam: FamilySpec, width: float, split: Any) -> torch.nn.Module:
    opts = _model_options(fam, split)
    try:
        with torch.device("meta"):
            return models.build(fam.model, width, **opts)
    except (RuntimeError, NotImplementedError):  # an init the meta device cannot run: these models are small
        return models.build(fam.model, width, **opts)


def _alignment_cost(cfg: SweepConfig, fam: FamilySpec, width: float, budget: int) -> dict[str, Any]:
    """The counted fields of :class:`ModelCost` for one family at one width."""
    try:
        split = _load_split(fam, budget, cfg)
    except (WidthscopeError, OSError) as exc:
        return {"note": f"data not read ({str(exc)[:200]}): not counted"}
    model = _build(fam, width, split)
    opts = cell_options(cfg, {"family": fam.name, "seed": 0})
    names = resolve_points(model, fam.points or None)
    batch = _example(split, model)
    c = count_pass(model, batch, names)
    dims = 0
    for shape in c["shapes"].values():
        z = torch.empty(shape, device="meta")
        dims += z[0].numel() if opts.pool == "flatten" or z.ndim < 2 else int(shape[channel_dim(z)])
    conditions = sum(len(probe_lengths(fam, c_)) for c_ in probe_conditions(fam))
    per_train = _train_flops(model, batch, fam.dataset in LM_DATASETS)
    batch_size = min(int(fam.train.get("batch_size", 64)), budget)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    samples = 8 * dims * (fam.n_probe_train + fam.n_probe_test) * conditions
    free, _ = device_memory(cfg.device)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": weights,
        "dtype": str(next(iter(model.parameters())).dtype).removeprefix("torch."),
        "flops_forward": int(c["flops_forward"]),
        "flops_backward": int(c["flops_backward"]),
        "peak_bytes_per_example": int(c["peak_bytes"]),
        "sample_bytes": samples,
        "probe_examples": (fam.n_probe_train + fam.n_probe_test) * conditions,
        "intervention_forwards": _interventions(opts, len(names)),
        "train_flops": per_train * int(fam.train["steps"]) * batch_size,
        "max_batch": max_batch(free, weights, samples, int(c["peak_bytes"])),
    }


def _best_of_two(fn: Callable[[], Any]) -> float:
    """Seconds of ``fn()``, the faster of two calls (the first warms up)."""
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _alignment_time(cfg: SweepConfig, fam: FamilySpec, width: float, budget: int, counted: Mapping[str, Any]) -> float:
    """``--plan``: one cell's wall time on a model built for real on ``[sweep].device``, as
    :func:`~widthscope.sweeps.cell.run_cell` spends it: the training (one timed step: forward, loss,
    backward, AdamW, at the training batch size, x steps); per probe condition and length (its own
    pools, drawn as the cell draws them) one timed probed batch x the pools' batches, and the
    statistics of every point timed on random samples of the pools' sizes and the point's width
    (:func:`widthscope.planning.time_statistics`); the interventions' forwards at the probe's
    forward share; and with a ``monitor`` table one timed monitor probe x its steps."""
    split = _load_split(fam, budget, cfg)
    torch.manual_seed(0)
    model = models.build(fam.model, width, **_model_options(fam, split)).to(cfg.device)
    train_s = int(fam.train["steps"]) * _step_time(model, fam, split, budget, cfg.device)
    model.eval()
    opts = cell_options(cfg, {"family": fam.name, "seed": 0})
    points = list(opts.points or ()) or probe.insertion_points(model)
    probe_s = stats_s = 0.0
    per_example = None
    timed: dict[tuple[int, int, int, int], float] = {}
    for cond in probe_conditions(fam):
        for L in probe_lengths(fam, cond):
            pa, pb, _, _ = _probe_pools(fam, cond, L, split, cfg)
            one = _batches(pa, split.task, fam.probe_batch_size)[:1]
            got: dict[str, torch.Tensor] = {}

            def probed(one: list[Any] = one, got: dict[str, torch.Tensor] = got) -> None:
                got.update(
                    probe.collect(model, one, points=points, pool=opts.pool, train_mode=opts.train_mode, progress=False)
                )

            batch_s = _best_of_two(probed)
            n_a, n_b = len(pa[0]), len(pb[0])
            in_batch = batch_size_of(one[0])
            probe_s += batch_s * (math.ceil(n_a / in_batch) + math.ceil(n_b / in_batch))
            if per_example is None:  # the interventions run on the first condition and length
                per_example = batch_s / in_batch
            for p in points:  # points of one width are timed once
                key = (n_a, n_b, int(got[p].shape[1]), max(1, got[p].shape[0] // in_batch))
                if key not in timed:
                    timed[key] = time_statistics(opts, key[:2], key[2], key[3])
                stats_s += timed[key]
    share = counted["flops_forward"] / max(1, counted["flops_forward"] + counted["flops_backward"])
    intervene_s = (per_example or 0.0) * share * counted["intervention_forwards"]
    return train_s + probe_s + stats_s + intervene_s + _monitor_time(cfg, fam, split, model, opts)


def _step_time(model: torch.nn.Module, fam: FamilySpec, split: Any, budget: int, device: str) -> float:
    """One training step (forward, loss, backward, AdamW), the faster of two."""
    lm = fam.dataset in LM_DATASETS
    bs = min(int(fam.train.get("batch_size", 64)), budget)
    train_batch = _batches((split.train[0][:bs], split.train[1][:bs]), split.task, bs)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=float(fam.train["lr"]))
    where = next(iter(model.parameters())).device

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if lm:
            ids = train_batch.to(where)
            logits = logits_of(model(ids))
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        else:
            x, y = (t.to(where) for t in train_batch)
            loss = F.cross_entropy(logits_of(model(x)), y)
        loss.backward()
        opt.step()

    return _best_of_two(step)


def _monitor_time(cfg: SweepConfig, fam: FamilySpec, split: Any, model: torch.nn.Module, opts: Any) -> float:
    """A ``monitor`` table's probes: one monitor probe timed (the faster of two), x its steps."""
    if fam.monitor is None:
        return 0.0
    with tempfile.TemporaryDirectory(prefix="widthscope-plan-monitor-") as tmp:  # its log: not the results folder
        mon, _ = _cell_monitor(cfg, fam, split, model, opts, Path(tmp))
        calls = iter(range(2))
        one = _best_of_two(lambda: mon.probe(model, next(calls)))
    return one * len(fam.monitor["steps"])


def alignment_costs(
    cfg: SweepConfig,
    cells: Sequence[Mapping[str, Any]],
    done: Callable[[Mapping[str, Any]], bool],
    *,
    timed: bool = False,
) -> list[ModelCost]:
    """One :class:`ModelCost` per distinct (family, width) of ``cells`` (``done``: finished cells);
    ``timed`` (``--plan``): with each cell's predicted wall time."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["family"], c["width"]), []).append(c)
    out = []
    for (name, width), these in groups.items():
        fam = next(f for f in cfg.families if f.name == name)
        try:
            counted = _alignment_cost(cfg, fam, width, int(these[0]["budget"]))
            if timed and "flops_forward" in counted:
                counted["cell_s"] = _alignment_time(cfg, fam, width, int(these[0]["budget"]), counted)
        except WidthscopeError as exc:
            raise WidthscopeError(f"{_where(f'family {name!r}')} at width {width}: {exc}") from None
        left = sum(1 for c in these if not done(c))
        out.append(ModelCost(label=f"{name} @ {width}", cells=len(these), left=left, **counted))
    return out


# ----------------------------------------------------------------------------- suites
def max_batch(free: int | None, resident: int, held: int, per_example: int) -> int | None:
    """The largest batch whose ``per_example`` bytes fit in ``free`` beside ``resident`` weights and
    ``held`` bytes (None where free memory or the per-example cost is unknown)."""
    if free is None or per_example <= 0:
        return None
    return max(0, (free - resident - held) // per_example)


def _from_plan(p: Plan) -> dict[str, Any]:
    """A suite checkpoint's row from its ``certify --plan`` (:func:`widthscope.planning.plan_certify`):
    its work, not the process's start (the sweep's own, once)."""
    work = [t for n, t in p.parts if not n.startswith("process start")]
    return {
        "cell_s": sum(t for t in work if t is not None) if p.timed else None,
        "parameters": p.parameters,
        "weight_bytes": p.weight_bytes,
        "dtype": p.dtype,
        "peak_bytes_per_example": p.bytes_per_example,
        "sample_bytes": p.sample_bytes,
        "probe_examples": p.examples,
        "max_batch": p.max_batch,
    }


def suite_costs(
    cfg: Any,
    cells: Sequence[Mapping[str, Any]],
    done: Callable[[Mapping[str, Any]], bool],
    directory: Callable[[Mapping[str, Any]], Path | None],
    *,
    timed: bool = False,
) -> list[ModelCost]:
    """One :class:`ModelCost` per distinct checkpoint architecture of a suite's ``cells``
    (``directory``: a cell's local snapshot, None when not cached: not counted); ``timed``
    (``--plan``): the weights loaded and a batch timed (:func:`~widthscope.planning.plan_certify`'s
    prediction of one cell)."""
    groups: dict[tuple[str, str], list[tuple[Mapping[str, Any], Path | None]]] = {}
    for c in cells:
        where = directory(c)
        cfg_file = where / "config.json" if where is not None else None
        key = (
            hashlib.sha256(cfg_file.read_bytes()).hexdigest()
            if cfg_file is not None and cfg_file.is_file()
            else f"missing {c['model']} {c['revision']}"
        )
        groups.setdefault((c["model"], key), []).append((c, where))
    run = CertifyRunOptions(batch_size=cfg.batch_size, device=cfg.device)
    out = []
    for (model, key), these in groups.items():
        cell, where = these[0]
        revs = sorted({str(c["revision"] or "default") for c, _ in these})
        label = f"{model} @ {', '.join(revs)}"
        left = sum(1 for c, _ in these if not done(c))
        if where is None or key.startswith("missing"):
            out.append(ModelCost(label=label, cells=len(these), left=left, note="not cached: not counted"))
            continue
        # the local snapshot itself: no hub call, and the revision's own files
        spec = dataclasses.replace(cfg.spec(model, cell["revision"]), model=str(where), revision=None)
        try:
            counted = _from_plan(plan_certify(spec, cfg.certify, run, time_run=timed))
        except WidthscopeError as exc:
            raise WidthscopeError(
                f"sweep config [suite] model {model!r} revision {cell['revision']!r}: {exc}"
            ) from None
        out.append(ModelCost(label=label, cells=len(these), left=left, **counted))
    return out


# ----------------------------------------------------------------------------- printing
def _g(v: int | None) -> str:
    return "?" if v is None else f"{v:.3g}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 60:.3g} min" if seconds < 7200 else f"{seconds / 3600:.3g} h"


def print_costs(costs: Sequence[ModelCost], shard: tuple[int, int], device: str) -> None:
    """The cost table (one row per distinct model) and the total over the unfinished cells."""
    timed = any(c.cell_s is not None for c in costs)
    rows = [
        {
            "model": c.label,
            "cells (left)": f"{c.cells} ({c.left})",
            "parameters": "?" if c.parameters is None else f"{c.parameters:,}",
            "weights": "?" if c.weight_bytes is None else f"{human_size(c.weight_bytes)} {c.dtype}",
            "FLOPs / probed example": _g(c.flops_per_example),
            "probe peak / example": "?" if c.peak_bytes_per_example is None else human_size(c.peak_bytes_per_example),
            "largest batch": "?" if c.max_batch is None else c.max_batch,
            "training FLOPs / cell": "-" if c.train_flops is None else _g(c.train_flops),
            "FLOPs / cell": _g(c.cell_flops),
            **({"time / cell": "?" if c.cell_s is None else _duration(c.cell_s)} if timed else {}),
            "note": c.note or "",
        }
        for c in costs
    ]
    free, source = device_memory(device)
    k, n = shard
    print(format_table(rows, title=f"cost plan (counted without weights; memory: {source} on {device})"))
    counted = [c for c in costs if c.cell_flops is not None]
    left = sum(c.left for c in costs)
    total = sum((c.cell_flops or 0) * c.left for c in counted)
    train = sum((c.train_flops or 0) * c.left for c in counted)
    unknown = sum(c.left for c in costs if c.cell_flops is None)
    peak = max(
        ((c.weight_bytes or 0) + (c.sample_bytes or 0) + (c.peak_bytes_per_example or 0) for c in counted if c.left),
        default=0,
    )  # weights + samples + one probed example
    print(
        f"total over the {left} unfinished cell(s) of shard {k}/{n}: {total:.3g} FLOPs"
        + (f" (training {train:.3g})" if train else "")
        + (f"; the largest cell holds {human_size(peak)} at probe batch 1" if peak else "")
        + (f" of {human_size(free)} free" if free is not None and peak else "")
        + (f"; {unknown} cell(s) not counted" if unknown else "")
        + (
            f"; e.g. {_duration(total / 1e11)} at 1e11 FLOP/s (a CPU), {_duration(total / 3e13)} at 3e13 (a GPU)"
            if total
            else ""
        )
    )
    if timed:
        secs = sum((c.cell_s or 0.0) * c.left for c in costs)
        untimed = sum(c.left for c in costs if c.cell_s is None)
        print(
            f"predicted wall time of the {left} unfinished cell(s) on this machine: {_duration(secs)} ("
            + (
                "one timed training step, probed batch and statistics per model and probe condition"
                if any(c.train_flops is not None for c in costs)
                else "one timed batch per model"
            )
            + (f"; {untimed} cell(s) not timed" if untimed else "")
            + ")"
        )
