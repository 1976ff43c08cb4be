"""Unbiased and plug-in estimates of the moments the alignment certificate needs.

One population: ``‖μ‖²``, ``μᵀΣμ``, ``tr(Σ²)``; two independent populations: ``aᵀb``, ``bᵀΣ_a b``,
``aᵀΣ_b a``, ``tr(Σ_a Σ_b)``. Each from the Gram (dual, ``O(n²d)``) or from mergeable moments
(primal, :class:`PrimalMoments`, ``O(nd²)``); ``method="auto"`` picks the cheaper. Derivations:
docs/statistics.md §1–3.

Example::

    >>> import torch
    >>> from widthscope.stats import moments, cross_moments, PrimalMoments
    >>> X = torch.randn(200, 16, dtype=torch.float64) + 1.0
    >>> m = moments(X)                      # unbiased, method picked by cost
    >>> abs(m.mu_sq - moments(X, method="primal").mu_sq) < 1e-9
    True
    >>> pm = PrimalMoments(16).update(X[:100]).update(X[100:])   # update returns self
    >>> abs(pm.finalize().tr_sigma_sq - m.tr_sigma_sq) < 1e-9
    True
    >>> c = cross_moments(X[:100], X[100:])  # two-population estimates
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from .. import _args
from ..errors import WidthscopeError

__all__ = [
    "Moments",
    "CrossMoments",
    "PrimalMoments",
    "moments",
    "moments_from_gram",
    "gram_sums",
    "cross_moments",
    "cross_moments_from_gram",
    "as_matrix",
]

Estimator = Literal["unbiased", "plugin"]
Method = Literal["auto", "dual", "primal"]
_ESTIMATORS = ("unbiased", "plugin")
_METHODS = ("auto", "dual", "primal")
# Rows of the Gram formed at once in the dual form: bounds memory to _BLOCK * n floats.
_BLOCK = 2048


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Moments:
    """One-population estimates (python floats). ``tr_sigma`` is tr(Σ) (same in both estimators)."""

    n: int
    d: int
    mu_sq: float
    mu_sigma_mu: float
    tr_sigma_sq: float
    estimator: str
    method: str
    tr_sigma: float = float("nan")


@dataclass(frozen=True)
class CrossMoments:
    """Two-population estimates: ``ab`` = aᵀb (train mean · held-out mean) and the rest."""

    n_a: int
    n_b: int
    d: int
    ab: float
    b_sigma_a_b: float
    a_sigma_b_a: float
    tr_sigma_a_sigma_b: float
    estimator: str
    method: str


# ----------------------------------------------------------------------------- input checks
def as_matrix(X: Any, name: str = "X", *, d: int | None = None) -> torch.Tensor:
    """Validate ``X`` as a finite ``(n, d)`` array/tensor and return it as float64.

    Raises :class:`WidthscopeError` for the wrong rank, no rows or columns, a dimension
    different from ``d``, or NaN/Inf entries (naming the offending rows).
    """
    if isinstance(X, torch.Tensor):
        t = X.detach()
    else:
        try:
            arr = np.asarray(X)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise WidthscopeError(f"{name} must be an (n, d) array or tensor, got {type(X).__name__}") from exc
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise WidthscopeError(f"{name} must be a numeric (n, d) array, got dtype {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.is_complex():
        raise WidthscopeError(f"{name} must be real-valued, got dtype {t.dtype}")
    if t.dim() != 2:
        raise WidthscopeError(
            f"{name} must be a 2-D (n samples, d dims) matrix, got shape {tuple(t.shape)}; "
            "reshape with X.reshape(n, -1) or pass one row per sample"
        )
    n, dd = t.shape
    if n == 0 or dd == 0:
        raise WidthscopeError(
            f"{name} is empty (shape {tuple(t.shape)}): need at least one sample with at least one dimension"
        )
    if d is not None and dd != d:
        raise WidthscopeError(
            f"{name} has dimension d={dd} but {d} was expected; all samples must "
            "come from the same insertion point/pooling"
        )
    t = t.to(torch.float64)
    # A finite sum proves every entry finite (NaN/Inf propagate); only an overflowing or
    # non-finite sum needs the per-row check.
    if bool(torch.isfinite(t.sum())):
        return t
    finite = torch.isfinite(t).all(dim=1)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        raise WidthscopeError(
            f"{name} has NaN/Inf in {len(bad)} row(s): {shown}; drop or fix those "
            "samples (e.g. a diverged loss) before computing statistics"
        )
    return t


def _check_estimator(estimator: str) -> None:
    if estimator not in _ESTIMATORS:
        raise WidthscopeError(f"unknown estimator {estimator!r}; choose one of {', '.join(_ESTIMATORS)}")


def _check_method(method: str) -> None:
    if method not in _METHODS:
        raise WidthscopeError(f"unknown method {method!r}; choose one of {', '.join(_METHODS)}")


def _check_n(n: int, need: int = 4, name: str = "X") -> None:
    if n < need:
        raise WidthscopeError(f"need at least {need} samples, got n={n} in {name}; collect more examples")


def falling_factorial(n: int, k: int) -> float:
    out = 1.0
    for i in range(k):
        out *= n - i
    return out


# ----------------------------------------------------------------------------- sums -> estimates
def gram_sums(G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct-index sums ``(S, A, B, C)`` of a symmetric Gram ``G`` (shape ``(..., n, n)``).

    For users who already have a Gram (e.g. the block probe's product of Grams).
    """
    G = G.to(torch.float64)
    diag = G.diagonal(dim1=-2, dim2=-1)
    A = (G * G).sum((-2, -1)) - (diag * diag).sum(-1)
    r = G.sum(-1) - diag
    S = r.sum(-1)
    B = (r * r).sum(-1) - A
    C = S * S - 4 * B - 2 * A
    return S, A, B, C


def _unbiased_from_sums(n: int, S: float, A: float, B: float, C: float) -> tuple[float, float, float]:
    p2, p3, p4 = falling_factorial(n, 2), falling_factorial(n, 3), falling_factorial(n, 4)
    mu_sq = S / p2
    mu_sigma_mu = B / p3 - C / p4
    tr_sigma_sq = A / p2 - 2 * B / p3 + C / p4
    return mu_sq, mu_sigma_mu, tr_sigma_sq


def _cross_unbiased_from_sums(
    na: int, nb: int, T: float, Q: float, R: float, Rp: float
) -> tuple[float, float, float, float]:
    U = T * T - R - Rp + Q
    pa, pb = falling_factorial(na, 2), falling_factorial(nb, 2)
    row = (R - Q) / (na * pb)  # mean of C_ij C_ij'  (same train sample)
    col = (Rp - Q) / (pa * nb)  # mean of C_ij C_i'j  (same held-out sample)
    both = U / (pa * pb)  # mean of C_ij C_i'j'
    ab = T / (na * nb)
    return ab, row - both, col - both, Q / (na * nb) - row - col + both


def _f(x) -> float:
    return float(x)


# ----------------------------------------------------------------------------- primal accumulator
class PrimalMoments:
    """Mergeable moments ``n, Σx, Σxxᵀ, Σ‖x‖²x, Σ‖x‖², Σ‖x‖⁴`` (float64, ``O(d²)`` memory).

    Update with batches, merge shards with ``+`` (or :meth:`merge`), ship across processes
    as one flat tensor (:meth:`to_tensor` / :meth:`from_tensor`, sum with ``all_reduce``),
    then :meth:`finalize` into :class:`Moments`.

    Example::

        >>> pm = PrimalMoments(3)
        >>> _ = pm.update(torch.randn(10, 3)).update(torch.randn(5, 3))
        >>> pm.n
        15
        >>> PrimalMoments.from_tensor(pm.to_tensor(), 3).n
        15
    """

    def __init__(self, d: int, *, device: torch.device | str | None = None) -> None:
        if not isinstance(d, int) or d < 1:
            raise WidthscopeError(f"PrimalMoments needs a positive integer dimension d, got {d!r}")
        self.d = d
        kw: dict[str, Any] = dict(dtype=torch.float64, device=device)
        self.n = 0
        self.s = torch.zeros(d, **kw)  # Σx
        self.M = torch.zeros(d, d, **kw)  # Σxxᵀ
        self.v = torch.zeros(d, **kw)  # Σ‖x‖²x
        self.q2 = torch.zeros((), **kw)  # Σ‖x‖²
        self.q4 = torch.zeros((), **kw)  # Σ‖x‖⁴

    def update(self, X: Any) -> PrimalMoments:
        """Add the rows of ``X`` (``(b, d)``, any float dtype); returns ``self``."""
        return self._add(as_matrix(X, "X", d=self.d).to(self.s.device))

    def _add(self, X: torch.Tensor) -> PrimalMoments:
        # X already validated, float64, on this accumulator's device.
        sq = (X * X).sum(1)
        self.n += X.shape[0]
        self.s += X.sum(0)
        self.M += X.T @ X
        self.v += X.T @ sq
        self.q2 += sq.sum()
        self.q4 += (sq * sq).sum()
        return self

    def merge(self, other: PrimalMoments) -> PrimalMoments:
        """A new accumulator holding both (exact: every field is a sum)."""
        if not isinstance(other, PrimalMoments):
            raise WidthscopeError(f"can only merge PrimalMoments, got {type(other).__name__}")
        if other.d != self.d:
            raise WidthscopeError(f"cannot merge PrimalMoments of dimension {self.d} and {other.d}")
        out = PrimalMoments(self.d, device=self.s.device)
        out.n = self.n + other.n
        dev = self.s.device
        out.s = self.s + other.s.to(dev)
        out.M = self.M + other.M.to(dev)
        out.v = self.v + other.v.to(dev)
        out.q2 = self.q2 + other.q2.to(dev)
        out.q4 = self.q4 + other.q4.to(dev)
        return out

    __add__ = merge

    def to_tensor(self) -> torch.Tensor:
        """Flat float64 vector ``[n, q₂, q₄, s, v, vec(M)]`` of length ``3 + 2d + d²``."""
        n = torch.tensor([float(self.n)], dtype=torch.float64, device=self.s.device)
        return torch.cat([n, self.q2.reshape(1), self.q4.reshape(1), self.s, self.v, self.M.reshape(-1)])

    @classmethod
    def from_tensor(cls, t: torch.Tensor, d: int) -> PrimalMoments:
        """Inverse of :meth:`to_tensor` (e.g. after ``dist.all_reduce(t, SUM)``)."""
        t = torch.as_tensor(t)
        want = 3 + 2 * d + d * d
        if t.dim() != 1 or t.numel() != want:
            raise WidthscopeError(
                f"PrimalMoments.from_tensor: expected a flat vector of length "
                f"3 + 2d + d² = {want} for d={d}, got shape {tuple(t.shape)}"
            )
        t = t.to(torch.float64)
        n = float(t[0])
        if n < 0 or n != round(n):
            raise WidthscopeError(
                f"PrimalMoments.from_tensor: sample count {n} is not a non-negative "
                "integer; was the vector averaged instead of summed?"
            )
        out = cls(d, device=t.device)
        out.n = int(round(n))
        out.q2, out.q4 = t[1].clone(), t[2].clone()
        out.s = t[3 : 3 + d].clone()
        out.v = t[3 + d : 3 + 2 * d].clone()
        out.M = t[3 + 2 * d :].reshape(d, d).clone()
        return out

    def sums(self) -> tuple[float, float, float, float]:
        """The distinct-index Gram sums ``(S, A, B, C)`` without forming the Gram."""
        s, M = self.s, self.M
        S = s @ s - self.q2
        A = (M * M).sum() - self.q4
        r2 = s @ M @ s - 2 * (self.v @ s) + self.q4
        B = r2 - A
        C = S * S - 4 * B - 2 * A
        return _f(S), _f(A), _f(B), _f(C)

    def finalize(self, estimator: Estimator = "unbiased") -> Moments:
        """Estimates of ``‖μ‖², μᵀΣμ, tr(Σ²)`` from the accumulated moments."""
        _check_estimator(estimator)
        _check_n(self.n)
        n = self.n
        tr_sigma = _f((self.q2 - (self.s @ self.s) / n) / (n - 1))
        if estimator == "unbiased":
            S, A, B, C = self.sums()
            mu_sq, msm, trs = _unbiased_from_sums(n, S, A, B, C)
        else:
            mean = self.s / n
            cov = (self.M - n * torch.outer(mean, mean)) / (n - 1)
            mu_sq, msm, trs = _f(mean @ mean), _f(mean @ cov @ mean), _f((cov * cov).sum())
        return Moments(n, self.d, mu_sq, msm, trs, estimator, "primal", tr_sigma)

    def __repr__(self) -> str:
        return f"PrimalMoments(d={self.d}, n={self.n})"


# ----------------------------------------------------------------------------- one population
def _dual_moments(X: torch.Tensor, estimator: str) -> Moments:
    n, d = X.shape
    sq = (X * X).sum(1)
    tr_sigma = _f((sq.sum() - X.sum(0) @ X.sum(0) / n) / (n - 1))
    if estimator == "plugin":
        mean = X.mean(0)
        Xc = X - mean
        # x̄ᵀΣ̂x̄ = ‖Xc x̄‖²/(n−1),  tr(Σ̂²) = ‖Xc Xcᵀ‖_F²/(n−1)²
        fro_c = sum(_f(((Xc[i : i + _BLOCK] @ Xc.T) ** 2).sum()) for i in range(0, n, _BLOCK))
        proj = Xc @ mean
        return Moments(
            n, d, _f(mean @ mean), _f(proj @ proj) / (n - 1), fro_c / (n - 1) ** 2, estimator, "dual", tr_sigma
        )
    # Gram in row blocks: only ‖G‖_F² and the row sums are needed.
    fro = torch.zeros((), dtype=torch.float64, device=X.device)
    rows = torch.empty(n, dtype=torch.float64, device=X.device)
    for i in range(0, n, _BLOCK):
        Gb = X[i : i + _BLOCK] @ X.T
        fro += (Gb * Gb).sum()
        rows[i : i + _BLOCK] = Gb.sum(1)
    A = fro - (sq * sq).sum()
    r = rows - sq
    S = r.sum()
    B = r @ r - A
    C = S * S - 4 * B - 2 * A
    mu_sq, msm, trs = _unbiased_from_sums(n, _f(S), _f(A), _f(B), _f(C))
    return Moments(n, d, mu_sq, msm, trs, estimator, "dual", tr_sigma)


def moments(X: Any, estimator: Estimator = "unbiased", method: Method = "auto") -> Moments:
    """Estimate ``‖μ‖², μᵀΣμ, tr(Σ²)`` from the rows of ``X`` (``(n, d)``, ``n ≥ 4``).

    ``method="auto"`` uses the dual (Gram) form when ``n ≤ d`` (cost ``n²d`` ≤ ``nd²``) and the
    primal form otherwise; ``"dual"``/``"primal"`` force one. Accumulation is float64.

    Example::

        >>> m = moments(torch.randn(50, 8, dtype=torch.float64) + 0.5)
        >>> m.n, m.d, m.method
        (50, 8, 'primal')
    """
    _args.tensor("moments", "X", X, ndim=2, arrays=True, accepts="a 2-D (n samples, d dims) tensor or array")
    _args.choice("moments", "estimator", estimator, _ESTIMATORS)
    _args.choice("moments", "method", method, _METHODS)
    _check_estimator(estimator)
    _check_method(method)
    X = as_matrix(X, "X")
    n, d = X.shape
    _check_n(n)
    if method == "auto":
        method = "dual" if n <= d else "primal"
    if method == "dual":
        return _dual_moments(X, estimator)
    return PrimalMoments(d, device=X.device)._add(X).finalize(estimator)


def moments_from_gram(G: Any, estimator: Estimator = "unbiased") -> Moments:
    """Same estimates from a precomputed ``(n, n)`` Gram matrix ``G_ij = ⟨x_i, x_j⟩``.

    The inner product may be any one (e.g. the block probe's elementwise product of the
    gradient and hidden-activation Grams); ``d`` is reported as 0 (unknown).

    Example::

        >>> X = torch.randn(20, 5, dtype=torch.float64)
        >>> abs(moments_from_gram(X @ X.T).mu_sq - moments(X).mu_sq) < 1e-12
        True
    """
    _check_estimator(estimator)
    G = as_matrix(G, "G")
    n = G.shape[0]
    if G.shape[1] != n:
        raise WidthscopeError(f"G must be a square (n, n) Gram matrix, got shape {tuple(G.shape)}")
    _check_n(n, name="G")
    tr_sigma = _f((G.diagonal().sum() - G.sum() / n) / (n - 1))
    if estimator == "plugin":
        rows = G.sum(1)
        Gc = G - rows[:, None] / n - rows[None, :] / n + G.sum() / n**2
        hr = rows - rows.mean()
        return Moments(
            n,
            0,
            _f(G.sum()) / n**2,
            _f(hr @ hr) / ((n - 1) * n**2),
            _f((Gc * Gc).sum()) / (n - 1) ** 2,
            estimator,
            "dual",
            tr_sigma,
        )
    S, A, B, C = gram_sums(G)
    mu_sq, msm, trs = _unbiased_from_sums(n, _f(S), _f(A), _f(B), _f(C))
    return Moments(n, 0, mu_sq, msm, trs, estimator, "dual", tr_sigma)


# ----------------------------------------------------------------------------- two populations
def _cross_from_gram(C: torch.Tensor, d: int, estimator: str) -> CrossMoments:
    na, nb = C.shape
    if estimator == "plugin":
        m = C.mean()
        rm, cm = C.mean(1) - m, C.mean(0) - m  # (x_i − â)·b̂ and â·(y_j − b̂)
        Cc = C - C.mean(1, keepdim=True) - C.mean(0, keepdim=True) + m
        return CrossMoments(
            na,
            nb,
            d,
            _f(m),
            _f(rm @ rm) / (na - 1),
            _f(cm @ cm) / (nb - 1),
            _f((Cc * Cc).sum()) / ((na - 1) * (nb - 1)),
            estimator,
            "dual",
        )
    T, Q = C.sum(), (C * C).sum()
    R, Rp = (C.sum(1) ** 2).sum(), (C.sum(0) ** 2).sum()
    vals = _cross_unbiased_from_sums(na, nb, _f(T), _f(Q), _f(R), _f(Rp))
    return CrossMoments(na, nb, d, *vals, estimator, "dual")


def _cross_from_primal(pa: PrimalMoments, pb: PrimalMoments, estimator: str) -> CrossMoments:
    if pa.d != pb.d:
        raise WidthscopeError(
            f"train and test have different dimensions ({pa.d} vs {pb.d}); both "
            "must come from the same insertion point/pooling"
        )
    na, nb = pa.n, pb.n
    _check_n(na, 2, "train")
    _check_n(nb, 2, "test")
    sa, sb = pa.s, pb.s.to(pa.s.device)
    Ma, Mb = pa.M, pb.M.to(pa.s.device)
    if estimator == "plugin":
        a, b = sa / na, sb / nb
        Sa = (Ma - na * torch.outer(a, a)) / (na - 1)
        Sb = (Mb - nb * torch.outer(b, b)) / (nb - 1)
        return CrossMoments(
            na, nb, pa.d, _f(a @ b), _f(b @ Sa @ b), _f(a @ Sb @ a), _f((Sa * Sb).sum()), estimator, "primal"
        )
    vals = _cross_unbiased_from_sums(na, nb, _f(sa @ sb), _f((Ma * Mb).sum()), _f(sb @ Ma @ sb), _f(sa @ Mb @ sa))
    return CrossMoments(na, nb, pa.d, *vals, estimator, "primal")


def cross_moments(Xa: Any, Xb: Any, estimator: Estimator = "unbiased", method: Method = "auto") -> CrossMoments:
    """Two-population estimates from train rows ``Xa`` and independent held-out rows ``Xb``.

    Either argument pair may also be two :class:`PrimalMoments` (merged shards). ``"auto"``
    uses the cross-Gram when ``n_a n_b d ≤ (n_a + n_b) d²``, else the primal moments.
    Needs ``n_a, n_b ≥ 2``.

    Example::

        >>> Xa = torch.randn(30, 4, dtype=torch.float64) + 1
        >>> Xb = torch.randn(40, 4, dtype=torch.float64) + 1
        >>> c = cross_moments(Xa, Xb)
        >>> abs(c.ab - cross_moments(Xa, Xb, method="primal").ab) < 1e-12
        True
    """
    _check_estimator(estimator)
    _check_method(method)
    if isinstance(Xa, PrimalMoments) or isinstance(Xb, PrimalMoments):
        if not (isinstance(Xa, PrimalMoments) and isinstance(Xb, PrimalMoments)):
            raise WidthscopeError("cross_moments: pass either two sample matrices or two PrimalMoments")
        if method == "dual":
            raise WidthscopeError("cross_moments: method='dual' needs the samples, not PrimalMoments")
        return _cross_from_primal(Xa, Xb, estimator)
    A = as_matrix(Xa, "train")
    B = as_matrix(Xb, "test")
    if A.shape[1] != B.shape[1]:
        raise WidthscopeError(
            f"train has dimension d={A.shape[1]} but test has d={B.shape[1]}; both "
            "must come from the same insertion point/pooling"
        )
    na, d = A.shape
    nb = B.shape[0]
    _check_n(na, 2, "train")
    _check_n(nb, 2, "test")
    B = B.to(A.device)
    if method == "auto":
        method = "dual" if na * nb <= (na + nb) * d else "primal"
    if method == "dual":
        return _cross_from_gram(A @ B.T, d, estimator)
    pa = PrimalMoments(d, device=A.device)._add(A)
    pb = PrimalMoments(d, device=A.device)._add(B)
    return _cross_from_primal(pa, pb, estimator)


def cross_moments_from_gram(C_ab: Any, estimator: Estimator = "unbiased") -> CrossMoments:
    """Two-population estimates from a precomputed cross-Gram ``C_ab[i, j] = ⟨x_i, y_j⟩``.

    Example::

        >>> Xa, Xb = torch.randn(6, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
        >>> abs(cross_moments_from_gram(Xa @ Xb.T).ab - cross_moments(Xa, Xb).ab) < 1e-12
        True
    """
    _check_estimator(estimator)
    C = as_matrix(C_ab, "C_ab")
    _check_n(C.shape[0], 2, "C_ab rows (train)")
    _check_n(C.shape[1], 2, "C_ab columns (test)")
    return _cross_from_gram(C, 0, estimator)
