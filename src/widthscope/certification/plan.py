"""A cost plan before a certify run (``widthscope certify --plan``): what the run will need, before it runs.

:func:`plan_run` takes the same typed settings as :func:`widthscope.certification.run.run_certify` and
returns a :class:`CostPlan`:

1. the model's structure: a Hugging Face checkpoint directory is built from its ``config.json`` on
   the *meta* device (accelerate's ``init_empty_weights`` and the task's Auto class ``from_config``:
   no weight is read); widthscope checkpoints and the built-in model are small and built for real.
   Parameters and weight bytes at the dtype the run will use (``--dtype``, else the checkpoint's);
2. one probed example, counted as the probe runs it (forward, then one backward to the insertion
   points with the parameters frozen): FLOPs (``torch.utils.flop_counter.FlopCounterMode``, forward
   and backward apart; attention through its matmuls, the math kernel) and the bytes autograd
   saves (``saved_tensors_hooks``; weights excluded, each storage once; attention as the run's
   kernel keeps it: :mod:`widthscope.probe.cost`), the activation gradients at the points, and the
   live peak of the pass (every tensor from the op that makes it until it
   dies, a ``TorchDispatchMode``; also for a forward without gradients, as the interventions run
   it). All scale with the batch;
3. the run's memory: weights + pooled float64 samples + the held-out outputs before each point the
   bias interventions keep (``K`` examples) + the larger of a probed batch and a stacked
   intervention pass (64 rows); the largest batch that fits: the device's free memory (CPU:
   ``MemAvailable``; CUDA: ``torch.cuda.mem_get_info``) less the resident weights (within
   ``--max-memory`` with a device map), the samples and the kept prefix, over the probe's peak
   per example;
4. with ``time_batch=True`` (the default) the weights are loaded and one probed batch is timed
   (after a warm-up batch), the statistics of one point are timed on random samples of the run's
   shapes, and the whole run is predicted: load + inputs + probe batches + statistics × points +
   intervention forward passes (counted: ``n_etas`` stacked steps over the ``K`` held-out examples
   per point, each costing the share of the forward FLOPs after its point — the bias steps rerun
   only that part — at the timed batch's speed). The built-in model's training is not counted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .._io import format_table, human_size
from ..data.inputs import resolve
from ..data.published import is_all
from ..data.spec import InputSpec
from ..hub import attach, resolve_model
from ..models.dispatch import parse_max_memory
from ..models.hf import auto_classes, check_model_type, hf_task, main_stack
from ..options import CertifyOptions, CertifyRunOptions
from ..probe import collect, resolve_points
from ..probe.batches import batch_size_of, index_batch, to_batches
from ..probe.collect import float_dtype, to_device
from ..probe.cost_plan import device_memory, max_batch
from ..probe.insert import channel_dim
from .per_point import statistics
from .plan_count import count_pass
from .run import _device, _load

__all__ = ["CostPlan", "plan_run", "count_pass", "time_statistics"]


@dataclasses.dataclass(frozen=True)
class CostPlan:
    """What a certify run will cost (see the module docstring for how each number is found).

    Bytes are bytes, times seconds; ``None`` where a number was not found (``notes`` say why)."""

    model: str
    dtype: str  # the dtype assumed for the weights and the probe
    dtype_source: str  # "--dtype", "the checkpoint's config", "float32 (the built-in model)", ...
    counted_on: str  # "meta" (no weights read) or "loaded" (the real model)
    parameters: int
    weight_bytes: int
    points: int
    n_train: int
    n_test: int
    batch_size: int
    example_shape: str
    flops_forward: int  # per probed example
    flops_backward: int  # per probed example, to the insertion points only
    saved_bytes_per_example: int  # what autograd keeps from the forward for the backward
    probe_peak_bytes_per_example: int  # all tensors alive at once in the probe's pass (saved, gradients, transients)
    forward_peak_bytes_per_example: int  # the same for a forward without gradients (the interventions')
    gradient_bytes_per_example: int  # the activation gradients at the points
    sample_bytes: int  # the pooled float64 samples of the whole run (kept until the statistics)
    device: str
    memory_bytes: int | None
    memory_source: str
    max_batch: int | None
    probe_batches: int  # forward + backward passes of the probe (every point at once)
    intervention_forwards: int  # example-forwards of the interventions (all points)
    intervention_share: float  # the share of a forward they run (the network after each point, averaged)
    prefix_bytes: int  # the held-out outputs before each point the bias steps reuse
    intervention_rows: int  # examples x steps in one stacked intervention pass
    load_s: float | None = None
    inputs_s: float | None = None
    batch_s: float | None = None  # one probed batch of batch_size
    stats_point_s: float | None = None  # the statistics of one point
    predicted_s: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def flops_per_example(self) -> int:
        return self.flops_forward + self.flops_backward

    @property
    def batch_bytes(self) -> int:
        """Activation + gradient memory of one probed batch of ``batch_size`` (the pass's live peak)."""
        return self.probe_peak_bytes_per_example * self.batch_size

    @property
    def intervention_bytes(self) -> int:
        """One stacked intervention pass (``intervention_rows`` rows of a forward without gradients)."""
        return self.forward_peak_bytes_per_example * self.intervention_rows

    @property
    def peak_bytes(self) -> int:
        """The run's memory as planned: weights, samples and the kept prefix, plus the larger of a
        probed batch and a stacked intervention pass (one runs after the other)."""
        return (
            self.weight_bytes + self.sample_bytes + self.prefix_bytes + max(self.batch_bytes, self.intervention_bytes)
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["notes"] = list(self.notes)
        d.update(
            flops_per_example=self.flops_per_example,
            batch_bytes=self.batch_bytes,
            intervention_bytes=self.intervention_bytes,
            peak_bytes=self.peak_bytes,
        )
        return d

    def table(self) -> str:
        """The plan as the terminal shows it (``widthscope._io.format_table``)."""

        def sec(v: float | None) -> str | None:
            return None if v is None else f"{v:.3g} s"

        rows: list[tuple[str, Any]] = [
            ("model", self.model),
            ("dtype assumed", f"{self.dtype} ({self.dtype_source})"),
            ("counted on", "the meta device (no weights read)" if self.counted_on == "meta" else "the loaded model"),
            ("parameters", f"{self.parameters:,}"),
            ("weights", human_size(self.weight_bytes)),
            ("probe input, one example", self.example_shape),
            ("FLOPs per probed example", f"{self.flops_per_example:.3g} (forward {self.flops_forward:.3g})"),
            ("saved activations per example", human_size(self.saved_bytes_per_example)),
            ("point gradients per example", human_size(self.gradient_bytes_per_example)),
            ("probe pass peak per example", human_size(self.probe_peak_bytes_per_example)),
            (f"activations + gradients, batch {self.batch_size}", human_size(self.batch_bytes)),
            ("pooled samples (float64)", human_size(self.sample_bytes)),
            ("kept prefix (interventions)", human_size(self.prefix_bytes)),
            (f"stacked intervention pass, {self.intervention_rows} rows", human_size(self.intervention_bytes)),
            ("run memory (weights + samples + prefix + larger pass)", human_size(self.peak_bytes)),
            (
                f"memory ({self.memory_source})",
                None if self.memory_bytes is None else human_size(self.memory_bytes),
            ),
            ("largest batch that fits", self.max_batch),
            ("probe passes", f"{self.probe_batches} batches ({self.n_train} + {self.n_test} examples)"),
            (
                "intervention example-forwards",
                f"{self.intervention_forwards} x {self.intervention_share:.2f} of a forward",
            ),
            ("load / inputs", f"{sec(self.load_s) or '-'} / {sec(self.inputs_s) or '-'}"),
            ("one probed batch", sec(self.batch_s)),
            ("statistics of one point", sec(self.stats_point_s)),
            ("predicted wall time", sec(self.predicted_s)),
        ]
        table = format_table([{"what": k, "plan": v} for k, v in rows], ["what", "plan"], title="cost plan")
        return table + "".join(f"\nnote: {n}" for n in self.notes)


# ----------------------------------------------------------------------------- the model's structure
@dataclasses.dataclass
class _Structure:
    model: nn.Module
    dtype: torch.dtype
    source: str
    on_meta: bool
    hf_dir: Path | None = None


def _dtype_named(name: Any) -> torch.dtype | None:
    dt = getattr(torch, str(name).removeprefix("torch."), None) if name else None
    return dt if isinstance(dt, torch.dtype) and dt.is_floating_point else None


def _hf_dir(spec: InputSpec) -> tuple[Path, Any] | None:
    """The Hugging Face checkpoint directory of the spec (with its hub record), or None."""
    if not isinstance(spec.model, str) or spec.model == "builtin":
        return None
    path, hub = resolve_model(spec.model, spec.revision)
    cfg_file = path / "config.json"
    if not path.is_dir() or not cfg_file.is_file():
        return None
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the loader names what is wrong with it
    return (path, hub) if isinstance(cfg, dict) and "model_type" in cfg else None


def _meta_hf(spec: InputSpec, directory: Path, hub: Any) -> _Structure:
    """The checkpoint's architecture on the meta device, as ``load_hf`` would load it (no weights)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    check_model_type(raw, directory / "config.json")
    task = spec.task or hf_task(raw, str(directory / "config.json"))
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    if spec.dtype != "auto":
        dtype, source = getattr(torch, spec.dtype), "--dtype"
    else:
        recorded = _dtype_named(raw.get("dtype") or raw.get("torch_dtype"))
        dtype, source = (
            (recorded, "the checkpoint's config") if recorded else (torch.float32, "float32: no dtype in its config")
        )
    with init_empty_weights(include_buffers=True):
        model = auto_classes()[task].from_config(config, dtype=dtype)
    model.eval()
    model.widthscope_task = task
    model.widthscope_points = main_stack(model)
    model.widthscope_hf = {"directory": str(directory), "architecture": type(model).__name__}
    return _Structure(attach(model, hub), dtype, source, True, directory)


def _structure(spec: InputSpec, seed: int) -> _Structure:
    """A Hugging Face directory on the meta device; anything else built (they are small)."""
    found = _hf_dir(spec)
    if found is not None:
        return _meta_hf(spec, *found)
    model, _ = _load(spec, seed)
    if spec.model == "builtin" and spec.dtype != "auto":
        model.to(getattr(torch, spec.dtype))
    dtype = float_dtype(model) or torch.float32
    source = (
        "--dtype" if spec.dtype != "auto" else ("the built-in model" if spec.model == "builtin" else "the checkpoint")
    )
    return _Structure(model, dtype, source, False)


def _shape(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"{tuple(batch.shape[1:])} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, Mapping):
        return _shape(batch["input_ids"] if "input_ids" in batch else next(iter(batch.values())))
    return _shape(batch[0])


# ----------------------------------------------------------------------------- memory and time
def _resident(weights: int, device: torch.device, spec: InputSpec) -> tuple[int, str | None]:
    """The weights on the run's device: all of them, or within the device's --max-memory share."""
    if spec.max_memory is None:
        return weights, None
    budget = parse_max_memory(spec.max_memory)
    key: str | int = device.index or 0 if device.type == "cuda" else "cpu"
    share = budget.get(key)
    if share is None:
        return weights, None
    return min(weights, int(share)), f"--max-memory: at most {human_size(share)} of the weights on {device}"


def time_statistics(options: CertifyOptions, n: tuple[int, int], d: int, rows: int) -> float:
    """The statistics of one point, timed on random samples of the run's shapes (their cost does
    not depend on the values)."""
    g = torch.Generator().manual_seed(0)
    width = options.project or d
    a = {"p": torch.randn(n[0] * rows, width, generator=g, dtype=torch.float64)}
    b = {"p": torch.randn(n[1] * rows, width, generator=g, dtype=torch.float64)}
    t0 = time.perf_counter()
    statistics(
        a,
        b,
        pairs=options.pairs,
        draws=options.draws,
        seed=options.seed,
        estimator=options.estimator,
        pool=options.pool,
        project=options.project,
        dims={"p": d},
        draw_scheme=options.draw_scheme,
        sample_dtype=None,
        sample_errors=None,
    )
    return time.perf_counter() - t0


def _time_batch(model: nn.Module, batch: Any, names: list[str], inputs: Any, options: CertifyOptions) -> float:
    """One probed batch (the second of two: the first warms up)."""
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        collect(model, [batch], points=names, loss_fn=inputs.loss_fn, pool=options.pool, progress=False)
        best = min(best, time.perf_counter() - t0)
    return best


def _dims(shapes: dict[str, tuple[int, ...]], pool: str) -> tuple[dict[str, int], int]:
    """Each point's sample dimension and the sample rows per example (one example's output shapes)."""
    dims, rows = {}, 1
    for n, shape in shapes.items():
        z = torch.empty(shape, device="meta")
        if pool == "flatten" or z.ndim < 2:
            dims[n] = max(1, z[0].numel())
            continue
        c = channel_dim(z)
        dims[n] = int(shape[c])
        if pool == "token":
            rows = max(rows, z[0].numel() // dims[n])
    return dims, rows


def _cached(options: CertifyOptions) -> bool:
    """The bias steps rerun only the network after each point (the held-out prefix is kept)."""
    return options.kind == "bias" and options.project is None and options.train_mode == "eval"


# examples per intervention call (widthscope.probe.intervene's batch_size, certify keeps the default)
INTERVENE_BATCH = 64


def _stacked_rows(options: CertifyOptions) -> int:
    """Rows of one stacked intervention pass: ``n_etas`` steps x ``64 // n_etas`` examples."""
    if options.kind not in ("bias", "block"):
        return 0
    steps = len(options.etas) if options.etas is not None else options.n_etas
    return steps * max(1, INTERVENE_BATCH // steps)


def _interventions(options: CertifyOptions, points: int) -> int:
    """Example-forwards of the interventions: each step over the ``K`` held-out examples, per point."""
    if options.kind not in ("bias", "block"):
        return 0
    steps = len(options.etas) if options.etas is not None else options.n_etas
    return points * steps * max(k for _, k in options.pairs)


# ----------------------------------------------------------------------------- the plan
def plan_run(
    spec: InputSpec,
    options: CertifyOptions | None = None,
    run_options: CertifyRunOptions | None = None,
    *,
    time_batch: bool = True,
) -> CostPlan:
    """The cost plan of ``run_certify(CertifyJob(spec, options, run_options))``; nothing is probed
    beyond one example (and, with ``time_batch``, two batches), nothing written. See the module
    docstring for what is counted and how."""
    options = options or CertifyOptions()
    run_options = run_options or CertifyRunOptions()
    device = _device()(run_options.device)
    t0 = time.perf_counter()
    s = _structure(spec, options.seed)
    built_s = time.perf_counter() - t0
    names = resolve_points(s.model, list(options.points) if options.points else None)
    t0 = time.perf_counter()
    inputs = resolve(spec, model=s.model, show_progress=False)
    inputs_s = time.perf_counter() - t0
    n_train = batch_size_of(inputs.train) if is_all(spec.n_train) else int(spec.n_train)
    n_test = batch_size_of(inputs.test) if is_all(spec.n_test) else int(spec.n_test)
    one = index_batch(inputs.train, slice(0, 1))
    where = torch.device("meta") if s.on_meta else next(iter(p.device for p in s.model.parameters()))
    c = count_pass(s.model, to_device(one, where, s.dtype), names, inputs.loss_fn, device=device)
    dims, rows = _dims(c["shapes"], options.pool)
    weights = sum(p.numel() * p.element_size() for p in s.model.parameters())
    samples = 8 * rows * (n_train + n_test) * sum(options.project or d for d in dims.values())
    free, free_source = device_memory(device)
    resident, budget_note = _resident(weights, device, spec)
    per_example = c["peak_bytes"]
    bs = run_options.batch_size
    k_max = max(k for _, k in options.pairs)
    prefix = k_max * c["gradient_bytes"] if _cached(options) else 0  # the points' outputs, K examples
    share = sum(c["flops_after"].values()) / max(1, len(names) * c["flops_forward"]) if _cached(options) else 1.0
    notes = [budget_note] if budget_note else []
    notes.append(
        "time = load + inputs + probe batches + statistics x points + intervention forwards (the share of a "
        "forward after each point); the built-in model's training is not counted"
    )
    timing: dict[str, float | None] = {"load_s": None, "batch_s": None, "stats_point_s": None, "predicted_s": None}
    if time_batch:
        timing = _predict(spec, s, built_s, inputs, names, options, bs, device, c, (n_train, n_test), dims, rows, share)
        timing["predicted_s"] = (timing["predicted_s"] or 0.0) + inputs_s
    else:
        notes.append("no time predicted (the weights were not loaded)")
    return CostPlan(
        model=str(spec.to_dict()["model"]),
        dtype=str(s.dtype).removeprefix("torch."),
        dtype_source=s.source,
        counted_on="meta" if s.on_meta else "loaded",
        parameters=sum(p.numel() for p in s.model.parameters()),
        weight_bytes=weights,
        points=len(names),
        n_train=n_train,
        n_test=n_test,
        batch_size=bs,
        example_shape=_shape(one),
        flops_forward=c["flops_forward"],
        flops_backward=c["flops_backward"],
        saved_bytes_per_example=c["saved_bytes"],
        probe_peak_bytes_per_example=c["peak_bytes"],
        forward_peak_bytes_per_example=c["forward_peak_bytes"],
        intervention_rows=_stacked_rows(options),
        gradient_bytes_per_example=c["gradient_bytes"],
        sample_bytes=samples,
        device=str(device),
        memory_bytes=free,
        memory_source=free_source,
        max_batch=max_batch(free, resident, samples + prefix, per_example),
        probe_batches=math.ceil(n_train / bs) + math.ceil(n_test / bs),
        intervention_forwards=_interventions(options, len(names)),
        intervention_share=share,
        prefix_bytes=prefix,
        load_s=timing["load_s"],
        inputs_s=inputs_s,
        batch_s=timing["batch_s"],
        stats_point_s=timing["stats_point_s"],
        predicted_s=timing["predicted_s"],
        notes=tuple(notes),
    )


def _predict(
    spec: InputSpec,
    s: _Structure,
    built_s: float,
    inputs: Any,
    names: list[str],
    options: CertifyOptions,
    bs: int,
    device: torch.device,
    c: dict[str, Any],
    n: tuple[int, int],
    dims: dict[str, int],
    rows: int,
    share: float,
) -> dict[str, float | None]:
    """Load the weights (a meta-built model), time one probed batch and one point's statistics,
    and predict the run's wall time (without the inputs' time, which the caller adds)."""
    model = s.model
    load_s = built_s
    if s.on_meta:
        t0 = time.perf_counter()
        model, _ = _load(spec, options.seed)
        load_s = time.perf_counter() - t0
    if getattr(model, "hf_device_map", None) is None:
        model.to(device)
    batch = to_batches(inputs.train, bs)[0]
    batch_s = _time_batch(model, batch, names, inputs, options) * bs / batch_size_of(batch)
    stats_point_s = time_statistics(options, n, max(dims.values()), rows)
    per_example = batch_s / bs
    forward_share = c["flops_forward"] / max(1, c["flops_forward"] + c["flops_backward"])
    predicted = (
        load_s
        + per_example * (n[0] + n[1] + 1)  # the probe, and the one example that checks the points' shapes
        + stats_point_s * len(names)
        + per_example * forward_share * share * _interventions(options, len(names))
    )
    return {"load_s": load_s, "batch_s": batch_s, "stats_point_s": stats_point_s, "predicted_s": predicted}
