r"""When to grow (:class:`Schedule`: at fixed fractions of the budget, or when a signal fires), where
(:func:`choose_points`), and whether it pays (:func:`growth_pays`). Details: docs/growth.md.

Example::

    >>> s = Schedule("fixed", fractions=(0.25, 0.5))
    >>> s.due(0, 0.2, []), s.due(0, 0.3, []), s.due(1, 0.3, [])
    (False, True, False)
    >>> Schedule("plateau", threshold=0.01, patience=2).due(0, 0.5, [3.0, 2.0, 1.99, 1.995])
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch.nn as nn

from .. import _args
from ..errors import WidthscopeError
from ..probe.collect import EvalMode
from ..probe.growth import CRITERIA, block_input_features, point_criteria
from ..stats import certificate, misalignment

__all__ = ["Schedule", "KINDS", "alignment_signal", "choose_points", "SCHEDULES", "growth_pays"]

KINDS = ("fixed", "plateau", "certificate", "misalignment")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When to grow: ``fixed`` at ``fractions`` of the budget; ``plateau``, ``certificate``
    (``B_exact`` of the bias step) or ``misalignment`` when the signal reaches ``threshold``, never
    before ``earliest`` and forced at ``latest``."""

    kind: str
    fractions: tuple[float, ...] = ()
    threshold: float = 0.5
    patience: int = 2
    earliest: float = 0.05
    latest: float = 0.75
    stages: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise WidthscopeError(f"schedule kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.kind == "fixed":
            fr = tuple(float(f) for f in self.fractions)
            if not fr or any(not (0 < f < 1) for f in fr) or list(fr) != sorted(set(fr)):
                raise WidthscopeError(
                    f"fixed schedule fractions {self.fractions!r}: give increasing fractions of the budget in (0, 1)"
                )
            object.__setattr__(self, "fractions", fr)
            object.__setattr__(self, "stages", len(fr))
        elif not (0 <= self.earliest < self.latest < 1):
            raise WidthscopeError(
                f"schedule earliest={self.earliest}, latest={self.latest}: need 0 <= earliest < latest < 1"
            )
        if not (math.isfinite(self.threshold) and self.threshold > 0):
            raise WidthscopeError(f"schedule threshold {self.threshold}: must be a positive number")
        if self.patience < 1 or self.stages < 1:
            raise WidthscopeError("schedule patience and stages must be at least 1")

    @property
    def name(self) -> str:
        if self.kind == "fixed":
            return "fixed@" + "+".join(f"{f:g}" for f in self.fractions)
        return f"{self.kind}>{self.threshold:g}" if self.kind != "plateau" else f"plateau<{self.threshold:g}"

    @property
    def signal(self) -> bool:
        return self.kind != "fixed"

    def due(
        self, stage: int, fraction: float, history: Sequence[float], measure: Callable[[], float] | None = None
    ) -> bool:
        """Whether growth ``stage`` (0-based) is due at ``fraction`` of the budget, given the held-out
        losses ``history`` since the last growth; ``measure()`` gives the signal, called only if needed."""
        if stage >= self.stages:
            return False
        if self.kind == "fixed":
            return fraction >= self.fractions[stage]
        if fraction < self.earliest:
            return False
        if fraction >= self.latest:
            return True
        if self.kind == "plateau":
            h, k = list(history), self.patience
            return len(h) > k and min(h[-k:]) > (1 - self.threshold) * min(h[:-k])
        if measure is None:
            raise WidthscopeError(f"schedule {self.name}: the {self.kind} signal needs a measure function")
        value = measure()
        return math.isfinite(value) and value >= self.threshold

    def forced(self, fraction: float) -> bool:
        """A signal growth that happened only because ``latest`` was reached."""
        return self.signal and fraction >= self.latest


def alignment_signal(
    model: nn.Module, point: str, train: Any, test: Any, *, kind: str, M: int, K: int, seed: int = 0
) -> float:
    """``B_exact`` of the bias-step certificate (``kind="certificate"``) or the misalignment
    probability at ``point``, from position-pooled activation gradients of ``train`` and ``test``."""
    with EvalMode(model):
        qa, _ = block_input_features(model, point, train, None, batch_size=64)
        qb, _ = block_input_features(model, point, test, None, batch_size=64)
    sa, sb = qa.sum(1).double(), qb.sum(1).double()
    if kind == "certificate":
        c = certificate(sa, sb, M=M, K=K)
        return float(c.b_exact) if math.isfinite(c.b_exact) else 1.0
    if kind == "misalignment":
        mis = misalignment(sa, sb, M=M, K=K, draws=500, seed=seed)
        return float((mis[0] if isinstance(mis, list) else mis).probability)
    raise WidthscopeError(f"alignment_signal(kind={kind!r}): choose certificate or misalignment")


def choose_points(
    model: nn.Module,
    points: Sequence[str],
    train: Any,
    test: Any,
    *,
    k: int = 1,
    criterion: str = "line_search",
    M: int = 32,
    K: int = 32,
    eta: float = 1e-3,
) -> list[str]:
    """The ``k`` points of ``points`` that ``criterion`` (:data:`widthscope.probe.growth.CRITERIA`)
    ranks highest; ties keep the order of ``points``."""
    if criterion not in CRITERIA:
        raise WidthscopeError(f"choose_points(criterion={criterion!r}): choose one of {', '.join(CRITERIA)}")
    if not 1 <= k <= len(points):
        raise WidthscopeError(f"choose_points(k={k}): must be between 1 and the {len(points)} points")
    column = CRITERIA[criterion]
    line = column.startswith("ls_")
    scores = []
    for p in points:
        row = point_criteria(model, p, train, test, M=M, K=K, eta=eta, line_search=line)
        v = float(row[column])
        scores.append(v if math.isfinite(v) else -math.inf)
    order = sorted(range(len(points)), key=lambda i: (-scores[i], i))
    return [points[i] for i in order[:k]]


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("fixed", fractions=(0.1,)),
        Schedule("fixed", fractions=(0.25,)),
        Schedule("fixed", fractions=(0.5,)),
        Schedule("fixed", fractions=(0.15, 0.35)),
        Schedule("plateau", threshold=0.01, patience=2),
        Schedule("certificate", threshold=0.5),
        Schedule("misalignment", threshold=0.1),
    )
}


def growth_pays(curve: Sequence[Sequence[float]], budget: float, target: float) -> dict[str, Any]:
    """Will the small model's held-out ``curve`` (``[(FLOPs, loss), ...]``) reach ``target`` by
    ``budget`` if continued alone? Fits ``loss ≈ E + A · C^(-alpha)`` (``E, A ≥ 0``, ``alpha`` on a
    grid, refined once) and says ``"grow"`` if the fit stays above ``target`` at ``budget``, else ``"continue"``.

    >>> curve = [[c, 2.0 + 3.0 * c**-0.5] for c in (1, 2, 4, 8)]
    >>> growth_pays(curve, 100.0, 2.2)["decision"], growth_pays(curve, 1000.0, 2.2)["decision"]
    ('grow', 'continue')
    >>> fit = growth_pays([[c, 2.0 + 3.0 * c**-0.5] for c in (1, 2, 4, 8, 16, 32)], 10.0, 2.2)
    >>> round(fit["floor"], 3), round(fit["scale"], 3), round(fit["alpha"], 3)
    (2.0, 3.0, 0.5)
    """
    fn = "growth_pays"
    _args.number(fn, "budget", budget, 0.0, lo_open=True)
    _args.number(fn, "target", target, 0.0)
    try:
        raw = np.asarray([(float(c), float(v)) for c, v in curve], float).reshape(-1, 2)
    except (TypeError, ValueError) as exc:
        raise WidthscopeError(f"{fn}: curve must be a list of (FLOPs, loss) pairs of numbers ({exc})") from None
    if not np.isfinite(raw).all() or (raw < 0).any():
        raise WidthscopeError(f"{fn}: curve must hold finite FLOPs and losses >= 0 (a diverged run cannot be fitted)")
    pts = raw[raw[:, 0] > 0]
    if len(pts) < 3:
        raise WidthscopeError(f"growth_pays: need at least 3 points with compute > 0, got {len(pts)}")
    c, y = pts[:, 0] / pts[:, 0].max(), pts[:, 1]  # compute in units of the last point

    def fit(alpha: float) -> tuple[float, float, float]:
        x = c**-alpha
        (E, A), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), y, rcond=None)
        fits = (
            [(float(E), float(A))]
            if E >= 0 and A >= 0
            else [(max(0.0, float(y.mean())), 0.0), (0.0, max(0.0, float(x @ y / (x @ x))))]
        )
        return min([(math.inf, 0.0, 0.0)] + [(float(((e + a * x - y) ** 2).sum()), e, a) for e, a in fits])

    grid = np.linspace(0.02, 3.0, 150)
    a0 = min(grid, key=lambda a: fit(float(a))[0])
    fine = np.linspace(max(0.005, a0 - 0.02), a0 + 0.02, 81)
    alpha = float(min(fine, key=lambda a: fit(float(a))[0]))
    _, E, A = fit(alpha)
    A *= float(pts[:, 0].max()) ** alpha
    at_budget = E + A * float(budget) ** -alpha
    reach = None if target <= E or A == 0 else (A / (target - E)) ** (1 / alpha)
    return {
        "decision": "grow" if at_budget > target else "continue",
        "floor": E,
        "scale": A,
        "alpha": alpha,
        "loss_at_budget": at_budget,
        "reach_flops": reach,
        "fitted_to": float(pts[:, 0].max()),
    }
