"""Empirical misalignment probability by resampling, with a Wilson interval.

Each draw takes ``M`` train and ``K`` held-out sample vectors without replacement and records
whether ``μ_Mᵀ g_K ≤ 0`` (the mean of an ``M×K`` sub-block of the cross-Gram). Details: docs/statistics.md §6.

Example::

    >>> import torch
    >>> from widthscope.stats import misalignment, misalignment_from_gram, wilson_interval
    >>> Xa = torch.randn(256, 32, dtype=torch.float64) + 0.2
    >>> Xb = torch.randn(256, 32, dtype=torch.float64) + 0.2
    >>> r = misalignment(Xa, Xb, M=16, K=16, draws=500, seed=0)
    >>> r.low <= r.probability <= r.high
    True
    >>> rows = misalignment_from_gram(Xa @ Xb.T, pairs=[(16, 16), (64, 64)], draws=500)
    >>> len(rows)
    2
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .. import _args
from ..errors import WidthscopeError
from ..options import DRAW_SCHEMES
from .estimators import as_matrix, as_pair, sample_size

# Elements gathered at once (float64): bounds the memory of a chunk of draws to ~32 MiB.
_CHUNK_ELEMS = 1 << 22
# Relative cost of a random single-entry gather vs one element of a contiguous row sum.
_GATHER_COST = 32


@dataclass(frozen=True)
class Misalignment:
    """Fraction of draws with ``μ_Mᵀ g_K ≤ 0``, its Wilson interval and the mean ``μ_Mᵀ g_K``."""

    probability: float
    low: float
    high: float
    draws: int
    count: int
    M: int
    K: int
    mean_alignment: float
    seed: int


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (default ~95%, ``z = 1.96``).

    Example::

        >>> lo, hi = wilson_interval(0, 100)
        >>> lo == 0.0 and 0.036 < hi < 0.038
        True
    """
    if isinstance(k, bool) or isinstance(n, bool):
        raise WidthscopeError("wilson_interval: k and n must be integers, not booleans")
    k, n = int(k), int(n)
    if n < 1:
        raise WidthscopeError(f"wilson_interval: need n ≥ 1 trials, got n={n}")
    if not 0 <= k <= n:
        raise WidthscopeError(f"wilson_interval: need 0 ≤ k ≤ n, got k={k}, n={n}")
    if not (z > 0 and math.isfinite(z)):
        raise WidthscopeError(f"wilson_interval: z must be a positive finite quantile, got {z}")
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _draw_indices(n: int, m: int, draws: int, gen: torch.Generator) -> torch.Tensor:
    """``(draws, m)`` indices, each row a uniform m-subset of ``range(n)`` whose first ``m'`` columns
    are a uniform ``m'``-subset too (the top keys, in key order)."""
    chunk = max(1, _CHUNK_ELEMS // max(n, 1))
    out = []
    for start in range(0, draws, chunk):
        keys = torch.rand(min(chunk, draws - start), n, generator=gen, dtype=torch.float64)
        out.append(keys.topk(m, dim=1).indices)
    return torch.cat(out)


def _check(
    fn: str, M: Any, K: Any, draws: Any, seed: Any, pairs: Any, z: Any, scheme: Any
) -> tuple[list[tuple[int, int]], bool]:
    """Check the arguments both entry points share; the ``(M, K)`` pairs and whether a list was asked for."""
    _args.integer(fn, "draws", draws, lo=1)
    _args.integer(fn, "seed", seed)
    _args.number(fn, "z", z, 0.0, lo_open=True, accepts="a positive finite quantile (e.g. 1.96)")
    _args.choice(fn, "scheme", scheme, DRAW_SCHEMES)
    if pairs is None:
        if M is None or K is None:
            raise WidthscopeError("misalignment needs M and K (or pairs=[(M, K), ...])")
        return [(sample_size(fn, "M", M), sample_size(fn, "K", K))], False
    if M is not None or K is not None:
        raise WidthscopeError("pass either M and K or pairs=[(M, K), ...], not both")
    try:
        plist = [(sample_size(fn, "M", a), sample_size(fn, "K", b)) for a, b in pairs]
    except (TypeError, ValueError) as exc:
        raise WidthscopeError(f"pairs must be a list of (M, K) integer pairs, got {pairs!r}") from exc
    if not plist:
        raise WidthscopeError("pairs is empty: give at least one (M, K)")
    return plist, True


def _block_sums_fn(C: torch.Tensor, plist, m_max: int, k_max: int):
    """Block sums via one gather of the (M_max × K_max) sub-blocks: O(MK) per draw."""
    nb = C.shape[1]
    Cflat = C.contiguous().reshape(-1)
    mi = torch.tensor([m - 1 for m, _ in plist], device=C.device)
    ki = torch.tensor([k - 1 for _, k in plist], device=C.device)
    use_slices = sum(m * k for m, k in plist) <= 2 * m_max * k_max

    def fn(Ic: torch.Tensor, Jc: torch.Tensor) -> torch.Tensor:
        # A flat index_select rather than broadcast advanced indexing C[I[:, :, None], J[:, None, :]].
        flat = (Ic[:, :, None] * nb + Jc[:, None, :]).reshape(-1)
        block = Cflat.index_select(0, flat).reshape(Ic.shape[0], m_max, k_max)
        if use_slices:  # few pairs: sum each leading sub-block directly
            return torch.stack([block[:, :m, :k].sum((1, 2)) for m, k in plist], 1)
        return block.cumsum(1).cumsum(2)[:, mi, ki]  # many pairs: one 2-D prefix sum

    return fn


def _row_sums_fn(C: torch.Tensor, plist, m_values: list[int], k_max: int):
    """Block sums via Σ_{i∈I} C[i, :] (contiguous rows, embedding_bag), then K picked columns."""
    C = C.contiguous()
    pos = list(enumerate(plist))  # a list, not a dict: a repeated (M, K) must fill every column

    def fn(Ic: torch.Tensor, Jc: torch.Tensor) -> torch.Tensor:
        out = torch.empty(Ic.shape[0], len(plist), dtype=torch.float64, device=C.device)
        for m in m_values:
            rows = F.embedding_bag(Ic[:, :m], C, mode="sum")  # (chunk, n_b)
            csum = rows.gather(1, Jc).cumsum(1)  # (chunk, K_max)
            for i, (mm, k) in pos:
                if mm == m:
                    out[:, i] = csum[:, k - 1]
        return out

    return fn


def _add_exact_sums(sums: torch.Tensor, parts: list[list[float]], slab: int = 1 << 16) -> None:
    """Append to ``parts[i]`` the correctly rounded sum of each slab of column ``i`` (CPU-independent)."""
    cols = sums.detach().to("cpu", torch.float64).T.contiguous().numpy()
    for i, col in enumerate(cols):
        parts[i].extend(math.fsum(memoryview(col[s : s + slab])) for s in range(0, col.shape[0], slab))


def _per_pair_sums(C: torch.Tensor, plist: list[tuple[int, int]], draws: int, seed: int) -> list[torch.Tensor]:
    """Block sums ``Σ_{I×J} C`` of fresh draws per pair, drawn as the published flip script draws them."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    na, nb = C.shape
    out = []
    for m, k in plist:
        I = torch.rand((draws, na), generator=gen).argsort(dim=1)[:, :m]  # float32 keys, as the script
        J = torch.rand((draws, nb), generator=gen).argsort(dim=1)[:, :k]
        step = max(1, _CHUNK_ELEMS // (m * k))
        sums = [
            C[I[s : s + step, :, None].to(C.device), J[s : s + step, None, :].to(C.device)].sum((1, 2))
            for s in range(0, draws, step)
        ]
        out.append(torch.cat(sums).to("cpu", torch.float64))
    return out


def _result(c: int, total: float, m: int, k: int, draws: int, z: float, seed: int) -> Misalignment:
    lo, hi = wilson_interval(c, draws, z)
    return Misalignment(c / draws, lo, hi, draws, c, m, k, total / (draws * m * k), seed)


def misalignment_from_gram(
    C_ab: Any,
    *,
    M: int | None = None,
    K: int | None = None,
    draws: int = 1000,
    seed: int = 0,
    pairs: Sequence[tuple[int, int]] | None = None,
    z: float = 1.96,
    scheme: str = "shared",
) -> Misalignment | list[Misalignment]:
    """Misalignment probability from a cross-Gram ``C_ab[i, j] = x_i·y_j``: one :class:`Misalignment`
    for ``M`` and ``K``, a list for ``pairs`` (sharing the subsets unless ``scheme="per-pair"``).

    Example::

        >>> import torch
        >>> Xa, Xb = torch.randn(64, 8) + 0.3, torch.randn(64, 8) + 0.3
        >>> r = misalignment_from_gram(Xa.double() @ Xb.double().T, M=8, K=8, draws=200, seed=1)
        >>> r.draws, r.M, r.K
        (200, 8, 8)
    """
    plist, many = _check("misalignment_from_gram", M, K, draws, seed, pairs, z, scheme)
    C, seed = as_matrix(C_ab, "C_ab"), int(seed)
    na, nb = C.shape
    m_max = max(m for m, _ in plist)
    k_max = max(k for _, k in plist)
    for name, size, n, pool, kind in (("M", m_max, na, "train", "training"), ("K", k_max, nb, "held-out", "held-out")):
        if size > n:
            raise WidthscopeError(
                f"{name}={size} is larger than the {pool} pool of {n} sample vectors; "
                f"use {name} ≤ {n} or collect more {kind} examples"
            )
    if scheme == "per-pair":
        out = [
            _result(int((sums <= 0).sum()), math.fsum(sums.tolist()), m, k, draws, z, seed)
            for (m, k), sums in zip(plist, _per_pair_sums(C, plist, draws, seed))
        ]
        return out if many else out[0]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    I = _draw_indices(na, m_max, draws, gen).to(C.device)
    J = _draw_indices(nb, k_max, draws, gen).to(C.device)
    counts = torch.zeros(len(plist), dtype=torch.long, device=C.device)
    m_values = sorted({m for m, _ in plist})
    # two exact ways to get the block sums: pick the cheaper
    rows_cost = sum(m_values) * nb
    block_cost = _GATHER_COST * m_max * k_max
    if rows_cost <= block_cost:
        sums_fn = _row_sums_fn(C, plist, m_values, k_max)
        chunk = max(1, _CHUNK_ELEMS // (nb + k_max))
    else:
        sums_fn = _block_sums_fn(C, plist, m_max, k_max)
        chunk = max(1, _CHUNK_ELEMS // (m_max * k_max))
    parts: list[list[float]] = [[] for _ in plist]
    for s in range(0, draws, chunk):
        sums = sums_fn(I[s : s + chunk], J[s : s + chunk])  # (chunk, pairs)
        counts += (sums <= 0).sum(0)
        _add_exact_sums(sums, parts)
    out = [_result(c, math.fsum(p), m, k, draws, z, seed) for (m, k), c, p in zip(plist, counts.tolist(), parts)]
    return out if many else out[0]


def misalignment(
    train: Any,
    test: Any,
    *,
    M: int | None = None,
    K: int | None = None,
    draws: int = 1000,
    seed: int = 0,
    pairs: Sequence[tuple[int, int]] | None = None,
    z: float = 1.96,
    scheme: str = "shared",
) -> Misalignment | list[Misalignment]:
    """:func:`misalignment_from_gram` of the float64 cross-Gram of train and held-out sample vectors.

    Example::

        >>> import torch
        >>> r = misalignment(torch.randn(100, 8) + 1, torch.randn(100, 8) + 1, M=16, K=16, draws=100)
        >>> r.probability <= r.high
        True
    """
    fn = "misalignment"
    _args.tensor(fn, "train", train, ndim=2, arrays=True, accepts="a 2-D (n_a, d) tensor or array of samples")
    _args.tensor(fn, "test", test, ndim=2, arrays=True, accepts="a 2-D (n_b, d) tensor or array of held-out samples")
    _check(fn, M, K, draws, seed, pairs, z, scheme)
    A, B = as_pair(train, test)
    return misalignment_from_gram(A @ B.T, M=M, K=K, draws=draws, seed=seed, pairs=pairs, z=z, scheme=scheme)
