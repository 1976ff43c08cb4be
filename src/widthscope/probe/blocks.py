"""Block probe maths: the Gram of an inserted block's per-example ``W_out`` gradients, its features and certificate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn as nn

from ..errors import WidthscopeError
from ..stats import certificate, cross_moments_from_gram
from .batches import batch_size_of
from .collect import EvalMode, frozen, hooked, split_output
from .insert import Inserted, ResidualBlock, channel_dim
from .steps import batch_losses

if TYPE_CHECKING:
    from ..stats.estimators import Estimator


def _positions(x: torch.Tensor, name: str) -> torch.Tensor:
    """``(n, N)`` -> ``(n, 1, N)``; ``(n, T, N)`` kept; ``(n, C, H, W)`` -> ``(n, H·W, C)``."""
    x = torch.as_tensor(x)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() == 3:
        return x
    if x.dim() == 4:
        return x.flatten(2).transpose(1, 2)
    raise WidthscopeError(f"{name} must be (n, N), (n, T, N) or (n, C, H, W); got shape {tuple(x.shape)}")


def block_gram(
    q: Any, h: Any, q2: Any = None, h2: Any = None, *, method: str = "auto", max_floats: int = 2**23
) -> torch.Tensor:
    r"""Gram of the per-example ``W_out`` gradients ``P_i = Σ_t q_{i,t} h_{i,t}ᵀ`` without forming them.

    .. math::  ⟨P_i, P'_j⟩_F = Σ_{t,s} (q_{i,t}·q'_{j,s})(h_{i,t}·h'_{j,s})

    ``q2, h2``: a second population for the cross-Gram; ``method``: position Grams (``"gram"``),
    materialised ``P_i`` (``"explicit"``) or the cheaper (``"auto"``). Returns a float64 Gram.

    Example::

        >>> q, h = torch.randn(5, 3, 4), torch.randn(5, 3, 6)
        >>> P = torch.einsum("itn,ith->inh", q, h).flatten(1).double()
        >>> torch.allclose(block_gram(q, h), P @ P.T)
        True
    """
    qa = _positions(q, "q").double()
    ha = _positions(h, "h").double()
    qb = qa if q2 is None else _positions(q2, "q2").double()
    hb = ha if h2 is None else _positions(h2, "h2").double()
    for qq, hh, nm in ((qa, ha, ""), (qb, hb, "2")):
        if qq.shape[:2] != hh.shape[:2]:
            raise WidthscopeError(
                f"q{nm} and h{nm} must have the same examples and positions, got "
                f"{tuple(qq.shape)} and {tuple(hh.shape)}"
            )
    if qa.shape[2] != qb.shape[2] or ha.shape[2] != hb.shape[2]:
        raise WidthscopeError("the two populations have different widths; both must come from the same block")
    n, T, N = qa.shape
    m, T2, _ = qb.shape
    H = ha.shape[2]
    if method not in ("auto", "gram", "explicit"):
        raise WidthscopeError(f"method must be 'auto', 'gram' or 'explicit', got {method!r}")
    if T == 1 and T2 == 1:
        return (qa[:, 0] @ qb[:, 0].T) * (ha[:, 0] @ hb[:, 0].T)
    if method == "auto":
        cost_gram = n * m * T * T2 * (N + H)
        cost_explicit = (n * T + m * T2) * N * H + n * m * N * H
        method = "gram" if cost_gram <= cost_explicit else "explicit"
    if method == "explicit":
        Pa = torch.einsum("itn,ith->inh", qa, ha).reshape(n, -1)
        Pb = Pa if q2 is None and h2 is None else torch.einsum("itn,ith->inh", qb, hb).reshape(m, -1)
        return Pa @ Pb.T
    out = torch.empty(n, m, dtype=torch.float64, device=qa.device)
    rows = max(1, max_floats // max(1, T * m * T2))  # bound the (rows, T, m, T2) temporaries
    for i in range(0, n, rows):
        Qg = torch.einsum("atn,bsn->atbs", qa[i : i + rows], qb)
        Hg = torch.einsum("atn,bsn->atbs", ha[i : i + rows], hb)
        out[i : i + rows] = (Qg * Hg).sum((1, 3))
    return out


def block_of(model: nn.Module, point: str) -> ResidualBlock:
    w = model.get_submodule(point)
    if not isinstance(w, Inserted) or not isinstance(w.widthscope_insert, ResidualBlock):
        raise WidthscopeError(
            f"point {point!r} has no inserted block; call insert(model, {point!r}, kind='block') first"
        )
    return w.widthscope_insert


def block_features(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example ``q = ∂ℓ/∂(block output)`` and hidden ``h`` of the block inserted at ``point``."""
    wrapper = model.get_submodule(point)
    block = block_of(model, point)
    if block.style == "conv3x3":
        raise WidthscopeError(
            "block_features needs an MLP/1x1-style block (its W_out gradient is "
            "Σ_t q_t h_tᵀ); a 3x3 block has no such form"
        )

    state: dict[str, torch.Tensor] = {}

    def hook(_m: nn.Module, _i: Any, out: Any) -> Any:
        z, put = split_output(out, point)
        state["b"] = torch.zeros_like(z, requires_grad=True)
        return put(z + state["b"])

    qs, hs = [], []
    block.keep_hidden = True
    try:
        with hooked([(wrapper, hook)]), EvalMode(model), frozen(model), torch.enable_grad():
            for losses in batch_losses(model, data, loss_fn, batch_size):
                (g,) = torch.autograd.grad(losses.sum(), [state["b"]])
                dim = channel_dim(g, block.style)
                B = g.shape[0]
                qs.append(g.movedim(dim, -1).reshape(B, -1, g.shape[dim]).detach().double().cpu())
                h = block.last_hidden
                assert h is not None  # keep_hidden: this forward set it
                hs.append(h.reshape(B, -1, h.shape[-1]).detach().double().cpu())
    finally:
        block.keep_hidden = False
        block.last_hidden = None
    return torch.cat(qs), torch.cat(hs)


def block_certificate(
    model: nn.Module,
    point: str,
    train: Any,
    test: Any,
    *,
    M: int,
    K: int,
    loss_fn: Callable | None = None,
    batch_size: int = 64,
    estimator: Estimator = "unbiased",
) -> Any:
    """Two-population certificate of an inserted block's ``W_out`` step, from Gram products only."""
    qa, ha = block_features(model, point, train, loss_fn, batch_size=batch_size)
    qb, hb = block_features(model, point, test, loss_fn, batch_size=batch_size)
    return certificate(cross_moments_from_gram(block_gram(qa, ha, qb, hb), estimator), M=M, K=K, estimator=estimator)


def w_out_grad(model: nn.Module, point: str, data: Any, loss_fn: Callable | None, batch_size: int) -> torch.Tensor:
    """Mean per-example gradient of ``W_out`` (= gradient of the mean loss), float64."""
    block = block_of(model, point)
    total = torch.zeros(block.w_out.shape, dtype=torch.float64)
    with EvalMode(model), torch.enable_grad():
        for losses in batch_losses(model, data, loss_fn, batch_size):
            (g,) = torch.autograd.grad(losses.sum(), [block.w_out])
            total += g.detach().double().cpu()
    return total / batch_size_of(data)
