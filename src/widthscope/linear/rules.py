r"""Which modules the structured NTK covers, and the per-example gradient features each one gives.

A covered module turns its captured input ``a`` and back-propagated output signals
``δ_o = ∂f_o/∂z`` (for every output component ``o``) into *records* that
:mod:`widthscope.linear.gram` contracts into kernel terms:

- ``nn.Linear``, widthscope's ``ScaledLinear`` (``z = m·a Wᵀ + b``) and transformers' ``Conv1D``
  (GPT-2, ``z = a W + b`` with ``W`` of shape ``(in, out)``): a *dense* record, weight term
  ``m² Σ_{t,s}(δ_t·δ'_s)(a_t·a'_s)`` over the positions ``t`` (every index but the first and the last)
  and bias term ``(Σ_t δ_t)·(Σ_s δ'_s)``.
- ``nn.Conv1d``/``nn.Conv2d`` (any stride, dilation, padding and padding mode, any ``groups``):
  the weight gradient is ``Σ_l δ_l ⊗ patch_l`` over output locations ``l`` (im2col), so a dense
  record per group with the unfolded patches as ``a`` and locations as positions; bias as above.
- ``nn.Embedding``: ``∂z_t/∂W_v = [id_t = v]``, so the weight term is
  ``Σ_{t,s} [id_t = id'_s] (δ_t·δ'_s)``: a dense record whose ``a_t`` is the one-hot of ``id_t``
  (built at contraction time over the ids the two batches share); positions holding
  ``padding_idx`` are dropped (that row gets no gradient). ``max_norm``/``scale_grad_by_freq``
  embeddings are left to the generic path.
- elementwise affine modules ``z = c(a) ⊙ w + b`` (``nn.LayerNorm``, ``nn.RMSNorm``, Hugging Face
  ``*RMSNorm``/``*LayerNorm`` classes, ``nn.GroupNorm``, ``BatchNorm`` in eval mode — any leaf module
  whose class name contains ``Norm`` and whose only parameters are a ``weight`` and a ``bias`` of
  the same shape, matching either the trailing dims or dim 1 of the output): the per-example
  gradients ``Σ_t δ_t ⊙ c_t`` (weight) and ``Σ_t δ_t`` (bias) are formed explicitly (a *vector*
  record, ``F`` = the parameter count). ``c = ∂z/∂w`` is one forward-mode product of the module
  alone along ``w = 1`` — computed from the module's input, never as ``(z − b)/w`` — so Gemma's
  ``(1 + w)`` scale is handled too. Whether a module really is elementwise is *checked* on the probe
  input: the jvp along a random tangent ``u`` must equal ``c ⊙ u`` (and ``v`` for the bias).

- ``nn.MultiheadAttention``: torch's own ``F.multi_head_attention_forward`` runs with its ``F.linear``
  calls recorded (:class:`LinearTaps`); each in-projection (the packed one or its slices, which must
  tile the parameter) and the out-projection is a dense record (:func:`mha_records`).
- a weight tied between dense layers/embeddings: each use's per-example gradient (:func:`tied_use`),
  summed before the product.

Example::

    >>> import torch
    >>> rule(torch.nn.Linear(3, 2)), rule(torch.nn.Conv2d(1, 2, 3)), rule(torch.nn.LayerNorm(4))
    ('dense', 'conv', 'elementwise')
"""
from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jvp
from torch.overrides import TorchFunctionMode

__all__ = ["rule", "multiplier", "elementwise_layout", "records", "LinearTaps", "mha_taps", "mha_records", "tied_use"]


def multiplier(m: nn.Module) -> float | None:
    """``m`` of a dense layer ``z = m·a Wᵀ + b`` (``None``: not a dense layer)."""
    if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward:
        return 1.0
    if type(m).__name__ == "ScaledLinear" and hasattr(m, "multiplier"):
        return float(m.multiplier)
    if (type(m).__name__ == "Conv1D" and hasattr(m, "nf") and getattr(m, "weight", None) is not None
            and m.weight.dim() == 2 and m.weight.shape[1] == m.nf):
        return 1.0
    return None


def _own_params(m: nn.Module) -> dict[str, nn.Parameter]:
    return dict(m.named_parameters(recurse=False))


def rule(m: nn.Module) -> str | None:
    """``"dense"``, ``"conv"``, ``"embedding"``, ``"elementwise"`` (to be checked), ``"mha"`` or ``None``."""
    if isinstance(m, nn.MultiheadAttention):
        return "mha"
    if multiplier(m) is not None:
        return "dense"
    if type(m) in (nn.Conv1d, nn.Conv2d):
        return "conv"
    if type(m) is nn.Embedding:
        return "embedding" if m.max_norm is None and not m.scale_grad_by_freq else None
    own = _own_params(m)
    if ("Norm" in type(m).__name__ and not list(m.children()) and "weight" in own
            and set(own) <= {"weight", "bias"} and all(p.shape == own["weight"].shape for p in own.values())):
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or not m.track_running_stats):
            return None  # batch statistics couple the examples (the caller reports it)
        return "elementwise"
    return None


def _affine_fn(m: nn.Module, x: torch.Tensor):
    names = list(_own_params(m))
    return names, (lambda *ps: functional_call(m, dict(zip(names, ps)), (x,)))


def _expand(v: torch.Tensor, y: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "last":
        return v.reshape((1,) * (y.dim() - v.dim()) + tuple(v.shape))
    return v.reshape((1, -1) + (1,) * (y.dim() - 2))


def elementwise_layout(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """``"last"``/``"channel"`` when ``z = c(x) ⊙ w + b`` holds on ``x`` (checked by jvps), else ``None``."""
    own = {k: v.detach() for k, v in _own_params(m).items()}
    S = tuple(own["weight"].shape)
    cands = []
    if y.dim() >= len(S) + 1 and tuple(y.shape[y.dim() - len(S):]) == S:
        cands.append("last")
    if len(S) == 1 and y.dim() >= 2 and y.shape[1] == S[0]:
        cands.append("channel")
    names, f = _affine_fn(m, x.detach())
    prim = tuple(own[k] for k in names)
    g = torch.Generator().manual_seed(1234)
    tol = 1e-9 if y.dtype == torch.float64 else 1e-4
    for layout in cands:
        ok = True
        for k in names:
            u = torch.randn(S, generator=g).to(own[k])
            ones = torch.ones_like(u)
            with torch.no_grad():
                dz_u = jvp(f, prim, tuple(u if n == k else torch.zeros_like(own[n]) for n in names))[1]
                dz_1 = jvp(f, prim, tuple(ones if n == k else torch.zeros_like(own[n]) for n in names))[1]
            want = dz_1 * _expand(u, y, layout)
            if k == "bias":
                ok = ok and torch.allclose(dz_1, torch.ones_like(dz_1), rtol=tol, atol=tol)
            scale = float(want.abs().max()) if want.numel() else 0.0
            ok = ok and dz_u.shape == y.shape and bool(((dz_u - want).abs() <= tol * (1 + scale)).all())
        if ok:
            return layout
    return None


def _unfold(m: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """im2col patches ``(n, L, C_in·K)`` of a Conv1d/Conv2d input, padding as the module pads."""
    mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
    x = nn.functional.pad(x, m._reversed_padding_repeated_twice, mode=mode)
    if isinstance(m, nn.Conv1d):
        x = x.unsqueeze(2)
        k, d, s = (1, m.kernel_size[0]), (1, m.dilation[0]), (1, m.stride[0])
    else:
        k, d, s = m.kernel_size, m.dilation, m.stride
    return nn.functional.unfold(x, k, dilation=d, stride=s).transpose(1, 2)


def records(kind: str, m: nn.Module, x: Any, delta: torch.Tensor, covered: set[str],
            layout: str | None) -> list[tuple]:
    """Records of one module from its input ``x`` (``(n, ...)``) and signals ``delta`` (``(o, n, ...)``).

    ``covered``: which of ``{"weight", "bias"}`` are on the structured path. Records:
    ``("dense", a (n,T,D_a), δ (o,n,T,D_δ), m², w_on, b_on)``, ``("embed", ids (n,T), δ (o,n,T,D))``,
    ``("vector", g (o,n,F))``."""
    O, n = delta.shape[:2]
    w_on, b_on = "weight" in covered, "bias" in covered
    if kind == "dense":
        mult = multiplier(m)
        a = x.reshape(n, -1, x.shape[-1])
        d = delta.reshape(O, n, -1, delta.shape[-1])
        return [("dense", a, d, mult ** 2, w_on, b_on)]
    if kind == "conv":
        G = m.groups
        patches = _unfold(m, x) if w_on else None  # (n, L, C_in·K), channel-major columns
        d = delta.reshape(O, n, delta.shape[2], -1).transpose(2, 3)  # (o, n, L, C_out)
        out = []
        cin, cout = m.in_channels // G, m.out_channels // G
        K = patches.shape[2] // m.in_channels if patches is not None else 0
        for gi in range(G):
            a = patches[:, :, gi * cin * K:(gi + 1) * cin * K] if patches is not None else None
            out.append(("dense", a, d[..., gi * cout:(gi + 1) * cout], 1.0, w_on, b_on))
        return out
    if kind == "embedding":
        ids = x.reshape(n, -1)
        d = delta.reshape(O, n, ids.shape[1], -1)
        if m.padding_idx is not None:
            d = d * (ids != m.padding_idx).to(d.dtype)[None, :, :, None]
        return [("embed", ids, d)] if w_on else []
    # elementwise
    own = {k: v.detach() for k, v in _own_params(m).items()}
    names, f = _affine_fn(m, x.detach())
    prim = tuple(own[k] for k in names)
    S = own["weight"].numel()
    gs = []
    for k in ("weight", "bias"):
        if k not in covered:
            continue
        with torch.no_grad():
            c = jvp(f, prim, tuple(torch.ones_like(own[q]) if q == k else torch.zeros_like(own[q])
                                   for q in names))[1]
        g = delta * c[None]
        if layout == "last":
            g = g.reshape(O, n, -1, S).sum(2)
        else:
            g = g.reshape(O, n, S, -1).sum(3)
        gs.append(g)
    return [("vector", torch.cat(gs, dim=2))] if gs else []


def _with_globals(fn, g: dict):
    f = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    f.__kwdefaults__ = fn.__kwdefaults__
    return f


def _tapped_mha(calls: list):
    """``F.multi_head_attention_forward`` — torch's own code, unchanged — with its ``linear`` (and that of the
    in-projection helpers it calls) recording ``(input, weight, bias, output)`` in ``calls``."""
    F = nn.functional
    g = dict(vars(F))

    def linear(input, weight, bias=None):
        out = F.linear(input, weight, bias)
        calls.append((input, weight, bias, out))
        return out

    g["linear"] = linear
    g["has_torch_function"] = lambda *_: False  # this copy is what the dispatch below already chose
    for name in ("_in_projection_packed", "_in_projection"):
        g[name] = _with_globals(getattr(F, name), g)
    return _with_globals(F.multi_head_attention_forward, g)


class LinearTaps(TorchFunctionMode):
    """While active, ``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` runs off its fused fast
    path, which autograd-enabled calls never take) runs with its in- and out-projection ``F.linear`` calls
    recorded in ``calls`` as ``(input, weight, bias, output)``: the signals are taken at those outputs."""

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types=(), args=(), kwargs=None):
        if func is nn.functional.multi_head_attention_forward:
            return _tapped_mha(self.calls)(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _slice_of(t: torch.Tensor | None, params: dict[str, torch.Tensor]) -> str | None:
    """The parameter ``t`` is, or is a view of (a packed projection's row slice)."""
    if t is None:
        return None
    base = t if t._base is None else t._base
    return next((k for k, p in params.items() if base is p), None)


def _partitions(parts: list[torch.Tensor], p: torch.Tensor) -> bool:
    """The contiguous slices ``parts`` tile ``p`` exactly (each number used by exactly one slice)."""
    if not all(q.is_contiguous() for q in parts):
        return False
    pos = p.storage_offset()
    for q in sorted(parts, key=lambda q: q.storage_offset()):
        if q.storage_offset() != pos:
            return False
        pos += q.numel()
    return pos == p.storage_offset() + p.numel()


def mha_taps(m: nn.MultiheadAttention, calls: list, n: int) -> list[tuple] | None:
    """``(weight name, bias name, a (n, L, D_a), z)`` per ``F.linear`` call of one ``nn.MultiheadAttention``
    forward on ``n`` examples, or ``None`` when a call does not fit (a weight that is not the module's, a
    packed parameter whose slices do not tile it, an input that is not batched). ``F.multi_head_attention_forward``
    works sequence-first: the in-projections see ``(L, n, E)``, the out-projection ``(L·n, E)`` rows in
    ``(position, example)`` order (for ``batch_first`` too: the module transposes first)."""
    params = dict(m.named_parameters())
    used: dict[str, list[torch.Tensor]] = {}
    out = []
    for x, w, b, z in calls:
        kw, kb = _slice_of(w, params), _slice_of(b, params)
        if kw is None or (b is not None and kb is None) or not isinstance(x, torch.Tensor):
            return None
        used.setdefault(kw, []).append(w)
        if kb is not None:
            used.setdefault(kb, []).append(b)
        if x.dim() == 3 and x.shape[1] == n:
            a = x.detach().transpose(0, 1)
        elif x.dim() == 2 and x.shape[0] % n == 0:
            a = x.detach().reshape(-1, n, x.shape[1]).transpose(0, 1)
        else:
            return None
        out.append((kw, kb, a, z))
    if not all(_partitions(v, params[k]) for k, v in used.items()):
        return None
    return out


def mha_records(taps: list[tuple], deltas: list[torch.Tensor], covered: set[str]) -> list[tuple]:
    """Dense records of the projections of one ``nn.MultiheadAttention`` (``taps`` from :func:`mha_taps`,
    ``deltas[k]``: ``(o, *z_k.shape)``): each projection (or slice of the packed one) is ``z = a Wᵀ + b``
    at the positions, and disjoint slices of a parameter add up to its kernel term."""
    recs = []
    for (kw, kb, a, z), d in zip(taps, deltas):
        n, L = a.shape[:2]
        d = d.reshape(d.shape[0], L, n, d.shape[-1]).transpose(1, 2)
        w_on, b_on = kw in covered, kb is not None and kb in covered
        if w_on or b_on:
            recs.append(("dense", a, d, 1.0, w_on, b_on))
    return recs


def tied_use(kind: str, m: nn.Module, x: Any, delta: torch.Tensor) -> tuple:
    """One use of a weight that several modules share (a tied input embedding and LM head), as what its
    per-example gradient is built from (:func:`widthscope.linear.gram.tied_gradients`):
    ``("linear", a, δ, m)`` (``z = m·a Wᵀ``: ``∂f/∂W = m Σ_t δ_t a_tᵀ``), ``("conv1d", a, δ, 1)``
    (transformers' ``Conv1D``, ``W`` is ``(in, out)``: ``Σ_t a_t δ_tᵀ``) or ``("embed", ids, δ, 1)``
    (``∂f/∂W_v = Σ_t [id_t = v] δ_t``, ``padding_idx`` positions dropped)."""
    O, n = delta.shape[:2]
    if kind == "embedding":
        rec = records(kind, m, x, delta, {"weight"}, None)[0]
        return ("embed", rec[1], rec[2], 1.0)
    a, d = x.reshape(n, -1, x.shape[-1]), delta.reshape(O, n, -1, delta.shape[-1])
    return ("conv1d", a, d, 1.0) if type(m).__name__ == "Conv1D" else ("linear", a, d, multiplier(m))
