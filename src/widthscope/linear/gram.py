r"""Gram contractions of the structured NTK, in the three kernel shapes.

Every covered parameter contributes a term of one of two forms (``o, p`` output components,
``i, j`` examples of the two batches):

- **Hadamard**: per-example gradients ``g_{o,i} ∈ ℝ^F`` weighted by an example-pair matrix ``W``:
  ``Θ_{op}(x_i, x'_j) += W_{ij} Σ_F g_{o,i,F} g'_{p,j,F}``. A dense layer at one position is this
  with ``g = δ`` (the back-propagated signal) and ``W = m² (a a'ᵀ)`` (``+ 1`` with its bias); a
  gradient that is formed explicitly (biases, elementwise scales, unfolded conv weights) has
  ``W = 1``.
- **positions**: ``Θ_{op}(x_i, x'_j) += m² Σ_{t,s} (δ_{o,i,t}·δ'_{p,j,s}) (a_{i,t}·a'_{j,s})`` for a
  layer applied at positions ``t`` (sequences, conv patches, embedding lookups with one-hot ``a``).
  It is computed either from position Grams (``"gram"``: ``O((o n T)² (D_δ + 1) + (n T)² D_a)``) or
  by forming the per-example weight gradients ``P_{o,i} = Σ_t δ_{o,i,t} a_{i,t}ᵀ`` (``"explicit"``:
  ``O(o n T D_δ D_a + (o n)² D_δ D_a)``, memory ``o n D_δ D_a``), whichever costs fewer flops.
  With one output this is :func:`widthscope.probe.intervene.block_gram`.

Shapes of the accumulator (``mode``): ``"full"`` ``(o, n1, o, n2)`` (permuted to ``(n1, n2, o, o)``
by the caller), ``"trace"`` ``(n1, n2)`` (the sum over ``o = p``; only the ``o`` diagonal blocks
are formed, ``o``× fewer flops), ``"diag"`` ``(n, o, o)`` (``x_i = x'_i`` only; no off-diagonal
example pairs are formed, ``n``× fewer flops), ``"diagtrace"`` ``(n,)``.

Products run in the inputs' dtype; the accumulator may be wider (``acc += G`` upcasts).

Example::

    >>> import torch
    >>> g1, g2 = torch.randn(2, 4, 5), torch.randn(2, 3, 5)   # (o, n, F)
    >>> acc = torch.zeros(2, 4, 2, 3)
    >>> hadamard(acc, g1, g2, None, "full")
    >>> bool(torch.allclose(acc.permute(1, 3, 0, 2), torch.einsum("oiF,pjF->ijop", g1, g2)))
    True
    >>> sym = torch.zeros(2, 4, 2, 4)
    >>> hadamard(sym, g1, g1, None, "full", same=True); mirror_upper(sym)
    >>> bool(torch.allclose(sym.permute(1, 3, 0, 2), torch.einsum("oiF,pjF->ijop", g1, g1)))
    True
"""
from __future__ import annotations

import torch

__all__ = ["hadamard", "positions", "mirror_upper", "MODES"]

MODES = ("full", "trace", "diag", "diagtrace")


def hadamard(acc: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor, W: torch.Tensor | None, mode: str,
             *, same: bool = False) -> None:
    """``acc += W ⊙ Σ_F g1 g2ᵀ`` in ``mode`` (module docstring); ``g``: ``(o, n, F)``; ``W``: ``(n1, n2)``
    (``(n,)`` in the diag modes) or ``None`` (all ones). ``same``: ``g1 is g2`` and ``W`` symmetric,
    so the full mode forms and adds only the ``o ≤ p`` blocks (half the flops); the caller must then
    call :func:`mirror_upper` once after all terms (the other terms may add all blocks)."""
    O, n1, F = g1.shape
    n2 = g2.shape[1]
    if mode == "full":
        if same and O > 1:  # upper blocks o <= p only: the caller mirrors once (mirror_upper)
            flat = g1.reshape(O * n1, F)
            Wb = None if W is None else W.to(g1.dtype)[None, :, None, :]
            step = max(1, -(-256 // n1))  # rows of outputs per product: >= 256 rows keeps the GEMM efficient
            for o in range(0, O, step):  # blocks (o..o+step, >= o); the few p < o ones are mirrored over
                oc = min(step, O - o)
                blk = (flat[o * n1:(o + oc) * n1] @ flat[o * n1:].T).view(oc, n1, O - o, n2)
                acc[o:o + oc, :, o:] += blk if Wb is None else blk.mul_(Wb)
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


def mirror_upper(acc: torch.Tensor) -> None:
    """Fill the ``o > p`` blocks of a symmetric full accumulator ``(o, n, o, n)`` from the ``o < p`` ones."""
    for o in range(1, acc.shape[0]):
        acc[o, :, :o] = acc[:o, :, o].permute(2, 0, 1)


def positions(acc: torch.Tensor, a1: torch.Tensor, d1: torch.Tensor, a2: torch.Tensor, d2: torch.Tensor,
              scale: float, mode: str, *, same: bool = False, method: str = "auto",
              max_floats: int = 2 ** 24) -> None:
    """``acc += scale · Σ_{t,s} (δ_t·δ'_s)(a_t·a'_s)``; ``a``: ``(n, T, D_a)``, ``d``: ``(o, n, T, D_δ)``.

    ``method``: ``"gram"``, ``"explicit"`` or ``"auto"`` (fewer flops, explicit only while the
    ``o·n·D_δ·D_a`` gradients fit ``4·max_floats`` numbers; the diag modes always use ``"explicit"``);
    ``max_floats`` bounds the position-Gram chunk of the full mode."""
    O, n1, T1, Dd = d1.shape
    n2, T2, Da = d2.shape[1], d2.shape[2], a2.shape[2]
    diag = mode.startswith("diag")
    if T1 == 1 and T2 == 1:
        if diag:
            W = scale * (a1[:, 0] * a2[:, 0]).sum(-1)
        else:
            W = scale * (a1[:, 0] @ a2[:, 0].T)
        hadamard(acc, d1[:, :, 0], d2[:, :, 0], W, mode, same=same)
        return
    n = max(n1, n2)
    explicit_cost = O * n * max(T1, T2) * Dd * Da + (O * n) ** 2 * Dd * Da / (O if mode != "full" else 1)
    # the position Grams are (o·n·T)² numbers that are written, weighted and summed: memory-bound
    # work, counted as 32 flops a number besides the D_δ of the product
    gram_cost = (O * n * max(T1, T2)) ** 2 * (Dd + 32) / (O if mode != "full" else 1) + (n * max(T1, T2)) ** 2 * Da
    if same and mode == "full":
        explicit_cost /= 2  # the symmetric product forms half the blocks
    if diag:
        gram_cost /= n
        explicit_cost = O * n * max(T1, T2) * Dd * Da + O * O * n * Dd * Da
    fits = O * n * Dd * Da <= 4 * max_floats  # the per-example gradients P, held at once
    if method == "explicit" or diag or (method == "auto" and explicit_cost <= gram_cost and fits):
        p1 = torch.einsum("oitd,ita->oida", d1, a1).reshape(O, n1, Dd * Da)
        if same and scale >= 0:  # scale·P Pᵀ = (√scale P)(√scale P)ᵀ: the symmetric product
            p1 = p1 * scale ** 0.5 if scale != 1.0 else p1
            hadamard(acc, p1, p1, None, mode, same=True)
            return
        p2 = torch.einsum("oitd,ita->oida", d2, a2).reshape(O, n2, Dd * Da)
        hadamard(acc, p1 * scale if scale != 1.0 else p1, p2, None, mode, same=False)
        return
    GA = (a1.reshape(n1 * T1, Da) @ a2.reshape(n2 * T2, Da).T).view(n1, T1, n2, T2) * scale
    D2 = d2.reshape(O * n2 * T2, Dd)
    if mode == "full":
        step = max(1, max_floats // max(1, n1 * T1 * O * n2 * T2))
        for o in range(0, O, step):
            oc = min(step, O - o)
            GD = (d1[o:o + oc].reshape(oc * n1 * T1, Dd) @ D2.T).view(oc, n1, T1, O, n2, T2)
            acc[o:o + oc] += torch.einsum("oitpjs,itjs->oipj", GD, GA)
    else:  # trace
        for o in range(O):
            GD = (d1[o].reshape(n1 * T1, Dd) @ d2[o].reshape(n2 * T2, Dd).T).view(n1, T1, n2, T2)
            acc += (GD * GA).sum((1, 3))
