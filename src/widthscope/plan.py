"""``--plan``: what a run will cost, as the whole process will cost it (one module, every command).

Each command's plan is built from the same few measured pieces:

* **the model**: its parameters and weight bytes (:func:`weights`; a Hugging Face checkpoint
  under ``--plan-no-time`` is built on the meta device, no weight read);
* **bytes per example**: what autograd saves for the backward (:func:`saved_bytes`: the tensors
  packed by ``saved_tensors_hooks``, each storage once, the parameters excluded) counted at batch 1
  and 2, the difference; the **largest batch** that fits: the device's free memory less what is
  resident, over that;
* **one timed batch** (or training step, or loop): the run's own code on the run's batch, timed
  after a warm-up and scaled to the run's batches or steps;
* **the fixed costs** the run pays besides its work: process start and imports, loading the model
  and the data (the plan loads them as the run does, and reads the seconds since the process
  started, :func:`since_start`), and the resident memory they leave (the process's peak so far).

The printed totals are whole-process numbers, comparable to ``/usr/bin/time -v``'s "Elapsed (wall
clock)" and "Maximum resident set size": the peak is the largest resident size measured while the
plan runs the work (:class:`RssPeak`, sampled) plus the bytes the run holds on top of it that the
plan does not (the samples of every example, counted). ``--plan-no-time`` loads nothing beyond the
structure and times nothing: it says no time is predicted.

Nothing a plan does writes a file.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import resource
import threading
import time
from typing import Any, Callable

import psutil
import torch
import torch.nn as nn

from ._io import format_table, human_size
from .certification.per_point import statistics
from .certification.run import device_memory, load_checkpoint, run_device
from .data.inputs import resolve
from .data.published import is_all
from .growth.block import train_new_block
from .growth.inputs import builtin_inputs, check_builtin, load_inputs
from .growth.pipeline import chosen_points, grow_options, split_pools
from .growth.rank import n_examples, rank_points
from .models.hf import meta_checkpoint
from .options import CertifyOptions, CertifyRunOptions
from .probe import collect, resolve_points
from .probe.blocks import block_of
from .probe.collect import to_device
from .probe.insert import insert
from .probe.intervene import batch_size_of, index_batch, mean_loss, to_batches
from .train import train as train_model

__all__ = [
    "Plan",
    "RssPeak",
    "peak_so_far",
    "plan_certify",
    "plan_grow",
    "saved_bytes",
    "since_start",
    "time_loop",
    "time_statistics",
    "weights",
]


# ----------------------------------------------------------------------------- the result
def _sec(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g} s" if v < 120 else f"{v:.0f} s ({v / 60:.1f} min)"


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's cost. ``parts``: (name, seconds) the whole process spends, the fixed costs first
    (``None`` where not timed); ``counts``: (name, value) shown as counted; ``peak_bytes``: the
    whole process's predicted peak resident memory; ``predicted_s``: the parts' sum."""

    command: str
    model: str
    parameters: int
    weight_bytes: int
    bytes_per_example: int | None
    batch_size: int
    max_batch: int | None
    parts: tuple[tuple[str, float | None], ...] = ()
    counts: tuple[tuple[str, Any], ...] = ()
    peak_bytes: int | None = None
    notes: tuple[str, ...] = ()
    dtype: str = "float32"
    examples: int = 0  # examples the run probes or trains on (per step: batch_size)
    sample_bytes: int | None = None  # the samples the run holds (certify: every point's, float64)

    @property
    def timed(self) -> bool:
        return bool(self.parts) and all(t is not None for _, t in self.parts)

    @property
    def predicted_s(self) -> float | None:
        return sum(t for _, t in self.parts if t is not None) if self.timed else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["parts"] = [{"part": n, "seconds": t} for n, t in self.parts]
        d["counts"] = {n: v for n, v in self.counts}
        d["notes"] = list(self.notes)
        d["predicted_s"] = self.predicted_s
        return d

    def table(self) -> str:
        rows: list[tuple[str, Any]] = [
            ("model", self.model),
            ("parameters", f"{self.parameters:,}"),
            ("weights", human_size(self.weight_bytes)),
            (
                "saved activations per example",
                None if self.bytes_per_example is None else human_size(self.bytes_per_example),
            ),
            ("batch size", self.batch_size),
            ("largest batch that fits", self.max_batch),
            *self.counts,
            *((f"time: {n}", _sec(t)) for n, t in self.parts),
            ("predicted wall time (whole process)", _sec(self.predicted_s) if self.timed else "not predicted"),
            (
                "predicted peak memory (whole process, RSS)",
                None if self.peak_bytes is None else human_size(self.peak_bytes),
            ),
        ]
        table = format_table(
            [{"what": k, "plan": v} for k, v in rows], ["what", "plan"], title=f"cost plan: {self.command}"
        )
        return table + "".join(f"\nnote: {n}" for n in self.notes)


FIXED = "process start"  # the name every fixed part starts with


# ----------------------------------------------------------------------------- the pieces
def since_start() -> float:
    """Seconds since this process started (interpreter start, imports, everything so far)."""
    return max(0.0, time.time() - psutil.Process().create_time())


def peak_so_far() -> int:
    """This process's peak resident memory so far (bytes; what ``/usr/bin/time`` reports at the end)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class RssPeak:
    """``with RssPeak() as p: ...``; ``p.peak``: the largest resident size seen while the block ran
    (sampled every ``every`` seconds by a thread, and at the start and the end)."""

    def __init__(self, every: float = 0.002) -> None:
        self.every, self.peak = every, 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _rss(self) -> int:
        return int(self._proc.memory_info().rss)

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> RssPeak:
        self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def weights(model: nn.Module) -> tuple[int, int]:
    """(parameters, weight bytes) of ``model`` (meta or real), each parameter once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def saved_bytes(fn: Callable[[], Any], model: nn.Module | None = None) -> int:
    """The bytes autograd saves for the backward while ``fn()`` runs: each packed tensor's storage
    once, the parameters of ``model`` excluded (they are counted as weights). On the meta device
    (no storage) every packed tensor's own bytes."""

    def key(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)

    skip = {key(p) for p in model.parameters() if p.device.type != "meta"} if model is not None else set()
    params = {id(p) for p in model.parameters()} if model is not None else set()
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        k = key(t)
        if id(t) in params or k in skip or k in seen:
            return t
        seen.add(k)
        total += t.untyped_storage().nbytes() if t.device.type != "meta" else t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def per_example(count: Callable[[int], int]) -> int:
    """Bytes per example from ``count(n)`` at n = 1 and 2 (the difference; what does not grow with
    the batch drops out), at least a sixteenth of ``count(1)``."""
    one, two = count(1), count(2)
    return max(two - one, one // 16, 0)


def timed(fn: Callable[[], Any], repeats: int = 2) -> float:
    """The best of ``repeats`` timings of ``fn()`` (the first also warms up)."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_loop(run: Callable[[int], Any], small: int = 2, large: int = 6, min_s: float = 0.2) -> tuple[float, float]:
    """``(fixed_s, step_s)`` of a training loop ``run(steps)`` (the run's own loop, on a copy):
    timed at ``small`` and ``large`` steps after a one-step warm-up, the step the slope (``large``
    raised until it takes ``min_s``: a slope over milliseconds is the clock's noise)."""
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


def _fits(free: int | None, held: int, per: int | None) -> int | None:
    if free is None or not per:
        return None
    return max(0, (free - held) // per)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _fixed(ready_s: float) -> list[tuple[str, float | None]]:
    return [(f"{FIXED}, imports, loading the model and the data (measured)", ready_s)]


def _no_time_note() -> str:
    return "no time predicted (--plan-no-time): counted, not timed; memory = the process now + the weights + a batch"


def time_statistics(options: Any, n: tuple[int, int], d: int, rows: int) -> float:
    """The statistics of one point (:func:`widthscope.certification.per_point.statistics`), timed on random
    samples of the run's shapes: ``n`` (train, held-out) examples of ``rows`` rows of width ``d``."""
    return _statistics(options, n, d, rows)[0]


def _statistics(options: Any, n: tuple[int, int], d: int, rows: int) -> tuple[float, int, int]:
    """(seconds, peak RSS while they ran, the bytes of their samples) of one point's statistics."""

    g = torch.Generator().manual_seed(0)
    width = options.project or d
    a = {"p": torch.randn(n[0] * rows, width, generator=g, dtype=torch.float64)}
    b = {"p": torch.randn(n[1] * rows, width, generator=g, dtype=torch.float64)}
    with RssPeak() as peak:
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
        seconds = time.perf_counter() - t0
    return seconds, peak.peak, (a["p"].numel() + b["p"].numel()) * 8


# ----------------------------------------------------------------------------- certify --plan
def plan_certify(spec: Any, options: Any = None, run_options: Any = None, *, time_run: bool = True) -> Plan:
    """The plan of ``widthscope certify`` with these settings (nothing probed beyond a few batches,
    nothing written). Timed: the model and the data are loaded as the run loads them, one probed
    batch, one point's statistics and one intervention forward are timed and scaled."""
    options = options or CertifyOptions()
    run_options = run_options or CertifyRunOptions()
    device = run_device(run_options.device)
    meta = None if time_run else meta_checkpoint(spec.model, spec.revision, spec.task, spec.dtype)
    model = meta if meta is not None else load_checkpoint(spec, options.seed)[0]
    if meta is None and spec.model == "builtin" and spec.dtype != "auto":
        model.to(getattr(torch, spec.dtype))
    inputs = resolve(spec, model=model, show_progress=False)
    ready = (since_start(), peak_so_far())
    names = resolve_points(model, list(options.points) if options.points else None)
    n = (
        batch_size_of(inputs.train) if is_all(spec.n_train) else int(spec.n_train),
        batch_size_of(inputs.test) if is_all(spec.n_test) else int(spec.n_test),
    )
    bs = run_options.batch_size
    if meta is None and getattr(model, "hf_device_map", None) is None:
        model.to(device)
    where = torch.device("meta") if meta is not None else next(p.device for p in model.parameters())
    dtype = next(model.parameters()).dtype

    def probe(batch: Any) -> Any:
        return collect(model, [batch], points=names, loss_fn=inputs.loss_fn, pool=options.pool, progress=False)

    def count(k: int) -> int:
        return saved_bytes(lambda: probe(to_device(index_batch(inputs.train, slice(0, k)), where, dtype)), model)

    notes: list[str] = []
    try:
        per: int | None = per_example(count)
    except Exception as exc:  # noqa: BLE001  a model the meta device cannot run: said, not counted
        per = None
        notes.append(f"saved bytes not counted on the meta device ({type(exc).__name__}): run --plan to count them")
    free, source = device_memory(device)
    batches = math.ceil(n[0] / bs) + math.ceil(n[1] / bs)
    counts: list[tuple[str, Any]] = [
        ("insertion points", len(names)),
        ("examples probed", f"{n[0]} + {n[1]} ({batches} batches)"),
        (f"memory ({source})", None if free is None else human_size(free)),
    ]
    params, wbytes = weights(model)
    base: dict[str, Any] = dict(
        command="certify", model=str(spec.to_dict()["model"]), parameters=params, weight_bytes=wbytes
    )
    base.update(bytes_per_example=per, batch_size=bs, dtype=_dt(dtype), examples=n[0] + n[1])
    if not time_run:
        held = peak_so_far() + (wbytes if meta is not None else 0)
        notes.append(_no_time_note())
        peak = None if per is None else held + per * bs
        return Plan(**base, max_batch=_fits(free, held, per), counts=tuple(counts), peak_bytes=peak, notes=tuple(notes))
    parts, peaks, sample_bytes = _certify_work(model, inputs, names, options, bs, n, probe)
    counts.append(("pooled samples (all points, all examples)", human_size(sample_bytes)))
    notes.append(
        "time = since the process started (imports, loading) + probe batches + statistics x points + interventions; "
        "peak = the largest resident size measured while a batch and a point's statistics ran + the samples held"
    )
    if spec.model == "builtin":
        notes.append("the built-in model's training is in the fixed part (the plan trains it as the run does)")
    return Plan(
        **base,
        max_batch=_fits(free, peaks[0], per),
        parts=tuple(_fixed(ready[0]) + parts),
        counts=tuple(counts),
        peak_bytes=int(max(ready[1], *peaks)),
        notes=tuple(notes),
        sample_bytes=sample_bytes,
    )


def _certify_work(
    model: nn.Module,
    inputs: Any,
    names: list[str],
    options: Any,
    bs: int,
    n: tuple[int, int],
    probe: Callable[[Any], Any],
) -> tuple[list[tuple[str, float | None]], tuple[int, int], int]:
    """The run's work, timed and scaled: (parts, (the probe's peak, the statistics' peak) with the
    samples the run holds added, the samples' bytes)."""
    batch = to_batches(inputs.train, bs)[0]
    rows = batch_size_of(batch)
    with RssPeak() as probe_peak:
        probed = probe(batch)
        batch_s = timed(lambda: probe(batch)) * bs / rows
    per_row = sum(v.numel() * v.element_size() for v in probed.values()) / max(1, rows)  # per example
    sample_bytes = int(per_row * (n[0] + n[1]))
    width = {p: int(v.shape[-1]) for p, v in probed.items()}
    point_rows = max(1, round(per_row / 8 / max(1, sum(width.values()))))
    stats_s, stats_peak, one_point = _statistics(options, n, max(width.values()), point_rows)
    batches = math.ceil(n[0] / bs) + math.ceil(n[1] / bs)
    parts: list[tuple[str, float | None]] = [
        (f"probe: one batch of {bs} x {batches} batches", batch_s * (n[0] + n[1] + 1) / bs),
        (f"statistics: one point x {len(names)}", stats_s * len(names)),
    ]
    steps = len(options.etas) if options.etas is not None else options.n_etas
    if options.kind in ("bias", "block") and steps:
        k_max = max(k for _, k in options.pairs)
        cached = options.kind == "bias" and options.project is None and options.train_mode == "eval"
        share = (len(names) + 1) / (2 * len(names)) if cached else 1.0  # the network after each point, averaged
        fwd = timed(lambda: mean_loss(model, batch, inputs.loss_fn, batch_size=bs)) / rows
        what = f"interventions: {steps} steps x {k_max} examples x {len(names)} points"
        parts.append((what, fwd * share * steps * k_max * len(names)))
    peaks = (probe_peak.peak + sample_bytes, stats_peak + sample_bytes - one_point)
    return parts, peaks, sample_bytes


# ----------------------------------------------------------------------------- grow --plan
def plan_grow(
    spec: Any = None,
    options: Any = None,
    *,
    n_train: Any = None,
    n_test: Any = None,
    dtype: str = "auto",
    time_run: bool = True,
    **keywords: Any,
) -> Plan:
    """The plan of ``run_grow(spec, options, n_train=, n_test=, dtype=)`` (nothing trained beyond a
    few timed steps, nothing written): the model and the data loaded as the run loads them; the
    ranking timed on pools of ``(M, K)``, ``(2M, K)``, ``(M, 2K)`` examples and extrapolated to the
    run's; one block's training loop and one evaluation batch timed and scaled."""
    opts = grow_options("plan_grow", options, keywords)
    base_s: float | None = None
    if spec is None:
        model, full, split = builtin_inputs(opts.seed, n_train, n_test)
        check_builtin(model, split, opts, None)
        loss_fn, name = None, "builtin"
        if time_run:  # the run trains the built-in model 300 steps first: its loop, timed
            f, step = time_loop(
                lambda k: train_model(copy.deepcopy(model), full, steps=k, lr=3e-3, seed=opts.seed, progress=False)
            )
            base_s = f + 300 * step
        if dtype != "auto":
            model.to(getattr(torch, dtype))
    else:
        inputs = load_inputs(spec, opts.points, show=False)
        model, split, loss_fn = inputs.model, (inputs.train, inputs.test), inputs.loss_fn
        name = str(spec.to_dict()["model"])
    ready = (since_start(), peak_so_far())
    g = _Growth(model, split, loss_fn, opts)
    params, wbytes = weights(model)
    free, source = device_memory("cpu")
    n_tr, n_rk = g.pools.n_train, g.pools.n_rank
    sample_bytes = 8 * (n_tr + n_rk) * sum(g.widths.values())
    grown = f"{g.runs} x {opts.steps} steps (batch {g.bs})" + (" + the continue baseline" if opts.compare else "")
    counts: list[tuple[str, Any]] = [
        ("insertion points", len(g.names)),
        ("ranking pools", f"{n_tr} train + {n_rk} held-out examples"),
        ("blocks grown", grown),
        ("ranking samples (float64, every point)", human_size(sample_bytes)),
        (f"memory ({source})", None if free is None else human_size(free)),
    ]
    per = per_example(g.count)
    base: dict[str, Any] = dict(
        command="grow", model=name, parameters=params, weight_bytes=wbytes, bytes_per_example=per
    )
    base.update(batch_size=g.bs, counts=tuple(counts), dtype=_dt(next(model.parameters()).dtype))
    if not time_run:
        held = peak_so_far()
        peak = held + sample_bytes + 4 * wbytes + per * g.bs
        return Plan(**base, max_batch=_fits(free, held, per), peak_bytes=peak, notes=(_no_time_note(),))
    parts = _fixed(ready[0])
    if base_s is not None:
        parts.append(("the built-in model's base training (300 steps)", base_s))
    ranking_s, rank_peak, small = g.time_ranking()
    with RssPeak() as grow_peak:
        f, step = time_loop(g.loop)
    parts += [
        (f"ranking {len(g.names)} points (timed at 2 points on small pools, extrapolated)", ranking_s),
        (f"growing: {g.runs} x {opts.steps} steps", g.runs * (f + opts.steps * step)),
        ("held-out evaluations", g.time_evaluations()),
    ]
    if opts.compare:  # the original trained for the FLOPs of the best growth: about its time
        parts.append(("continue baseline (the FLOPs of one growth)", f + opts.steps * step))
    scale = sample_bytes * max(0, n_tr + n_rk - small) // max(1, n_tr + n_rk)
    peak = max(ready[1], rank_peak + scale, grow_peak.peak + g.runs * wbytes)
    note = (
        "time = since the process started (imports, loading) + ranking + growing + evaluations; peak = the largest "
        "resident size measured while the ranking and a growth ran + the ranking's samples at the run's pools"
    )
    return Plan(
        **base, max_batch=_fits(free, grow_peak.peak, per), parts=tuple(parts), peak_bytes=int(peak), notes=(note,)
    )


class _Growth:
    """What ``grow --plan`` times of a run: its pools and points, the block at the widest point."""

    def __init__(self, model: nn.Module, split: Any, loss_fn: Callable | None, opts: Any) -> None:
        self.model, self.loss_fn, self.opts = model, loss_fn, opts
        self.train = split[0]
        self.pools = split_pools(model, split[0], split[1], opts)
        self.names = resolve_points(model, opts.points)
        one = index_batch(self.pools.probe_train, slice(0, 1))
        got = collect(model, [one], points=self.names, loss_fn=loss_fn, progress=False)
        self.widths = {p: int(v.shape[1]) for p, v in got.items()}
        self.runs = len(chosen_points([{"point": p} for p in self.names], opts))
        self.bs = min(opts.batch_size, n_examples(self.train))
        self.at = max(self.names, key=lambda p: self.widths[p])
        self.grown = copy.deepcopy(model)
        insert(self.grown, self.at, "block", width=self.widths[self.at], hidden=opts.block_width, seed=opts.seed)

    def _copy(self) -> tuple[nn.Module, list[nn.Parameter]]:
        m = copy.deepcopy(self.grown)
        ps = list(m.parameters()) if self.opts.train_all else list(block_of(m, self.at).parameters())
        ids = {id(p) for p in ps}
        for p in m.parameters():
            p.requires_grad_(id(p) in ids)
        return m, ps

    def _train(self, m: nn.Module, ps: list[nn.Parameter], data: Any, steps: int, bs: int) -> None:
        o = self.opts
        train_new_block(
            m, ps, data, steps=steps, lr=o.lr, batch_size=bs, seed=o.seed, loss_fn=self.loss_fn, show_progress=False
        )

    def loop(self, k: int) -> None:
        """The run's training loop of the block, ``k`` steps on a copy."""
        self._train(*self._copy(), self.train, k, self.opts.batch_size)

    def count(self, k: int) -> int:
        """The bytes one training step on ``k`` examples saves."""
        m, ps = self._copy()
        return saved_bytes(lambda: self._train(m, ps, index_batch(self.train, slice(0, k)), 1, k), m)

    def time_ranking(self) -> tuple[float, int, int]:
        """(seconds, peak RSS, examples at the first size) of the ranking: timed at the first and the last
        point on pools of ``(M, K)``, ``(2M, K)``, ``(M, 2K)``, fitted in train and held-out examples and
        extrapolated to the run's pools and points."""
        o, pools = self.opts, self.pools
        n_tr, n_rk = pools.n_train, pools.n_rank

        def rank(a: int, b: int, points: list[str]) -> None:
            rank_points(
                self.model,
                index_batch(pools.probe_train, slice(0, a)),
                index_batch(pools.rank_test, slice(0, b)),
                o.replace(points=tuple(points)),
                loss_fn=self.loss_fn,
                show_progress=False,
            )

        ends = sorted({self.names[0], self.names[-1]}, key=self.names.index)
        m_, k_ = max(o.M, 4), max(o.K, 4)
        sizes = [(min(n_tr, m_), min(n_rk, k_)), (min(n_tr, 2 * m_), min(n_rk, k_)), (min(n_tr, m_), min(n_rk, 2 * k_))]
        with RssPeak() as peak:
            rank(*sizes[0], ends)  # warm-up
            times = []
            for a, b in sizes:
                t0 = time.perf_counter()
                rank(a, b, ends)
                times.append(time.perf_counter() - t0)
        a0, b0 = sizes[0]
        c_a = (times[1] - times[0]) / (sizes[1][0] - a0) if sizes[1][0] > a0 else times[0] / (a0 + b0)
        c_b = (times[2] - times[0]) / (sizes[2][1] - b0) if sizes[2][1] > b0 else times[0] / (a0 + b0)
        at_run = max(0.0, times[0] + max(0.0, c_a) * (n_tr - a0) + max(0.0, c_b) * (n_rk - b0))
        return at_run * len(self.names) / len(ends), peak.peak, a0 + b0

    def time_evaluations(self) -> float:
        """The held-out evaluations: one batch timed, counted as the run evaluates."""
        o, bs = self.opts, self.bs
        n_eval = self.pools.n_test - self.pools.n_rank
        evaluate = index_batch(self.pools.evaluate, slice(0, min(bs, n_eval)))
        per_batch = timed(lambda: mean_loss(self.model, evaluate, self.loss_fn, batch_size=bs))
        runs = self.runs + (1 if o.compare else 0)
        return per_batch * (2 * runs * -(-n_eval // bs) + runs * -(-(o.M + o.K) // bs))
