"""``--plan``: a run's whole-process cost: parameters and weight bytes (meta device under ``--plan-no-time``),
bytes saved per example and the largest batch that fits, one batch or step timed and scaled, and the fixed
costs (process start, imports, loading). The suite commands sum per-model plans. Nothing is written."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import torch
import torch.nn as nn

from . import models
from ._io import format_table, human_size
from .certification.per_point import statistics
from .certification.pipeline import device_memory, load_checkpoint, run_device
from .data.inputs import resolve
from .data.spec import is_all
from .errors import WidthscopeError
from .growth.block import train_new_block, trainable
from .growth.options import GrowBenchOptions, GrowOptions, GrowTargetOptions
from .growth.pipeline import builtin_inputs, check_builtin, chosen_points, load_inputs, rank_points, split_pools
from .linear.correlation import correlation_summary, parse_correlation_name
from .models.hf import meta_checkpoint
from .options import CertifyOptions, CertifyRunOptions, with_keywords
from .probe import collect, resolve_points
from .probe.batches import batch_size_of, index_batch, to_batches
from .probe.blocks import block_of
from .probe.collect import logits_of, run_batch, to_device
from .probe.growth import point_criteria
from .probe.insert import channel_dim, insert
from .probe.steps import mean_loss
from .train import resolve_device
from .train import train as train_model


# ----------------------------------------------------------------------------- the result
def _sec(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g} s" if v < 120 else f"{v:.0f} s ({v / 60:.1f} min)"


def _size(v: int | None, unknown: Any = None) -> Any:
    return unknown if v is None else human_size(v)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's cost. ``parts``: (name, seconds or ``None``) the whole process spends, the fixed costs
    first; ``counts``: (name, value) counted; ``peak_bytes``: the whole process's predicted peak RSS."""

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
        d.update(parts=[{"part": n, "seconds": t} for n, t in self.parts], counts=dict(self.counts))
        d.update(notes=list(self.notes), predicted_s=self.predicted_s)
        return d

    def table(self) -> str:
        rows: list[tuple[str, Any]] = [
            ("model", self.model),
            ("parameters", f"{self.parameters:,}"),
            ("weights", human_size(self.weight_bytes)),
            ("saved activations per example", _size(self.bytes_per_example)),
            ("batch size", self.batch_size),
            ("largest batch that fits", self.max_batch),
            *self.counts,
            *((f"time: {n}", _sec(t)) for n, t in self.parts),
            *_totals(self.predicted_s, self.peak_bytes),
        ]
        table = format_table([{"what": k, "plan": v} for k, v in rows], title=f"cost plan: {self.command}")
        return table + "".join(f"\nnote: {n}" for n in self.notes)


def _totals(seconds: float | None, peak: int | None) -> list[tuple[str, Any]]:
    """The two rows every plan ends with: what ``/usr/bin/time -v`` reports for the whole process."""
    return [
        ("predicted wall time (whole process)", "not predicted" if seconds is None else _sec(seconds)),
        ("predicted peak memory (whole process, RSS)", _size(peak)),
    ]


def whole_process(seconds: float | None, peak: int | None, title: str) -> str:
    """The totals of a plan made of parts (a sweep's cells, the demo's parts), as :meth:`Plan.table` ends."""
    return format_table([{"what": k, "plan": v} for k, v in _totals(seconds, peak)], title=title)


FIXED = "process start"  # the name every fixed part starts with
READY = f"{FIXED}, imports, loading the model and the data (measured)"
COUNTED = "no time predicted (--plan-no-time): counted, not timed"
NO_TIME = f"{COUNTED}; memory = the process now + the weights + a batch"
PLATEAU = "runs that stop early (to a plateau, to a target) are counted at their longest: time is an upper bound"


def work_s(plan: Plan) -> float | None:
    """The seconds of ``plan``'s work: its parts less the fixed ones; ``None`` when not timed."""
    return sum(t or 0.0 for n, t in plan.parts if not n.startswith(FIXED)) if plan.timed else None


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
        self.every, self.peak, self._proc = every, 0, psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, int(self._proc.memory_info().rss))

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> RssPeak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def _nbytes(x: Any) -> int:
    """The bytes of the tensors in ``x`` (nested in dicts, lists and tuples)."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        x = list(x.values())
    return sum(_nbytes(v) for v in x) if isinstance(x, (list, tuple)) else 0


def weights(model: nn.Module) -> tuple[int, int]:
    """(parameters, weight bytes) of ``model`` (meta or real), each parameter once."""
    return sum(p.numel() for p in model.parameters()), _nbytes(list(model.parameters()))


def saved_bytes(fn: Callable[[], Any], model: nn.Module | None = None) -> int:
    """The bytes autograd saves for the backward while ``fn()`` runs: each storage once (on the meta
    device each tensor), the parameters of ``model`` left out (they are counted as weights)."""

    def key(t: torch.Tensor) -> int:
        return id(t) if t.device.type == "meta" else t.untyped_storage().data_ptr()

    seen = {key(p) for p in model.parameters()} if model is not None else set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if key(t) not in seen:
            seen.add(key(t))
            total += _nbytes(t) if t.device.type == "meta" else t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def per_example(count: Callable[[int], int]) -> int:
    """Bytes per example: ``count(2) - count(1)``, at least a sixteenth of ``count(1)``."""
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
    after a warm-up step (``large`` raised until it takes ``min_s``), the step the slope; loops under a
    second are timed three times and the fastest kept, so one pause cannot zero or double the slope."""
    run(1)
    got = [seconds(run, small), seconds(run, large)]
    if got[1] < min_s:
        large = min(50 * large, max(large + 1, math.ceil(large * min_s / max(got[1], 1e-6))))
        got[1] = seconds(run, large)
    if got[1] < 1.0:  # cheap: twice more each, the fastest kept
        got = [min([t, seconds(run, n), seconds(run, n)]) for t, n in zip(got, (small, large))]
    step = max(0.0, (got[1] - got[0]) / (large - small))
    return max(0.0, got[0] - small * step), step


def _fits(free: int | None, held: int, per: int | None) -> int | None:
    return None if free is None or not per else max(0, (free - held) // per)


def _dt(model: nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def _memory(device: Any) -> tuple[int | None, tuple[str, Any]]:
    """The free memory of ``device`` and its row of a plan's counts."""
    free, source = device_memory(device)
    return free, (f"memory ({source})", _size(free))


def _interventions(opts: Any) -> tuple[int, int]:
    """(steps, the largest K) of a certification's interventions ((0, 0): none run)."""
    steps = len(opts.etas) if opts.etas is not None else opts.n_etas
    if opts.kind not in ("bias", "block") or not steps:
        return 0, 0
    return steps, max(k for _, k in opts.pairs)


def time_statistics(options: Any, n: tuple[int, int], d: int, rows: int) -> float:
    """Seconds of one point's statistics on random samples of ``n`` (train, held-out) x ``rows`` rows of width ``d``."""
    g = torch.Generator().manual_seed(0)
    a, b = ({"p": torch.randn(k * rows, options.project or d, generator=g, dtype=torch.float64)} for k in n)
    keys = ("pairs", "draws", "seed", "estimator", "pool", "project", "draw_scheme")
    return seconds(lambda: statistics(a, b, **{k: getattr(options, k) for k in keys}, dims={"p": d}))


# ----------------------------------------------------------------------------- certify --plan
def plan_certify(spec: Any, options: Any = None, run_options: Any = None, *, time_run: bool = True) -> Plan:
    """The plan of ``widthscope certify``: the model (meta device without ``time_run``) and data loaded as the run
    does; one probed batch, one point's statistics and one intervention forward timed and scaled to the run."""
    options, run_options = options or CertifyOptions(), run_options or CertifyRunOptions()
    device = run_device(run_options.device)
    meta = None if time_run else meta_checkpoint(spec.model, spec.revision, spec.task, spec.dtype)
    model = meta if meta is not None else load_checkpoint(spec, options.seed)[0]
    if meta is None and spec.model == "builtin" and spec.dtype != "auto":
        model.to(getattr(torch, spec.dtype))
    inputs = resolve(spec, model=model, show_progress=False)
    ready = (since_start(), peak_so_far())
    names = resolve_points(model, list(options.points) if options.points else None)
    data = ((inputs.train, spec.n_train), (inputs.test, spec.n_test))
    n = [batch_size_of(x) if is_all(k) else int(k) for x, k in data]
    bs, notes = run_options.batch_size, []
    if meta is None and getattr(model, "hf_device_map", None) is None:
        model.to(device)
    first = next(model.parameters())

    def probe(batch: Any) -> Any:
        return collect(model, [batch], points=names, loss_fn=inputs.loss_fn, pool=options.pool, progress=False)

    def count(k: int) -> int:
        batch = to_device(index_batch(inputs.train, slice(0, k)), first.device, first.dtype)
        return saved_bytes(lambda: probe(batch), model)

    try:
        per: int | None = per_example(count)
    except Exception as exc:  # noqa: BLE001  a model the meta device cannot run: said, not counted
        per = None
        notes.append(f"saved bytes not counted on the meta device ({type(exc).__name__}): run --plan to count them")
    free, memory = _memory(device)
    batches = math.ceil(n[0] / bs) + math.ceil(n[1] / bs)
    counts = [("insertion points", len(names)), ("examples probed", f"{n[0]} + {n[1]} ({batches} batches)"), memory]
    params, wbytes = weights(model)
    label = str(spec.to_dict()["model"])
    plan = functools.partial(Plan, "certify", label, params, wbytes, per, bs, dtype=_dt(model), examples=sum(n))
    if not time_run:
        held = peak_so_far() + (wbytes if meta is not None else 0)
        peak = None if per is None else held + per * bs
        return plan(_fits(free, held, per), counts=tuple(counts), peak_bytes=peak, notes=(*notes, NO_TIME))
    batch = to_batches(inputs.train, bs)[0]
    rows = batch_size_of(batch)
    with RssPeak() as probe_peak:
        probed = probe(batch)
        batch_s = timed(lambda: probe(batch)) * bs / rows
    per_row = _nbytes(probed) / max(1, rows)
    samples = int(per_row * sum(n))
    width = {p: int(v.shape[-1]) for p, v in probed.items()}
    point_rows = max(1, round(per_row / 8 / max(1, sum(width.values()))))
    with RssPeak() as stats_peak:  # one point's samples: float64, of the width the statistics see
        stats_s = time_statistics(options, (n[0], n[1]), max(width.values()), point_rows)
    one_point = 8 * sum(n) * point_rows * (options.project or max(width.values()))
    parts = [(READY, ready[0]), (f"probe: one batch of {bs} x {batches} batches", batch_s * (sum(n) + 1) / bs)]
    parts.append((f"statistics: one point x {len(names)}", stats_s * len(names)))
    steps, k_max = _interventions(options)
    if steps:
        cached = options.kind == "bias" and options.project is None and options.train_mode == "eval"
        share = (len(names) + 1) / (2 * len(names)) if cached else 1.0  # the network after each point, averaged
        fwd = timed(lambda: mean_loss(model, batch, inputs.loss_fn, batch_size=bs)) / rows
        what = f"interventions: {steps} steps x {k_max} examples x {len(names)} points"
        parts.append((what, fwd * share * steps * k_max * len(names)))
    counts.append(("pooled samples (all points, all examples)", human_size(samples)))
    notes.append(
        "time = since the process started (imports, loading) + probe batches + statistics x points + interventions; "
        "peak = the largest resident size measured while a batch and a point's statistics ran + the samples held"
    )
    if spec.model == "builtin":
        notes.append("the built-in model's training is in the fixed part (the plan trains it as the run does)")
    peak = int(max(ready[1], probe_peak.peak + samples, stats_peak.peak + samples - one_point))
    return plan(
        _fits(free, probe_peak.peak + samples, per),
        parts=tuple(parts),
        counts=tuple(counts),
        peak_bytes=peak,
        notes=tuple(notes),
        sample_bytes=samples,
    )


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
    """The plan of ``run_grow(spec, options, n_train=, n_test=, dtype=)``: the ranking timed on pools of ``(M, K)``,
    ``(2M, K)``, ``(M, 2K)`` and extrapolated, one block's training loop and one evaluation batch timed and scaled."""
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
    train = split[0]
    pools = split_pools(model, train, split[1], opts)
    names = resolve_points(model, opts.points)
    one = index_batch(pools.probe_train, slice(0, 1))
    got = collect(model, [one], points=names, loss_fn=loss_fn, progress=False)
    widths = {p: int(v.shape[1]) for p, v in got.items()}
    runs = len(chosen_points([{"point": p} for p in names], opts))
    bs = min(opts.batch_size, batch_size_of(train))
    at = max(names, key=lambda p: widths[p])  # the block grown at the widest point
    grown = copy.deepcopy(model)
    insert(grown, at, "block", width=widths[at], hidden=opts.block_width, seed=opts.seed)

    def fresh() -> tuple[nn.Module, list[nn.Parameter]]:
        m = copy.deepcopy(grown)
        return m, trainable(m, None if opts.train_all else list(block_of(m, at).parameters()))

    fit = functools.partial(train_new_block, lr=opts.lr, seed=opts.seed, loss_fn=loss_fn, show_progress=False)

    def count(k: int) -> int:  # the bytes one training step on k examples saves
        m, ps = fresh()
        return saved_bytes(lambda: fit(m, ps, index_batch(train, slice(0, k)), steps=1, batch_size=k), m)

    params, wbytes = weights(model)
    free, memory = _memory("cpu")
    n_tr, n_rk = pools.n_train, pools.n_rank
    sample_bytes = 8 * (n_tr + n_rk) * sum(widths.values())
    blocks = f"{runs} x {opts.steps} steps (batch {bs})" + (" + the continue baseline" if opts.compare else "")
    counts = (
        ("insertion points", len(names)),
        ("ranking pools", f"{n_tr} train + {n_rk} held-out examples"),
        ("blocks grown", blocks),
        ("ranking samples (float64, every point)", human_size(sample_bytes)),
        memory,
    )
    per = per_example(count)
    plan = functools.partial(Plan, "grow", name, params, wbytes, per, bs, counts=counts, dtype=_dt(model))
    if not time_run:
        held = peak_so_far()
        return plan(_fits(free, held, per), peak_bytes=held + sample_bytes + 4 * wbytes + per * bs, notes=(NO_TIME,))
    parts = [(READY, ready[0])]
    if base_s is not None:
        parts.append(("the built-in model's base training (300 steps)", base_s))

    # the ranking: timed at the first and the last point on pools of (M, K), (2M, K), (M, 2K), fitted in
    # train and held-out examples and extrapolated to the run's pools and points
    ends = sorted({names[0], names[-1]}, key=names.index)

    def rank(a: int, b: int) -> None:
        ab = index_batch(pools.probe_train, slice(0, a)), index_batch(pools.rank_test, slice(0, b))
        rank_points(model, *ab, opts.replace(points=tuple(ends)), loss_fn=loss_fn, show_progress=False)

    m_, k_ = max(opts.M, 4), max(opts.K, 4)
    sizes = [(min(n_tr, m_), min(n_rk, k_)), (min(n_tr, 2 * m_), min(n_rk, k_)), (min(n_tr, m_), min(n_rk, 2 * k_))]
    with RssPeak() as rank_peak:
        rank(*sizes[0])  # warm-up
        times = [seconds(rank, a, b) for a, b in sizes]
    (a0, b0), small = sizes[0], sum(sizes[0])
    c_a = (times[1] - times[0]) / (sizes[1][0] - a0) if sizes[1][0] > a0 else times[0] / small
    c_b = (times[2] - times[0]) / (sizes[2][1] - b0) if sizes[2][1] > b0 else times[0] / small
    ranking_s = max(0.0, times[0] + max(0.0, c_a) * (n_tr - a0) + max(0.0, c_b) * (n_rk - b0)) * len(names) / len(ends)
    with RssPeak() as grow_peak:
        f, step = time_loop(lambda k: fit(*fresh(), train, steps=k, batch_size=opts.batch_size))
    # the held-out evaluations: one batch timed, counted as the run evaluates
    n_eval = pools.n_test - pools.n_rank
    evaluate = index_batch(pools.evaluate, slice(0, min(bs, n_eval)))
    eval_s = timed(lambda: mean_loss(model, evaluate, loss_fn, batch_size=bs))
    evals = runs + (1 if opts.compare else 0)
    parts += [
        (f"ranking {len(names)} points (timed at 2 points on small pools, extrapolated)", ranking_s),
        (f"growing: {runs} x {opts.steps} steps", runs * (f + opts.steps * step)),
        ("held-out evaluations", eval_s * (2 * evals * -(-n_eval // bs) + evals * -(-(opts.M + opts.K) // bs))),
    ]
    if opts.compare:  # the original trained for the FLOPs of the best growth: about its time
        parts.append(("continue baseline (the FLOPs of one growth)", f + opts.steps * step))
    scale = sample_bytes * max(0, n_tr + n_rk - small) // max(1, n_tr + n_rk)
    peak = max(ready[1], rank_peak.peak + scale, grow_peak.peak + runs * wbytes)
    note = (
        "time = since the process started (imports, loading) + ranking + growing + evaluations; peak = the largest "
        "resident size measured while the ranking and a growth ran + the ranking's samples at the run's pools"
    )
    return plan(_fits(free, grow_peak.peak, per), parts=tuple(parts), peak_bytes=int(peak), notes=(note,))


# ----------------------------------------------------------------------------- linearize --plan
def plan_linearize(config: Any, *, time_run: bool = True) -> Plan:
    """The plan of ``widthscope linearize`` (every cell): the widest network counted twice (it and its
    linearization); with ``time_run`` one whole cell run per width, times that width's cells."""
    from .linearization.config import build_mlp, make_cells, validate_config  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .linearization.run import cell_inputs, run_cell  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    cfg = validate_config(config)
    cells = make_cells(cfg)
    (X, Y), (Xt, Yt), k, words = cell_inputs(cfg)
    ready = (since_start(), peak_so_far())
    tr = cfg["train"]
    bs = int(tr["batch_size"]) or int(X.shape[0])
    widths = sorted({int(c["width"]) for c in cells})
    torch.manual_seed(0)
    net = build_mlp(cfg, widths[-1], X.shape[1], k).to(getattr(torch, tr["dtype"]))
    params, wbytes = weights(net)

    def loss(n: int) -> Any:
        out = net(X[:n])
        return ((out - Y[:n]) ** 2).sum() if tr["loss"] == "mse" else nn.functional.cross_entropy(out, Y[:n])

    def correlations(w: int) -> None:  # a cell's derivative correlations, on a fresh model of width w
        torch.manual_seed(0)
        model, c = build_mlp(cfg, w, X.shape[1], k).to(X.dtype), cfg["correlations"]
        for name in c["measure"]:
            D, d = parse_correlation_name(name)
            correlation_summary(model, X, D=D, d=d, n_tuples=c["n_tuples"], eta=tr["eta0"], output=c["output"])

    per = 2 * per_example(lambda n: saved_bytes(lambda: loss(n), net))  # the network and its linearization
    free, memory = _memory("cpu")
    counts = (
        ("cells", f"{len(cells)} ({len(widths)} widths x {len(cfg['seeds'])} seeds x {len(tr['alphas'])} alphas)"),
        ("steps per cell", f"{int(tr['steps'])} (at most: a diverging cell stops early)"),
        ("data", f"{words.split(':')[0]} ({human_size(_nbytes([X, Y, Xt, Yt]))})"),
        memory,
    )
    shown = ", ".join(str(w) for w in widths)
    label = f"mlp depth {cfg['model']['depth']}, widths {shown} (the widest counted; x2: its linearization)"
    plan = functools.partial(
        Plan, "linearize", label, params, 2 * wbytes, per, bs, counts=counts, dtype=str(tr["dtype"])
    )
    if not time_run:
        held = peak_so_far()  # + two models, each with its gradient and optimizer state
        return plan(_fits(free, held, per), peak_bytes=held + 8 * wbytes + per * bs, notes=(COUNTED,), examples=len(X))
    parts, peak = [(READY, ready[0])], ready[1]
    for w in widths:
        these = [c for c in cells if int(c["width"]) == w]
        corr = sum(1 for c in these if c["correlations"])
        with RssPeak() as p:
            cell_s = seconds(run_cell, cfg, {**these[0], "correlations": False})
            corr_s = seconds(correlations, w) if corr else 0.0  # timed once, untrained: the same cost
        peak = max(peak, p.peak)
        what = f"width {w}: one cell x {len(these)}" + (f" + the correlations x {corr}" if corr else "")
        parts.append((what, cell_s * len(these) + corr_s * corr))
    notes = (
        "time = since the process started (imports, the data) + one cell timed per width x its cells; peak = measured",
        "steps are an upper bound: a diverging cell stops early",
    )
    return plan(_fits(free, peak, per), parts=tuple(parts), peak_bytes=int(peak), notes=notes, examples=len(X))


# ----------------------------------------------------------------------------- grow-bench, grow-target --plan
def plan_bench(options: Any = None, *, time_run: bool = True, **keywords: Any) -> Plan:
    """The plan of ``widthscope grow-bench`` (every cell of the suite, no shard): per model of the
    suite :func:`_bench_model`, summed (their cells run one after the other), the fixed costs once."""
    from .growth.suite import cells  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    opts = with_keywords("plan_bench", options, GrowBenchOptions, keywords)
    grid = cells(opts.suite, opts.seeds, M=opts.M, K=opts.K)
    keys = [str(c["model"]) for c in grid]
    return _suite_plan("grow-bench", f"growth suite {opts.suite!r}", grid, keys, _bench_model, time_run)


def _bench_model(cell: Any, runs: int, time_run: bool) -> dict[str, Any]:
    """One model of the growth suite as its cell builds it (untrained), its training steps counted at their
    longest; timed: a step of the cell's loop, the criteria at the middle point, the held-out evaluations."""
    from .growth.bench import fit_block  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.suite import build_model, cell_data, reproducible, split_held_out  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    (train, test, _, student), load_s = clocked(cell_data, cell)
    sp = split_held_out(cell, test)
    seed = int(cell["seed"])
    torch.manual_seed(seed)
    model = student if student is not None else build_model(cell, cell["depth"] if cell["family"] != "resnet20" else 0)
    model.eval()
    points = list(model.widthscope_points)  # type: ignore[arg-type]
    bs = min(int(cell["batch_size"]), batch_size_of(train))
    params, wbytes = weights(model)
    lr = float(cell["continue_lrs"][0])

    def loop(k: int, data: Any = train, size: int = bs) -> None:
        m = copy.deepcopy(model)
        fit_block(m, list(m.parameters()), data, steps=k, at=(), lr=lr, batch_size=size, seed=seed)

    per = per_example(lambda n: saved_bytes(lambda: loop(1, index_batch(train, slice(0, n)), n), model))
    P, long = len(points), int(cell["long"])
    lrs, clrs, seeds = len(cell["block_lrs"]), len(cell["continue_lrs"]), len(cell["block_seeds"])
    plateau = int(cell["max_steps"]) if int(cell["max_steps"]) > 0 and cell["family"] != "teacher" else 0
    scratch = int(cell["max_steps"]) if cell.get("scratch") else 0
    # (steps, runs): the base; per point each block lr and other block seed, GradMax, train-all; each continue lr
    trainings = [(plateau, int(plateau > 0)), (long, P * (lrs + seeds + 1) + clrs), (scratch, int(scratch > 0))]
    steps, n_runs = sum(s * r for s, r in trainings), sum(r for _, r in trainings)
    out: dict[str, Any] = dict(name=str(cell["model"]), params=params, wbytes=wbytes, per=per, bs=bs, runs=runs)
    out.update(steps=steps, data_bytes=_nbytes((train, test)), dtype=_dt(model))
    if not time_run:
        return out
    with reproducible(1), RssPeak() as peak:
        f, step = time_loop(loop)
        probe = index_batch(train, slice(0, min(int(cell["n_probe"]), batch_size_of(train))))
        MK = {"M": int(cell["M"]), "K": int(cell["K"])}
        kw = dict(
            eta=float(cell["block_lrs"][lrs // 2]), block_seed=0, hidden=None, batch_size=64, keep_gradmax_rows=True
        )
        # gradmax_k: run_cell's GradMax block's hidden width (at most the point's width)
        criteria = seconds(point_criteria, model, points[P // 2], probe, sp["rank"], **MK, **kw, gradmax_k=8) * P
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


def plan_target(options: Any = None, *, time_run: bool = True, **keywords: Any) -> Plan:
    """The plan of ``widthscope grow-target`` (every cell): per suite setting :func:`_target_setting`,
    summed, the fixed costs once."""
    from .growth.target import suite_cells  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    opts = with_keywords("plan_target", options, GrowTargetOptions, keywords)
    grid = suite_cells(opts)
    settings = [{k: v for k, v in c.items() if k not in ("seed", "kind")} for c in grid]
    what = f"compute-to-target suite {grid[0]['suite']!r}"
    return _suite_plan("grow-target", what, grid, settings, _target_setting, time_run)


def _target_setting(cell: Any, runs: int, time_run: bool) -> dict[str, Any]:
    """One setting of the compute-to-target suite: its models counted on the meta device, each run's steps
    (growth runs to ``cap x B``); timed where its device is here: a step of each model, an evaluation, a signal."""
    from .growth import target as gt  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.schedule import SCHEDULES  # noqa: PLC0415  start-up time: each command loads only its own pipeline
    from .growth.suite import reproducible  # noqa: PLC0415  start-up time: each command loads only its own pipeline

    W, D, w, d = (int(cell[k]) for k in ("width", "depth", "small_width", "small_depth"))
    grown = {gt.OPERATORS[o] for o in cell["operators"]}
    shapes = {"target": (W, D), **{k: s for k, s in (("depth", (W, d)), ("width", (w, D))) if k in grown}}
    flops = {k: gt.meta_step_flops(cell, *s)[0] for k, s in shapes.items()}
    meta = gt.target_model(cell, W, D, meta=True)
    params, wbytes = weights(meta)

    def count(n: int) -> int:
        ids = torch.zeros(n, int(cell["seq_len"]), dtype=torch.long, device="meta")
        return saved_bytes(lambda: meta(ids, labels=ids).loss, meta)

    steps = gt.budget_steps(cell, params)
    B, cap, evals = steps * flops["target"], float(cell["cap"]), int(cell["evals"])
    schedules = [SCHEDULES[c] for c in cell["schedules"]]
    earliest = [s.fractions[0] if s.kind == "fixed" else s.earliest for s in schedules]
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
    n_data = int(cell["n_train"]) + int(cell["n_eval"]) + 2 * int(cell["n_signal"])
    out: dict[str, Any] = dict(name=f"llama {W} x {D}", params=params, wbytes=wbytes, per=per_example(count))
    out.update(bs=int(cell["batch_size"]), runs=runs, steps=sum(s for _, s, _ in work), dtype=_dt(meta))
    out.update(device=device, data_bytes=8 * int(cell["seq_len"]) * n_data)
    try:
        resolve_device(device)
    except WidthscopeError as exc:
        out.update(device="cpu", note=f"the suite trains on {str(exc).split(';')[0]}: counted, not timed")
        return out
    if not time_run:
        return out
    seed = int(cell["seed"])
    with reproducible(1), RssPeak() as peak:
        ctx, load_s = clocked(gt.CellContext, cell)
        ctx.grid = math.inf  # no evaluation inside the timed loops but the last
        real: dict[str, nn.Module] = {}
        for k, s in shapes.items():
            torch.manual_seed(seed)
            real[k] = gt.target_model(cell, *s)

        def loop(m: nn.Module) -> Callable[[int], Any]:
            f = ctx.step_flops(m)
            return lambda k: gt.train_until(ctx, gt.start_run(ctx, copy.deepcopy(m), seed, k * f), k * f)

        step_s = {k: time_loop(loop(m)) for k, m in real.items()}
        eval_s = {k: seconds(ctx.eval_loss, m) for k, m in real.items()}
        kinds = {s.kind for s in schedules} & {"certificate", "misalignment"}
        signal = sum(seconds(gt.measure_signal, ctx, real[k], kd) for k in real if k != "target" for kd in kinds)
    train_s = sum(steps * step_s[k][1] + step_s[k][0] + n_eval * eval_s[k] for k, steps, n_eval in work)
    out.update(peak=peak.peak, train_s=train_s * runs, other="growth signals, data")
    out.update(other_s=(signal * math.ceil(cap * evals) + load_s) * runs)
    return out


def _suite_plan(
    command: str, what: str, grid: list[Any], keys: list[Any], one: Callable[..., dict[str, Any]], time_run: bool
) -> Plan:
    """A suite's plan: ``one(cell, cells, time_run)`` for the first cell of each distinct key, summed, the fixed
    costs once."""
    ready = (since_start(), peak_so_far())
    got = [one(grid[i], keys.count(k), time_run) for i, k in enumerate(keys) if k not in keys[:i]]
    big = max(got, key=lambda g: g["wbytes"])
    free, memory = _memory(got[0].get("device", "cpu"))
    counts: list[tuple[str, Any]] = [("cells", len(grid))]
    for g in got:
        row = f"{g['params']:,} parameters, {human_size(g['wbytes'])}; {g['steps']:,} training steps per cell"
        counts.append((g["name"], f"{row} x {g['runs']} cell(s)" + (f"; {g['note']}" if g.get("note") else "")))
    per, bs = max(g["per"] for g in got), max(g["bs"] for g in got)
    counts.append(memory)
    plan = functools.partial(Plan, command, what, big["params"], big["wbytes"], per, bs, dtype=big["dtype"])
    if not time_run or any("train_s" not in g for g in got):
        held = peak_so_far()
        peak = held + max(4 * g["wbytes"] + g["per"] * g["bs"] + g["data_bytes"] for g in got)
        note = COUNTED if not time_run else "not timed: " + "; ".join(g["note"] for g in got if "train_s" not in g)
        return plan(_fits(free, held, per), peak_bytes=peak, notes=(note, PLATEAU), counts=tuple(counts))
    parts: list[tuple[str, float | None]] = [(f"{FIXED} and imports (measured)", ready[0])]
    for g in got:
        parts.append((f"{g['name']}: training, {g['steps']:,} steps x {g['runs']} cell(s)", g["train_s"]))
        parts.append((f"{g['name']}: {g.get('other', 'criteria, evaluations, data')}", g["other_s"]))
    peak = max([ready[1]] + [g["peak"] for g in got])
    note = (
        "time = since the process started + per model one training step timed x the steps of its cells "
        "+ the rest timed once; peak = measured while they ran"
    )
    return plan(
        _fits(free, peak, per), counts=tuple(counts), parts=tuple(parts), peak_bytes=int(peak), notes=(note, PLATEAU)
    )


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
        plan, note = (got, None) if isinstance(got, Plan) else (None, got)
        out.append(CellPlan(f"{name} @ {width}", len(these), sum(1 for c in these if not done(c)), plan, note))
    return out


def _alignment_plan(cfg: Any, fam: Any, width: float, budget: int, timed_run: bool) -> Plan | str:
    """One cell of an alignment family at ``width`` counted on the meta device where the model runs there
    (a note where it cannot be counted); with ``timed_run`` :func:`_alignment_time`."""
    from .sweeps.cell import cell_options  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .sweeps.pools import fill_model_options, load_split, probe_conditions, probe_lengths  # noqa: PLC0415  cycle: widthscope.sweeps imports this module

    try:
        split = load_split(fam, budget, cfg)
    except (WidthscopeError, OSError) as exc:
        return f"data not read ({str(exc)[:200]}): not counted"
    build = functools.partial(models.build, fam.model, width, **fill_model_options(fam, split))
    opts = cell_options(cfg, {"family": fam.name, "seed": 0})
    shapes: dict[str, torch.Size] = {}  # each point's output

    def seen(name: str, _m: nn.Module, _i: Any, out: Any) -> None:
        shapes.setdefault(name, (out[0] if isinstance(out, tuple) else out).shape)

    def count(model: nn.Module) -> int:  # the probe's forward (per-example losses, the points on its path)
        where, names = next(model.parameters()).device, resolve_points(model, fam.points or None)

        def batch(n: int) -> Any:
            X, y = split.train[0][:n].to(where), split.train[1][:n].to(where)
            return X if split.task == "lm" else (X, y)

        hooks = [model.get_submodule(n).register_forward_hook(functools.partial(seen, n)) for n in names]
        try:
            return per_example(lambda n: saved_bytes(lambda: run_batch(model, batch(n), None, 0), model))
        finally:
            for h in hooks:
                h.remove()

    try:  # on the meta device where the model's init and forward run there
        with torch.device("meta"):
            model = build()
        per = count(model)
    except (RuntimeError, NotImplementedError, WidthscopeError):  # these models are small: built for real
        torch.manual_seed(0)
        model = build()
        per = count(model)
    dims = 0
    for shape in shapes.values():
        z = torch.empty(shape, device="meta")
        dims += z[0].numel() if opts.pool == "flatten" or z.ndim < 2 else int(shape[channel_dim(z)])
    conditions = sum(len(probe_lengths(fam, c)) for c in probe_conditions(fam))
    examples = (fam.n_probe_train + fam.n_probe_test) * conditions
    params, wbytes = weights(model)
    samples, free = 8 * dims * examples, device_memory(cfg.device)[0]
    parts = (("one cell", _alignment_time(cfg, fam, split, build, opts, budget)),) if timed_run else ()
    plan = functools.partial(Plan, "sweep", f"{fam.name} @ {width}", params, wbytes, per, fam.probe_batch_size)
    return plan(
        _fits(free, wbytes + samples, per), parts=parts, dtype=_dt(model), examples=examples, sample_bytes=samples
    )


def _alignment_time(cfg: Any, fam: Any, split: Any, build: Callable[[], nn.Module], opts: Any, budget: int) -> float:
    """One cell's seconds on ``[sweep].device``: a training step x steps; per probe condition and length a probed
    batch x the pools' batches and each point's statistics (once per sample shape); a forward per example x the
    interventions' example-forwards; with a ``monitor`` table a monitor probe x its steps."""
    from .sweeps.cell import cell_monitor  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .sweeps.config import LM_DATASETS  # noqa: PLC0415  cycle: widthscope.sweeps imports this module
    from .sweeps.pools import pool_batches, probe_conditions, probe_lengths, probe_pools  # noqa: PLC0415  cycle: widthscope.sweeps imports this module

    torch.manual_seed(0)
    model = build().to(cfg.device)
    bs = min(int(fam.train.get("batch_size", 64)), budget)
    train_batch = pool_batches((split.train[0][:bs], split.train[1][:bs]), split.task, bs)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=float(fam.train["lr"]))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if fam.dataset in LM_DATASETS:
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
    points = resolve_points(model, list(opts.points) if opts.points else None)
    forward: float | None = None
    stats_s = functools.cache(lambda na, nb, d, rows: time_statistics(opts, (na, nb), d, rows))
    kw: dict[str, Any] = dict(points=points, pool=opts.pool, train_mode=opts.train_mode, progress=False)
    for cond in probe_conditions(fam):
        for L in probe_lengths(fam, cond):
            pa, pb, _, _ = probe_pools(fam, cond, L, split, cfg)
            one = pool_batches(pa, split.task, fam.probe_batch_size)[:1]
            got, batch_s = collect(model, one, **kw), timed(functools.partial(collect, model, one, **kw))
            rows = batch_size_of(one[0])
            total += batch_s * (math.ceil(len(pa[0]) / rows) + math.ceil(len(pb[0]) / rows))
            if forward is None:  # the interventions run on the first condition and length
                forward = timed(functools.partial(mean_loss, model, one[0], None, batch_size=rows)) / rows
            for p in points:
                total += stats_s(len(pa[0]), len(pb[0]), int(got[p].shape[1]), max(1, got[p].shape[0] // rows))
    steps, k_max = _interventions(opts)
    total += (forward or 0.0) * len(points) * steps * k_max
    if fam.monitor is not None:
        with tempfile.TemporaryDirectory(prefix="widthscope-plan-monitor-") as tmp:  # its log: not the results
            mon, _ = cell_monitor(cfg, fam, split, model, opts, Path(tmp))
            calls = iter(range(2))
            total += timed(lambda: mon.probe(model, next(calls))) * len(fam.monitor["steps"])
    return total


def plan_suite_models(
    cfg: Any, cells: Any, done: Callable[[Any], bool], directory: Callable[[Any], Any], *, timed_run: bool = False
) -> list[CellPlan]:
    """One :class:`CellPlan` per distinct ``config.json`` of a suite's ``cells`` (``directory``: a cell's local
    snapshot or None): one cell's :func:`plan_certify` (``timed_run``: the weights loaded, a batch timed)."""
    groups: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
    for c in cells:
        where = directory(c)
        found = where is not None and (where / "config.json").is_file()
        key = hashlib.sha256((where / "config.json").read_bytes()).hexdigest() if found else f"missing {c['revision']}"
        groups.setdefault((c["model"], key), []).append((c, where))
    run = CertifyRunOptions(batch_size=cfg.batch_size, device=cfg.device)
    out = []
    for (model, key), these in groups.items():
        (cell, where), left = these[0], sum(1 for c, _ in these if not done(c))
        label = f"{model} @ {', '.join(sorted({str(c['revision'] or 'default') for c, _ in these}))}"
        if key.startswith("missing"):
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
    table = []
    for r in rows:
        p = r.plan
        table.append(
            {
                "model": r.label,
                "cells (left)": f"{r.cells} ({r.left})",
                "parameters": "?" if p is None else f"{p.parameters:,}",
                "weights": "?" if p is None else f"{human_size(p.weight_bytes)} {p.dtype}",
                "saved / probed example": "?" if p is None else _size(p.bytes_per_example, "?"),
                "samples / cell": "?" if p is None else _size(p.sample_bytes, "?"),
                "largest batch": "?" if p is None or p.max_batch is None else p.max_batch,
                **({"time / cell": _sec(r.cell_s)} if timed_run else {}),
                "note": r.note or "",
            }
        )
    free, source = device_memory(device)
    print(format_table(table, title=f"cost plan (memory: {source} on {device})"), file=file)
    left = sum(r.left for r in rows)
    # the largest unfinished cell: weights + samples + one probe batch
    counted = [r.plan for r in rows if r.plan is not None and r.left]
    held = max(
        (p.weight_bytes + (p.sample_bytes or 0) + (p.bytes_per_example or 0) * p.batch_size for p in counted), default=0
    )
    unknown = sum(r.left for r in rows if r.plan is None)
    print(
        f"total over the {left} unfinished cell(s) of shard {shard[0]}/{shard[1]}"
        + (f": the largest cell holds {human_size(held)} beside the process" if held else "")
        + (f" ({human_size(free)} free)" if free is not None and held else "")
        + (f"; {unknown} cell(s) not counted" if unknown else ""),
        file=file,
    )
    whole = None
    if timed_run:
        work = sum((r.cell_s or 0.0) * r.left for r in rows)
        untimed = sum(r.left for r in rows if r.cell_s is None)
        fixed = since_start()
        whole = None if untimed else work + fixed
        print(
            f"predicted wall time of the {left} unfinished cell(s) on this machine: {_sec(work + fixed)} (the process "
            f"so far, {_sec(fixed)}, + one cell per model timed x its cells"
            + (f"; {untimed} cell(s) not timed" if untimed else "")
            + ")",
            file=file,
        )
    # the run holds what this process holds now (its imports, the data) + the largest cell, or more
    # where this plan already ran a cell per model
    peak = max(peak_so_far(), psutil.Process().memory_info().rss + held)
    print(whole_process(whole, peak, f"cost plan: the {left} unfinished cell(s)"), file=file)
