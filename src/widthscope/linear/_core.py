"""The core that :mod:`.model` and :mod:`.structured` share: parameters as dicts, a model's output
tensor, and the explicit-Jacobian and NTK-vector-product kernels (its own module so that neither
imports the other)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

from ..errors import WidthscopeError


def params_and_buffers(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Detached copies-free views: trainable parameters (requires_grad) and everything else."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    # Frozen parameters are constants of the linearization: pass them like buffers.
    buffers.update({k: v.detach() for k, v in model.named_parameters() if not v.requires_grad})
    return params, buffers


def model_output(out: Any) -> torch.Tensor:
    """The tensor a model's call returns: itself, ``.logits`` (HF) or the first element."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict) and "logits" in out:
        return out["logits"]
    raise WidthscopeError(
        f"model returned {type(out).__name__}; expected a tensor or an object with "
        "a .logits tensor (wrap the model so that it returns its output tensor)"
    )


def as_param_dtype(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Floating inputs in the parameters' dtype and device (float32 data with a float64 model)."""
    p0 = next(iter(params.values()), None)
    if p0 is None or not isinstance(x, torch.Tensor):
        return x
    if x.is_floating_point() and p0.is_floating_point():
        return x.to(device=p0.device, dtype=p0.dtype)
    return x.to(p0.device)


def first_output(model: nn.Module, params, buffers, x: torch.Tensor, who: str) -> torch.Tensor:
    """The model's (flattened) output on ``x``; a failing forward becomes a WidthscopeError."""
    try:
        with torch.no_grad():
            return flat_out(model, params, buffers, x)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise WidthscopeError(
            f"{who}: the model cannot run on inputs of shape {tuple(x.shape)} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "pass inputs shaped like the model's training inputs"
        ) from None


def flat_out(model: nn.Module, params, buffers, x: torch.Tensor) -> torch.Tensor:
    out = model_output(functional_call(model, (params, buffers), (x,)))
    return out.reshape(out.shape[0], -1)


def ntk_jacobian(model, params, buffers, x1, x2, chunk, same, out_chunk=None):
    """Σ over parameter blocks of J_b(x1) J_b(x2)ᵀ from Jacobians of ``chunk`` examples × ``out_chunk``
    outputs at a time; with ``x2 = x1`` only the upper block pairs (mirrored)."""

    def jac(x, o):  # list of (c, oc, p_b) blocks, one per parameter tensor
        j = jacrev(lambda p: flat_out(model, p, buffers, x)[:, o])(params)
        return [v.reshape(v.shape[0], v.shape[1], -1) for v in j.values()]

    def contract(ja, jb):
        return sum(torch.einsum("iap,jbp->ijab", a, b) for a, b in zip(ja, jb))

    n1, n2 = x1.shape[0], x2.shape[0]
    O = flat_out(model, params, buffers, x1[:1]).shape[1] if out_chunk else None
    outs = [slice(a, a + out_chunk) for a in range(0, O, out_chunk)] if out_chunk else [slice(None)]
    b1 = [(slice(i, min(i + chunk, n1)), o) for i in range(0, n1, chunk) for o in outs]
    b2 = b1 if same else [(slice(j, min(j + chunk, n2)), o) for j in range(0, n2, chunk) for o in outs]
    kept = None if same or len(b2) > 1 else jac(x2[b2[0][0]], b2[0][1])  # x2's one block, kept
    K = None
    for bi, (si, oi) in enumerate(b1):
        ja = jac(x1[si], oi)
        for bj, (sj, oj) in enumerate(b2):
            if same and bj < bi:
                continue
            jb = ja if same and bj == bi else kept if kept is not None else jac((x1 if same else x2)[sj], oj)
            blk = contract(ja, jb)
            if K is None:
                O = O or blk.shape[2]
                K = torch.empty(n1, n2, O, O, dtype=blk.dtype, device=blk.device)
            K[si, sj, oi, oj] = blk
            if same and bj != bi:
                K[sj, si, oj, oi] = blk.permute(1, 0, 3, 2)
    return K


def _per_example_jac(model, params, buffers, x: torch.Tensor, o: slice) -> list[torch.Tensor]:
    """Per-example Jacobians ``vmap(jacrev(f))`` over the rows of ``x``, outputs ``o``: one ``(c·oc, p_b)``
    matrix per parameter tensor. Each example is run alone (a batch of one), so a backward pass touches
    its own example only: ``c·oc`` passes of one example, not ``c·oc`` passes of the whole chunk."""

    def f(p, xi):
        return flat_out(model, p, buffers, xi.unsqueeze(0))[0, o]

    with warnings.catch_warnings():  # ops without a batching rule (fused attention) run as a loop: fine
        warnings.filterwarnings("ignore", message="There is a performance drop")
        j = vmap(jacrev(f), in_dims=(None, 0))(params, x)
    return [v.reshape(v.shape[0] * v.shape[1], -1) for v in j.values()]


def ntk_per_example(model, params, buffers, x1, x2, chunk, same, out_chunk=None, n_out=None):
    """``Σ_b J_b(x1) J_b(x2)ᵀ`` from per-example Jacobians (:func:`_per_example_jac`) of ``chunk`` examples ×
    ``out_chunk`` outputs at a time, contracted as one matrix product per parameter tensor (accumulated in
    place); with ``x2 = x1`` only the upper block pairs (mirrored). Examples must not be batch-coupled."""
    n1, n2 = x1.shape[0], x2.shape[0]
    if out_chunk:
        O = n_out or flat_out(model, params, buffers, x1[:1]).shape[1]
        outs = [slice(a, min(a + out_chunk, O)) for a in range(0, O, out_chunk)]
    else:  # all outputs at once: their number comes with the first Jacobian block (no extra forward pass)
        O, outs = 0, [slice(None)]
    b1 = [(slice(i, min(i + chunk, n1)), o) for i in range(0, n1, chunk) for o in outs]
    b2 = b1 if same else [(slice(j, min(j + chunk, n2)), o) for j in range(0, n2, chunk) for o in outs]
    kept = None if same or len(b2) > 1 else _per_example_jac(model, params, buffers, x2[b2[0][0]], b2[0][1])
    K = None
    for bi, (si, oi) in enumerate(b1):
        ja = _per_example_jac(model, params, buffers, x1[si], oi)
        for bj, (sj, oj) in enumerate(b2):
            if same and bj < bi:
                continue
            jb = (
                ja
                if same and bj == bi
                else kept
                if kept is not None
                else _per_example_jac(model, params, buffers, (x1 if same else x2)[sj], oj)
            )
            G = ja[0] @ jb[0].T
            for a, b in zip(ja[1:], jb[1:]):
                G.addmm_(a, b.T)
            if K is None:
                O = O or G.shape[0] // (si.stop - si.start)
                K = torch.empty(n1, n2, O, O, dtype=G.dtype, device=G.device)
            blk = G.view(si.stop - si.start, len(range(O)[oi]), sj.stop - sj.start, len(range(O)[oj]))
            K[si, sj, oi, oj] = blk.permute(0, 2, 1, 3)
            if same and bj != bi:
                K[sj, si, oj, oi] = blk.permute(2, 0, 3, 1)
    return K


def vmap_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says an operator has no batching rule under ``vmap`` (the per-example route vmaps the
    forward pass too; ``jacrev`` over a batch vmaps only the backward)."""
    return isinstance(exc, RuntimeError) and "vmap" in str(exc).lower()


def ntk_products(model, params, buffers, x1, x2, chunk=None, coupled=False):
    """NTK-vector products: column (j, b) of Θ is jvp at x1 along g = J(x2_j)ᵀ e_b; the jvp over ``chunk``
    rows of x1 at a time, the vjp on row j alone (on all of x2 when the examples are ``coupled``)."""
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


ATTENTION_FIX = (
    'build or load the model with attn_implementation="eager" (e.g. '
    'AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), or '
    'model.set_attn_implementation("eager")): fused scaled-dot-product attention '
    "kernels have no forward-mode (jvp) derivative"
)


def _is_attention_ad_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    keys = ("scaled_dot_product", "flash", "efficient_attention", "sdpa", "_fused_sdp", "attention")
    return any(k in msg for k in keys)


def _uses_fused_attention(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    return impl is not None and impl != "eager"


def reraise_attention(exc: BaseException, model: nn.Module) -> None:
    if _is_attention_ad_error(exc) or _uses_fused_attention(model):
        raise WidthscopeError(
            f"forward-mode differentiation (jvp) failed inside attention "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); fix: "
            f"{ATTENTION_FIX}"
        ) from exc
