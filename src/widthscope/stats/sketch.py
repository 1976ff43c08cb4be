"""Memory-bound statistics: a seeded random projection ``y = Rᵀx`` of the sample vectors as they stream.

``μᵀΣμ`` and ``tr(Σ²)`` are corrected to be unbiased over ``R`` and the samples. Maths: docs/performance.md §2.

Example::

    >>> import torch
    >>> from widthscope.stats.sketch import Projector, projected_moments
    >>> X = torch.randn(200, 1000, dtype=torch.float64) + 0.1
    >>> P = Projector(1000, 64, seed=0)
    >>> P(X).shape
    torch.Size([200, 64])
    >>> pm = projected_moments(X, k=64, seed=0)
    >>> pm.k, pm.n
    (64, 200)
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from .. import _args
from ..errors import WidthscopeError
from .estimators import CrossMoments, Moments, PrimalMoments, as_matrix, sums_from_rows, unbiased_from_sums

KINDS = ("gaussian", "sparse")
_ROWS = 4096  # rows of R generated at once (bounded memory for the generator's temporaries)


class Projector:
    """Seeded random projection ``P(X) = X @ R``; ``R`` (``d×k``) is generated on the CPU from ``seed``.

    Example::

        >>> import torch
        >>> P = Projector(10, 4, seed=1)
        >>> X = torch.randn(6, 10, dtype=torch.float64)
        >>> bool(torch.allclose(torch.cat([P(X[:2]), P(X[2:])]), P(X), rtol=1e-12, atol=1e-12))
        True
    """

    def __init__(
        self,
        d: int,
        k: int,
        seed: int = 0,
        *,
        kind: str = "gaussian",
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        _args.integer("Projector", "d", d, lo=1)
        _args.integer("Projector", "k", k, lo=2, accepts="an integer k >= 2 (bias corrections; use tens to hundreds)")
        _args.choice("Projector", "kind", kind, KINDS)
        self.d, self.k, self.seed, self.kind = d, k, int(seed), kind
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        blocks = []
        for start in range(0, d, _ROWS):
            rows = min(_ROWS, d - start)
            if kind == "gaussian":
                blocks.append(torch.randn(rows, k, generator=gen, dtype=torch.float64) / k**0.5)
            else:
                u = torch.rand(rows, k, generator=gen, dtype=torch.float64)
                sign = torch.where(u < 1 / 6, -1.0, torch.where(u < 1 / 3, 1.0, 0.0))
                blocks.append(sign.to(torch.float64) * (3.0 / k) ** 0.5)
        self.R = torch.cat(blocks).to(dtype=dtype, device=device)

    def __call__(self, X: Any) -> torch.Tensor:
        X = torch.as_tensor(X)
        if X.dim() != 2 or X.shape[1] != self.d:
            raise WidthscopeError(
                f"Projector(d={self.d}): expected rows of shape (b, {self.d}), got "
                f"{tuple(X.shape)}; build the projector with the samples' dimension"
            )
        R = self.R if self.R.device == X.device else self.R.to(X.device)
        return X.to(R.dtype) @ R

    def __repr__(self) -> str:
        return f"Projector(d={self.d}, k={self.k}, seed={self.seed}, kind={self.kind!r})"


@dataclasses.dataclass(frozen=True)
class ProjectedMoments:
    """Projected-sample estimates corrected to be unbiased for the unprojected moments (``raw``: uncorrected)."""

    n: int
    d: int
    k: int
    mu_sq: float
    mu_sigma_mu: float
    tr_sigma_sq: float
    tr_sigma: float
    raw: Moments
    tm: float  # unbiased tr(Σ_y)·‖μ_y‖²
    t2: float  # unbiased tr(Σ_y)²
    seed: int
    kind: str

    def as_moments(self) -> Moments:
        vals = (self.mu_sq, self.mu_sigma_mu, self.tr_sigma_sq)
        return Moments(self.n, self.d, *vals, "unbiased", f"projected(k={self.k})", self.tr_sigma)


def finalize_projected(pm: PrimalMoments, projector: Projector) -> ProjectedMoments:
    """Corrected estimates from the (possibly merged / all-reduced) moments of projected rows."""
    if pm.d != projector.k:
        raise WidthscopeError(
            f"finalize_projected: moments of dimension {pm.d} do not match the projector's k={projector.k}"
        )
    n, k = pm.n, projector.k
    raw = pm.finalize("unbiased")
    S, A, B, C = pm.sums()
    q2, q4 = float(pm.q2), float(pm.q4)
    vs = float(pm.v @ pm.s)
    p2, p3, p4 = n * (n - 1.0), n * (n - 1.0) * (n - 2.0), n * (n - 1.0) * (n - 2.0) * (n - 3.0)
    E1 = q2 * S - 2 * (vs - q4)  # Σ_{i,j,k distinct} D_i G_jk
    E2 = q2 * q2 - q4  # Σ_{i≠j} D_i D_j
    tm = E1 / p3 - C / p4
    t2 = E2 / p2 - 2 * E1 / p3 + C / p4
    c = (k + 2) * (k - 1) / k**2
    corrected = (raw.mu_sq, (raw.mu_sigma_mu - tm / k) / c, (raw.tr_sigma_sq - t2 / k) / c, raw.tr_sigma)
    return ProjectedMoments(n, projector.d, k, *corrected, raw, tm, t2, projector.seed, projector.kind)


def correct_projected_cross(cross: CrossMoments, raw_a: Moments, raw_b: Moments, k: int) -> CrossMoments:
    """Two-population estimates for the unprojected populations from the projected ones:
    ``(v_ab − t_a·m_b/k)/c`` and the like, ``c = (k+2)(k−1)/k²``."""
    c, ta, tb = (k + 2) * (k - 1) / k**2, raw_a.tr_sigma, raw_b.tr_sigma
    return dataclasses.replace(
        cross,
        b_sigma_a_b=(cross.b_sigma_a_b - ta * raw_b.mu_sq / k) / c,
        a_sigma_b_a=(cross.a_sigma_b_a - tb * raw_a.mu_sq / k) / c,
        tr_sigma_a_sigma_b=(cross.tr_sigma_a_sigma_b - ta * tb / k) / c,
        method=f"projected(k={k})",
    )


def projected_moments(
    X: Any | Iterable[Any], *, k: int, seed: int = 0, kind: str = "gaussian", d: int | None = None
) -> ProjectedMoments:
    """Bias-corrected ``‖μ‖², μᵀΣμ, tr(Σ²)`` of an ``(n, d)`` matrix or ``(b, d)`` row blocks projected to ``k`` dims.

    Example::

        >>> import torch
        >>> X = torch.randn(100, 50, dtype=torch.float64) + 0.2
        >>> blocks = (X[i:i + 16] for i in range(0, 100, 16))
        >>> a, b = projected_moments(X, k=8, seed=3), projected_moments(blocks, k=8, seed=3, d=50)
        >>> abs(a.mu_sigma_mu - b.mu_sigma_mu) < 1e-9 * abs(a.mu_sigma_mu)
        True
    """
    if isinstance(X, torch.Tensor) or hasattr(X, "__array__"):
        X = as_matrix(X, "X")
        blocks: Iterable[Any] = (X[i : i + _ROWS] for i in range(0, X.shape[0], _ROWS))
        d = X.shape[1]
    else:
        blocks = iter(X)
        if d is None:
            first = next(blocks, None)
            if first is None:
                raise WidthscopeError("projected_moments: no row blocks given")
            first = as_matrix(first, "X block")
            d = first.shape[1]
            blocks = itertools.chain([first], blocks)
    proj = Projector(int(d), k, seed, kind=kind)
    pm = PrimalMoments(k)
    for block in blocks:
        pm.update(proj(as_matrix(block, "X block")))
    return finalize_projected(pm, proj)


def spill_rows(blocks: Iterable[Any], path: Any, *, d: int | None = None) -> Any:
    """Write streamed ``(b, d)`` row blocks to a float64 ``.npy`` file (atomically); returns it memory-mapped.

    Example::

        >>> import torch, tempfile, os
        >>> X = torch.randn(10, 3, dtype=torch.float64)
        >>> f = os.path.join(tempfile.mkdtemp(), "rows.npy")
        >>> spill_rows([X[:4], X[4:]], f).shape
        (10, 3)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        n = 0
        with open(tmp, "wb") as raw:
            for block in blocks:
                b = as_matrix(block, "row block", d=d).numpy()
                d = b.shape[1]
                raw.write(np.ascontiguousarray(b, dtype="<f8").tobytes())
                n += b.shape[0]
        if d is None or n == 0:
            raise WidthscopeError("spill_rows: no row blocks given")
        # Prepend the .npy header now that n is known (one sequential copy; n·d stays on disk).
        header_file = tmp + ".npy"
        out = np.lib.format.open_memmap(header_file, mode="w+", dtype="<f8", shape=(n, d))
        src = np.memmap(tmp, dtype="<f8", mode="r", shape=(n, d))
        step = max(1, (1 << 24) // (8 * d))
        for i in range(0, n, step):
            out[i : i + step] = src[i : i + step]
        out.flush()
        del out, src
        os.replace(header_file, path)
    finally:
        for f in (tmp, tmp + ".npy"):
            if os.path.exists(f):
                os.unlink(f)
    return np.load(path, mmap_mode="r")


def out_of_core_moments(X: Any, *, block: int = 2048) -> Moments:
    """Unbiased dual-form :class:`Moments` of an ``(n, d)`` array too large for memory, by tiles of ``G = XXᵀ``.

    Example::

        >>> import numpy as np
        >>> X = np.random.default_rng(0).normal(size=(30, 5)) + 0.3
        >>> m = out_of_core_moments(X, block=8)
        >>> m.n, m.method
        (30, 'dual-out-of-core')
    """
    if getattr(X, "ndim", None) != 2:
        raise WidthscopeError("out_of_core_moments: X must be a 2-D (n, d) array (e.g. a numpy.memmap)")
    _args.integer("out_of_core_moments", "block", block, lo=1)
    n, d = int(X.shape[0]), int(X.shape[1])
    if n < 4:
        raise WidthscopeError(f"need at least 4 samples, got n={n}; collect more examples")

    def rows(i: int) -> torch.Tensor:
        blk = X[i : i + block]
        if not isinstance(blk, torch.Tensor):  # read-only memmap slice -> an owned in-memory block
            blk = np.array(blk)
        return as_matrix(blk, "X block")

    fro = 0.0
    rowsum = torch.zeros(n, dtype=torch.float64)
    sq = torch.zeros(n, dtype=torch.float64)
    for i in range(0, n, block):
        Xi = rows(i)
        sq[i : i + Xi.shape[0]] = (Xi * Xi).sum(1)
        for j in range(i, n, block):
            Xj = Xi if j == i else rows(j)
            G = Xi @ Xj.T
            w = 1.0 if j == i else 2.0  # off-diagonal tiles stand for themselves and their transpose
            fro += w * float((G * G).sum())
            rowsum[i : i + Xi.shape[0]] += G.sum(1)
            if j != i:
                rowsum[j : j + Xj.shape[0]] += G.sum(0)
    vals = unbiased_from_sums(n, *sums_from_rows(fro, rowsum, sq))
    tr_sigma = (float(sq.sum()) - float(rowsum.sum()) / n) / (n - 1)
    return Moments(n, d, *vals, "unbiased", "dual-out-of-core", tr_sigma)
