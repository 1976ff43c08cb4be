"""The monitor's settings: :class:`MonitorOptions` (the statistics declared as in
:class:`widthscope.options.CertifyOptions`, ``M`` and ``K`` one size each; the schedule, ``delta`` and
``batch_size`` its own).

Example::

    >>> from widthscope.monitor.options import MonitorOptions
    >>> opts = MonitorOptions(M=32, every=50)
    >>> opts.K_or_M, opts.budget_in_force
    (32, None)
    >>> MonitorOptions().budget_in_force        # the log-spaced default runs under a 5% budget
    0.05
    >>> MonitorOptions(draws=0)
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: draws 0: must be a whole number in 1..1000000 (resamples)
    >>> MonitorOptions.from_dict(opts.to_dict()) == opts
    True
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from typing import Any

from ..errors import WidthscopeError, WidthscopeTypeError
from ..options import CertifyOptions, Estimator, Options, option

#: Time-share cap of the default log-spaced schedule (monitor time / training time).
DEFAULT_BUDGET = 0.05
_BUDGET_ACCEPTS = "a share of training time > 0 (e.g. 0.05 for 5%), math.inf or None"


def _certify_field(name: str, default: Any = dataclasses.MISSING, **changes: Any) -> Any:
    """The field ``name`` of :class:`CertifyOptions` with the monitor's ``default`` and metadata ``changes``."""
    src = {f.name: f for f in dataclasses.fields(CertifyOptions)}[name]
    meta = {**src.metadata, **changes}
    return dataclasses.field(default=src.default if default is dataclasses.MISSING else default, metadata=meta)


def _whole(v: Any) -> Any:
    """A numpy / 0-D tensor integer as a python ``int`` (anything else unchanged)."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    try:
        return operator.index(v)
    except TypeError:
        return v


@dataclasses.dataclass(frozen=True)
class MonitorOptions(Options):
    """What an :class:`~widthscope.monitor.AlignmentMonitor` measures and when (messages name the keyword)."""

    points: tuple[str, ...] | None = _certify_field("points")
    M: int = _certify_field(
        "M",
        16,
        kind="int",
        metavar="M",
        help="train sample size of the certificate and of the misalignment draws: one size, default 16 "
        "(certify takes a list, default 16,32,64,128)",
    )
    K: int | None = _certify_field(
        "K",
        None,
        kind="int",
        metavar="K",
        help="held-out sample size: one size (certify takes a list); default K = M",
    )
    draws: int = _certify_field("draws")
    seed: int = _certify_field("seed")
    estimator: Estimator = _certify_field("estimator")
    pool: str = _certify_field("pool")
    every: int | None = option(
        None,
        kind="int",
        lo=1,
        unit="optimizer steps",
        help="probe when step % every == 0 (default: neither every nor at: log-spaced steps under a budget)",
    )
    at: tuple[int, ...] | None = option(
        None, kind="ints", lo=0, unit="optimizer steps", help="probe exactly at these optimizer steps"
    )
    budget: float | None = option(
        None,
        kind="float",
        lo=0.0,
        help="cap on the monitor's share of training time (None: 0.05 with the default schedule, "
        "no cap with every/at; math.inf: no cap)",
    )
    delta: float = option(
        0.05,
        lo=0.0,
        hi=1.0,
        unit="a probability",
        help="target of the planner and of the certified event (b_exact <= delta), in (0, 1)",
    )
    batch_size: int = option(
        64, lo=1, hi=10**6, unit="examples per batch", help="probe batch size when the pools are whole tensors"
    )

    @classmethod
    def flag(cls, name: str) -> str:
        return name  # messages name the keyword of AlignmentMonitor

    def _normalise(self, name: str, meta: Mapping[str, Any], value: Any) -> Any:
        if name == "budget":
            return _budget(value)
        if name == "at":
            try:
                steps = [_whole(s) for s in value] if not isinstance(value, (str, int)) else value
            except TypeError:
                steps = value  # not iterable: the base check names it
            if isinstance(steps, list) and not steps:
                raise WidthscopeError("at is empty: give the optimizer steps to probe, e.g. at=[0, 100, 1000]")
            out = super()._normalise(name, meta, steps)
            return tuple(sorted(set(out)))
        return super()._normalise(name, meta, _whole(value))

    def check(self) -> None:
        if self.every is not None and self.at is not None:
            raise WidthscopeError("give either every=N or at=[steps], not both")
        if not 0.0 < self.delta < 1.0:
            raise WidthscopeError(f"delta {self.delta:g}: must be a probability in (0, 1), both ends excluded")

    @property
    def K_or_M(self) -> int:
        """The held-out size in force (``K``, or ``M`` when ``K`` is None)."""
        return self.M if self.K is None else self.K

    @property
    def budget_in_force(self) -> float | None:
        """The cap in force: ``budget``, or :data:`DEFAULT_BUDGET` for the log-spaced default (None: no cap)."""
        if self.budget is None:
            return DEFAULT_BUDGET if self.every is None and self.at is None else None
        return self.budget

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (``budget=math.inf`` written ``"inf"``, which :meth:`from_dict` reads back)."""
        out = super().to_dict()
        if out["budget"] is not None and math.isinf(out["budget"]):
            out["budget"] = "inf"
        return out


def _budget(v: Any) -> float:
    """``budget``: a share ``> 0`` or ``inf`` (also the recorded text ``"inf"``)."""
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    v = _whole(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WidthscopeTypeError(f"budget must be {_BUDGET_ACCEPTS}, got {v!r}")
    if math.isnan(v) or v <= 0:
        raise WidthscopeError(f"budget must be {_BUDGET_ACCEPTS}, got {v!r}")
    return float(v)
