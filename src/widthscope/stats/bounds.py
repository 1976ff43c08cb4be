"""The alignment certificate and the sample-size planner.

For ``A = μ_Mᵀ g_K``: ``Var(A) = p/M + q/K + t/(MK)``, Cantelli's ``B_exact = Var/(Var + E[A]²)``,
``d_align = min(d_par, d_2)`` and ``B_align = 1/(1 + n_eff d_align)``; a certificate with an estimate
``≤ 0`` is vacuous (bounds 1, reason named). Maths and the vacuous rule: docs/statistics.md §4–5.

Example::

    >>> import torch
    >>> from widthscope.stats import certificate, moments, plan
    >>> X = torch.randn(400, 32, dtype=torch.float64) + 0.3
    >>> c = certificate(X, M=16, K=16)
    >>> c.b_exact <= c.b_align
    True
    >>> m = moments(X)                                  # compute once ...
    >>> grid = [certificate(m, M=k, K=k) for k in (16, 32, 64, 128)]   # ... certify a grid
    >>> p = plan(m, target=0.05)
    >>> certificate(m, M=p.equal_exact, K=p.equal_exact).b_exact <= 0.05
    True
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Literal

from .. import _args
from ..errors import WidthscopeError
from ..options import ESTIMATORS, Estimator
from .estimators import METHODS, CrossMoments, Method, Moments, PrimalMoments, cross_moments, moments, sample_size

Populations = Literal["auto", "one", "two"]
POPULATIONS = ("auto", "one", "two")


@dataclass(frozen=True)
class Certificate:
    """Certificate for one ``(M, K)``; ``e_dir_train`` / ``e_dir_test`` / ``e_cov`` are the raw
    estimates ``p = bᵀΣ_a b``, ``q = aᵀΣ_b a``, ``t = tr(Σ_aΣ_b)`` (one population: ``μᵀΣμ, μᵀΣμ, tr(Σ²)``)."""

    expectation: float
    variance: float
    d_par: float
    d_2: float
    d_align: float
    n_eff: float
    b_exact: float
    b_align: float
    vacuous: bool
    reason: str | None
    populations: str
    estimator: str
    M: int
    K: int
    e_dir_train: float
    e_dir_test: float
    e_cov: float
    n_train: int
    n_test: int


def resolve_moments(
    train: Any,
    test: Any = None,
    *,
    estimator: Estimator = "unbiased",
    populations: Populations = "auto",
    method: Method = "auto",
) -> Moments | CrossMoments:
    """The (cross) moments of :func:`certificate`'s inputs; ``"auto"``: two populations when held-out data is given."""
    if populations not in POPULATIONS:
        raise WidthscopeError(f"unknown populations {populations!r}; choose auto, one or two")
    if isinstance(train, (Moments, CrossMoments)):
        if test is not None:
            raise WidthscopeError(
                "pass test=None when train is precomputed Moments/CrossMoments "
                "(compute cross_moments(train, test) for the two-population form)"
            )
        kind = "one" if isinstance(train, Moments) else "two"
        if populations not in ("auto", kind):
            raise WidthscopeError(
                f"populations={populations!r} but a precomputed {type(train).__name__} gives the "
                f"{kind}-population form; pass "
                f"{'cross_moments(train, test)' if kind == 'one' else 'moments(train)'} instead"
            )
        return train
    if populations == "auto":
        populations = "two" if test is not None else "one"
    if populations == "two":
        if test is None:
            raise WidthscopeError("populations='two' needs held-out samples: pass test=(n, d) samples")
        return cross_moments(train, test, estimator, method)
    if isinstance(train, PrimalMoments):
        return train.finalize(estimator)
    return moments(train, estimator, method)


_TRAIN = "a 2-D (n, d) tensor or array of samples, PrimalMoments, Moments or CrossMoments"
_TEST = "a 2-D (n, d) tensor or array of held-out samples, PrimalMoments or None"


def _check_inputs(fn: str, train: Any, test: Any, estimator: Any, populations: Any, method: Any) -> None:
    """The types :func:`certificate` and :func:`plan` take, before any moment is computed."""
    if not isinstance(train, (Moments, CrossMoments, PrimalMoments)):
        _args.tensor(fn, "train", train, ndim=2, arrays=True, accepts=_TRAIN)
    if not isinstance(test, PrimalMoments):
        _args.tensor(fn, "test", test, ndim=2, arrays=True, optional=True, accepts=_TEST)
    _args.choice(fn, "estimator", estimator, ESTIMATORS)
    _args.choice(fn, "populations", populations, POPULATIONS)
    _args.choice(fn, "method", method, METHODS)


_NAMES = {"one": ("‖μ‖²", "μᵀΣμ", "μᵀΣμ", "tr(Σ²)"), "two": ("aᵀb", "bᵀΣ_a b", "aᵀΣ_b a", "tr(Σ_aΣ_b)")}


def _terms(m: Moments | CrossMoments) -> tuple[float, float, float, float, str, int, int]:
    """(E, p, q, t, populations, n_train, n_test); :data:`_NAMES` names E, p, q, t in messages."""
    if isinstance(m, Moments):
        return m.mu_sq, m.mu_sigma_mu, m.mu_sigma_mu, m.tr_sigma_sq, "one", m.n, m.n
    return m.ab, m.b_sigma_a_b, m.a_sigma_b_a, m.tr_sigma_a_sigma_b, "two", m.n_a, m.n_b


def _vacuous_reason(E: float, p: float, q: float, t: float, pop: str) -> str | None:
    bad = [f"{nm} = {v:.3g} ≤ 0" for nm, v in zip(_NAMES[pop], (E, p, q, t)) if not v > 0]
    if not bad:
        return None
    return (  # dict.fromkeys: one population lists μᵀΣμ once
        "estimate " + ", ".join(dict.fromkeys(bad)) + "; the certificate needs a positive mean alignment "
        "and positive variance terms (collect more samples or check the insertion point)"
    )


def _variance(p: float, q: float, t: float, M: int, K: int) -> float:
    return p / M + q / K + t / (M * K)


def _b_exact(E: float, V: float) -> float:
    return V / (V + E * E)


def certificate(
    train: Any,
    test: Any = None,
    *,
    M: int,
    K: int,
    estimator: Estimator = "unbiased",
    populations: Populations = "auto",
    method: Method = "auto",
) -> Certificate:
    """Alignment certificate for ``M`` train and ``K`` held-out samples.

    ``train``/``test``: ``(n, d)`` sample matrices, :class:`PrimalMoments`, or (``train`` only)
    precomputed :class:`Moments` / :class:`CrossMoments`, which keep their own estimator.

    Example::

        >>> import torch
        >>> Xa = torch.randn(300, 16, dtype=torch.float64) + 0.4
        >>> Xb = torch.randn(300, 16, dtype=torch.float64) + 0.4
        >>> c = certificate(Xa, Xb, M=32, K=32)
        >>> c.populations, c.vacuous
        ('two', False)
    """
    _check_inputs("certificate", train, test, estimator, populations, method)
    M = sample_size("certificate", "M", M)
    K = sample_size("certificate", "K", K)
    m = resolve_moments(train, test, estimator=estimator, populations=populations, method=method)
    E, p, q, t, pop, n_tr, n_te = _terms(m)
    if not all(math.isfinite(x) for x in (E, p, q, t)):
        raise WidthscopeError(
            f"moment estimates are not finite ({', '.join(_NAMES[pop])} = "
            f"{E}, {p}, {q}, {t}); the sample vectors overflow float64, rescale them"
        )
    n_eff = M * K / (M + K + 1)
    V = _variance(p, q, t, M, K)
    reason = _vacuous_reason(E, p, q, t, pop)
    d_par = d_2 = d_align = 0.0
    b_exact = b_align = 1.0
    E2 = E * E
    if E > 0 and E2 > 0 and math.isfinite(E2):
        # each effective dimension is reported when its own estimates are positive
        dims = [E2 / max(p, q) if p > 0 and q > 0 else math.nan, E2 / t if t > 0 else math.nan]
        d_par, d_2 = (d if math.isfinite(d) else 0.0 for d in dims)
        d_align = min((d for d in dims if math.isfinite(d)), default=0.0)
    if reason is None:
        # The bounds need every term: Var(A) from a negative estimate would understate it.
        b_exact = _b_exact(E, V)
        b_align = 1.0 / (1.0 + n_eff * d_align)
        if not all(math.isfinite(x) for x in (E2, V, d_par, d_2, b_exact, b_align)) or E2 == 0.0:
            reason = "numerical over/underflow in E[A]²/Var(A); rescale the sample vectors"
            d_par = d_2 = d_align = 0.0
            b_exact = b_align = 1.0
    if not math.isfinite(V):  # p/M + q/K + t/(MK) overflowed: keep the field finite
        V = sys.float_info.max
    bounds = (E, V, d_par, d_2, d_align, n_eff, b_exact, b_align, bool(reason), reason)
    return Certificate(*bounds, pop, m.estimator, M, K, p, q, t, n_tr, n_te)


def _float(v: Any) -> float:
    """``v`` as a float; NaN for a bool or a non-number."""
    try:
        return math.nan if isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return math.nan


def _positive(v: Any) -> float | None:
    f = _float(v)
    return f if math.isfinite(f) and f > 0 else None


def vacuous_rule(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Apply the reporting rule for vacuous certificates to the ``{prefix}d_par`` / ``d_2`` /
    ``d_align`` / ``vacuous`` / ``limit`` columns present in ``fields`` (in place, idempotent): the
    terms are ``None`` unless positive, ``d_align`` also when vacuous or a term is ``None``.

    Example::

        >>> vacuous_rule({"d_par": 0.0, "d_2": 1.2, "d_align": 1.2, "vacuous": True})
        {'d_par': None, 'd_2': 1.2, 'd_align': None, 'vacuous': True}
    """
    terms = {}
    for t in ("d_par", "d_2"):  # a column that is absent stays absent (and voids nothing)
        if prefix + t in fields:
            terms[t] = fields[prefix + t] = _positive(fields[prefix + t])
    if prefix + "d_align" in fields:
        align = _positive(fields[prefix + "d_align"])
        if bool(fields.get(prefix + "vacuous")) or any(v is None for v in terms.values()):
            align = None
        fields[prefix + "d_align"] = align
        if prefix + "limit" in fields:
            par, two = terms.get("d_par"), terms.get("d_2")
            fields[prefix + "limit"] = (
                None if align is None or par is None or two is None else ("d_par" if par <= two else "d_2")
            )
    return fields


@dataclass(frozen=True)
class Plan:
    """Smallest sample sizes meeting ``target`` (``None`` when unreachable; see ``notes``): ``M`` at
    the given ``K`` (``exact_M``, ``align_M``; ``*_limit``: the bound as ``M → ∞``), and ``M = K``."""

    target: float
    K: int | None
    exact_M: int | None
    align_M: int | None
    exact_limit: float | None
    align_limit: float | None
    equal_exact: int | None
    equal_align: int | None
    populations: str
    estimator: str
    d_align: float
    vacuous: bool
    notes: str


_SEARCH_LIMIT = 1 << 62


def _smallest(ok) -> int | None:
    """Smallest integer m ≥ 1 with ok(m), for monotone ok; ``None`` beyond 2^62."""
    lo_bad, hi = 0, 1
    while not ok(hi):
        lo_bad, hi = hi, hi * 2
        if hi > _SEARCH_LIMIT:
            return None
    while hi - lo_bad > 1:
        mid = (lo_bad + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo_bad = mid
    return hi


def plan(
    train: Any,
    test: Any = None,
    *,
    target: float,
    K: int | None = None,
    estimator: Estimator = "unbiased",
    populations: Populations = "auto",
    method: Method = "auto",
) -> Plan:
    """Smallest ``M`` (at a fixed ``K``, and with ``M = K``) so that each bound is ≤ ``target``,
    searched on the certificate's own formulas. Inputs as for :func:`certificate`.

    Example::

        >>> import torch
        >>> X = torch.randn(500, 20, dtype=torch.float64) + 0.3
        >>> p = plan(X, target=0.1, K=64)
        >>> p.exact_M is None or certificate(X, M=p.exact_M, K=64).b_exact <= 0.1
        True
    """
    _check_inputs("plan", train, test, estimator, populations, method)
    checked = _args.number(
        "plan", "target", target, 0.0, 1.0, lo_open=True, hi_open=True, accepts="a probability in (0, 1)"
    )
    assert checked is not None  # not optional
    target = checked
    K = _args.integer("plan", "K", K, lo=1, optional=True, accepts="a positive integer sample size or None")
    m = resolve_moments(train, test, estimator=estimator, populations=populations, method=method)
    E, p, q, t, pop, _, _ = _terms(m)
    probe = certificate(m, M=1, K=1)
    if probe.vacuous:
        why = f"certificate is vacuous ({probe.reason}); no sample size reaches the target"
        return Plan(target, K, None, None, None, None, None, None, pop, m.estimator, 0.0, True, why)
    d_align = probe.d_align

    def exact_ok(Mv: int, Kv: int) -> bool:
        return _b_exact(E, _variance(p, q, t, Mv, Kv)) <= target

    def align_ok(Mv: int, Kv: int) -> bool:
        return 1.0 / (1.0 + (Mv * Kv / (Mv + Kv + 1)) * d_align) <= target

    notes: list[str] = []
    equal_exact = _smallest(lambda k: exact_ok(k, k))
    equal_align = _smallest(lambda k: align_ok(k, k))
    for name, v in (("B_exact", equal_exact), ("B_align", equal_align)):
        if v is None:
            notes.append(
                f"{name} needs M = K above {_SEARCH_LIMIT:.3g} to reach {target:g} "
                "(too little signal for this target); relax the target"
            )
    exact_M = align_M = exact_limit = align_limit = None
    if K is not None:
        exact_limit = (q / K) / (q / K + E * E)
        align_limit = 1.0 / (1.0 + K * d_align)
        exact_M = _smallest(lambda k: exact_ok(k, K))
        align_M = _smallest(lambda k: align_ok(k, K))
        if exact_M is None:
            notes.append(
                f"B_exact cannot reach {target:g} at K={K}: even as M→∞ it stays at "
                f"{exact_limit:.4g} (held-out noise aᵀΣ_b a/K); increase K"
            )
        if align_M is None:
            notes.append(
                f"B_align cannot reach {target:g} at K={K}: as M→∞ it tends to "
                f"{align_limit:.4g} = 1/(1+K·d_align); increase K"
            )
    found = (exact_M, align_M, exact_limit, align_limit, equal_exact, equal_align)
    return Plan(target, K, *found, pop, m.estimator, d_align, False, "; ".join(notes))


def certified(b_exact: Any, vacuous: Any, delta: Any) -> bool:
    """Certified at ``delta``: not vacuous and a finite ``B_exact ≤ delta``."""
    b, d = _float(b_exact), _float(delta)
    return not vacuous and math.isfinite(b) and math.isfinite(d) and b <= d


def certified_steps(flags: Any) -> tuple[int | None, int | None]:
    """``(first, since)`` over ``(step, certified)`` pairs: the first certified step, and the step
    from which every later one is certified (None: no such step).

    Example::

        >>> certified_steps([(0, True), (5, False), (9, True)])
        (0, 9)
    """
    first = since = None
    for step, ok in sorted(flags, key=lambda f: int(f[0])):
        if ok and first is None:
            first = int(step)
        since = (int(step) if since is None else since) if ok else None
    return first, since
