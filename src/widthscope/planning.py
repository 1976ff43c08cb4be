"""``--plan``: what a run will cost, as the whole process will cost it (every command).

:func:`plan_certify` and :func:`plan_grow` plan one run; ``linearize``, ``grow-bench``,
``grow-target``, ``sweep --plan`` and ``demo`` sum per-cell or per-model plans. The pieces: the
model's weights (:func:`weights`, on the meta device under ``--plan-no-time``), the bytes autograd
saves per example (:func:`saved_bytes` at batch 1 and 2) and the largest batch that fits, one batch
or step timed and scaled, and the fixed costs (process start, loading: :func:`since_start`). The
totals are whole-process wall time and peak RSS (:class:`RssPeak`). Nothing a plan does writes a file.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
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
from .certification.pipeline import device_memory, load_checkpoint, run_device
from .data.inputs import resolve
from .data.spec import is_all
from .errors import WidthscopeError
from .growth.block import train_new_block
from .growth.options import GrowOptions
from .growth.pipeline import builtin_inputs, check_builtin, chosen_points, load_inputs, rank_points, split_pools
from .models.hf import meta_checkpoint
from .options import CertifyOptions, CertifyRunOptions, with_keywords
from .probe import collect, resolve_points
from .probe.batches import batch_size_of, index_batch, to_batches
from .probe.blocks import block_of
from .probe.collect import to_device
from .probe.insert import insert
from .probe.steps import mean_loss
from .train import train as train_model


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
        d["counts"] = dict(self.counts)
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


def clocked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def seconds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """The seconds ``fn(*args, **kwargs)`` takes."""
    return clocked(fn, *args, **kwargs)[1]


def timed(fn: Callable[[], Any], repeats: int = 2) -> float:
    """The best of ``repeats`` timings of ``fn()`` (the first also warms up)."""
    return min(seconds(fn) for _ in range(repeats))


def time_loop(run: Callable[[int], Any], small: int = 2, large: int = 6, min_s: float = 0.2) -> tuple[float, float]:
    """``(fixed_s, step_s)`` of a training loop ``run(steps)``: timed at ``small`` and ``large`` steps
    after a warm-up step (``large`` raised until it takes ``min_s``), the step the slope."""
    run(1)
    got = [seconds(run, small), seconds(run, large)]
    if got[1] < min_s:
        large = min(50 * large, max(large + 1, math.ceil(large * min_s / max(got[1], 1e-6))))
        got[1] = seconds(run, large)
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


COUNTED = "no time predicted (--plan-no-time): counted, not timed"
NO_TIME = f"{COUNTED}; memory = the process now + the weights + a batch"
PLATEAU = "runs that stop early (to a plateau, to a target) are counted at their longest: time is an upper bound"


def time_statistics(options: Any, n: tuple[int, int], d: int, rows: int) -> float:
    """Seconds of one point's statistics on random samples: ``n`` (train, held-out) examples of
    ``rows`` rows of width ``d``."""
    return _statistics(options, n, d, rows)[0]


def _statistics(options: Any, n: tuple[int, int], d: int, rows: int) -> tuple[float, int, int]:
    """(seconds, peak RSS while they ran, the bytes of their samples) of one point's statistics."""
    g = torch.Generator().manual_seed(0)
    width = options.project or d
    a = {"p": torch.randn(n[0] * rows, width, generator=g, dtype=torch.float64)}
    b = {"p": torch.randn(n[1] * rows, width, generator=g, dtype=torch.float64)}
    keys = ("pairs", "draws", "seed", "estimator", "pool", "project", "draw_scheme")
    with RssPeak() as peak:
        t = seconds(lambda: statistics(a, b, **{k: getattr(options, k) for k in keys}, dims={"p": d}))
    return t, peak.peak, (a["p"].numel() + b["p"].numel()) * 8


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
        notes.append(NO_TIME)
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
    opts = with_keywords("plan_grow", options, GrowOptions, keywords)
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
        return Plan(**base, max_batch=_fits(free, held, per), peak_bytes=peak, notes=(NO_TIME,))
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
        self.bs = min(opts.batch_size, batch_size_of(self.train))
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
            times = [seconds(rank, a, b, ends) for a, b in sizes]
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


# ----------------------------------------------------------------------------- sums of plans
def work_s(plan: Plan) -> float | None:
    """The seconds of ``plan``'s work: its parts less the fixed ones (what a run pays once per
    process); ``None`` when not timed."""
    if not plan.timed:
        return None
    return sum(t or 0.0 for n, t in plan.parts if not n.startswith(FIXED))


# ----------------------------------------------------------------------------- linearize --plan
def plan_linearize(config: Any, *, time_run: bool = True) -> Plan:
    """The plan of ``widthscope linearize`` (every cell, no shard; nothing written): the data loaded
    as the run loads it; the network's weights and the bytes a training step saves per example
    (twice: the network and its linearization train side by side); with ``time_run`` one whole
    cell run per distinct shape (width, with or without the derivative correlations), times the
    cells of that shape."""
    from .linearization.config import make_cells, validate_config  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .linearization.run import cell_inputs, run_cell  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    cfg = validate_config(config)
    cells = make_cells(cfg)
    (X, Y), (Xt, Yt), k, words = cell_inputs(cfg)
    ready = (since_start(), peak_so_far())
    tr, m = cfg["train"], cfg["model"]
    bs = int(tr["batch_size"]) or int(X.shape[0])
    widths = sorted({int(c["width"]) for c in cells})
    net = _mlp(cfg, widths[-1], X, k).to(getattr(torch, tr["dtype"]))
    params, wbytes = weights(net)

    def loss(n: int) -> Any:
        out = net(X[:n])
        return ((out - Y[:n]) ** 2).sum() if tr["loss"] == "mse" else nn.functional.cross_entropy(out, Y[:n])

    per = 2 * per_example(lambda n: saved_bytes(lambda: loss(n), net))  # the network and its linearization
    data_bytes = sum(t.numel() * t.element_size() for t in (X, Y, Xt, Yt))
    free, source = device_memory("cpu")
    counts: list[tuple[str, Any]] = [
        ("cells", f"{len(cells)} ({len(widths)} widths x {len(cfg['seeds'])} seeds x {len(tr['alphas'])} alphas)"),
        ("steps per cell", f"{int(tr['steps'])} (at most: a diverging cell stops early)"),
        ("data", f"{words.split(':')[0]} ({human_size(data_bytes)})"),
        (f"memory ({source})", None if free is None else human_size(free)),
    ]
    shown = ", ".join(str(w) for w in widths)
    label = f"mlp depth {m['depth']}, widths {shown} (the widest counted; x2: its linearization)"
    base: dict[str, Any] = dict(command="linearize", model=label, parameters=params, weight_bytes=2 * wbytes)
    base.update(bytes_per_example=per, batch_size=bs, dtype=str(tr["dtype"]), examples=int(X.shape[0]))
    if not time_run:
        held = peak_so_far()
        peak = held + 8 * wbytes + per * bs  # two models, each with its gradient and optimizer state
        notes = (COUNTED,)
        return Plan(**base, max_batch=_fits(free, held, per), counts=tuple(counts), peak_bytes=peak, notes=notes)
    parts, peak = _fixed(ready[0]), ready[1]
    for w in widths:
        these = [c for c in cells if int(c["width"]) == w]
        corr = sum(1 for c in these if c["correlations"])
        with RssPeak() as p:
            cell_s, corr_s = seconds(run_cell, cfg, {**these[0], "correlations": False}), 0.0
            if corr:  # the derivative correlations: timed once, on the untrained model (the same cost)
                corr_s = seconds(_correlations, cfg, w, X, k)
        peak = max(peak, p.peak)
        what = f"width {w}: one cell x {len(these)}" + (f" + the correlations x {corr}" if corr else "")
        parts.append((what, cell_s * len(these) + corr_s * corr))
    note = (
        "time = since the process started (imports, the data) + one cell timed per width x its cells; peak = measured"
    )
    return Plan(
        **base,
        max_batch=_fits(free, peak, per),
        parts=tuple(parts),
        counts=tuple(counts),
        peak_bytes=int(peak),
        notes=(note, "steps are an upper bound: a diverging cell stops early"),
    )


def _mlp(cfg: Any, width: int, X: torch.Tensor, k: int) -> nn.Module:
    """A linearize cell's network of ``width`` (seed 0)."""
    from .models import build  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    torch.manual_seed(0)
    kw = {key: cfg["model"][key] for key in ("depth", "activation", "parametrization", "sigma_w")}
    return build("mlp", width, in_dim=X.shape[1], out_dim=k, **kw)


def _correlations(cfg: Any, width: int, X: torch.Tensor, k: int) -> None:
    """The derivative correlations a linearize cell measures, on a fresh model of ``width``."""
    from .linear.correlation import correlation_summary, parse_correlation_name  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    c = cfg["correlations"]
    model = _mlp(cfg, width, X, k).to(X.dtype)
    for name in c["measure"]:
        D, d = parse_correlation_name(name)
        correlation_summary(model, X, D=D, d=d, n_tuples=c["n_tuples"], eta=cfg["train"]["eta0"], output=c["output"])


# ----------------------------------------------------------------------------- grow-bench --plan
GRADMAX_K = 8  # run_cell's gradmax_k: the GradMax block's hidden width (at most the point's width)


def _bench_model(cell: Any, runs: int, time_run: bool) -> dict[str, Any]:
    """One model of the growth suite as its cell builds it (untrained: base training is the work
    planned): weights, bytes per example of one training step (the cell's own loop, every
    parameter), the cell's training steps counted (runs that stop early at their longest) and,
    with ``time_run``, one step of that loop timed, the criteria at the middle point and one
    held-out evaluation timed, all scaled to the cell and its seeds."""
    from .growth.bench import fit_block  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.suite import build_model, cell_data, reproducible, split_held_out  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .probe.growth import point_criteria  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    (train, test, _, student), load_s = clocked(cell_data, cell)
    sp = split_held_out(cell, test)
    torch.manual_seed(int(cell["seed"]))
    model = student if student is not None else build_model(cell, cell["depth"] if cell["family"] != "resnet20" else 0)
    model.eval()
    points = list(model.widthscope_points)  # type: ignore[arg-type]
    bs = min(int(cell["batch_size"]), batch_size_of(train))
    params, wbytes = weights(model)
    seed = int(cell["seed"])

    def loop(k: int, data: Any = train, size: int = bs) -> None:
        m = copy.deepcopy(model)
        lr = float(cell["continue_lrs"][0])
        fit_block(m, list(m.parameters()), data, steps=k, at=(), lr=lr, batch_size=size, seed=seed)

    per = per_example(lambda n: saved_bytes(lambda: loop(1, index_batch(train, slice(0, n)), n), model))
    P, long = len(points), int(cell["long"])
    lrs, clrs, seeds = len(cell["block_lrs"]), len(cell["continue_lrs"]), len(cell["block_seeds"])
    plateau = int(cell["max_steps"]) if int(cell["max_steps"]) > 0 and cell["family"] != "teacher" else 0
    scratch = int(cell["max_steps"]) if cell.get("scratch") else 0
    # base, the blocks (every point, each lr and block seed), GradMax, continue (each lr), train-all, scratch
    trainings = [(plateau, int(plateau > 0)), (long * P * (lrs + seeds - 1), P * (lrs + seeds - 1)), (long * P, P)]
    trainings += [(long * clrs, clrs), (long * P, P), (scratch, int(scratch > 0))]
    steps, n_runs = sum(s for s, _ in trainings), sum(r for _, r in trainings)
    out: dict[str, Any] = dict(
        name=str(cell["model"]),
        params=params,
        wbytes=wbytes,
        per=per,
        bs=bs,
        runs=runs,
        steps=steps,
        data_bytes=sum(t.numel() * t.element_size() for t in _tensors((train, test))),
        dtype=_dt(next(model.parameters()).dtype),
        points=P,
    )
    if not time_run:
        return out
    with reproducible(1), RssPeak() as peak:
        f, step = time_loop(loop)
        probe = index_batch(train, slice(0, min(int(cell["n_probe"]), batch_size_of(train))))
        lr_mid = float(cell["block_lrs"][lrs // 2])
        MK = {"M": int(cell["M"]), "K": int(cell["K"])}
        kw = dict(eta=lr_mid, block_seed=0, hidden=None, batch_size=64, gradmax_k=GRADMAX_K, keep_gradmax_rows=True)
        criteria = seconds(point_criteria, model, points[P // 2], probe, sp["rank"], **MK, **kw) * P
        evals = {h: seconds(mean_loss, model, sp[h], batch_size=64) for h in ("rank", "B")}
    checks = math.ceil(int(cell["max_steps"]) / int(cell["eval_every"])) * (2 if scratch else 1)
    n_rank = checks + P * lrs + clrs * P  # plateau checks, the lr grid's choice, the continue runs' choice
    n_b = 3 + P * 16  # before; per point: the trained blocks and the continue run, on A and B
    out.update(
        peak=peak.peak,
        train_s=(steps * step + n_runs * f) * runs,
        other_s=(criteria + n_rank * evals["rank"] + n_b * evals["B"] + load_s) * runs,
    )
    return out


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def plan_bench(options: Any = None, *, time_run: bool = True, **keywords: Any) -> Plan:
    """The plan of ``widthscope grow-bench`` (every cell of the suite, no shard; nothing trained
    beyond a few timed steps, nothing written): per model of the suite :func:`_bench_model`, the
    sum over models (their cells run one after the other), the fixed costs once."""
    from .growth.options import GrowBenchOptions, with_keywords  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.suite import cells  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    opts = with_keywords("plan_bench", options, GrowBenchOptions, keywords)
    grid = cells(opts.suite, opts.seeds, M=opts.M, K=opts.K)
    groups: dict[str, list[Any]] = {}
    for cell in grid:
        groups.setdefault(str(cell["model"]), []).append(cell)
    ready = (since_start(), peak_so_far())
    got = [_bench_model(cs[0], len(cs), time_run) for cs in groups.values()]
    return _suite_plan("grow-bench", f"growth suite {opts.suite!r}", grid, got, ready, time_run)


def _suite_plan(
    command: str, what: str, grid: list[Any], got: list[dict[str, Any]], ready: Any, time_run: bool
) -> Plan:
    """A suite's plan: its models' counts and (timed) parts summed, the fixed costs once."""
    big = max(got, key=lambda g: g["wbytes"])
    free, source = device_memory(got[0].get("device", "cpu"))
    counts: list[tuple[str, Any]] = [("cells", len(grid))]
    counts += [
        (
            g["name"],
            f"{g['params']:,} parameters, {human_size(g['wbytes'])}; {g['steps']:,} training steps "
            f"per cell x {g['runs']} cell(s)" + (f"; {g['note']}" if g.get("note") else ""),
        )
        for g in got
    ]
    counts.append((f"memory ({source})", None if free is None else human_size(free)))
    base: dict[str, Any] = dict(command=command, model=what, parameters=big["params"], weight_bytes=big["wbytes"])
    per = max(g["per"] for g in got)
    base.update(bytes_per_example=per, batch_size=max(g["bs"] for g in got), dtype=big["dtype"], counts=tuple(counts))
    notes = [PLATEAU]
    if not time_run or any("train_s" not in g for g in got):
        held = peak_so_far()
        peak = held + max(4 * g["wbytes"] + g["per"] * g["bs"] + g.get("data_bytes", 0) for g in got)
        notes.insert(
            0,
            COUNTED if not time_run else "not timed: " + "; ".join(g["note"] for g in got if "train_s" not in g),
        )
        return Plan(**base, max_batch=_fits(free, held, per), peak_bytes=peak, notes=tuple(notes))
    parts: list[tuple[str, float | None]] = [(f"{FIXED} and imports (measured)", ready[0])]
    for g in got:
        parts += [(f"{g['name']}: training, {g['steps']:,} steps x {g['runs']} cell(s)", g["train_s"])]
        parts += [(f"{g['name']}: {g.get('other', 'criteria, evaluations, data')}", g["other_s"])]
    peak = max([ready[1]] + [g["peak"] for g in got])
    notes.insert(
        0,
        "time = since the process started + per model one training step timed x the steps of its cells "
        "+ the rest timed once; peak = measured while they ran",
    )
    return Plan(**base, max_batch=_fits(free, peak, per), parts=tuple(parts), peak_bytes=int(peak), notes=tuple(notes))


# ----------------------------------------------------------------------------- grow-target --plan
def _target_setting(cell: Any, runs: int, time_run: bool) -> dict[str, Any]:
    """One setting of the compute-to-target suite: its models counted on the meta device (weights,
    bytes per example, step FLOPs: the benchmark's budget), each run's steps (growth runs at their
    longest, to ``cap x B``), and with ``time_run`` (where the suite's device is here) one step of
    each distinct model timed in the cell's own loop, one held-out evaluation and growth signal."""
    from .growth.schedule import SCHEDULES  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.suite import reproducible  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.target import (  # noqa: PLC0415  start-up time: each command loads only its own pipeline
        OPERATORS,
        CellContext,
        budget_steps,
        measure_signal,
        meta_step_flops,
        start_run,
        target_model,
        train_until,
    )
    from .train import resolve_device  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    W, D, w, d = (int(cell[k]) for k in ("width", "depth", "small_width", "small_depth"))
    shapes = {
        "target": (W, D),
        **{k: s for k, s in (("depth", (W, d)), ("width", (w, D))) if k in {OPERATORS[o] for o in cell["operators"]}},
    }
    flops = {k: meta_step_flops(cell, *s)[0] for k, s in shapes.items()}
    meta = target_model(cell, W, D, meta=True)
    params, wbytes = weights(meta)

    def count(n: int) -> int:
        ids = torch.zeros(n, int(cell["seq_len"]), dtype=torch.long, device="meta")
        return saved_bytes(lambda: meta(ids, labels=ids).loss, meta)

    steps = budget_steps(cell, params)
    B, cap, evals = steps * flops["target"], float(cell["cap"]), int(cell["evals"])
    earliest = [
        (s.fractions[0] if s.kind == "fixed" else s.earliest) for s in (SCHEDULES[c] for c in cell["schedules"])
    ]
    # (model, steps, evaluations) of every run of one seed; zero_block's grown model has the target's shape
    work = [("target", steps, evals + 1)]
    work += [
        (k, math.ceil(cap * B * (1 - 1e-12) / flops[k]), math.ceil(cap * evals) + 1) for k in shapes if k != "target"
    ]
    work += [
        ("target", math.ceil((cap - e) * B / flops["target"]), math.ceil((cap - e) * evals) + 1)
        for _ in cell["operators"]
        for e in earliest
    ]
    device = str(cell.get("device", "cpu"))
    out: dict[str, Any] = dict(
        name=f"llama {W} x {D}",
        params=params,
        wbytes=wbytes,
        per=per_example(count),
        bs=int(cell["batch_size"]),
        runs=runs,
        steps=sum(s for _, s, _ in work),
        dtype=_dt(next(meta.parameters()).dtype),
        device=device,
        data_bytes=8 * int(cell["seq_len"]) * (int(cell["n_train"]) + int(cell["n_eval"]) + 2 * int(cell["n_signal"])),
        budget=B,
    )
    try:
        resolve_device(device)
    except WidthscopeError as exc:
        out.update(device="cpu", note=f"the suite trains on {str(exc).split(';')[0]}: counted, not timed")
        return out
    if not time_run:
        return out
    seed = int(cell["seed"])
    with reproducible(1), RssPeak() as peak:
        ctx, load_s = clocked(CellContext, cell)
        ctx.grid = math.inf  # no evaluation inside the timed loops but the last
        real: dict[str, nn.Module] = {}
        for k, s in shapes.items():
            torch.manual_seed(seed)
            real[k] = target_model(cell, *s)

        def loop(m: nn.Module) -> Callable[[int], Any]:
            f = ctx.step_flops(m)
            return lambda k: train_until(ctx, start_run(ctx, copy.deepcopy(m), seed, k * f), k * f)

        step_s = {k: time_loop(loop(m)) for k, m in real.items()}
        eval_s = {k: seconds(ctx.eval_loss, m) for k, m in real.items()}
        kinds = {SCHEDULES[s].kind for s in cell["schedules"]} & {"certificate", "misalignment"}
        signal = sum(seconds(measure_signal, ctx, real[k], kd) for k in real if k != "target" for kd in kinds)
    train_s = sum(steps * step_s[k][1] + step_s[k][0] + n_eval * eval_s[k] for k, steps, n_eval in work)
    out.update(
        peak=peak.peak,
        train_s=train_s * runs,
        other_s=(signal * math.ceil(cap * evals) + load_s) * runs,
        other="growth signals, data",
    )
    return out


def plan_target(options: Any = None, *, time_run: bool = True, **keywords: Any) -> Plan:
    """The plan of ``widthscope grow-target`` (every cell; nothing trained beyond a few timed steps,
    nothing written): per suite setting :func:`_target_setting`, summed, the fixed costs once."""
    from .growth.options import GrowTargetOptions, with_keywords  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.target import suite_cells  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    opts = with_keywords("plan_target", options, GrowTargetOptions, keywords)
    grid = suite_cells(opts)
    groups: list[tuple[dict[str, Any], list[Any]]] = []
    for c in grid:
        key = {k: v for k, v in c.items() if k not in ("seed", "kind")}
        match = next((cs for k, cs in groups if k == key), None)
        if match is None:
            groups.append((key, [c]))
        else:
            match.append(c)
    ready = (since_start(), peak_so_far())
    got = [_target_setting(cs[0], len(cs), time_run) for _, cs in groups]
    return _suite_plan("grow-target", f"compute-to-target suite {grid[0]['suite']!r}", grid, got, ready, time_run)


# ----------------------------------------------------------------------------- sweep --dry-run / --plan
@dataclasses.dataclass(frozen=True)
class CellPlan:
    """One distinct model of a sweep: its cells in this shard, those not finished, and the plan of
    one cell (``None`` where it could not be counted: ``note``)."""

    label: str
    cells: int
    left: int
    plan: Plan | None = None
    note: str | None = None

    @property
    def cell_s(self) -> float | None:
        return None if self.plan is None else work_s(self.plan)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "plan": None if self.plan is None else self.plan.to_dict()}


def _alignment_plan(cfg: Any, fam: Any, width: float, budget: int, timed_run: bool) -> Plan | str:
    """One cell of an alignment family at ``width``: the model built on the meta device (weights;
    the probe's saved bytes per example and its samples' widths, counted); with ``timed_run`` the
    model built for real on ``[sweep].device`` and :func:`_alignment_time`."""
    from . import models  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .probe.collect import run_batch  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .probe.insert import channel_dim  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .sweeps.cell import cell_options  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .sweeps.pools import fill_model_options, load_split, probe_conditions, probe_lengths  # noqa: PLC0415  cycle: widthscope.sweeps imports this module

    try:
        split = load_split(fam, budget, cfg)
    except (WidthscopeError, OSError) as exc:
        return f"data not read ({str(exc)[:200]}): not counted"
    build = functools.partial(models.build, fam.model, width, **fill_model_options(fam, split))
    try:
        with torch.device("meta"):
            model = build()
    except (RuntimeError, NotImplementedError):  # an init the meta device cannot run: these models are small
        model = build()
    opts = cell_options(cfg, {"family": fam.name, "seed": 0})
    names = resolve_points(model, fam.points or None)
    where = next(p.device for p in model.parameters())

    def batch(n: int) -> Any:
        X, y = split.train[0][:n].to(where), split.train[1][:n].to(where)
        return X if split.task == "lm" else (X, y)

    shapes: dict[str, torch.Size] = {}

    def seen(name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _i: Any, out: Any) -> None:
            shapes.setdefault(name, (out[0] if isinstance(out, tuple) else out).shape)

        return hook

    def count() -> int:  # the probe's forward (per-example losses, the points on the path): what its backward keeps
        hooks = [model.get_submodule(n).register_forward_hook(seen(n)) for n in names]
        try:
            return per_example(lambda n: saved_bytes(lambda: run_batch(model, batch(n), None, 0), model))
        finally:
            for h in hooks:
                h.remove()

    try:
        per = count()
    except (RuntimeError, NotImplementedError, WidthscopeError):  # a forward the meta device cannot run
        if where.type != "meta":
            raise
        torch.manual_seed(0)
        model, where = build(), torch.device("cpu")
        per = count()
    dims = 0
    for shape in shapes.values():
        z = torch.empty(shape, device="meta")
        dims += z[0].numel() if opts.pool == "flatten" or z.ndim < 2 else int(shape[channel_dim(z)])
    conditions = sum(len(probe_lengths(fam, c)) for c in probe_conditions(fam))
    examples = (fam.n_probe_train + fam.n_probe_test) * conditions
    params, wbytes = weights(model)
    samples = 8 * dims * examples
    free, _ = device_memory(cfg.device)
    parts = (("one cell", _alignment_time(cfg, fam, width, budget)),) if timed_run else ()
    return Plan(
        command="sweep",
        model=f"{fam.name} @ {width}",
        parameters=params,
        weight_bytes=wbytes,
        bytes_per_example=per,
        batch_size=fam.probe_batch_size,
        max_batch=_fits(free, wbytes + samples, per),
        parts=parts,
        dtype=_dt(next(model.parameters()).dtype),
        examples=examples,
        sample_bytes=samples,
    )


def _alignment_time(cfg: Any, fam: Any, width: float, budget: int) -> float:
    """One cell's seconds on a model built for real on ``[sweep].device``, as the cell spends them:
    one training step timed (forward, loss, backward, AdamW) x steps; per probe condition and length
    one probed batch timed x the pools' batches, every point's statistics timed on random samples of
    the pools' sizes and the point's width (one per distinct shape); one forward per example x the
    interventions' example-forwards; with a ``monitor`` table one monitor probe x its steps."""
    import tempfile  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from pathlib import Path  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    from . import models  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .probe.collect import logits_of  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .sweeps.cell import cell_monitor, cell_options  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .sweeps.config import LM_DATASETS  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .sweeps.pools import fill_model_options, load_split, pool_batches, probe_conditions, probe_lengths, probe_pools  # noqa: PLC0415  cycle: widthscope.sweeps imports this module

    split = load_split(fam, budget, cfg)
    torch.manual_seed(0)
    model = models.build(fam.model, width, **fill_model_options(fam, split)).to(cfg.device)
    lm, bs = fam.dataset in LM_DATASETS, min(int(fam.train.get("batch_size", 64)), budget)
    train_batch = pool_batches((split.train[0][:bs], split.train[1][:bs]), split.task, bs)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=float(fam.train["lr"]))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if lm:
            ids = train_batch.to(cfg.device)
            logits = logits_of(model(ids))
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        else:
            x, y = (t.to(cfg.device) for t in train_batch)
            loss = nn.functional.cross_entropy(logits_of(model(x)), y)
        loss.backward()
        opt.step()

    total = int(fam.train["steps"]) * timed(step)
    model.eval()
    opts = cell_options(cfg, {"family": fam.name, "seed": 0})
    points = resolve_points(model, list(opts.points) if opts.points else None)
    forward: float | None = None
    stats: dict[tuple[int, int, int, int], float] = {}
    for cond in probe_conditions(fam):
        for L in probe_lengths(fam, cond):
            pa, pb, _, _ = probe_pools(fam, cond, L, split, cfg)
            one = pool_batches(pa, split.task, fam.probe_batch_size)[:1]
            kw: dict[str, Any] = dict(points=points, pool=opts.pool, train_mode=opts.train_mode, progress=False)
            got, batch_s = collect(model, one, **kw), timed(functools.partial(collect, model, one, **kw))
            rows = batch_size_of(one[0])
            total += batch_s * (math.ceil(len(pa[0]) / rows) + math.ceil(len(pb[0]) / rows))
            if forward is None:  # the interventions run on the first condition and length
                forward = timed(functools.partial(mean_loss, model, one[0], None, batch_size=rows)) / rows
            for p in points:
                key = (len(pa[0]), len(pb[0]), int(got[p].shape[1]), max(1, got[p].shape[0] // rows))
                if key not in stats:
                    stats[key] = time_statistics(opts, key[:2], key[2], key[3])
                total += stats[key]
    if opts.kind in ("bias", "block"):
        steps = len(opts.etas) if opts.etas is not None else opts.n_etas
        total += (forward or 0.0) * len(points) * steps * max(k for _, k in opts.pairs)
    if fam.monitor is not None:
        with tempfile.TemporaryDirectory(prefix="widthscope-plan-monitor-") as tmp:  # its log: not the results
            mon, _ = cell_monitor(cfg, fam, split, model, opts, Path(tmp))
            calls = iter(range(2))
            total += timed(lambda: mon.probe(model, next(calls))) * len(fam.monitor["steps"])
    return total


def plan_alignment(cfg: Any, cells: Any, done: Callable[[Any], bool], *, timed_run: bool = False) -> list[CellPlan]:
    """One :class:`CellPlan` per distinct (family, width) of an alignment sweep's ``cells``
    (``done``: a finished cell); ``timed_run`` (``sweep --plan``): each with one cell's seconds."""
    groups: dict[tuple[str, float], list[Any]] = {}
    for c in cells:
        groups.setdefault((c["family"], c["width"]), []).append(c)
    out = []
    for (name, width), these in groups.items():
        fam = next(f for f in cfg.families if f.name == name)
        try:
            got = _alignment_plan(cfg, fam, width, int(these[0]["budget"]), timed_run)
        except WidthscopeError as exc:
            raise WidthscopeError(f"sweep config family {name!r} at width {width}: {exc}") from None
        left = sum(1 for c in these if not done(c))
        label = f"{name} @ {width}"
        plan, note = (got, None) if isinstance(got, Plan) else (None, got)
        out.append(CellPlan(label, len(these), left, plan, note))
    return out


def plan_suite_models(
    cfg: Any, cells: Any, done: Callable[[Any], bool], directory: Callable[[Any], Any], *, timed_run: bool = False
) -> list[CellPlan]:
    """One :class:`CellPlan` per distinct checkpoint architecture of a suite's ``cells`` (keyed by
    its ``config.json``; ``directory``: a cell's local snapshot, None when not cached): the
    ``certify --plan`` of one cell (:func:`plan_certify`; ``timed_run``: the weights loaded and a
    batch timed), its work only (the process's start is the sweep's, once)."""
    import hashlib  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    groups: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
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
        label, left = f"{model} @ {', '.join(revs)}", sum(1 for c, _ in these if not done(c))
        if where is None or key.startswith("missing"):
            out.append(CellPlan(label, len(these), left, note="not cached: not counted"))
            continue
        # the local snapshot itself: no hub call, and the revision's own files
        spec = dataclasses.replace(cfg.spec(model, cell["revision"]), model=str(where), revision=None)
        try:
            plan = plan_certify(spec, cfg.certify, run, time_run=timed_run)
        except WidthscopeError as exc:
            raise WidthscopeError(
                f"sweep config [suite] model {model!r} revision {cell['revision']!r}: {exc}"
            ) from None
        out.append(CellPlan(label, len(these), left, plan))
    return out


def print_cell_plans(rows: Any, shard: tuple[int, int], device: str, file: Any = None) -> None:
    """The cost table (one row per distinct model), then the unfinished cells' largest memory and,
    where timed, their predicted wall time with the fixed costs this process has paid so far."""
    timed_run = any(r.cell_s is not None for r in rows)

    def size(v: int | None) -> str:
        return "?" if v is None else human_size(v)

    table = []
    for r in rows:
        p = r.plan
        table.append(
            {
                "model": r.label,
                "cells (left)": f"{r.cells} ({r.left})",
                "parameters": "?" if p is None else f"{p.parameters:,}",
                "weights": "?" if p is None else f"{human_size(p.weight_bytes)} {p.dtype}",
                "saved / probed example": size(None if p is None else p.bytes_per_example),
                "samples / cell": size(None if p is None else p.sample_bytes),
                "largest batch": "?" if p is None or p.max_batch is None else p.max_batch,
                **({"time / cell": _sec(r.cell_s)} if timed_run else {}),
                "note": r.note or "",
            }
        )
    free, source = device_memory(device)
    k, n = shard
    print(format_table(table, title=f"cost plan (memory: {source} on {device})"), file=file)
    left = sum(r.left for r in rows)
    counted = [r.plan for r in rows if r.plan is not None and r.left]
    held = max(
        (p.weight_bytes + (p.sample_bytes or 0) + (p.bytes_per_example or 0) * p.batch_size for p in counted), default=0
    )  # weights + samples + one probe batch
    unknown = sum(r.left for r in rows if r.plan is None)
    print(
        f"total over the {left} unfinished cell(s) of shard {k}/{n}"
        + (f": the largest cell holds {human_size(held)} beside the process" if held else "")
        + (f" ({human_size(free)} free)" if free is not None and held else "")
        + (f"; {unknown} cell(s) not counted" if unknown else ""),
        file=file,
    )
    if timed_run:
        work = sum((r.cell_s or 0.0) * r.left for r in rows)
        untimed = sum(r.left for r in rows if r.cell_s is None)
        fixed = since_start()
        print(
            f"predicted wall time of the {left} unfinished cell(s) on this machine: {_sec(work + fixed)} (the process "
            f"so far, {_sec(fixed)}, + one cell per model timed x its cells"
            + (f"; {untimed} cell(s) not timed" if untimed else "")
            + ")",
            file=file,
        )
