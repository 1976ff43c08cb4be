"""Unbiased and plug-in estimates of the moments the alignment certificate needs.

One population: ``‖μ‖²``, ``μᵀΣμ``, ``tr(Σ²)``; two: ``aᵀb``, ``bᵀΣ_a b``, ``aᵀΣ_b a``, ``tr(Σ_a Σ_b)``;
from the Gram (dual) or from mergeable moments (primal). Derivations: docs/statistics.md §1–3.

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
from ..options import ESTIMATORS, Estimator

Method = Literal["auto", "dual", "primal"]
METHODS = ("auto", "dual", "primal")
# Rows of the Gram formed at once in the dual form: bounds memory to _BLOCK * n floats.
_BLOCK = 2048


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


def as_matrix(X: Any, name: str = "X", *, d: int | None = None) -> torch.Tensor:
    """``X`` checked to be a finite, non-empty ``(n, d)`` array/tensor, as float64."""
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
    # A finite sum proves every entry finite; only a non-finite sum needs the per-row check.
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


def as_pair(train: Any, test: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and held-out samples as float64 matrices of the same dimension, both on train's device."""
    A, B = as_matrix(train, "train"), as_matrix(test, "test")
    _same_d(A.shape[1], B.shape[1])
    return A, B.to(A.device)


def sample_size(fn: str, name: str, v: Any) -> int:
    """A sample size ``name`` of ``fn`` (``M``, ``K``): a positive integer."""
    n = _args.integer(fn, name, v, lo=1, accepts="a positive integer sample size")
    assert n is not None  # not optional
    return n


def _same_d(da: int, db: int) -> None:
    if da != db:
        raise WidthscopeError(
            f"train has dimension d={da} but test has d={db}; both must come from the same insertion point/pooling"
        )


def _check(fn: str, estimator: Any, method: Any = "auto") -> None:
    _args.choice(fn, "estimator", estimator, ESTIMATORS)
    _args.choice(fn, "method", method, METHODS)


def _check_n(n: int, need: int = 4, name: str = "X") -> None:
    if n < need:
        raise WidthscopeError(f"need at least {need} samples, got n={n} in {name}; collect more examples")


def sums_from_rows(fro: Any, rows: Any, sq: Any) -> tuple[Any, Any, Any, Any]:
    """Distinct-index sums ``(S, A, B, C)`` from ``‖G‖_F²``, the row sums of ``G`` and its diagonal."""
    A = fro - (sq * sq).sum(-1)
    r = rows - sq
    S = r.sum(-1)
    B = (r * r).sum(-1) - A
    return S, A, B, S * S - 4 * B - 2 * A


def gram_sums(G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct-index sums ``(S, A, B, C)`` of a symmetric Gram ``G`` (shape ``(..., n, n)``)."""
    G = G.to(torch.float64)
    return sums_from_rows((G * G).sum((-2, -1)), G.sum(-1), G.diagonal(dim1=-2, dim2=-1))


def unbiased_from_sums(n: int, S: Any, A: Any, B: Any, C: Any) -> tuple[float, float, float]:
    """Unbiased ``(‖μ‖², μᵀΣμ, tr(Σ²))`` from the distinct-index Gram sums of ``n`` samples."""
    S, A, B, C = float(S), float(A), float(B), float(C)
    p2, p3 = n * (n - 1.0), n * (n - 1.0) * (n - 2.0)
    p4 = p3 * (n - 3.0)
    return S / p2, B / p3 - C / p4, A / p2 - 2 * B / p3 + C / p4


def _cross_unbiased(na: int, nb: int, T: Any, Q: Any, R: Any, Rp: Any) -> tuple[float, float, float, float]:
    T, Q, R, Rp = float(T), float(Q), float(R), float(Rp)
    U = T * T - R - Rp + Q
    pa, pb = na * (na - 1.0), nb * (nb - 1.0)
    row = (R - Q) / (na * pb)  # mean of C_ij C_ij'  (same train sample)
    col = (Rp - Q) / (pa * nb)  # mean of C_ij C_i'j  (same held-out sample)
    both = U / (pa * pb)  # mean of C_ij C_i'j'
    return T / (na * nb), row - both, col - both, Q / (na * nb) - row - col + both


class PrimalMoments:
    """Mergeable moments ``n, Σx, Σxxᵀ, Σ‖x‖²x, Σ‖x‖², Σ‖x‖⁴`` (float64); merge with ``+``.

    Example::

        >>> pm = PrimalMoments(3)
        >>> _ = pm.update(torch.randn(10, 3)).update(torch.randn(5, 3))
        >>> pm.n
        15
        >>> PrimalMoments.from_tensor(pm.to_tensor(), 3).n
        15
    """

    _SUMS = ("q2", "q4", "s", "v", "M")  # the summed fields, in the order of to_tensor (after n)

    def __init__(self, d: int, *, device: torch.device | str | None = None) -> None:
        _args.integer("PrimalMoments", "d", d, lo=1)
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
        for f in self._SUMS:
            setattr(out, f, getattr(self, f) + getattr(other, f).to(self.s.device))
        return out

    __add__ = merge

    def to_tensor(self) -> torch.Tensor:
        """Flat float64 vector ``[n, q₂, q₄, s, v, vec(M)]`` of length ``3 + 2d + d²``."""
        n = torch.tensor([float(self.n)], dtype=torch.float64, device=self.s.device)
        return torch.cat([n, *(getattr(self, f).reshape(-1) for f in self._SUMS)])

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
        for f, part in zip(cls._SUMS, t[1:].split([1, 1, d, d, d * d])):
            setattr(out, f, part.reshape(getattr(out, f).shape).clone())
        return out

    def sums(self) -> tuple[float, float, float, float]:
        """The distinct-index Gram sums ``(S, A, B, C)`` without forming the Gram."""
        s, M = self.s, self.M
        S = s @ s - self.q2
        A = (M * M).sum() - self.q4
        B = s @ M @ s - 2 * (self.v @ s) + self.q4 - A
        return float(S), float(A), float(B), float(S * S - 4 * B - 2 * A)

    def finalize(self, estimator: Estimator = "unbiased") -> Moments:
        """Estimates of ``‖μ‖², μᵀΣμ, tr(Σ²)`` from the accumulated moments."""
        _check("PrimalMoments.finalize", estimator)
        _check_n(self.n)
        n = self.n
        tr_sigma = float((self.q2 - (self.s @ self.s) / n) / (n - 1))
        if estimator == "unbiased":
            vals = unbiased_from_sums(n, *self.sums())
        else:
            mean = self.s / n
            cov = (self.M - n * torch.outer(mean, mean)) / (n - 1)
            vals = float(mean @ mean), float(mean @ cov @ mean), float((cov * cov).sum())
        return Moments(n, self.d, *vals, estimator, "primal", tr_sigma)

    def __repr__(self) -> str:
        return f"PrimalMoments(d={self.d}, n={self.n})"


def _dual_moments(X: torch.Tensor, estimator: str) -> Moments:
    n, d = X.shape
    sq = (X * X).sum(1)
    tr_sigma = float((sq.sum() - X.sum(0) @ X.sum(0) / n) / (n - 1))
    if estimator == "plugin":
        mean = X.mean(0)
        Xc = X - mean
        # x̄ᵀΣ̂x̄ = ‖Xc x̄‖²/(n−1),  tr(Σ̂²) = ‖Xc Xcᵀ‖_F²/(n−1)²
        fro_c = sum(float(((Xc[i : i + _BLOCK] @ Xc.T) ** 2).sum()) for i in range(0, n, _BLOCK))
        proj = Xc @ mean
        vals = float(mean @ mean), float(proj @ proj) / (n - 1), fro_c / (n - 1) ** 2
        return Moments(n, d, *vals, estimator, "dual", tr_sigma)
    # Gram in row blocks: only ‖G‖_F² and the row sums are needed.
    fro = torch.zeros((), dtype=torch.float64, device=X.device)
    rows = torch.empty(n, dtype=torch.float64, device=X.device)
    for i in range(0, n, _BLOCK):
        Gb = X[i : i + _BLOCK] @ X.T
        fro += (Gb * Gb).sum()
        rows[i : i + _BLOCK] = Gb.sum(1)
    return Moments(n, d, *unbiased_from_sums(n, *sums_from_rows(fro, rows, sq)), estimator, "dual", tr_sigma)


def moments(X: Any, estimator: Estimator = "unbiased", method: Method = "auto") -> Moments:
    """Estimate ``‖μ‖², μᵀΣμ, tr(Σ²)`` from the rows of ``X`` (``n ≥ 4``); ``method="auto"`` takes the
    dual (Gram) form when ``n ≤ d``.

    Example::

        >>> m = moments(torch.randn(50, 8, dtype=torch.float64) + 0.5)
        >>> m.n, m.d, m.method
        (50, 8, 'primal')
    """
    _args.tensor("moments", "X", X, ndim=2, arrays=True, accepts="a 2-D (n samples, d dims) tensor or array")
    _check("moments", estimator, method)
    X = as_matrix(X, "X")
    n, d = X.shape
    _check_n(n)
    if method == "dual" or (method == "auto" and n <= d):
        return _dual_moments(X, estimator)
    return PrimalMoments(d, device=X.device)._add(X).finalize(estimator)


def moments_from_gram(G: Any, estimator: Estimator = "unbiased") -> Moments:
    """Same estimates from a precomputed ``(n, n)`` Gram ``G_ij = ⟨x_i, x_j⟩`` (``d`` reported as 0).

    Example::

        >>> X = torch.randn(20, 5, dtype=torch.float64)
        >>> abs(moments_from_gram(X @ X.T).mu_sq - moments(X).mu_sq) < 1e-12
        True
    """
    _check("moments_from_gram", estimator)
    G = as_matrix(G, "G")
    n = G.shape[0]
    if G.shape[1] != n:
        raise WidthscopeError(f"G must be a square (n, n) Gram matrix, got shape {tuple(G.shape)}")
    _check_n(n, name="G")
    tr_sigma = float((G.diagonal().sum() - G.sum() / n) / (n - 1))
    if estimator == "plugin":
        rows = G.sum(1)
        Gc = G - rows[:, None] / n - rows[None, :] / n + G.sum() / n**2
        hr = rows - rows.mean()
        vals = float(G.sum()) / n**2, float(hr @ hr) / ((n - 1) * n**2), float((Gc * Gc).sum()) / (n - 1) ** 2
    else:
        vals = unbiased_from_sums(n, *gram_sums(G))
    return Moments(n, 0, *vals, estimator, "dual", tr_sigma)


def _cross_from_gram(C: torch.Tensor, d: int, estimator: str) -> CrossMoments:
    na, nb = C.shape
    if estimator == "plugin":
        m = C.mean()
        rm, cm = C.mean(1) - m, C.mean(0) - m  # (x_i − â)·b̂ and â·(y_j − b̂)
        Cc = C - C.mean(1, keepdim=True) - C.mean(0, keepdim=True) + m
        vals = (
            float(m),
            float(rm @ rm) / (na - 1),
            float(cm @ cm) / (nb - 1),
            float((Cc * Cc).sum()) / ((na - 1) * (nb - 1)),
        )
    else:
        vals = _cross_unbiased(na, nb, C.sum(), (C * C).sum(), (C.sum(1) ** 2).sum(), (C.sum(0) ** 2).sum())
    return CrossMoments(na, nb, d, *vals, estimator, "dual")


def _cross_from_primal(pa: PrimalMoments, pb: PrimalMoments, estimator: str) -> CrossMoments:
    _same_d(pa.d, pb.d)
    na, nb = pa.n, pb.n
    _check_n(na, 2, "train")
    _check_n(nb, 2, "test")
    sa, sb = pa.s, pb.s.to(pa.s.device)
    Ma, Mb = pa.M, pb.M.to(pa.s.device)
    if estimator == "plugin":
        a, b = sa / na, sb / nb
        Sa = (Ma - na * torch.outer(a, a)) / (na - 1)
        Sb = (Mb - nb * torch.outer(b, b)) / (nb - 1)
        vals = float(a @ b), float(b @ Sa @ b), float(a @ Sb @ a), float((Sa * Sb).sum())
    else:
        vals = _cross_unbiased(na, nb, sa @ sb, (Ma * Mb).sum(), sb @ Ma @ sb, sa @ Mb @ sa)
    return CrossMoments(na, nb, pa.d, *vals, estimator, "primal")


def cross_moments(Xa: Any, Xb: Any, estimator: Estimator = "unbiased", method: Method = "auto") -> CrossMoments:
    """Two-population estimates from train rows ``Xa`` and independent held-out rows ``Xb`` (or two
    :class:`PrimalMoments`); ``"auto"`` uses the cross-Gram when ``n_a n_b ≤ (n_a + n_b) d``.

    Example::

        >>> Xa = torch.randn(30, 4, dtype=torch.float64) + 1
        >>> Xb = torch.randn(40, 4, dtype=torch.float64) + 1
        >>> c = cross_moments(Xa, Xb)
        >>> abs(c.ab - cross_moments(Xa, Xb, method="primal").ab) < 1e-12
        True
    """
    _check("cross_moments", estimator, method)
    if isinstance(Xa, PrimalMoments) or isinstance(Xb, PrimalMoments):
        if not (isinstance(Xa, PrimalMoments) and isinstance(Xb, PrimalMoments)):
            raise WidthscopeError("cross_moments: pass either two sample matrices or two PrimalMoments")
        if method == "dual":
            raise WidthscopeError("cross_moments: method='dual' needs the samples, not PrimalMoments")
        return _cross_from_primal(Xa, Xb, estimator)
    A, B = as_pair(Xa, Xb)
    (na, d), nb = A.shape, B.shape[0]
    _check_n(na, 2, "train")
    _check_n(nb, 2, "test")
    if method == "dual" or (method == "auto" and na * nb <= (na + nb) * d):
        return _cross_from_gram(A @ B.T, d, estimator)
    pa = PrimalMoments(d, device=A.device)._add(A)
    return _cross_from_primal(pa, PrimalMoments(d, device=A.device)._add(B), estimator)


def cross_moments_from_gram(C_ab: Any, estimator: Estimator = "unbiased") -> CrossMoments:
    """Two-population estimates from a precomputed cross-Gram ``C_ab[i, j] = ⟨x_i, y_j⟩``.

    Example::

        >>> Xa, Xb = torch.randn(6, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
        >>> abs(cross_moments_from_gram(Xa @ Xb.T).ab - cross_moments(Xa, Xb).ab) < 1e-12
        True
    """
    _check("cross_moments_from_gram", estimator)
    C = as_matrix(C_ab, "C_ab")
    _check_n(C.shape[0], 2, "C_ab rows (train)")
    _check_n(C.shape[1], 2, "C_ab columns (test)")
    return _cross_from_gram(C, 0, estimator)
