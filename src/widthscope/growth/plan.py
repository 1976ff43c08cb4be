"""The cost plan of a ``widthscope grow`` run (``grow --plan``): before anything trains.

:func:`plan_grow` takes the settings of :func:`widthscope.growth.pipeline.run_grow` and returns a
:class:`~widthscope.probe.cost_plan.TrainPlan`:

1. the model and its pools, loaded and checked as the run loads them (the built-in MLP is built,
   untrained); its parameters and weight bytes at the dtype of the run;
2. the training stages, each counted on one example and on the run's batch
   (:func:`widthscope.probe.cost.count_step`): the built-in model's base training (300 AdamW
   steps, batch 64); the new block at each grown point (AdamW on the block's parameters, or all of
   them with ``train_all``; ``compare`` grows at the best, worst and a random point) counted at
   every candidate point (FLOPs: their mean, memory: the largest, since the point is not known
   before the ranking); with ``compare``, the original model trained whole for the FLOPs of the
   best growth;
3. the memory of the work between the steps, each run for real at a small size and counted
   (:func:`~widthscope.probe.cost.live_peak`, the bytes of the tensors it holds at once): the
   ranking (:func:`ranking_bytes`: the first and the last point, each at three pool sizes and
   extrapolated to the run's pools, the larger, plus every other point's pooled samples), one
   growth (:func:`growth_bytes`) and, with
   ``compare``, the baseline (:func:`continue_bytes`); with ``time_run`` each also measured, and
   loading the model and the data, as the run is measured (the resident peak in a fresh process,
   :func:`~widthscope.probe.resident.resident_peak`), the larger taken and labelled; held beside
   them, the original model and the data with its pools (each storage once). The run's memory is
   the largest step or phase + what is held;
4. with ``time_run`` (the default) each stage's training loop is timed (the block at the first and
   the last candidate point, averaged), the ranking of the points is timed at the first and the
   last point on pools of ``(M, K)``, ``(2M, K)`` and ``(M, 2K)`` examples and extrapolated to the
   run's pools and points, and one held-out evaluation batch is timed; the predicted wall time is
   steps x step time + ranking + evaluations.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from ..data.spec import InputSpec, PoolSize
from ..probe import collect
from ..probe.blocks import block_of
from ..probe.cost import count_step, live_peak
from ..probe.cost_plan import TrainPlan, TrainStage, device_memory, stage_of, tensor_bytes, time_loop
from ..probe.insert import insert
from ..probe.intervene import index_batch, mean_loss
from ..probe.points import resolve_points
from ..probe.resident import Resident, larger, resident_peak
from ..train import train as train_model
from .block import _train_new, continue_training, grow_at
from .inputs import builtin_inputs, check_builtin, load_inputs
from .options import GrowOptions
from .pipeline import _chosen, _split_pools, grow_options
from .rank import _n, rank_points

__all__ = ["plan_grow", "BASE_STEPS", "BASE_BATCH"]

BASE_STEPS, BASE_LR, BASE_BATCH = 300, 3e-3, 64  # run_grow's training of the built-in model


def _grown(model: nn.Module, point: str, width: int, opts: GrowOptions) -> nn.Module:
    """A copy of ``model`` with the block :func:`~widthscope.growth.block.grow_at` inserts at ``point``."""
    g = copy.deepcopy(model)
    insert(g, point, "block", width=width, hidden=opts.block_width, seed=opts.seed)
    return g


def _trainable(point: str, train_all: bool) -> Callable[[nn.Module], Sequence[nn.Parameter]]:
    return lambda m: list(m.parameters()) if train_all else list(block_of(m, point).parameters())


def _widths(model: nn.Module, names: list[str], batch: Any, loss_fn: Callable | None) -> dict[str, int]:
    """Each point's channel width (from one forward: what rank_points reads from the samples)."""
    got = collect(model, [batch], points=names, loss_fn=loss_fn, progress=False)
    return {n: int(v.shape[1]) for n, v in got.items()}


def _block_stage(
    model: nn.Module, names: list[str], widths: dict[str, int], train: Any, opts: GrowOptions, loss_fn: Callable | None
) -> tuple[TrainStage, list[nn.Module]]:
    """The new block's training, counted at every candidate point (FLOPs: mean, memory: largest)."""
    bs = min(opts.batch_size, _n(train))
    one, two = index_batch(train, slice(0, 1)), index_batch(train, slice(0, max(2, bs)))
    counts, grown = [], []
    for n in names:
        g = _grown(model, n, widths[n], opts)
        c = count_step(g, (one, two), loss_fn, params=_trainable(n, opts.train_all)(g))
        counts.append(c)
        grown.append(g)
    worst = max(range(len(counts)), key=lambda i: counts[i]["activation_bytes_per_example"])
    mean = {k: round(sum(c[k] for c in counts) / len(counts)) for k in ("flops_forward", "flops_backward")}
    merged = {**counts[worst], **mean}
    merged["fixed_bytes"] = max(c["fixed_bytes"] for c in counts)
    runs = len(_chosen([{"point": n} for n in names], opts))
    stage = stage_of(
        "new block" + (" (all parameters)" if opts.train_all else ""),
        merged,
        grown[worst],
        runs=runs,
        steps=opts.steps,
        batch_size=bs,
        optimizer="adamw",
    )
    return stage, grown


def _continue_stage(model: nn.Module, block: TrainStage, train: Any, opts: GrowOptions, loss_fn: Callable | None):
    """The original model trained whole for the FLOPs of the best growth (``compare``)."""
    bs = min(opts.batch_size, _n(train))
    one, two = index_batch(train, slice(0, 1)), index_batch(train, slice(0, max(2, bs)))
    c = count_step(model, (one, two), loss_fn)
    per_step = max(1, (c["flops_forward"] + c["flops_backward"]) * block.batch_size)
    steps = max(1, round(block.steps * block.flops_per_example * block.batch_size / per_step))
    return stage_of(
        "continue (original, all parameters)",
        c,
        model,
        runs=1,
        steps=steps,
        batch_size=block.batch_size,
        optimizer="adamw",
    )


def _sub_pools(pools: Any, a: int, b: int) -> tuple[Any, Any]:
    """The first ``a`` ranking train and ``b`` held-out ranking examples of ``pools``."""
    return (index_batch(pools.probe_train, slice(0, a)), index_batch(pools.rank_test, slice(0, b)))


def _rank(model: nn.Module, train: Any, test: Any, points: list[str], opts: GrowOptions, loss_fn: Callable | None):
    return rank_points(
        model,
        train,
        test,
        points=points,
        M=opts.M,
        K=opts.K,
        eta=opts.eta_or_lr,
        loss_fn=loss_fn,
        batch_size=opts.batch_size,
        show_progress=False,
        criterion=opts.criterion,
        block_width=opts.block_width,
        block_seed=opts.seed,
    )


def _peak_counted(fn: Callable[[], Any], warm: Callable[[], Any] | None = None) -> int | None:
    return live_peak(fn)[1]


def _peak_measured(fn: Callable[[], Any], warm: Callable[[], Any] | None = None) -> int | None:
    return resident_peak(fn, warm=warm).peak


def ranking_bytes(
    model: nn.Module, names: list[str], widths: dict[str, int], pools: Any, opts: GrowOptions, loss_fn: Callable | None
) -> int:
    """The ranking's memory, counted (:func:`_ranking_peak` with :func:`~widthscope.probe.cost.live_peak`)."""
    got = _ranking_peak(model, names, widths, pools, opts, loss_fn, _peak_counted)
    assert got is not None  # the counter always counts
    return got


def ranking_sizes(
    pools: Any, opts: GrowOptions
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], GrowOptions]:
    """The ranking's measured pool sizes ``(a, b)`` and ``(2a, 2b)`` (``a``, ``b`` at least two batches
    and ``M``, ``K``; at most the run's pools), the warm-up's size ``(a/2, b/2)`` and its options
    (``M``, ``K`` no larger than it). Warmed at a size none of the three has: the run ranks at its size
    once, and what a new size fills (caches, the allocator's pools) is in its peak (built-in MLP: 2.7 MB
    warmed on itself, 3.5 MB this way, 3.6 MB in the run; benchmarks/results/ranking-warm-cpu.json)."""
    bs = opts.batch_size
    a1, b1 = min(pools.n_train, max(opts.M, 2 * bs)), min(pools.n_rank, max(opts.K, 2 * bs))
    a0, b0 = max(4, a1 // 2), max(4, b1 // 2)
    small = dataclasses.replace(opts, M=min(opts.M, a0), K=min(opts.K, b0))
    return (a1, b1), (min(pools.n_train, 2 * a1), min(pools.n_rank, 2 * b1)), (a0, b0), small


def _ranking_peak(
    model: nn.Module,
    names: list[str],
    widths: dict[str, int],
    pools: Any,
    opts: GrowOptions,
    loss_fn: Callable | None,
    peak_of: Callable[[Callable[[], Any], Callable[[], Any]], int | None],
) -> int | None:
    """The ranking's memory: :func:`rank_points` at the first and at the last point, each run and
    counted (``peak_of``: :func:`~widthscope.probe.cost.live_peak`, or the resident peak: its probe passes, the
    criteria's features and block Grams, the line search's double backward) on pools of ``(a, b)``,
    ``(2a, b)`` and ``(a, 2b)`` examples (``a``, ``b`` at least two batches and ``M``, ``K``: a
    second batch adds a working set the first does not have), fitted
    as ``c0 + c_train a + c_test b`` and extrapolated to the run's pools; the larger of the two, plus
    the float64 pooled samples of every other point (kept until the ranking ends). Train and
    held-out examples cost differently (the line search runs on the held-out ones), and the last
    point can peak above the first (llama-128 at its last point: 143 MB at (32, 32), 270 MB at
    (64, 64), 283 MB at (128, 64), 309 MB at (256, 64); its first point 216-267 MB); a chord through
    ``(a, b)`` and ``(2a, 2b)`` predicted 650 MB there. ``peak_of(work, warm)``: each measurement is
    warmed on the same point at ``(a/2, b/2)`` (see below). ``None`` where ``peak_of`` measured nothing."""
    n_tr, n_rk = pools.n_train, pools.n_rank
    (a1, b1), (a2, b2), (a0, b0), small = ranking_sizes(pools, opts)
    peaks = []
    for point in dict.fromkeys([names[0], names[-1]]):
        got: dict[tuple[int, int], int] = {}
        warm = functools.partial(_rank, model, *_sub_pools(pools, a0, b0), [point], small, loss_fn)
        for a, b in dict.fromkeys([(a1, b1), (a2, b1), (a1, b2)]):
            peak = peak_of(functools.partial(_rank, model, *_sub_pools(pools, a, b), [point], opts, loss_fn), warm)
            if peak is None:
                return None
            got[a, b] = peak
        p1 = got[a1, b1]
        c_a = max(0.0, (got[a2, b1] - p1) / (a2 - a1)) if a2 > a1 else 0.0
        c_b = max(0.0, (got[a1, b2] - p1) / (b2 - b1)) if b2 > b1 else 0.0
        peaks.append(round(p1 + c_a * (n_tr - a1) + c_b * (n_rk - b1)))
    return max(peaks) + 8 * (n_tr + n_rk) * sum(widths[n] for n in names[1:])


def _growth_work(
    model: nn.Module, point: str, width: int, train: Any, pools: Any, opts: GrowOptions, loss_fn: Callable | None
) -> Callable[[], Any]:
    """One growth at ``point`` for one step, as a picklable call (measured in a fresh process)."""
    n_eval = pools.n_test - pools.n_rank
    return functools.partial(
        grow_at,
        model,
        point,
        train,
        index_batch(pools.evaluate, slice(0, min(n_eval, opts.batch_size))),
        probe_train=index_batch(pools.probe_train, slice(0, min(opts.M, pools.n_train))),
        probe_test=index_batch(pools.rank_test, slice(0, min(opts.K, pools.n_rank))),
        steps=1,
        lr=opts.lr,
        block_width=opts.block_width,
        width=width,
        train_all=opts.train_all,
        batch_size=opts.batch_size,
        seed=opts.seed,
        loss_fn=loss_fn,
        show_progress=False,
    )


def growth_bytes(
    model: nn.Module, point: str, width: int, train: Any, pools: Any, opts: GrowOptions, loss_fn: Callable | None
) -> int:
    """One growth's memory: :func:`~widthscope.growth.block.grow_at` at ``point`` run for one step and
    counted (the model's copy with its block, the block's ``W_out`` gradients on ``M`` and ``K``
    examples, a training step with its optimizer state, the held-out evaluations); with more than
    one growth (``compare``), the previous grown model, still referenced, beside it."""
    return live_peak(_growth_work(model, point, width, train, pools, opts, loss_fn))[1]


def _continue_work(model: nn.Module, train: Any, pools: Any, opts: GrowOptions, loss_fn: Callable | None):
    n_eval = pools.n_test - pools.n_rank
    evaluate = index_batch(pools.evaluate, slice(0, min(n_eval, opts.batch_size)))
    return functools.partial(
        continue_training,
        model,
        train,
        evaluate,
        flops=1.0,
        lr=opts.lr,
        batch_size=opts.batch_size,
        seed=opts.seed,
        loss_fn=loss_fn,
    )


def continue_bytes(model: nn.Module, train: Any, pools: Any, opts: GrowOptions, loss_fn: Callable | None) -> int:
    """The ``compare`` baseline's memory: :func:`~widthscope.growth.block.continue_training` run for one
    step and counted (a whole copy of the model, its gradients and AdamW state, the evaluations)."""
    return live_peak(_continue_work(model, train, pools, opts, loss_fn))[1]


def _time_ranking(model: nn.Module, pools: Any, names: list[str], opts: GrowOptions, loss_fn: Callable | None) -> float:
    """rank_points timed at the first and the last point (the longest and the shortest backward; their
    mean stands for every point) on pools of ``(M, K)``, ``(2M, K)`` and ``(M, 2K)`` examples, fitted
    as ``c0 + c_train a + c_test b`` and extrapolated to the run's pools (the train and the held-out
    examples cost differently: the line search runs on the held-out ones)."""
    n_tr, n_rk = pools.n_train, pools.n_rank
    ends = sorted({names[0], names[-1]}, key=names.index)
    m, k = max(opts.M, 4), max(opts.K, 4)
    sizes = [(m, k), (min(n_tr, 2 * m), k), (m, min(n_rk, 2 * k))]
    times = []
    for a, b in sizes:
        t0 = time.perf_counter()
        _rank(model, *_sub_pools(pools, a, b), ends, opts, loss_fn)
        times.append(time.perf_counter() - t0)
    c_a = max(0.0, (times[1] - times[0]) / (sizes[1][0] - m)) if sizes[1][0] > m else times[0] / (m + k)
    c_b = max(0.0, (times[2] - times[0]) / (sizes[2][1] - k)) if sizes[2][1] > k else times[0] / (m + k)
    at_run = max(0.0, times[0] + c_a * (n_tr - m) + c_b * (n_rk - k))
    return at_run * len(names) / len(ends)


def plan_grow(
    spec: InputSpec | None = None,
    options: GrowOptions | None = None,
    *,
    n_train: PoolSize | None = None,
    n_test: PoolSize | None = None,
    dtype: str = "auto",
    time_run: bool = True,
    **keywords: Any,
) -> TrainPlan:
    """The cost plan of ``run_grow(spec, options, n_train=..., n_test=..., dtype=...)`` (same
    arguments; nothing trained, nothing written). See the module docstring."""
    opts = grow_options("plan_grow", options, keywords)
    notes: list[str] = []
    stages: list[TrainStage] = []
    t0 = time.perf_counter()
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])  # the first optimizer of a process imports torch._dynamo
    other_s: list[tuple[str, float]] = [("start-up (first optimizer)", time.perf_counter() - t0)]
    loaded = _measure_loading(spec, opts, n_train, n_test) if time_run else None
    t0 = time.perf_counter()
    full = None
    if spec is None:
        model, full, split = builtin_inputs(opts.seed, n_train, n_test)
        check_builtin(model, split, opts, None)
        if dtype != "auto":
            model.to(getattr(torch, dtype))
        loss_fn, name, source = None, "builtin", "--dtype" if dtype != "auto" else "the built-in model"
        one, two = (tuple(t[:1] for t in full.train), tuple(t[:BASE_BATCH] for t in full.train))
        stages.append(
            stage_of(
                "built-in model (base training)",
                count_step(model, (one, two)),
                model,
                runs=1,
                steps=BASE_STEPS,
                batch_size=min(BASE_BATCH, len(full.train[0])),
                optimizer="adamw",
            )
        )
        held: Any = (split, tuple(full.train), tuple(full.test))
    else:
        inputs = load_inputs(spec, opts.points, show=False)
        model, split, loss_fn = inputs.model, (inputs.train, inputs.test), inputs.loss_fn
        name, source = str(spec.to_dict()["model"]), "--dtype" if spec.dtype != "auto" else "the checkpoint"
        held = split
        notes.append("counted on the loaded model: a block is inserted into a real copy")
    other_s.append(("load + inputs", time.perf_counter() - t0))

    train, test = split
    pools = _split_pools(model, train, test, opts, None)
    names = resolve_points(model, opts.points)
    widths = _widths(model, names, index_batch(pools.probe_train, slice(0, 1)), loss_fn)
    block, grown = _block_stage(model, names, widths, train, opts, loss_fn)
    stages.append(block)
    if opts.compare:
        stages.append(_continue_stage(model, block, train, opts, loss_fn))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    pool_bytes = tensor_bytes((held, pools.probe_train, pools.rank_test, pools.evaluate))  # each storage once
    other_bytes = [("the original model", weights), ("data and its pools", pool_bytes)]
    phases = _phases(model, names, widths, grown, block, train, pools, opts, loss_fn, time_run)
    if loaded is not None and loaded.peak is not None:  # loading's own peak beyond the tensors it keeps
        phases.insert(
            0, ("loading the model and the data (measured)", max(0, loaded.peak - weights - tensor_bytes(held)))
        )
    elif loaded is not None:
        notes.append(f"memory counted, not measured: {loaded.why}")
    notes.append("FLOPs as FlopCounterMode counts them (matmuls, convolutions, attention)")
    predicted = None
    if time_run:
        stages, timed = _timed(model, grown, names, stages, pools, train, opts, loss_fn, full)
        other_s += timed
        predicted = sum(s.train_s or 0.0 for s in stages) + sum(v for _, v in other_s)
    else:
        notes.append("no time predicted (--plan-no-time)")
    dev = "cpu"
    free, free_source = device_memory(dev)
    return TrainPlan(
        command="grow",
        model=name,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        dtype_source=source,
        counted_on="loaded",
        parameters=sum(p.numel() for p in model.parameters()),
        weight_bytes=weights,
        stages=tuple(stages),
        device=dev,
        memory_bytes=free,
        memory_source=free_source,
        other_bytes=tuple(other_bytes),
        phases=tuple(phases),
        other_s=tuple(other_s),
        predicted_s=predicted,
        notes=tuple(notes),
    )


def _measure_loading(spec: InputSpec | None, opts: GrowOptions, n_train: Any, n_test: Any) -> Resident:
    """The resident memory of loading the model and the data (measured before this process loads
    them, as the run loads them: the parser's buffers, the libraries' caches, no tensor holds)."""
    if spec is None:
        return resident_peak(functools.partial(builtin_inputs, opts.seed, n_train, n_test))
    return resident_peak(functools.partial(load_inputs, spec, opts.points, show=False))


def _phases(
    model: nn.Module,
    names: list[str],
    widths: dict[str, int],
    grown: list[nn.Module],
    block: TrainStage,
    train: Any,
    pools: Any,
    opts: GrowOptions,
    loss_fn: Callable | None,
    measure: bool,
) -> list[tuple[str, int]]:
    """The memory of the work between the training steps, each run for real at a small size and
    counted (:func:`ranking_bytes`, :func:`growth_bytes`, :func:`continue_bytes`); with ``measure``
    also measured (:func:`~widthscope.probe.resident.resident_peak`, the resident peak as the run is
    measured) and the larger taken, the label saying which."""
    at = max(range(len(names)), key=lambda i: sum(p.numel() for p in grown[i].parameters()))
    point, width = names[at], widths[names[at]]
    none = Resident(None, None, "not measured")
    # measured first: where a work falls back to a forked child, the counting's heap is not yet in pieces
    rank_m = _ranking_peak(model, names, widths, pools, opts, loss_fn, _peak_measured) if measure else None
    grow_m = resident_peak(_growth_work(model, point, width, train, pools, opts, loss_fn)) if measure else none
    cont_m = resident_peak(_continue_work(model, train, pools, opts, loss_fn)) if measure and opts.compare else none
    grow_b, how = larger(growth_bytes(model, point, width, train, pools, opts, loss_fn), grow_m)
    grow_how = "measured on one step" if how == "measured" else "counted at one step"
    rank_b, rank_how = larger(ranking_bytes(model, names, widths, pools, opts, loss_fn), Resident(rank_m, None))
    cont_b, cont_how = 0, ""
    if opts.compare:
        cont_b, how = larger(continue_bytes(model, train, pools, opts, loss_fn), cont_m)
        cont_how = "measured on one step" if how == "measured" else "counted at one step"
    if block.runs > 1:  # grow() still holds the previous growth's model while the next one grows
        grow_b += sum(p.numel() * p.element_size() for p in grown[at].parameters())
    phases = [
        (f"ranking the points ({rank_how}, extrapolated)", rank_b),
        (f"growing a block ({block.runs} x; {grow_how})", grow_b),
    ]
    if opts.compare:
        phases.append((f"continue baseline ({cont_how})", cont_b))
    return phases


def _loop(model: nn.Module, train: Any, opts: GrowOptions, loss_fn: Callable | None, pick: Callable):
    """``run(steps)``: grow's own training loop on a fresh copy of ``model``."""

    def run(steps: int) -> None:
        m = copy.deepcopy(model)
        params = list(pick(m))
        ids = {id(p) for p in params}
        for p in m.parameters():
            p.requires_grad_(id(p) in ids)
        _train_new(
            m,
            params,
            train,
            steps=steps,
            lr=opts.lr,
            batch_size=opts.batch_size,
            seed=opts.seed,
            loss_fn=loss_fn,
            show_progress=False,
        )

    return run


def _timed(
    model: nn.Module,
    grown: list[nn.Module],
    names: list[str],
    stages: list[TrainStage],
    pools: Any,
    train: Any,
    opts: GrowOptions,
    loss_fn: Callable | None,
    full: Any,
) -> tuple[list[TrainStage], list[tuple[str, float]]]:
    """Each stage's step timed in its own loop (the slope over 2 and 6 steps), the ranking timed
    and extrapolated, the evaluations timed."""
    out, fixed = [], 0.0
    for s in stages:
        if s.name.startswith("new block"):
            ends = sorted({0, len(names) - 1})
            got = [time_loop(_loop(grown[i], train, opts, loss_fn, _trainable(names[i], opts.train_all))) for i in ends]
            f, step = sum(g[0] for g in got) / len(got), sum(g[1] for g in got) / len(got)
        elif s.name.startswith("built-in"):

            def base(steps: int) -> None:
                train_model(copy.deepcopy(model), full, steps=steps, lr=BASE_LR, seed=opts.seed, progress=False)

            f, step = time_loop(base)
        else:
            f, step = time_loop(_loop(model, train, opts, loss_fn, lambda m: list(m.parameters())))
        fixed += f * s.runs
        out.append(dataclasses.replace(s, step_s=step))
    ranking = _time_ranking(model, pools, names, opts, loss_fn)
    bs = opts.batch_size
    n_eval = pools.n_test - pools.n_rank
    evaluate = index_batch(pools.evaluate, slice(0, min(bs, n_eval)))
    t0 = time.perf_counter()
    mean_loss(model, evaluate, loss_fn, batch_size=bs)
    per_batch = time.perf_counter() - t0
    runs = sum(s.runs for s in stages if not s.name.startswith("built-in"))
    # before and after each growth (and the continue run), plus the block's two w_out gradients (M + K)
    eval_s = per_batch * (2 * runs * -(-n_eval // bs) + runs * -(-(opts.M + opts.K) // bs))
    return out, [
        ("training loops' fixed cost", fixed),
        ("ranking the points (extrapolated)", ranking),
        ("held-out evaluations", eval_s),
    ]
