r"""Gram contractions of the structured NTK, in the three kernel shapes.

Each covered parameter adds a :func:`hadamard` term (per-example gradients weighted by an example-pair
matrix) or a :func:`positions` term (a layer applied at positions). Accumulator shapes (``mode``): ``"full"``
``(o, n1, o, n2)``, ``"trace"`` ``(n1, n2)``, ``"diag"`` ``(n, o, o)``, ``"diagtrace"`` ``(n,)``.

Example::

    >>> import torch
    >>> gen = torch.Generator().manual_seed(0)
    >>> g1, g2 = (torch.randn(2, n, 5, generator=gen, dtype=torch.float64) for n in (4, 3))  # (o, n, F)
    >>> acc = torch.zeros(2, 4, 2, 3, dtype=torch.float64)
    >>> hadamard(acc, g1, g2, None, "full")
    >>> bool(torch.allclose(acc.permute(1, 3, 0, 2), torch.einsum("oiF,pjF->ijop", g1, g2)))
    True
    >>> sym = torch.zeros(2, 4, 2, 4, dtype=torch.float64)
    >>> hadamard(sym, g1, g1, None, "full", same=True); mirror_upper(sym)
    >>> bool(torch.allclose(sym.permute(1, 3, 0, 2), torch.einsum("oiF,pjF->ijop", g1, g1)))
    True
"""

from __future__ import annotations

import torch

__all__ = ["hadamard", "positions", "mirror_upper", "tied_gradients"]


def hadamard(
    acc: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor, W: torch.Tensor | None, mode: str, *, same: bool = False
) -> None:
    """``acc += W ⊙ Σ_F g1 g2ᵀ``; ``g``: ``(o, n, F)``; ``W``: ``(n1, n2)`` (``(n,)`` in the diag modes) or ``None``.
    ``same`` (``g1 is g2``, ``W`` symmetric): the full mode adds only the ``o ≤ p`` blocks, for :func:`mirror_upper`."""
    O, n1, F = g1.shape
    n2 = g2.shape[1]
    if mode == "full":
        if same and O > 1:  # upper blocks o <= p only: the caller mirrors once (mirror_upper)
            flat = g1.reshape(O * n1, F)
            Wb = None if W is None else W.to(g1.dtype)[None, :, None, :]
            _upper(acc, flat, n1, Wb, 0, O)
            return
        G = (g1.reshape(O * n1, F) @ g2.reshape(O * n2, F).T).view(O, n1, O, n2)
        if W is not None:
            G.mul_(W.to(G.dtype)[None, :, None, :])
        acc.add_(G)
    elif mode == "trace":  # Σ_o: one (n1, o·F) @ (o·F, n2) product
        G = g1.permute(1, 0, 2).reshape(n1, O * F) @ g2.permute(1, 0, 2).reshape(n2, O * F).T
        acc.add_(G if W is None else G * W.to(G.dtype))
    elif mode == "diag":  # per example: (o, F) @ (F, o)
        G = torch.bmm(g1.permute(1, 0, 2), g2.permute(1, 2, 0))
        acc.add_(G if W is None else G * W.to(G.dtype)[:, None, None])
    else:  # diagtrace
        G = (g1 * g2).sum((0, 2))
        acc.add_(G if W is None else G * W.to(G.dtype))


SYM_ROWS = 128  # diagonal blocks of at most this many rows are formed whole


def _upper(acc: torch.Tensor, flat: torch.Tensor, n: int, Wb: torch.Tensor | None, lo: int, hi: int) -> None:
    """``acc[o, :, p] += W ⊙ g_o g_pᵀ`` for ``lo ≤ o ≤ p < hi`` (and some ``p < o`` in small diagonal blocks), by
    halving: the diagonal halves recursively, the off-diagonal one as one GEMM."""
    if hi - lo == 1 or (hi - lo) * n <= SYM_ROWS:
        rows = flat[lo * n : hi * n]
        blk = (rows @ rows.T).view(hi - lo, n, hi - lo, n)
        acc[lo:hi, :, lo:hi] += blk if Wb is None else blk.mul_(Wb)
        return
    mid = (lo + hi) // 2
    _upper(acc, flat, n, Wb, lo, mid)
    _upper(acc, flat, n, Wb, mid, hi)
    blk = (flat[lo * n : mid * n] @ flat[mid * n : hi * n].T).view(mid - lo, n, hi - mid, n)
    acc[lo:mid, :, mid:hi] += blk if Wb is None else blk.mul_(Wb)


def mirror_upper(acc: torch.Tensor) -> None:
    """Fill the ``o > p`` blocks of a symmetric full accumulator ``(o, n, o, n)`` from the ``o < p`` ones."""
    for o in range(1, acc.shape[0]):
        acc[o, :, :o] = acc[:o, :, o].permute(2, 0, 1)


def form_flops(O: int, n1: int, n2: int, T: int, Da: int, Dd: int, mode: str, same: bool) -> dict[str, float]:
    """Multiply-adds of each form of :func:`positions`: ``explicit`` (per-example gradients and their products),
    ``pairs`` (:func:`_pairs`) and, outside the diag modes, ``gram`` (a Gram number written and summed counts 32)."""
    form = O * (n1 + (0 if same else n2)) * T * Dd * Da
    if mode.startswith("diag"):
        per = O if mode == "diagtrace" else 1
        return {
            "explicit": form + O * O * n1 * Dd * Da / per,
            "pairs": n1 * T * T * Da + n1 * O * T * T * Dd + n1 * O * O * T * Dd / per,
        }
    prod = (O * n1) * (O * n2) * Dd * Da / (O if mode == "trace" else 1)
    main = (O * n1) * (O * n2) * T * Dd / (O if mode == "trace" else 1)
    return {
        "explicit": form + prod * (0.56 if same and mode == "full" and O > 1 else 1.0),
        "pairs": n1 * n2 * T * T * Da + (0.5 if same else 1.0) * (n1 * n2 * O * T * T * Dd + main),
        "gram": (O * n1 * T) * (O * n2 * T) * (Dd + 32) / (1 if mode == "full" else O) + (n1 * T) * (n2 * T) * Da,
    }


def _pairs(acc, a1, d1, a2, d2, scale: float, mode: str, same: bool) -> None:
    """``Θ_{oi,pj} = Σ_t δ_{o,i,t} · Y_{ij,p,t}`` with ``Y_{ij,p,t} = Σ_s M_{ij,ts} δ'_{p,j,s}`` and
    ``M_{ij,ts} = scale·(a_{i,t}·a'_{j,s})``; with ``same`` only ``j ≥ i``, the ``j > i`` blocks added transposed."""
    O, n1, T1, Dd = d1.shape
    n2, T2 = d2.shape[1], d2.shape[2]
    M = (a1.reshape(n1 * T1, -1) @ a2.reshape(n2 * T2, -1).T).view(n1, T1, n2, T2).permute(0, 2, 1, 3) * scale
    D2 = d2.permute(1, 2, 0, 3).reshape(n2, T2, O * Dd)  # (j, s, p·d)
    for i in range(n1):
        j0 = i if (same or mode.startswith("diag")) else 0
        j1 = i + 1 if mode.startswith("diag") else n2
        Y = torch.bmm(M[i, j0:j1].contiguous(), D2[j0:j1]).view(j1 - j0, T1, O, Dd)  # (j, t, p, d)
        Di = d1[:, i].reshape(O, T1 * Dd)
        if mode == "trace":
            G = torch.einsum("otd,jtod->j", d1[:, i], Y)
            acc[i, j0:] += G
            if same:
                acc[j0 + 1 :, i] += G[1:]
            continue
        if mode == "diagtrace":
            acc[i] += torch.einsum("otd,tod->", d1[:, i], Y[0])
            continue
        G = Di @ Y.permute(0, 2, 1, 3).reshape((j1 - j0) * O, T1 * Dd).T  # (o, j·p)
        if mode == "diag":
            acc[i] += G
            continue
        G = G.view(O, j1 - j0, O).permute(0, 2, 1)  # (o, p, j)
        acc[:, i, :, j0:j1] += G
        if same and j1 > j0 + 1:  # Θ_{pj,oi} = Θ_{oi,pj}
            acc[:, j0 + 1 : j1, :, i] += G[:, :, 1:].permute(1, 2, 0)


def _explicit(acc, a1, d1, a2, d2, scale: float, mode: str, same: bool, max_numbers: int) -> None:
    """The explicit form in chunks of ``D_δ``, at most ``max_numbers`` gradient numbers at once."""
    O, n1, _, Dd = d1.shape
    Da = a1.shape[2]
    step = max(1, min(Dd, max_numbers // max(1, O * max(n1, d2.shape[1]) * Da)))
    sym = same and scale >= 0  # scale·P Pᵀ = (√scale P)(√scale P)ᵀ: the symmetric product
    for c in range(0, Dd, step):
        p1 = torch.einsum("oitd,ita->oida", d1[..., c : c + step], a1).reshape(O, n1, -1)
        if sym:
            p1 = p1 * scale**0.5 if scale != 1.0 else p1
            hadamard(acc, p1, p1, None, mode, same=True)
            continue
        p2 = torch.einsum("oitd,ita->oida", d2[..., c : c + step], a2).reshape(O, d2.shape[1], -1)
        hadamard(acc, p1 * scale if scale != 1.0 else p1, p2, None, mode, same=False)


def positions(
    acc: torch.Tensor,
    a1: torch.Tensor,
    d1: torch.Tensor,
    a2: torch.Tensor,
    d2: torch.Tensor,
    scale: float,
    mode: str,
    *,
    same: bool = False,
    method: str = "auto",
    max_floats: int = 2**24,
) -> None:
    """``acc += scale · Σ_{t,s} (δ_t·δ'_s)(a_t·a'_s)``; ``a``: ``(n, T, D_a)``, ``d``: ``(o, n, T, D_δ)``. ``method``:
    ``"gram"``, ``"explicit"``, ``"pairs"`` or ``"auto"`` (fewest multiply-adds); ``max_floats``: numbers held."""
    O, n1, T1, Dd = d1.shape
    n2, T2, Da = d2.shape[1], d2.shape[2], a2.shape[2]
    diag = mode.startswith("diag")
    if T1 == 1 and T2 == 1:
        W = scale * ((a1[:, 0] * a2[:, 0]).sum(-1) if diag else a1[:, 0] @ a2[:, 0].T)
        hadamard(acc, d1[:, :, 0], d2[:, :, 0], W, mode, same=same)
        return
    T = max(T1, T2)
    if method == "auto":
        costs = form_flops(O, n1, n2, T, Da, Dd, mode, same)
        method = min(costs, key=costs.__getitem__)
    if method == "pairs":
        _pairs(acc, a1, d1, a2, d2, scale, mode, same)
        return
    if method == "explicit" or diag:
        _explicit(acc, a1, d1, a2, d2, scale, mode, same, max_floats)
        return
    GA = (a1.reshape(n1 * T1, Da) @ a2.reshape(n2 * T2, Da).T).view(n1, T1, n2, T2) * scale
    D2 = d2.reshape(O * n2 * T2, Dd)
    if mode == "full":
        step = max(1, max_floats // max(1, n1 * T1 * O * n2 * T2))
        for o in range(0, O, step):
            oc = min(step, O - o)
            GD = (d1[o : o + oc].reshape(oc * n1 * T1, Dd) @ D2.T).view(oc, n1, T1, O, n2, T2)
            acc[o : o + oc] += torch.einsum("oitpjs,itjs->oipj", GD, GA)
    else:  # trace
        for o in range(O):
            GD = (d1[o].reshape(n1 * T1, Dd) @ d2[o].reshape(n2 * T2, Dd).T).view(n1, T1, n2, T2)
            acc += (GD * GA).sum((1, 3))


def tied_gradients(uses: list[tuple], shape: tuple[int, ...], step: int):
    """The per-example gradients ``(o, n, rows·C)`` of a weight of ``shape`` shared by several modules, summed
    over its ``uses`` (:func:`widthscope.linear.rules.tied_use`), in chunks of ``step`` rows."""
    R = shape[0]
    for r0 in range(0, R, step):
        r1 = min(R, r0 + step)
        G = None
        for kind, a, d, mult in uses:
            O, n = d.shape[:2]
            if kind == "linear":
                g = torch.einsum("oitd,ita->oida", d[..., r0:r1], a) * mult
            elif kind == "conv1d":
                g = torch.einsum("ita,oitd->oiad", a[..., r0:r1], d)
            else:  # embed: ids (n, T) → rows of this chunk
                g = torch.zeros(O, n * (r1 - r0), d.shape[-1], dtype=d.dtype, device=d.device)
                ids = a.reshape(n, -1)
                keep = (ids >= r0) & (ids < r1)
                rows = (torch.arange(n, device=ids.device)[:, None] * (r1 - r0) + ids - r0)[keep]
                g.index_add_(1, rows, d[:, keep])
                g = g.view(O, n, r1 - r0, -1)
            G = g if G is None else G + g
        assert G is not None  # a tied weight has at least two uses
        yield G.reshape(G.shape[0], G.shape[1], -1)
