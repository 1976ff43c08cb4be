"""When the monitor probes: the schedule (``every``, ``at``, log-spaced), the run's first and last
steps, and the time budget that skips planned probes (each skip said in the log and the file).

**The budget rule.** With a cap ``b`` a planned probe at ``step`` is made only when

    monitor time so far + next probe + (the last step's probe, while it is still to come) ≤ b × training time so far

(the next probe and the last step's are predicted as the slowest probe so far, or from the dry
probe before the first; training time = wall time since the first ``step`` call minus the
monitor's own). Reserving the last step's probe is what keeps the *whole run* within ``b``: the
first and last steps (:meth:`Schedule.bounds`) are probed whatever the budget, so every probe in
between must leave room for the last one. The monitor's share at the end of a run is therefore at
most ``b``, or, when the first and last probes alone are more than ``b`` of a short run, exactly those
two probes (:meth:`Schedule.summary` states the share)."""

from __future__ import annotations

import logging
import math
import operator
from pathlib import Path
from typing import Any, Sequence

from .. import distributed
from .._io import append_jsonl
from ..errors import WidthscopeError

__all__ = ["log_steps", "is_log_step", "Schedule", "check_step"]

_log = logging.getLogger("widthscope.monitor")


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


def is_log_step(step: int, per_octave: int = 2) -> bool:
    return step in log_steps(step, per_octave)


class Schedule:
    """The scheduling half of :class:`~widthscope.monitor.AlignmentMonitor` (a mixin: its state is
    the monitor's attributes, set in the monitor's constructor)."""

    every: int | None
    at: list[int] | None
    budget: float | None
    rows: list[dict[str, Any]]
    skipped: list[int]
    forced: set[int]
    spent_s: float
    out: Path | None
    _done: set[int]
    _last: int | None
    _t_first: float | None
    _predict_s: float

    @property
    def _writes(self) -> bool:
        """Whether this process writes the ``out=`` file (the monitor's)."""
        raise NotImplementedError

    def _now(self) -> float:
        """The budget's clock (the monitor's)."""
        raise NotImplementedError

    def bounds(self, first: int, last: int | None) -> None:
        """The run's first and last optimizer steps (``last=None``: not known): both are probed
        whatever the schedule (``every=``, ``at=`` or the default) and the budget, and the budget
        keeps room for the last one. The Trainer and Lightning callbacks call it at train start; a
        plain loop may call it before training."""
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
        return is_log_step(step)

    def _train_s(self, now: float) -> float:
        return max(0.0, now - (self._t_first if self._t_first is not None else now) - self.spent_s)

    def _reserve_s(self, step: int) -> float:
        """The last step's probe, predicted, while it is still to come after ``step``."""
        last = self._last
        return self._predict_s if last is not None and last > step and last not in self._done else 0.0

    def _within_budget(self, now: float, step: int) -> bool:
        """Whether a probe at ``step`` keeps the rule of the module docstring (rank 0 decides)."""
        if self.budget is None or math.isinf(self.budget):
            return True
        ok = self.spent_s + self._predict_s + self._reserve_s(step) <= self.budget * self._train_s(now)
        return bool(distributed.broadcast_object(ok)) if distributed.is_distributed() else ok

    def _skip(self, step: int, now: float) -> None:
        """Record, log and (``out=``) write that the budget skipped the probe planned at ``step``."""
        if self.skipped and self.skipped[-1] == step:  # called again at the same step: said once
            return
        self.skipped.append(step)
        if not distributed.is_main():
            return
        assert self.budget is not None  # (only a budget skips)
        train_s, reserve = self._train_s(now), self._reserve_s(step)
        _log.warning(
            "alignment monitor: skipped the probe planned at step %d: the monitor would exceed its "
            "budget of %.3g%% of training time (monitor %.3g s + next probe ~%.3g s%s > %.3g%% of %.3g s "
            "of training)%s",
            step,
            100 * self.budget,
            self.spent_s,
            self._predict_s,
            f" + the last step's ~{reserve:.3g} s" if reserve else "",
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
        """One line: the probed steps, the planned steps the budget skipped, the monitor's time and
        its share of the training time so far."""
        probed = sorted({int(r["step"]) for r in self.rows})

        def steps(xs: Sequence[int]) -> str:
            return (
                ", ".join(map(str, xs))
                if len(xs) <= 12
                else f"{', '.join(map(str, xs[:6]))}, ..., {', '.join(map(str, xs[-3:]))} ({len(xs)} steps)"
            )

        budget = "" if self.budget is None or math.isinf(self.budget) else f" (budget {100 * self.budget:.3g}%)"
        train_s = self._train_s(self._now())
        share = f" = {100 * self.spent_s / train_s:.3g}% of {train_s:.3g} s of training" if train_s > 0 else ""
        return (
            f"alignment monitor: probed step(s) {steps(probed) or 'none'}; skipped planned step(s) "
            f"{steps(sorted(self.skipped)) or 'none'}{budget}; {self.spent_s:.3g} s in probes{share}"
        )


def check_step(v: Any, name: str, low: int) -> int:
    """A step number: a whole number (not bool) ``>= low``."""
    try:
        n = None if isinstance(v, bool) else operator.index(v)
    except TypeError:
        n = None
    if n is None or n < low:
        raise WidthscopeError(f"{name} must be an integer >= {low}, got {v!r}")
    return n
