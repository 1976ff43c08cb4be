r"""Growth criteria: what each candidate point promises *before* a block is grown there.

``bias_gain = η aᵀb``; ``block_gain = η ⟨G_a, G_b⟩_F``; ``gradmax = η λ_max(sym(S_aᵀS_b))``;
``certified_gain = block_gain·(1 − B_exact)``; ``ls_gain = s²/(2c)``. Details: docs/interventions.md §3.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe.growth import point_criteria
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    >>> x, y = torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,))
    >>> c = point_criteria(net, "1", (x[:32], y[:32]), (x[32:], y[32:]), M=8, K=8)
    >>> sorted(k for k in c if k.endswith("_gain"))
    ['bias_gain', 'block_gain', 'certified_gain', 'ls_gain']
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn as nn

from ..errors import WidthscopeError
from ..stats import certificate, cross_moments_from_gram, plan
from .batches import batch_size_of, index_batch
from .blocks import block_features, block_gram, w_out_grad
from .collect import EvalMode, frozen
from .insert import ACTIVATIONS, ResidualBlock, inserted
from .steps import batch_losses, point_activation_rms
from .structure import eager_attention_for

__all__ = [
    "point_criteria",
    "gradmax_directions",
    "line_search_gain",
    "CRITERIA",
    "block_input_features",
]

# criterion name -> row column ranked on (higher is better)
CRITERIA: dict[str, str] = {
    "bias": "bias_gain",
    "block": "block_gain",
    "gradmax": "gradmax",
    "certified": "certified_gain",
    "d_align": "block_d_align",
    "line_search": "ls_gain",
}


def block_input_features(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64, norm: str = "rms"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` (activation gradients) and ``u = norm(z)`` (block input) at ``point``, ``(n, T, N)`` each."""
    _, width = point_activation_rms(model, point, index_batch(data, slice(0, 2)), loss_fn, batch_size)
    with inserted(model, point, "block", width=width, hidden=width, activation="identity", norm=norm) as blk:
        with torch.no_grad():
            blk.w_in.copy_(torch.eye(width, dtype=blk.w_in.dtype))
        return block_features(model, point, data, loss_fn, batch_size=batch_size)


def _gradmax_matrix(qa: torch.Tensor, ua: torch.Tensor, qb: torch.Tensor, ub: torch.Tensor) -> torch.Tensor:
    """``sym(S_aᵀ S_b)``, ``S = mean_i Σ_t q_{i,t} u_{i,t}ᵀ`` from one product of the thin factors."""
    Sa = torch.einsum("itn,itm->nm", qa.double(), ua.double()) / qa.shape[0]
    Sb = torch.einsum("itn,itm->nm", qb.double(), ub.double()) / qb.shape[0]
    X = Sa.T @ Sb
    return 0.5 * (X + X.T)


def gradmax_directions(qa: torch.Tensor, ua: torch.Tensor, qb: torch.Tensor, ub: torch.Tensor, k: int) -> torch.Tensor:
    """GradMax's ``k`` unit rows of ``W_in``: the top-``k`` eigenvectors of ``sym(S_aᵀ S_b)``, ``(k, N_in)``."""
    _, vec = torch.linalg.eigh(_gradmax_matrix(qa, ua, qb, ub))  # ascending eigenvalues, columns = eigenvectors
    k = max(1, min(int(k), vec.shape[1]))
    return vec[:, -k:].flip(1).T.contiguous()


def point_criteria(
    model: nn.Module,
    point: str,
    train: Any,
    test: Any,
    *,
    M: int = 32,
    K: int = 32,
    eta: float = 1e-3,
    hidden: int | None = None,
    activation: str = "gelu",
    norm: str = "rms",
    block_seed: int = 0,
    gradmax_k: int = 8,
    loss_fn: Callable | None = None,
    batch_size: int = 64,
    deltas: tuple[float, ...] = (0.1,),
    line_search: bool = True,
    keep_gradmax_rows: bool = False,
) -> dict[str, Any]:
    """Every growth criterion at ``point`` for the described block, as a flat dict; ``keep_gradmax_rows``
    adds the (not JSON-able) :func:`gradmax_directions`."""
    if activation not in ACTIVATIONS:
        raise WidthscopeError(f"activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
    qa, ua = block_input_features(model, point, train, loss_fn, batch_size=batch_size, norm=norm)
    qb, ub = block_input_features(model, point, test, loss_fn, batch_size=batch_size, norm=norm)
    N = qa.shape[2]
    H = int(hidden) if hidden is not None else N
    # the block that grow_at inserts: same shape, same seeded W_in, so h is *its* hidden layer
    w_in = ResidualBlock(N, H, activation=activation, norm=norm, seed=block_seed).w_in.detach().double()
    act = ACTIVATIONS[activation]
    ha, hb = act(ua @ w_in.T), act(ub @ w_in.T)
    row: dict[str, Any] = {
        "point": point,
        "width": N,
        "block_hidden": H,
        "M": M,
        "K": K,
        "eta": eta,
        "n_train": int(qa.shape[0]),
        "n_rank": int(qb.shape[0]),
    }
    # bias: sum-pooled samples Σ_t q_t (collect's default); block: cross-Gram of per-example W_out gradients
    sa, sb = qa.sum(1), qb.sum(1)
    cm = cross_moments_from_gram(block_gram(qa, ha, qb, hb))
    cb, ck = certificate(sa, sb, M=M, K=K), certificate(cm, M=M, K=K)
    for name, c in (("bias", cb), ("block", ck)):
        row.update({f"{name}_{k}": getattr(c, k) for k in ("expectation", "d_align", "b_exact", "b_align")})
        row.update({f"{name}_gain": eta * c.expectation, f"{name}_vacuous": bool(c.vacuous)})
    row["block_reason"] = ck.reason
    p_right = 1.0 - ck.b_exact if ck.expectation > 0 and math.isfinite(ck.b_exact) else 0.0
    row["p_improve"] = p_right  # Cantelli lower bound on Pr(the M-sample step's held-out sign is right)
    row["certified_gain"] = eta * max(ck.expectation, 0.0) * p_right
    for d in deltas:
        row[f"block_MK_exact_{d:g}"] = plan(cm, target=d).equal_exact
        row[f"bias_MK_exact_{d:g}"] = plan(sa, sb, target=d).equal_exact
    ev = torch.linalg.eigvalsh(_gradmax_matrix(qa, ua, qb, ub))  # ascending
    k = max(1, min(int(gradmax_k), ev.numel()))
    row.update(gradmax=eta * float(ev[-1]), gradmax_k=eta * float(ev[-k:].sum()), gradmax_kk=min(gradmax_k, N))
    if keep_gradmax_rows:
        row["gradmax_rows"] = gradmax_directions(qa, ua, qb, ub, gradmax_k)
    if line_search:  # one more pass with a Hessian-vector product
        block: dict[str, Any] = {"hidden": H, "activation": activation, "norm": norm, "block_seed": block_seed}
        row.update(line_search_gain(model, point, train, test, **block, loss_fn=loss_fn, batch_size=batch_size))
    return row


def line_search_gain(
    model: nn.Module,
    point: str,
    train: Any,
    test: Any,
    *,
    hidden: int | None = None,
    activation: str = "gelu",
    norm: str = "rms",
    block_seed: int = 0,
    loss_fn: Callable | None = None,
    batch_size: int = 64,
) -> dict[str, float]:
    r"""Second-order held-out gain of the best step ``W_out = −t G_a`` along the block's train gradient:
    ``L_b`` changes by ``−t s + ½ t² c`` (``s = ⟨∇L_b, G_a⟩``, ``c = G_aᵀ ∇²L_b G_a``), so ``ls_gain = s²/(2c)``
    (0 when ``s ≤ 0``; NaN when ``c ≤ 0``).
    """
    _, width = point_activation_rms(model, point, index_batch(test, slice(0, 2)), loss_fn, batch_size)
    options = {"width": width, "hidden": hidden, "activation": activation, "norm": norm, "seed": block_seed}
    with inserted(model, point, "block", **options) as blk:
        G = w_out_grad(model, point, train, loss_fn, batch_size).to(blk.w_out.dtype)
        n = batch_size_of(test)
        s = c = 0.0
        # double backward: fused attention kernels may lack it, the eager one has it
        with EvalMode(model), frozen(model), torch.enable_grad(), eager_attention_for(model):
            blk.w_out.requires_grad_(True)
            for losses in batch_losses(model, test, loss_fn, batch_size):
                (g,) = torch.autograd.grad(losses.sum() / n, [blk.w_out], create_graph=True)
                gv = (g * G).sum()
                (hv,) = torch.autograd.grad(gv, [blk.w_out])
                s += float(gv.detach())
                c += float((hv * G).sum())
    gain = 0.0 if s <= 0 else (s * s / (2 * c) if c > 0 else math.nan)
    return {"ls_slope": s, "ls_curvature": c, "ls_gain": gain}
