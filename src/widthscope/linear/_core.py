"""What the kernel tools share: parameters as dicts, a model's output tensor, the Jacobian and NTK-vector
product kernels, and the errors of a forward pass that cannot run or differentiate."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

from ..errors import WidthscopeError
from ..probe.collect import logits_of


def params_and_buffers(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Detached views: trainable parameters, and buffers with the frozen parameters."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    buffers.update({k: v.detach() for k, v in model.named_parameters() if not v.requires_grad})
    return params, buffers


def as_param_dtype(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Floating inputs in the parameters' dtype and device."""
    p0 = next(iter(params.values()), None)
    if p0 is None or not isinstance(x, torch.Tensor):
        return x
    if x.is_floating_point() and p0.is_floating_point():
        return x.to(device=p0.device, dtype=p0.dtype)
    return x.to(p0.device)


def cannot_run(who: str, x: torch.Tensor, exc: BaseException) -> WidthscopeError:
    """The error for a forward pass that fails on inputs ``x``."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return WidthscopeError(
        f"{who}: the model cannot run on inputs of shape {tuple(x.shape)} ({type(exc).__name__}: {first}); "
        "pass inputs shaped like the model's training inputs"
    )


def first_output(model: nn.Module, params, buffers, x: torch.Tensor, who: str) -> torch.Tensor:
    """The model's (flattened) output on ``x``; a failing forward becomes a WidthscopeError."""
    try:
        with torch.no_grad():
            return flat_out(model, params, buffers, x)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise cannot_run(who, x, exc) from None


def out_tensor(out: Any) -> torch.Tensor:
    """:func:`~widthscope.probe.collect.logits_of` flattened to ``(batch, outputs)``."""
    o = logits_of(out)
    return o.reshape(o.shape[0], -1)


def flat_out(model: nn.Module, params, buffers, x: torch.Tensor) -> torch.Tensor:
    return out_tensor(functional_call(model, (params, buffers), (x,)))


def _blocks(model, params, buffers, x1, x2, chunk, same, out_chunk, n_out, jac, contract) -> torch.Tensor:
    """``Σ_b J_b(x1) J_b(x2)ᵀ`` from Jacobian blocks ``jac(x, o)`` of ``chunk`` examples × ``out_chunk`` outputs,
    contracted by ``contract(ja, jb, ci, cj)``; with ``same`` only the upper block pairs (mirrored)."""
    n1, n2 = x1.shape[0], x2.shape[0]
    O = (n_out or flat_out(model, params, buffers, x1[:1]).shape[1]) if out_chunk else 0
    outs = [slice(a, min(a + out_chunk, O)) for a in range(0, O, out_chunk)] if out_chunk else [slice(None)]
    b1 = [(slice(i, min(i + chunk, n1)), o) for i in range(0, n1, chunk) for o in outs]
    b2 = b1 if same else [(slice(j, min(j + chunk, n2)), o) for j in range(0, n2, chunk) for o in outs]
    kept = None if same or len(b2) > 1 else jac(x2[b2[0][0]], b2[0][1])  # x2's one block, kept
    K = None
    for bi, (si, oi) in enumerate(b1):
        ja = jac(x1[si], oi)
        for bj, (sj, oj) in enumerate(b2):
            if same and bj < bi:
                continue
            if same and bj == bi:
                jb = ja
            else:
                jb = kept if kept is not None else jac((x1 if same else x2)[sj], oj)
            blk = contract(ja, jb, si.stop - si.start, sj.stop - sj.start)
            if K is None:  # all outputs at once: their number comes with the first block
                O = O or blk.shape[2]
                K = torch.empty(n1, n2, O, O, dtype=blk.dtype, device=blk.device)
            K[si, sj, oi, oj] = blk
            if same and bj != bi:
                K[sj, si, oj, oi] = blk.permute(1, 0, 3, 2)
    assert K is not None  # at least one row
    return K


def ntk_jacobian(model, params, buffers, x1, x2, chunk, same, out_chunk=None, n_out=None) -> torch.Tensor:
    """The kernel from ``jacrev`` Jacobians of whole chunks (:func:`_blocks`)."""

    def jac(x, o):  # list of (c, oc, p_b) blocks, one per parameter tensor
        j = jacrev(lambda p: flat_out(model, p, buffers, x)[:, o])(params)
        return [v.reshape(v.shape[0], v.shape[1], -1) for v in j.values()]

    def contract(ja, jb, ci, cj):
        return sum(torch.einsum("iap,jbp->ijab", a, b) for a, b in zip(ja, jb))

    return _blocks(model, params, buffers, x1, x2, chunk, same, out_chunk, n_out, jac, contract)


def ntk_per_example(model, params, buffers, x1, x2, chunk, same, out_chunk=None, n_out=None) -> torch.Tensor:
    """The kernel from per-example Jacobians ``vmap(jacrev(f))``, each example run alone (not batch-coupled),
    contracted as one matrix product per parameter tensor."""

    def jac(x, o):  # one (c·oc, p_b) matrix per parameter tensor
        def f(p, xi):
            return flat_out(model, p, buffers, xi.unsqueeze(0))[0, o]

        with warnings.catch_warnings():  # ops without a batching rule (fused attention) run as a loop: fine
            warnings.filterwarnings("ignore", message="There is a performance drop")
            j = vmap(jacrev(f), in_dims=(None, 0))(params, x)
        return [v.reshape(v.shape[0] * v.shape[1], -1) for v in j.values()]

    def contract(ja, jb, ci, cj):
        G = ja[0] @ jb[0].T
        for a, b in zip(ja[1:], jb[1:]):
            G.addmm_(a, b.T)
        return G.view(ci, G.shape[0] // ci, cj, G.shape[1] // cj).permute(0, 2, 1, 3)

    return _blocks(model, params, buffers, x1, x2, chunk, same, out_chunk, n_out, jac, contract)


def ntk_products(model, params, buffers, x1, x2, chunk=None, coupled=False):
    """NTK-vector products: column (j, b) of Θ is the jvp at x1 (``chunk`` rows at a time) along ``J(x2_j)ᵀ e_b``
    (the vjp on all of x2 when the examples are ``coupled``)."""
    n1, n2 = x1.shape[0], x2.shape[0]
    chunk = chunk or n1
    cols = None
    for j in range(n2):
        xj = x2 if coupled else x2[j : j + 1]
        out2, pull = vjp(lambda p, xj=xj: flat_out(model, p, buffers, xj), params)
        n_out = out2.shape[1]
        if cols is None:
            cols = torch.empty(n1, n2, n_out, n_out, dtype=out2.dtype, device=out2.device)
        for b in range(n_out):
            e = torch.zeros_like(out2)
            e[j if coupled else 0, b] = 1.0
            (g,) = pull(e)
            for i in range(0, n1, chunk):
                xi = x1[i : i + chunk]
                _, t = jvp(lambda p, xi=xi: flat_out(model, p, buffers, xi), (params,), (g,))
                cols[i : i + chunk, j, :, b] = t
    return cols


def forward_ad_ok(model, params, buffers, x: torch.Tensor) -> bool:
    """Whether one jvp (the ``"products"`` route) runs on this model."""
    try:
        zeros = {k: torch.zeros_like(v) for k, v in params.items()}
        jvp(lambda p: flat_out(model, p, buffers, x), (params,), (zeros,))
        return True
    except (RuntimeError, NotImplementedError):
        return False


def reraise_attention(exc: BaseException, model: nn.Module) -> None:
    """Say how to fix a forward-mode (jvp) failure inside fused attention; return for any other failure."""
    keys = ("scaled_dot_product", "flash", "efficient_attention", "sdpa", "_fused_sdp", "attention")
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if any(k in str(exc).lower() for k in keys) or (impl is not None and impl != "eager"):
        raise WidthscopeError(
            f"forward-mode differentiation (jvp) failed inside attention "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); fix: "
            'build or load the model with attn_implementation="eager" (e.g. '
            'AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), or '
            'model.set_attn_implementation("eager")): fused scaled-dot-product attention '
            "kernels have no forward-mode (jvp) derivative"
        ) from exc
