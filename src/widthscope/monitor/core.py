r"""The alignment monitor: certify fixed pools at chosen optimizer steps, leaving training untouched.

At a monitored step the monitor runs :func:`widthscope.probe.collect` on a *fixed* train pool
and a *fixed* held-out pool (materialised once, at construction) with the model in eval mode,
and turns the samples into statistics with exactly the code of ``certify``
(:func:`widthscope.certify.statistics`): for the configured ``(M, K)`` one row per point with
the two-population certificate

    d_par = (aᵀb)² / max(bᵀΣ_a b, aᵀΣ_b a),   d_2 = (aᵀb)² / tr(Σ_aΣ_b),   d_align = min(d_par, d_2)
    b_exact = Var(A) / (Var(A) + (aᵀb)²),      b_align = 1 / (1 + n_eff d_align)

(``n_eff = MK/(M+K+1)``), the empirical misalignment ``Pr(μ_Mᵀg_K ≤ 0)`` over ``draws``
resamples with its Wilson interval, and the planner's smallest ``M = K`` reaching ``delta``
(:func:`widthscope.stats.plan`). Rows follow :func:`widthscope.stats.vacuous_rule`.

**Restore guarantee.** Around every probe the monitor saves and restores: the torch CPU RNG
state, every CUDA device's RNG state (when CUDA is initialised), python's ``random`` and
numpy's global RNG, the train/eval flag of every module, ``requires_grad`` of every parameter
and the ``.grad`` of every parameter (same tensor object, same values). The probe never
creates parameter gradients (parameters are frozen during it) and never touches an
optimizer. So a training loop gives bit-identical weights with and without the monitor.
At construction one dry probe checks that parameters and buffers are unchanged by a probe
(a model that updates a buffer in eval-mode forward cannot be restored and is refused).

**Cost cap.** With a ``budget`` ``b`` a scheduled probe is made only when the monitor's total
time, this probe included (predicted as the slowest probe so far, or from the dry probe before the first),
stays ``≤ b ×`` the training time so far (wall time since the first :meth:`AlignmentMonitor.step`
call minus the monitor's own); other scheduled steps are skipped (``monitor.skipped``), each one said
in the log (logger ``widthscope.monitor``, WARNING) and in the ``out=`` file (a ``kind="skipped"``
line). The default log-spaced schedule runs under ``b = 0.05`` (:data:`DEFAULT_BUDGET`), so the
default costs at most ~5% of training plus the first and last probes; ``every=`` / ``at=`` schedules
are followed exactly unless a budget is given. Under ``torch.distributed`` rank 0's decision is broadcast.

**First and last step.** :meth:`AlignmentMonitor.bounds` tells the monitor the run's first and
last optimizer steps (the Trainer and Lightning callbacks do it at train start); both are then
probed whatever the schedule and the budget, and ``step(..., final=True)`` probes a run that
stops early (early stopping) at the step it stops.

**FSDP.** A model sharded by FSDP (``FullyShardedDataParallel`` or ``fully_shard``) is refused
at construction and at every probe: the probe's forward hooks and per-example gradients need
whole parameters, which a sharded model has on no rank outside its own forward.
"""

from __future__ import annotations

import logging
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from .._io import append_jsonl, read_jsonl, to_jsonable
from ..errors import WidthscopeError
from ..probe import batched, collect, resolve_points
from ..probe.collect import POOLS
from ..stats import certified
from ..stats.estimators import Estimator

__all__ = ["AlignmentMonitor", "TrainingState", "log_steps", "check_not_fsdp", "DEFAULT_BUDGET"]

#: Time-share cap of the default log-spaced schedule (monitor time / training time).
DEFAULT_BUDGET = 0.05

_log = logging.getLogger("widthscope.monitor")

#: Columns of a ``kind="row"`` row whose values are numbers (what the logging adapters send).
METRIC_COLUMNS = (
    "d_par",
    "d_2",
    "d_align",
    "b_exact",
    "b_align",
    "expectation",
    "misalignment",
    "misalignment_low",
    "misalignment_high",
    "plan_M_exact",
    "plan_M_align",
    "d_align_one",
    "probe_s",
    "stats_s",
)


def log_steps(limit: int, per_octave: int = 2) -> list[int]:
    """Log-spaced optimizer steps ``0 ≤ s ≤ limit``: 0 and ``round(2^(k/per_octave))``, k ≥ 0.

    Example::

        >>> log_steps(40)
        [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32]
    """
    out, k = {0}, 0
    while True:
        s = round(2 ** (k / per_octave))
        if s > limit:
            return sorted(out)
        out.add(s)
        k += 1


def _is_log_step(step: int, per_octave: int = 2) -> bool:
    return step in log_steps(step, per_octave)


class TrainingState:
    """Everything a probe could disturb, captured once and put back exactly by :meth:`restore`.

    RNG states (torch CPU, every CUDA device when CUDA is initialised, python ``random``, numpy),
    the ``training`` flag of every module, and per parameter its ``requires_grad`` flag and its
    ``.grad`` (the tensor object and a copy of its values).
    """

    def __init__(self, model: nn.Module) -> None:
        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        self.py_rng = random.getstate()
        self.np_rng = np.random.get_state()
        self.modes = [(m, m.training) for m in model.modules()]
        self.params = [
            (p, p.requires_grad, p.grad, None if p.grad is None else p.grad.detach().clone())
            for p in model.parameters()
        ]

    def restore(self) -> None:
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.py_rng)
        np.random.set_state(self.np_rng)
        for m, mode in self.modes:
            m.training = mode
        with torch.no_grad():
            for p, flag, grad, values in self.params:
                p.requires_grad_(flag)
                p.grad = grad
                if grad is not None and values is not None and not torch.equal(grad, values):
                    grad.copy_(values)


def _fsdp_classes() -> tuple[type, ...]:
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:  # a torch build without distributed: nothing can be sharded
        return ()
    return tuple(
        c
        for c in (getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None))
        if isinstance(c, type)
    )


FSDP_FIX = (
    "probe it unsharded: monitor a DDP (or single-process) run, or save a full state dict at the steps "
    "you want and run widthscope certify on those checkpoints"
)


def check_not_fsdp(model: Any, where: str = "the monitor") -> None:
    """Refuse (one line) a model with any FSDP-sharded module: FSDP1 ``FullyShardedDataParallel``
    or FSDP2 ``fully_shard`` (the ``FSDPModule`` mixin)."""
    classes = _fsdp_classes()
    if not classes or not isinstance(model, nn.Module):
        return
    for name, m in model.named_modules():
        if isinstance(m, classes):
            kind = (
                "fully_shard (FSDP2)"
                if type(m).__name__ != "FullyShardedDataParallel"
                else "FullyShardedDataParallel (FSDP1)"
            )
            raise WidthscopeError(
                f"{where} cannot probe an FSDP-sharded model ({name or 'the model'} is wrapped by "
                f"{kind}: its parameters are split across ranks); {FSDP_FIX}"
            )


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {f"parameter {n}": p.detach().clone() for n, p in model.named_parameters()}
    out.update({f"buffer {n}": b.detach().clone() for n, b in model.named_buffers()})
    return out


def _as_batches(pool: Any, what: str, batch_size: int) -> list[Any]:
    """A fixed list of probe batches from full tensors ``(X, Y)`` / ids ``(n, T)`` or batches."""
    if isinstance(pool, torch.Tensor):
        if pool.is_floating_point():
            raise WidthscopeError(
                f"the {what} pool is a float tensor without targets: give (X, Y), token ids (n, T) or a list of batches"
            )
        return batched(pool, batch_size=batch_size)
    if isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(t, torch.Tensor) for t in pool):
        # A tuple of two tensors is the whole pool (X, Y); a list is batches.
        if pool[0].ndim < 1 or pool[1].ndim < 1 or pool[0].shape[0] != pool[1].shape[0]:
            raise WidthscopeError(
                f"the {what} pool (X, Y) has {tuple(pool[0].shape)} inputs but "
                f"{tuple(pool[1].shape)} targets: give one target per example"
            )
        return batched(pool[0], pool[1], batch_size=batch_size)
    if isinstance(pool, Mapping) and isinstance(pool.get("input_ids"), torch.Tensor):
        # {"input_ids": (n, T), "attention_mask": ..., "labels": ...}: the whole pool, split along dim 0.
        n = pool["input_ids"].shape[0]
        return [{k: v[i : i + batch_size] for k, v in pool.items()} for i in range(0, n, batch_size)]
    try:
        batches = list(pool)  # a DataLoader is drawn once here: the pool stays fixed
    except TypeError as exc:
        raise WidthscopeError(
            f"the {what} pool is a {type(pool).__name__}: give (X, Y) tensors, token "
            "ids (n, T) or an iterable of batches"
        ) from exc
    if not batches:
        raise WidthscopeError(f"the {what} pool is empty: give it at least 4 examples")
    return batches


def _check_budget(v: Any, default: bool) -> float | None:
    """The cap in force: ``None`` (no cap), a share ``> 0`` or ``inf``."""
    if v is None:
        return DEFAULT_BUDGET if default else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v <= 0:
        raise WidthscopeError(f"budget must be a share of training time > 0 (e.g. 0.05 for 5%), got {v!r}")
    return float(v)


def _check_int(v: Any, name: str, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < low:
        raise WidthscopeError(f"{name} must be an integer >= {low}, got {v!r}")
    return int(v)


class AlignmentMonitor:
    """Certificates at fixed pools during training; see the module docstring for the maths.

    Args:
        model: the model being trained (used at construction for the checks and the dry probe).
        train, test: the fixed pools — a tuple ``(X, Y)`` of tensors, LongTensor token ids ``(n, T)``,
            a dict with ``input_ids`` ``(n, T)`` (and ``attention_mask``/``labels``), or an iterable of
            probe batches (a list, a DataLoader: as for :func:`widthscope.probe.collect`), drawn once
            at construction with the RNG states restored afterwards; a ``BatchEncoding``, or texts
            (``list[str]``) / a ``datasets.Dataset`` with ``tokenizer=`` (the loss of the model's task).
        points: insertion points (default: :func:`widthscope.probe.insertion_points`).
        M, K: the sample sizes of the certificate and the misalignment draws (``K=None``: ``K = M``).
        every: probe when ``step % every == 0``; ``at``: probe exactly at these steps; neither:
            log-spaced steps (:func:`log_steps`).
        delta: target for the planner and the ``certified`` event (``b_exact ≤ delta``).
        draws, seed, estimator, pool, loss_fn: as for :func:`widthscope.certify.certify`.
        out: a JSONL file; rows are appended (one write per probe) and, when it already exists
            with the same settings, read back so a resumed run skips the steps it has. Under
            ``torch.distributed`` every rank must call :meth:`step` at the same steps: each probes
            its share of the pool batches, the samples are gathered (same rows on every rank, equal
            to one process's), and rank 0 alone writes.
        batch_size: batch size when the pools are given as full tensors.
        progress: show the probe's progress bar.
        budget: cap on the monitor's share of training time (see the module docstring);
            ``None``: :data:`DEFAULT_BUDGET` with the default log-spaced schedule, no cap with
            ``every`` / ``at``; ``math.inf``: no cap.
        tokenizer: a Hugging Face tokenizer object, for pools given as texts (``list[str]``) or
            a ``datasets.Dataset`` with a text column (:func:`widthscope.data.objects.batches_from`;
            a ``BatchEncoding`` needs none).
        clock: the budget's time source in seconds (a benchmark that interleaves several trainings,
            or a test, passes one that runs only while this training does).

    Rows (``kind="row"``): ``step, point, M, K, n_train, n_test, d, populations, d_par, d_2,
    d_align, d_align_one, b_exact, b_align, expectation, vacuous, reason, misalignment
    (+ _low, _high), draws, delta, plan_M_exact, plan_M_align, probe_s, stats_s``; an event
    row (``kind="certified"``) when a point first has ``b_exact ≤ delta``.
    """

    def __init__(
        self,
        model: nn.Module,
        train: Any,
        test: Any,
        *,
        points: str | Sequence[str] | None = None,
        M: int = 16,
        K: int | None = None,
        every: int | None = None,
        at: Iterable[int] | None = None,
        delta: float = 0.05,
        draws: int = 1000,
        seed: int = 0,
        estimator: Estimator = "unbiased",
        pool: str = "sum",
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        out: str | Path | None = None,
        batch_size: int = 64,
        progress: bool = False,
        budget: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        tokenizer: Any = None,
    ) -> None:
        import os

        from .. import _args
        from ..certify import ESTIMATORS, check_pool, count_examples

        fn = "AlignmentMonitor"  # the types, before any work (values: the checks below)
        _args.module(fn, "model", model)
        from ..data.objects import batches_from, check_tokenizer, is_object_pool

        check_tokenizer(tokenizer, fn)
        pools = []
        for name, obj, off in (("train", train, 0), ("test", test, 1)):
            if is_object_pool(obj):  # texts or a datasets.Dataset: tokenized / cut into batches here
                _args.integer(fn, "batch_size", batch_size, lo=1)
                _args.integer(fn, "seed", seed, lo=0)
                obj, task_loss, _ = batches_from(
                    obj, model=model, tokenizer=tokenizer, batch_size=batch_size, seed=seed + off, fn=fn, name=name
                )
                loss_fn = loss_fn or task_loss
            pools.append(obj)
        train, test = pools
        _args.batches(fn, "train", train, single=True)
        _args.batches(fn, "test", test, single=True)
        _args.points(fn, "points", points)
        _args.integer(fn, "M", M, lo=1)
        for name, v in (("K", K), ("every", every)):
            _args.integer(fn, name, v, lo=1, optional=True)
        _args.int_list(fn, "at", at, accepts="a list of optimizer steps (integers >= 0) or None")
        _args.number(fn, "delta", delta, 0.0, 1.0, lo_open=True, hi_open=True, accepts="a probability in (0, 1)")
        _args.integer(fn, "draws", draws, lo=1)
        _args.integer(fn, "seed", seed, lo=0)
        _args.choice(fn, "estimator", estimator, ESTIMATORS)
        _args.choice(fn, "pool", pool, POOLS)
        _args.function(fn, "loss_fn", loss_fn)
        _args.instance(fn, "out", out, (str, os.PathLike), "a path (str or pathlib.Path)", optional=True)
        _args.integer(fn, "batch_size", batch_size, lo=1)
        _args.boolean(fn, "progress", progress)
        _args.number(
            fn,
            "budget",
            budget,
            0.0,
            lo_open=True,
            finite=False,
            optional=True,
            accepts="a share of training time > 0 (e.g. 0.05 for 5%), math.inf or None",
        )
        _args.function(fn, "clock", clock, optional=False, accepts="a function returning seconds")
        check_not_fsdp(model)
        if every is not None and at is not None:
            raise WidthscopeError("give either every=N or at=[steps], not both")
        self.every = None if every is None else _check_int(every, "every (probe interval in optimizer steps)", 1)
        self.at = None if at is None else sorted({_check_int(s, "each step of at", 0) for s in at})
        if self.at is not None and not self.at:
            raise WidthscopeError("at is empty: give the optimizer steps to probe, e.g. at=[0, 100, 1000]")
        self.budget = _check_budget(budget, default=self.every is None and self.at is None)
        self.M = _check_int(M, "M", 1)
        self.K = self.M if K is None else _check_int(K, "K", 1)
        self.draws = _check_int(draws, "draws", 1)
        self.seed = _check_int(seed, "seed", 0)
        if not (isinstance(delta, (int, float)) and 0.0 < float(delta) < 1.0):
            raise WidthscopeError(f"delta must be a probability in (0, 1), got {delta!r}")
        self.delta = float(delta)
        if estimator not in ESTIMATORS:
            raise WidthscopeError(f"unknown estimator {estimator!r}; choose {' or '.join(ESTIMATORS)}")
        if pool not in POOLS:
            raise WidthscopeError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
        self.estimator, self.pool, self.loss_fn, self.progress = estimator, pool, loss_fn, progress
        batch_size = _check_int(batch_size, "batch_size", 1)
        state = TrainingState(model)  # drawing a shuffling DataLoader uses the torch RNG: undo it
        try:
            self.train = _as_batches(train, "train", batch_size)
            self.test = _as_batches(test, "held-out", batch_size)
        finally:
            state.restore()
        if pool != "token":
            check_pool(count_examples(self.train), self.M, "train", "the train pool size", pool)
            check_pool(count_examples(self.test), self.K, "held-out", "the held-out pool size", pool)
        from .. import distributed

        W = distributed.world_size()
        for what, lst in (("train", self.train), ("held-out", self.test)):
            if len(lst) < W:
                raise WidthscopeError(
                    f"the {what} pool has {len(lst)} batch(es) for {W} ranks: every rank "
                    "probes its share; give smaller batches (batch_size=) or a larger pool"
                )
        model = _unwrap(model)
        self.points = resolve_points(model, points)
        self.model = model
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._certified: set[str] = set()
        self._done: set[int] = set()
        self.out = None if out is None else Path(out)
        self.notes: list[str] = []  # what the probe said once (e.g. BatchNorm ran in eval mode)
        self.skipped: list[int] = []  # scheduled steps left out to keep within the budget
        self.forced: set[int] = set()  # the run's first and last steps (bounds): probed whatever the schedule
        self.spent_s = 0.0  # seconds in probes (for the budget)
        self._t_first: float | None = None
        self._predict_s = 0.0
        self._probed = False
        self._clock = clock
        self._dry_check(model)
        if self.out is not None:
            self._open(self.out)

    @property
    def _writes(self) -> bool:
        # Under torch.distributed every rank computes the same rows; rank 0 alone writes them.
        from .. import distributed

        return self.out is not None and distributed.is_main()

    # ------------------------------------------------------------------ settings / resume
    def settings(self) -> dict[str, Any]:
        return {
            "kind": "settings",
            "points": list(self.points),
            "M": self.M,
            "K": self.K,
            "every": self.every,
            "at": self.at,
            "delta": self.delta,
            "draws": self.draws,
            "seed": self.seed,
            "estimator": self.estimator,
            "pool": self.pool,
            "budget": None if self.budget is None or math.isinf(self.budget) else self.budget,
            "n_train": _count_safe(self.train),
            "n_test": _count_safe(self.test),
        }

    def _open(self, path: Path) -> None:
        old = read_jsonl(path)
        mine = to_jsonable(self.settings())
        if not old:
            if self._writes:
                append_jsonl(path, [mine])
            return
        head = old[0]
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
                self._certified.add(r["point"])

    def _dry_check(self, model: nn.Module) -> None:
        """One probe of one batch per pool: bad data/points fail now, and a model whose probe
        changes a parameter or buffer (which the monitor could not undo) is refused. With
        ``pool="token"`` the sample count is known only after probing, so the whole pools are
        probed once here and checked against ``M`` / ``K``."""
        from ..certify import check_pool

        before = _tensors(model)
        state = TrainingState(model)
        whole = self.pool == "token"
        try:
            for batches, need, what in ((self.train, self.M, "train"), (self.test, self.K, "held-out")):
                t1 = self._clock()
                try:
                    q = collect(
                        model,
                        batches if whole else batches[:1],
                        points=self.points,
                        loss_fn=self.loss_fn,
                        pool=self.pool,
                        train_mode="eval",
                        progress=False,
                    )
                except (NotImplementedError, WidthscopeError) as exc:  # e.g. a LightningModule without forward()
                    cause = exc if isinstance(exc, NotImplementedError) else exc.__cause__
                    # torch: 'Module [X] is missing the required "forward" function'
                    if not isinstance(cause, NotImplementedError) or '"forward"' not in str(cause):
                        raise
                    raise WidthscopeError(
                        f"the monitor calls the model on the pools, but {type(model).__name__} has no forward() "
                        f"({cause}); build the monitor on the network it wraps, e.g. AlignmentMonitor(module.net, "
                        "...) with points named inside it (the Lightning callback probes that network)"
                    ) from exc
                self.notes = list(dict.fromkeys(self.notes + q.notes))
                # the budget's first prediction: one batch's time times the pool's batches
                self._predict_s += (self._clock() - t1) * (1 if whole else len(batches))
                if whole:
                    check_pool(q[self.points[0]].shape[0], need, what, f"the {what} pool size", self.pool)
        finally:
            state.restore()
        after = _tensors(model)
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        if changed:
            with torch.no_grad():  # put the model back before refusing it
                for k in changed:
                    kind, name = k.split(" ", 1)
                    src = before[k]
                    (model.get_parameter(name) if kind == "parameter" else model.get_buffer(name)).copy_(src)
            raise WidthscopeError(
                f"the monitor cannot restore this model exactly: an eval-mode forward pass changes "
                f"{', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}; make that update happen "
                "only in training mode (or probe a copy of the model with widthscope.certify.certify)"
            )

    # ------------------------------------------------------------------ scheduling
    def bounds(self, first: int, last: int | None) -> None:
        """The run's first and last optimizer steps (``last=None``: not known): both are probed
        whatever the schedule (``every=``, ``at=`` or the default) and the budget. The Trainer and
        Lightning callbacks call it at train start; a plain loop may call it before training."""
        first = _check_int(first, "first", 0)
        self.forced = {first} if last is None else {first, _check_int(last, "last", first)}

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
        return _is_log_step(step)

    def step(self, model: nn.Module | None = None, step: int = 0, *, final: bool = False) -> list[dict[str, Any]]:
        """Plain-loop adapter: call after each optimizer step with the number of steps done.

        Probes when :meth:`should_probe` says so and returns that step's rows (else ``[]``).
        ``final=True``: the run ends at this step (e.g. stopped early), so it is probed (once)
        whatever the schedule and the budget, as the last step given to :meth:`bounds` is.
        A planned probe the budget skips is listed in :attr:`skipped` and said in the log.
        """
        step = _check_int(step, "step", 0)
        now = self._clock()
        if self._t_first is None:
            self._t_first = now
        forced = step not in self._done and (final or step in self.forced)
        if not forced and not self.should_probe(step):
            return []
        if not forced and not self._within_budget(now):
            self._skip(step, now)
            return []
        return self.probe(self.model if model is None else model, step)

    def _skip(self, step: int, now: float) -> None:
        """Record, log and (``out=``) write that the budget skipped the probe planned at ``step``."""
        from .. import distributed

        if self.skipped and self.skipped[-1] == step:  # called again at the same step: said once
            return
        self.skipped.append(step)
        if not distributed.is_main():
            return
        assert self.budget is not None  # (only a budget skips)
        train_s = max(0.0, now - (self._t_first if self._t_first is not None else now) - self.spent_s)
        _log.warning(
            "alignment monitor: skipped the probe planned at step %d: the monitor would exceed its "
            "budget of %.3g%% of training time (monitor %.3g s + next probe ~%.3g s > %.3g%% of %.3g s "
            "of training)%s",
            step,
            100 * self.budget,
            self.spent_s,
            self._predict_s,
            100 * self.budget,
            train_s,
            ""
            if len(self.skipped) > 1
            else "; pass budget=math.inf, or every=/at= without a budget, to probe every planned step",
        )
        if self._writes:
            assert self.out is not None
            append_jsonl(
                self.out,
                [
                    {
                        "kind": "skipped",
                        "step": step,
                        "reason": "budget",
                        "budget": self.budget,
                        "monitor_s": self.spent_s,
                        "train_s": train_s,
                    }
                ],
            )

    def summary(self) -> str:
        """One line: the probed steps and the planned steps the budget skipped."""
        probed = sorted({int(r["step"]) for r in self.rows})

        def steps(xs: Sequence[int]) -> str:
            return (
                ", ".join(map(str, xs))
                if len(xs) <= 12
                else f"{', '.join(map(str, xs[:6]))}, ..., {', '.join(map(str, xs[-3:]))} ({len(xs)} steps)"
            )

        budget = "" if self.budget is None or math.isinf(self.budget) else f" (budget {100 * self.budget:.3g}%)"
        return (
            f"alignment monitor: probed step(s) {steps(probed) or 'none'}; skipped planned step(s) "
            f"{steps(sorted(self.skipped)) or 'none'}{budget}; {self.spent_s:.3g} s in probes"
        )

    def _within_budget(self, now: float) -> bool:
        """Whether a probe now keeps monitor time ``≤ budget ×`` training time (rank 0 decides)."""
        if self.budget is None or math.isinf(self.budget):
            return True
        from .. import distributed

        train_s = now - (self._t_first if self._t_first is not None else now) - self.spent_s
        ok = self.spent_s + self._predict_s <= self.budget * train_s
        return bool(distributed.broadcast_object(ok)) if distributed.is_distributed() else ok

    # ------------------------------------------------------------------ the probe
    def probe(self, model: nn.Module, step: int) -> list[dict[str, Any]]:
        """Probe now (whatever the schedule), record and return the rows of ``step``."""
        from .. import distributed
        from ..certify import gather_rows, statistics

        check_not_fsdp(model)
        model = _unwrap(model)
        state = TrainingState(model)
        t_start = self._clock()
        try:
            t0 = time.perf_counter()
            common: dict[str, Any] = dict(
                points=self.points, loss_fn=self.loss_fn, pool=self.pool, train_mode="eval", progress=self.progress
            )
            with warnings.catch_warnings():  # said once, by the dry probe at construction
                warnings.simplefilter("ignore", UserWarning)
                qa = collect(model, distributed.shard(self.train), **common)
                qb = collect(model, distributed.shard(self.test), **common)
            # Each rank probed its contiguous share; the gathered rows are in pool order.
            ga, gb = ({n: gather_rows(q[n], _device(model)) for n in self.points} for q in (qa, qb))
            probe_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            results, _ = statistics(
                ga,
                gb,
                pairs=[(self.M, self.K)],
                draws=self.draws,
                seed=self.seed,
                estimator=self.estimator,
                pool=self.pool,
            )
            rows = [self._row(r, step) for r in results]
            stats_s = time.perf_counter() - t0
        finally:
            state.restore()
        for r in rows:
            r["probe_s"], r["stats_s"] = probe_s, stats_s
        new = rows + self._events(rows)
        self.rows.extend(rows)
        self._done.add(step)
        if self._writes:
            assert self.out is not None  # (_writes: there is an out= file)
            append_jsonl(self.out, new)
        cost = self._clock() - t_start
        # The next probe is predicted to cost the most any probe has (the dry probe's guess is dropped).
        self._predict_s = cost if not self._probed else max(self._predict_s, cost)
        self._probed = True
        self.spent_s += cost
        return new

    def _row(self, r: dict[str, Any], step: int) -> dict[str, Any]:
        from ..stats import CrossMoments, plan, vacuous_rule

        c = r["certificates"][0]
        two, one, mis = c["two"], c["one"], c["misalignment"]
        p = plan(CrossMoments(**r["cross_moments"]), target=self.delta)
        row = {
            "kind": "row",
            "step": step,
            "point": r["point"],
            "M": self.M,
            "K": self.K,
            "n_train": r["n_train"],
            "n_test": r["n_test"],
            "d": r["d"],
            "populations": two["populations"],
            "d_par": two["d_par"],
            "d_2": two["d_2"],
            "d_align": two["d_align"],
            "vacuous": two["vacuous"],
            "reason": two["reason"],
            "b_exact": two["b_exact"],
            "b_align": two["b_align"],
            "expectation": two["expectation"],
            "d_align_one": one["d_align"],
            "misalignment": mis["probability"],
            "misalignment_low": mis["low"],
            "misalignment_high": mis["high"],
            "draws": mis["draws"],
            "delta": self.delta,
            "plan_M_exact": p.equal_exact,
            "plan_M_align": p.equal_align,
        }
        return vacuous_rule(row)

    def _events(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            if r["point"] not in self._certified and certified(r["b_exact"], r["vacuous"], self.delta):
                self._certified.add(r["point"])
                out.append(
                    {
                        "kind": "certified",
                        "step": r["step"],
                        "point": r["point"],
                        "delta": self.delta,
                        "b_exact": r["b_exact"],
                        "M": self.M,
                        "K": self.K,
                    }
                )
        self.events.extend(out)
        return out

    # ------------------------------------------------------------------ for loggers
    @staticmethod
    def metrics(rows: Iterable[dict[str, Any]], prefix: str = "align") -> dict[str, float]:
        """Flat ``{"align/<point>/<column>": number}`` of the rows (``None`` values left out)."""
        out: dict[str, float] = {}
        for r in rows:
            if r.get("kind") == "certified":
                out[f"{prefix}/{r['point']}/certified_step"] = float(r["step"])
                continue
            for col in METRIC_COLUMNS:
                v = r.get(col)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out[f"{prefix}/{r['point']}/{col}"] = float(v)
        return out


def lazy_class(module: str, name: str, make: Callable[[], type]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds class ``name`` with ``make()`` on first use, so the
    framework it subclasses is imported only then (importing the module, e.g. for doctests,
    never needs the framework)."""
    cache: dict[str, type] = {}

    def getattr_(attr: str) -> Any:
        if attr == name:
            if name not in cache:
                cache[name] = make()
            return cache[name]
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return getattr_


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / DataParallel (the probe needs no wrapper)."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


def _device(model: nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _count_safe(batches: list[Any]) -> int | None:
    from ..certify import count_examples

    try:
        return count_examples(batches)
    except (AttributeError, TypeError, IndexError, KeyError):
        return None
