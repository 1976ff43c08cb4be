"""The alignment monitor: certify fixed pools at chosen optimizer steps, restoring the training state
exactly. Steps: ``every=N``, ``at=[...]`` or log-spaced under a time ``budget``, plus the run's first and
last; schedule, budget rule and rows: docs/monitor.md."""

from __future__ import annotations

import logging
import math
import operator
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .. import _args, distributed
from .._io import append_jsonl, read_jsonl, to_jsonable
from ..certification import check_pool, count_examples, gather_rows, statistics
from ..data.objects import batches_from, check_tokenizer, is_object_pool
from ..errors import WidthscopeError
from ..options import with_keywords
from ..probe import collect, resolve_points
from ..probe.offload import input_device
from .options import MonitorOptions
from .pools import TrainingState, as_batches, check_not_fsdp, count_safe, dry_probe, unwrap
from .rows import certified_event, make_row, metrics

_log = logging.getLogger("widthscope.monitor")


def log_steps(limit: int, per_octave: int = 2) -> list[int]:
    """Log-spaced optimizer steps ``0 ≤ s ≤ limit``: 0 and ``round(2^(k/per_octave))``, k ≥ 0.

    Example::

        >>> log_steps(40)
        [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32]
    """
    out, k = {0}, 0
    while (s := round(2 ** (k / per_octave))) <= limit:
        out.add(s)
        k += 1
    return sorted(out)


def check_step(v: Any, name: str, low: int) -> int:
    try:
        n = None if isinstance(v, bool) else operator.index(v)
    except TypeError:
        n = None
    if n is None or n < low:
        raise WidthscopeError(f"{name} must be an integer >= {low}, got {v!r}")
    return n


class AlignmentMonitor:
    """Certificates of fixed train and held-out pools at chosen optimizer steps of a training run.

    ``train``/``test``: the pools (tensors, token ids, dicts, batches, or texts / a ``datasets.Dataset``
    with ``tokenizer=``), drawn once. ``options``: a :class:`MonitorOptions` (keywords override its
    fields). ``out``: a JSONL file, appended and read back to resume (rank 0 writes). ``clock``: the
    budget's time source.
    """

    metrics = staticmethod(metrics)

    def __init__(
        self,
        model: nn.Module,
        train: Any,
        test: Any,
        options: MonitorOptions | None = None,
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        out: str | Path | None = None,
        progress: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        tokenizer: Any = None,
        **keywords: Any,
    ) -> None:
        fn = "AlignmentMonitor"
        _args.module(fn, "model", model)
        also = ("loss_fn", "out", "progress", "clock", "tokenizer")  # objects of the run, not options
        opts = with_keywords(fn, options, MonitorOptions, keywords, also=also, words="unknown keyword argument {key!r}")
        check_tokenizer(tokenizer, fn)
        train, test, loss_fn = self._object_pools(model, train, test, opts, loss_fn, tokenizer)
        _args.batches(fn, "train", train, single=True)
        _args.batches(fn, "test", test, single=True)
        _args.function(fn, "loss_fn", loss_fn)
        _args.instance(fn, "out", out, (str, os.PathLike), "a path (str or pathlib.Path)", optional=True)
        _args.boolean(fn, "progress", progress)
        _args.function(fn, "clock", clock, optional=False, accepts="a function returning seconds")
        check_not_fsdp(model)
        self.options = opts
        self.every, self.at = opts.every, None if opts.at is None else list(opts.at)
        self.budget = opts.budget_in_force
        self.M, self.K = opts.M, opts.K_or_M
        self.draws, self.seed, self.delta = opts.draws, opts.seed, opts.delta
        self.estimator, self.pool, self.loss_fn, self.progress = opts.estimator, opts.pool, loss_fn, progress
        self.train, self.test = self._fixed_pools(model, train, test, opts.batch_size)
        model = unwrap(model)
        self.points = resolve_points(model, opts.points)
        self.model = model
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._done: set[int] = set()
        self.out = None if out is None else Path(out)
        self.skipped: list[int] = []  # planned steps the budget left out
        self.forced: set[int] = set()  # the run's first and last steps (bounds)
        self._last: int | None = None
        self.spent_s = 0.0  # seconds in probes
        self._t_first: float | None = None
        self._probed = False
        self._clock = clock
        self.notes, self._predict_s = dry_probe(
            model,
            ((self.train, self.M, "train"), (self.test, self.K, "held-out")),
            points=self.points,
            loss_fn=self.loss_fn,
            pool=self.pool,
            clock=clock,
        )
        if self.out is not None:
            self._open(self.out)

    @staticmethod
    def _object_pools(
        model: nn.Module, train: Any, test: Any, opts: MonitorOptions, loss_fn: Any, tokenizer: Any
    ) -> tuple[Any, Any, Any]:
        """Object pools (texts, a ``datasets.Dataset``) as batches, and the task's loss when none is given."""
        pools = []
        kw: dict[str, Any] = dict(model=model, tokenizer=tokenizer, batch_size=opts.batch_size, fn="AlignmentMonitor")
        for name, obj, off in (("train", train, 0), ("test", test, 1)):
            if is_object_pool(obj):
                obj, task_loss, _ = batches_from(obj, seed=opts.seed + off, name=name, **kw)
                loss_fn = loss_fn or task_loss
            pools.append(obj)
        return pools[0], pools[1], loss_fn

    def _fixed_pools(self, model: nn.Module, train: Any, test: Any, batch_size: int) -> tuple[list[Any], list[Any]]:
        """The pools as fixed lists of batches, checked against ``M`` / ``K`` and the ranks."""
        state = TrainingState(model)  # a shuffling DataLoader uses the torch RNG
        try:
            a = as_batches(train, "train", batch_size)
            b = as_batches(test, "held-out", batch_size)
        finally:
            state.restore()
        W = distributed.world_size()
        for what, lst, need in (("train", a, self.M), ("held-out", b, self.K)):
            if self.pool != "token":
                check_pool(count_examples(lst), need, what, f"the {what} pool size", self.pool)
            if len(lst) < W:
                raise WidthscopeError(
                    f"the {what} pool has {len(lst)} batch(es) for {W} ranks: every rank "
                    "probes its share; give smaller batches (batch_size=) or a larger pool"
                )
        return a, b

    @property
    def _writes(self) -> bool:
        return self.out is not None and distributed.is_main()

    def settings(self) -> dict[str, Any]:
        """The ``settings`` line of the ``out=`` file: the settings in force and the ``options``."""
        same = ("M", "K", "every", "at", "delta", "draws", "seed", "estimator", "pool")
        return {
            "kind": "settings",
            "points": list(self.points),
            **{k: getattr(self, k) for k in same},
            "budget": None if self.budget is None or math.isinf(self.budget) else self.budget,
            "n_train": count_safe(self.train),
            "n_test": count_safe(self.test),
            "options": self.options.to_dict(),
        }

    def _open(self, path: Path) -> None:
        old = read_jsonl(path)
        mine = to_jsonable(self.settings())
        if not old:
            if self._writes:
                append_jsonl(path, [mine])
            return
        head = old[0]
        if "options" not in head:  # a file written before the options were recorded
            mine.pop("options")
        if head.get("kind") != "settings" or head != mine:
            diff = sorted(k for k in set(head) | set(mine) if head.get(k) != mine.get(k))
            raise WidthscopeError(
                f"{path} holds monitor rows with other settings ({', '.join(diff) or 'no header'}); "
                "give another out= file or the same settings to resume"
            )
        for r in old[1:]:
            if r.get("kind") == "row":
                self.rows.append(r)
                self._done.add(int(r["step"]))
            elif r.get("kind") == "certified":
                self.events.append(r)

    def step(self, model: nn.Module | None = None, step: int = 0, *, final: bool = False) -> list[dict[str, Any]]:
        """Call after each optimizer step with the number of steps done: probes when the schedule and the
        budget allow and returns that step's rows (else ``[]``). ``final=True``: the run ends here, so it
        is probed whatever the schedule and the budget."""
        step = check_step(step, "step", 0)
        now = self._clock()
        if self._t_first is None:
            self._t_first = now
        forced = step not in self._done and (final or step in self.forced)
        if not forced and not self.should_probe(step):
            return []
        if not forced and not self._within_budget(now, step):
            self._skip(step, now)
            return []
        return self.probe(self.model if model is None else model, step)

    def probe(self, model: nn.Module, step: int) -> list[dict[str, Any]]:
        """Probe now (whatever the schedule), record and return the rows of ``step``."""
        check_not_fsdp(model)
        model = unwrap(model)
        state = TrainingState(model)
        t_start = self._clock()
        try:
            t0 = time.perf_counter()
            common: dict[str, Any] = dict(
                points=self.points, loss_fn=self.loss_fn, pool=self.pool, train_mode="eval", progress=self.progress
            )
            with warnings.catch_warnings():  # said once by the dry probe
                warnings.simplefilter("ignore", UserWarning)
                qa = collect(model, distributed.shard(self.train), **common)
                qb = collect(model, distributed.shard(self.test), **common)
            ga, gb = ({n: gather_rows(q[n], input_device(model)) for n in self.points} for q in (qa, qb))
            probe_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            stat = {k: getattr(self, k) for k in ("draws", "seed", "estimator", "pool")}
            results, _ = statistics(ga, gb, pairs=[(self.M, self.K)], **stat)
            rows = [make_row(r, step, self.M, self.K, self.delta) for r in results]
            stats_s = time.perf_counter() - t0
        finally:
            state.restore()
        for r in rows:
            r["probe_s"], r["stats_s"] = probe_s, stats_s
        new = rows + self._events(rows)
        self.rows.extend(rows)
        self._done.add(step)
        if self._writes:
            append_jsonl(self.out, new)  # type: ignore[arg-type]  # _writes: there is an out= file
        cost = self._clock() - t_start
        # the next probe costs the most any probe has (the dry probe's guess dropped)
        self._predict_s = cost if not self._probed else max(self._predict_s, cost)
        self._probed = True
        self.spent_s += cost
        return new

    def bounds(self, first: int, last: int | None) -> None:
        """The run's first and last optimizer steps (``last=None``: not known): both are probed whatever
        the schedule and the budget, which keeps room for the last one."""
        first = check_step(first, "first", 0)
        self._last = None if last is None else check_step(last, "last", first)
        self.forced = {first} if self._last is None else {first, self._last}

    def should_probe(self, step: int) -> bool:
        """Whether ``step`` (optimizer steps done) is a monitored step not yet recorded."""
        if step in self._done:
            return False
        if step in self.forced:
            return True
        if self.at is not None:
            return step in self.at
        if self.every is not None:
            return step % self.every == 0
        return step in log_steps(step)

    def _train_s(self, now: float) -> float:
        return max(0.0, now - (self._t_first if self._t_first is not None else now) - self.spent_s)

    def _reserve_s(self, step: int) -> float:
        """The last step's predicted probe, while it is still to come after ``step``."""
        last = self._last
        return self._predict_s if last is not None and last > step and last not in self._done else 0.0

    def _within_budget(self, now: float, step: int) -> bool:
        """Whether a probe at ``step`` keeps the budget rule of docs/monitor.md (rank 0 decides)."""
        if self.budget is None or math.isinf(self.budget):
            return True
        ok = self.spent_s + self._predict_s + self._reserve_s(step) <= self.budget * self._train_s(now)
        return bool(distributed.broadcast_object(ok)) if distributed.is_distributed() else ok

    def _skip(self, step: int, now: float) -> None:
        """Record, log and (``out=``) write that the budget skipped the probe planned at ``step``."""
        if self.skipped and self.skipped[-1] == step:
            return
        self.skipped.append(step)
        if not distributed.is_main():
            return
        assert self.budget is not None
        train_s, reserve, pct = self._train_s(now), self._reserve_s(step), f"{100 * self.budget:.3g}%"
        last = f" + the last step's ~{reserve:.3g} s" if reserve else ""
        hint = "; pass budget=math.inf, or every=/at= without a budget, to probe every planned step"
        _log.warning(
            f"alignment monitor: skipped the probe planned at step {step}: the monitor would exceed its budget of "
            f"{pct} of training time (monitor {self.spent_s:.3g} s + next probe ~{self._predict_s:.3g} s{last} > "
            f"{pct} of {train_s:.3g} s of training){'' if len(self.skipped) > 1 else hint}"
        )
        if self._writes:
            row = {"kind": "skipped", "step": step, "reason": "budget", "budget": self.budget}
            append_jsonl(self.out, [row | {"monitor_s": self.spent_s, "train_s": train_s}])  # type: ignore[arg-type]

    def summary(self) -> str:
        """One line: the probed steps, the steps the budget skipped, the monitor's time and share."""
        probed = sorted({int(r["step"]) for r in self.rows})

        def steps(xs: Sequence[int]) -> str:
            short = len(xs) <= 12
            return ", ".join(map(str, xs if short else [*xs[:6], "...", *xs[-3:]])) + (
                "" if short else f" ({len(xs)} steps)"
            )

        budget = "" if self.budget is None or math.isinf(self.budget) else f" (budget {100 * self.budget:.3g}%)"
        train_s = self._train_s(self._clock())
        share = f" = {100 * self.spent_s / train_s:.3g}% of {train_s:.3g} s of training" if train_s > 0 else ""
        return (
            f"alignment monitor: probed step(s) {steps(probed) or 'none'}; skipped planned step(s) "
            f"{steps(sorted(self.skipped)) or 'none'}{budget}; {self.spent_s:.3g} s in probes{share}"
        )

    def _events(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ``certified`` events of ``rows`` (one per point) whose point has none yet."""
        seen = {e["point"] for e in self.events}
        out = [e for r in rows if r["point"] not in seen and (e := certified_event(r, self.delta)) is not None]
        self.events.extend(out)
        return out


def monitor_from(
    monitor: AlignmentMonitor | None,
    model: Any,
    train: Any,
    test: Any,
    options: MonitorOptions | None,
    keywords: dict[str, Any],
    where: str,
) -> AlignmentMonitor:
    """The callbacks' monitor: ``monitor``, or one built from ``model``, the pools, ``options`` and keywords."""
    built = train is not None or test is not None or options is not None or bool(keywords)
    if monitor is not None:
        if not isinstance(monitor, AlignmentMonitor):
            raise WidthscopeError(f"{where}: monitor must be an AlignmentMonitor, not {type(monitor).__name__}")
        if built:
            raise WidthscopeError(
                f"{where}: give either a monitor or the pools and options to build one (train=, test=, "
                "options=, keywords), not both"
            )
        return monitor
    if train is None or test is None or model is None:
        missing = [n for n, v in (("model", model), ("train", train), ("test", test)) if v is None]
        raise WidthscopeError(
            f"{where}: no monitor given and no {', '.join(missing)} to build one: pass an AlignmentMonitor, "
            "or train=, test= (and options=) for the model being trained"
        )
    return AlignmentMonitor(model, train, test, options, **keywords)
