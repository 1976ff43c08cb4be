"""The structured kernel's assembly: blocks of examples captured (:func:`.structured.capture_records`), their records
combined into Gram terms (:mod:`.gram`), and the generic remainder added from explicit Jacobians. The split of
the parameters (:func:`.structured.plan`) and the formulas are in :mod:`widthscope.linear.structured`."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from ._core import as_param_dtype, ntk_jacobian, ntk_per_example, params_and_buffers
from .cost import SAFETY
from .gram import hadamard, mirror_upper, positions, tied_gradients
from .rules import bag_gram
from .structured import Plan, capture_records, out_tensor

__all__: list[str] = []


def _combine(acc: torch.Tensor, r1: list[tuple], r2: list[tuple], mode: str, same: bool) -> None:
    diag = mode.startswith("diag")
    for a, b in zip(r1, r2):
        if a[0] == "tied":  # Σ of every use's per-example gradient, then the product (in row chunks)
            O, n = a[1][0][2].shape[:2]
            step = max(1, 2**24 // max(1, O * max(n, b[1][0][2].shape[1]) * math.prod(a[2][1:])))
            if same:
                for g in tied_gradients(a[1], a[2], step):
                    hadamard(acc, g, g, None, mode, same=True)
            else:
                for g1, g2 in zip(tied_gradients(a[1], a[2], step), tied_gradients(b[1], b[2], step)):
                    hadamard(acc, g1, g2, None, mode)
            continue
        if a[0] == "vector":
            hadamard(acc, a[1], b[1], None, mode, same=same)
        elif a[0] == "bag":
            hadamard(acc, a[3], b[3], bag_gram(a, b, diag), mode, same=same)
        elif a[0] == "embed":
            ids1, d1, ids2, d2 = a[1], a[2], b[1], b[2]
            uniq, inv = torch.unique(torch.cat([ids1.reshape(-1), ids2.reshape(-1)]), return_inverse=True)
            oh = nn.functional.one_hot(inv, len(uniq)).to(d1.dtype)
            A1 = oh[: ids1.numel()].view(ids1.shape[0], ids1.shape[1], -1)
            A2 = A1 if same else oh[ids1.numel() :].view(ids2.shape[0], ids2.shape[1], -1)
            positions(acc, A1, d1, A2, d2, 1.0, mode, same=same)
        else:
            _, a1, d1, s, w_on, b_on = a
            a2, d2 = b[1], b[2]
            if d1.shape[2] == 1 and d2.shape[2] == 1:  # one position: weight and bias share δδ'ᵀ
                if w_on:
                    W = s * ((a1[:, 0] * a2[:, 0]).sum(-1) if diag else a1[:, 0] @ a2[:, 0].T)
                    W = W + 1.0 if b_on else W
                else:
                    W = None
                hadamard(acc, d1[:, :, 0], d2[:, :, 0], W, mode, same=same)
                continue
            if w_on:
                positions(acc, a1, d1, a2, d2, s, mode, same=same)
            if b_on:
                s1 = d1.sum(2)
                hadamard(acc, s1, s1 if same else d2.sum(2), None, mode, same=same)


def _blocks(n: int, b: int | None) -> list[slice]:
    b = n if b is None else b
    return [slice(i, min(i + b, n)) for i in range(0, n, b)]


def structured_kernel(
    model: nn.Module,
    x1: torch.Tensor,
    x2: torch.Tensor | None,
    *,
    plan: Plan,
    trace: bool = False,
    diagonal: bool = False,
    batch_size: int | None = None,
    dtype: torch.dtype | None = None,
    memory_budget: float = 2e9,
    info: dict | None = None,
    generic_chunks: tuple[int | None, int | None] = (None, None),
    reserved: float = 0.0,
) -> torch.Tensor:
    """The structured kernel of :func:`widthscope.linear.structured_ntk` (shapes and options there) for the
    :func:`plan` ``plan`` that :func:`widthscope.linear.ntk` made after checking the inputs; ``generic_chunks``
    (examples, outputs) size the generic remainder's Jacobian blocks and ``reserved`` is the bytes the cost
    model already counted, so blocks are kept for reuse only in the rest of ``memory_budget``."""
    params, buffers = params_and_buffers(model)
    pdtype = next(iter(params.values())).dtype
    acc_dtype = dtype or pdtype
    same = x2 is None
    x1 = as_param_dtype(x1, params)
    x2 = x1 if x2 is None else as_param_dtype(x2, params)
    P = plan
    if info is not None:
        info.update(method="structured", covered=P.n_covered, uncovered=P.n_generic, generic=list(P.generic))
    mode = ("diagtrace" if trace else "diag") if diagonal else ("trace" if trace else "full")
    n1, n2 = x1.shape[0], x2.shape[0]
    b1, b2 = _blocks(n1, batch_size), _blocks(n2, batch_size)
    with torch.no_grad():
        O = out_tensor(model(x1[:1])).shape[1]
    shape = {"full": (n1, n2, O, O), "trace": (n1, n2), "diag": (n1, O, O), "diagtrace": (n1,)}[mode]
    K = torch.zeros(shape, dtype=acc_dtype, device=x1.device)
    cache: dict[tuple[int, int], tuple[list[tuple], int]] = {}
    room = [max(0.0, SAFETY * float(memory_budget) - reserved)]  # what the cost model left for keeping blocks

    def get(which: int, idx: int, s: slice) -> list[tuple]:
        """Records of a block; kept for reuse (x2's blocks, or x1's when x2 is None) while they fit."""
        if (which, idx) in cache:
            return cache[(which, idx)][0]
        recs = capture_records(model, P, (x1 if which == 1 else x2)[s])[0] if P.entries else []
        size = sum(t.numel() * t.element_size() for rec in recs for t in rec if isinstance(t, torch.Tensor))
        reused = (which == 2 and len(b1) > 1) or (which == 1 and same and len(b1) > 1)
        if reused and size <= room[0]:
            room[0] -= size
            cache[(which, idx)] = (recs, size)
        return recs

    for bi, s1 in enumerate(b1):
        r1 = get(1, bi, s1)
        m1 = s1.stop - s1.start
        if diagonal:
            acc = torch.zeros((m1, O, O) if mode == "diag" else (m1,), dtype=acc_dtype, device=x1.device)
            _combine(acc, r1, r1, mode, True)
            K[s1] = acc
            continue
        for bj, s2 in enumerate(b2):
            if same and bj < bi:
                continue
            r2 = r1 if same and bj == bi else get(1 if same else 2, bj, s2)
            m2 = s2.stop - s2.start
            acc = torch.zeros((O, m1, O, m2) if mode == "full" else (m1, m2), dtype=acc_dtype, device=x1.device)
            _combine(acc, r1, r2, mode, same and bj == bi)
            if mode == "full" and same and bj == bi:
                mirror_upper(acc)
            blk = acc.permute(1, 3, 0, 2) if mode == "full" else acc
            K[s1, s2] = blk
            if same and bj != bi:
                K[s2, s1] = blk.permute(1, 0, 3, 2) if mode == "full" else blk.T
        room[0] += cache.pop((1, bi), ([], 0))[1]  # x1's block bi is not needed again
    if P.generic:  # the hybrid remainder: explicit Jacobians of just these parameters
        K = _generic(
            model, P, params, buffers, x1, x2, same, O, K, diagonal, trace, memory_budget, acc_dtype, generic_chunks
        )
    if trace:
        K /= O
    return K.detach()


def _generic(
    model: nn.Module,
    P: Plan,
    params: dict,
    buffers: dict,
    x1: torch.Tensor,
    x2: torch.Tensor,
    same: bool,
    O: int,
    K: torch.Tensor,
    diagonal: bool,
    trace: bool,
    memory_budget: float,
    acc_dtype: torch.dtype,
    chunks: tuple[int | None, int | None] = (None, None),
) -> torch.Tensor:
    """``K +=`` the generic-path parameters' kernel (``vmap(jacrev)`` per-example Jacobians, ``chunks`` = (examples,
    outputs) per Jacobian block as :mod:`.cost` sized them to ``memory_budget``)."""
    n1 = x1.shape[0]
    with warnings.catch_warnings():  # vmapped ops without a batching rule fall back to a loop: fine
        warnings.filterwarnings("ignore", message="There is a performance drop")
        gp = {k: params[k] for k in P.generic}
        gb = dict(buffers)
        gb.update({k: v for k, v in params.items() if k not in gp})
        per_example = O * sum(v.numel() for v in gp.values()) * gp[P.generic[0]].element_size()
        chunk = chunks[0] or max(1, int(memory_budget // (2 * per_example)))
        oc = chunks[1] if chunks[1] and chunks[1] < O else None
        if diagonal:
            for s in _blocks(n1, chunk):
                try:
                    Kg = ntk_per_example(model, gp, gb, x1[s], x1[s], chunk, True, oc)
                except RuntimeError:  # as below
                    Kg = ntk_jacobian(model, gp, gb, x1[s], x1[s], chunk, True, oc)
                Kg = torch.diagonal(Kg, dim1=0, dim2=1).permute(2, 0, 1)
                K[s] += (torch.diagonal(Kg, dim1=1, dim2=2).sum(-1) if trace else Kg).to(acc_dtype)
        else:
            try:
                Kg = ntk_per_example(model, gp, gb, x1, x2, chunk, same, oc)
            except RuntimeError:  # the vmapped forward failed (no batching rule, in-place ops): jacrev vmaps
                Kg = ntk_jacobian(model, gp, gb, x1, x2, chunk, same, oc)
            K += (torch.diagonal(Kg, dim1=2, dim2=3).sum(-1) if trace else Kg).to(acc_dtype)
    return K
