r"""Which modules the structured NTK covers (:func:`rule`), and the records (:func:`records`) each gives from
its captured input and back-propagated signals. Formulas: docs/linearization.md.

Example::

    >>> import torch
    >>> rule(torch.nn.Linear(3, 2)), rule(torch.nn.Conv2d(1, 2, 3)), rule(torch.nn.LayerNorm(4))
    ('dense', 'conv', 'elementwise')
    >>> rule(torch.nn.ConvTranspose2d(1, 2, 3)), rule(torch.nn.EmbeddingBag(5, 2)), rule(torch.nn.PReLU())
    ('conv_transpose', 'embedding_bag', 'prelu')
    >>> rule(torch.nn.EmbeddingBag(5, 2, mode="max")), rule(torch.nn.LSTM(2, 3))
    (None, None)
"""

from __future__ import annotations

import math
import types
from typing import Any, Mapping

import torch
from torch import nn
from torch.func import functional_call, jvp
from torch.overrides import TorchFunctionMode

__all__ = [
    "rule",
    "multiplier",
    "elementwise_layout",
    "records",
    "bag_input",
    "bag_gram",
    "LinearTaps",
    "mha_taps",
    "mha_records",
    "tied_use",
]


def multiplier(m: nn.Module) -> float | None:
    """``m`` of a dense layer ``z = m·a Wᵀ + b`` (``None``: not a dense layer)."""
    if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward:
        return 1.0
    if type(m).__name__ == "ScaledLinear" and hasattr(m, "multiplier"):
        scaled: Any = m  # widthscope.models.mlp.ScaledLinear, matched by name: a plain float attribute
        return float(scaled.multiplier)
    if type(m).__name__ == "Conv1D" and hasattr(m, "nf"):  # transformers' GPT-2 Conv1D, matched by name
        w = getattr(m, "weight", None)
        if w is not None and w.dim() == 2 and w.shape[1] == m.nf:
            return 1.0
    return None


def _own_params(m: nn.Module) -> dict[str, nn.Parameter]:
    return dict(m.named_parameters(recurse=False))


def rule(m: nn.Module) -> str | None:
    """The module's rule (``"dense"``, ``"conv"``, ``"mha"``, …; ``"elementwise"`` to be checked) or ``None``."""
    if isinstance(m, nn.MultiheadAttention):
        return "mha"
    if multiplier(m) is not None:
        return "dense"
    if type(m) in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        return "conv"
    if type(m) is nn.Embedding:
        return "embedding" if m.max_norm is None and not m.scale_grad_by_freq else None
    if type(m) in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
        return "conv_transpose"
    if type(m) is nn.EmbeddingBag:  # max: the gradient picks one row per coordinate, not linear in a closed form
        ok = m.mode in ("sum", "mean") and m.max_norm is None and not m.scale_grad_by_freq
        return "embedding_bag" if ok else None
    if type(m) is nn.PReLU:
        return "prelu"
    own = _own_params(m)
    if (
        "Norm" in type(m).__name__
        and not list(m.children())
        and "weight" in own
        and set(own) <= {"weight", "bias"}
        and all(p.shape == own["weight"].shape for p in own.values())
    ):
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or not m.track_running_stats):
            return None  # batch statistics couple the examples (the caller reports it)
        return "elementwise"
    if (
        own
        and not list(m.children())
        and type(m).__module__.split(".")[0] != "torch"
        and len({tuple(p.shape) for p in own.values()}) == 1
    ):
        return "elementwise"  # a user's leaf module owning same-shape parameters (LayerScale γ, ...): checked
    return None


def _affine_fn(m: nn.Module, x: torch.Tensor):
    """The module's own parameter names, their detached values, and ``f(*params)``: the module on ``x``."""
    own = _own_params(m)
    names = list(own)
    prim = tuple(p.detach() for p in own.values())
    return names, prim, (lambda *ps: functional_call(m, dict(zip(names, ps)), (x.clone(),)))  # in-place safe


def _dz(f, names: list[str], prim: tuple, k: str, t: torch.Tensor) -> torch.Tensor:
    """The change of ``f``'s output along parameter ``k`` in direction ``t`` (a jvp)."""
    with torch.no_grad():
        return jvp(f, prim, tuple(t if n == k else torch.zeros_like(p) for n, p in zip(names, prim)))[1]


def _expand(v: torch.Tensor, y: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "last":
        return v.reshape((1,) * (y.dim() - v.dim()) + tuple(v.shape))
    return v.reshape((1, -1) + (1,) * (y.dim() - 2))


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    scale = float(b.abs().max()) if b.numel() else 0.0
    return a.shape == b.shape and bool(((a - b).abs() <= tol * (1 + scale)).all())


def elementwise_layout(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """``"last"``/``"channel"`` when ``z = c(x) ⊙ w + b`` holds on ``x`` (checked by jvps), else ``None`` (also
    when the module alone on ``x`` does not reproduce ``y``, or has no forward derivative)."""
    names, prim, f = _affine_fn(m, x.detach())
    tol = 1e-9 if y.dtype == torch.float64 else 1e-4
    try:
        with torch.no_grad():
            if not _close(f(*prim), y.detach(), tol):
                return None
        return _layout_by_jvp(f, names, prim, y, tol)
    except Exception:  # noqa: BLE001 — whatever stops the recompute (a missing argument, no jvp rule): not covered
        return None


def _layout_by_jvp(f, names: list[str], prim: tuple, y: torch.Tensor, tol: float) -> str | None:
    S = tuple(prim[0].shape)
    cands = []
    if (y.dim() >= len(S) + 1 and tuple(y.shape[y.dim() - len(S) :]) == S) or (prim[0].numel() == 1 and y.dim() >= 1):
        cands.append("last")
    if len(S) == 1 and y.dim() >= 2 and y.shape[1] == S[0]:
        cands.append("channel")
    g = torch.Generator().manual_seed(1234)
    for layout in cands:
        ok = True
        for k, p in zip(names, prim):
            u = torch.randn(S, generator=g).to(p)
            dz_u, dz_1 = _dz(f, names, prim, k, u), _dz(f, names, prim, k, torch.ones_like(u))
            want = dz_1 * _expand(u, y, layout)
            if k == "bias":
                ok = ok and torch.allclose(dz_1, torch.ones_like(dz_1), rtol=tol, atol=tol)
            ok = ok and dz_u.shape == y.shape and _close(dz_u, want, tol)
        if ok:
            return layout
    return None


def _windows(
    x: torch.Tensor, kernel: tuple, dilation: tuple, stride: tuple, lengths: tuple | None = None
) -> torch.Tensor:
    """Sliding windows of an (already padded) ``(B, C, S_1..S_d)`` tensor: ``(B, C, L_1..L_d, K_1..K_d)``
    with ``[..., l, k] = x[..., l·stride + k·dilation]``; ``lengths`` keeps the first ``L_i`` windows."""
    for i, (k, d, st) in enumerate(zip(kernel, dilation, stride)):
        x = x.unfold(2 + i, d * (k - 1) + 1, st)[..., ::d]  # the new window dim goes last
        if lengths is not None:
            x = x.narrow(2 + i, 0, lengths[i])
    return x


def _unfold(m: nn.Conv1d | nn.Conv2d | nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """im2col patches ``(n, L, C_in·K)`` of a Conv1d/2d/3d input, padding as the module pads."""
    mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
    x = nn.functional.pad(x, m._reversed_padding_repeated_twice, mode=mode)
    d = len(m.kernel_size)
    p = _windows(x, m.kernel_size, m.dilation, m.stride)  # (n, C, L_1..L_d, K_1..K_d)
    p = p.permute(0, *range(2, 2 + d), 1, *range(2 + d, 2 + 2 * d))
    return p.reshape(x.shape[0], -1, x.shape[1] * math.prod(m.kernel_size))


def records(kind: str, m: Any, x: Any, delta: torch.Tensor, covered: set[str], layout: str | None) -> list[tuple]:
    """Records of one module from its input ``x`` ``(n, ...)``, signals ``delta`` ``(o, n, ...)`` and ``covered``
    attributes: ``("dense", a (n,T,D_a), δ (o,n,T,D_δ), m², w_on, b_on)``, ``("embed", ids (n,T), δ (o,n,T,D))``,
    ``("vector", g (o,n,F))``, ``("bag", ids (n,T), c (n,T), δ (o,n,D))``."""
    if not covered:  # a tied weight only: its records are the tie's (tied_use)
        return []
    O, n = delta.shape[:2]
    w_on, b_on = "weight" in covered, "bias" in covered
    if kind == "dense":
        mult = multiplier(m)
        assert mult is not None  # rule() calls exactly the layers with a multiplier dense
        return [("dense", x.reshape(n, -1, x.shape[-1]), delta.reshape(O, n, -1, delta.shape[-1]), mult**2, w_on, b_on)]
    if kind == "conv":
        G = m.groups
        a = _unfold(m, x).chunk(G, dim=2) if w_on else [None] * G  # (n, L, C_in·K), channel-major columns
        ds = delta.reshape(O, n, delta.shape[2], -1).transpose(2, 3).chunk(G, dim=3)  # (o, n, L, C_out)
        return [("dense", ag, dg, 1.0, w_on, b_on) for ag, dg in zip(a, ds)]
    if kind == "embedding":  # covered: the weight
        ids = x.reshape(n, -1)
        d = delta.reshape(O, n, ids.shape[1], -1)
        if m.padding_idx is not None:
            d = d * (ids != m.padding_idx).to(d.dtype)[None, :, :, None]
        return [("embed", ids, d)]
    if kind == "conv_transpose":
        out: list[tuple] = []
        if w_on:  # a dense record per group over input locations (_transposed_windows)
            a = x.reshape(n, m.in_channels, -1).transpose(1, 2).chunk(m.groups, dim=2)  # (n, L, C_in)
            w = _transposed_windows(m, x, delta).chunk(m.groups, dim=3)
            out = [("dense", ag, wg.reshape(O, n, wg.shape[2], -1), 1.0, True, False) for ag, wg in zip(a, w)]
        return out + ([("vector", delta.reshape(O, n, m.out_channels, -1).sum(3))] if b_on else [])
    if kind == "embedding_bag":
        ids, coef = x
        return [("bag", ids, coef.to(delta.dtype), delta.reshape(O, n, -1))]
    if kind == "prelu":  # z = max(a, 0) + w·min(a, 0): ∂z/∂w_c = min(a, 0) on channel c (all of a for one w)
        g = delta * x.clamp(max=0)[None].to(delta.dtype)
        one = m.num_parameters == 1
        return [("vector", g.reshape(O, n, -1).sum(2, keepdim=True) if one else g.reshape(O, n, x.shape[1], -1).sum(3))]
    # elementwise: z = c(x) ⊙ w + b along the layout, c = ∂z/∂w at w = 1
    names, prim, f = _affine_fn(m, x.detach())
    S = prim[0].numel()
    gs = []
    for k, p in zip(names, prim):
        if k in covered:
            g = delta * _dz(f, names, prim, k, torch.ones_like(p))[None]
            gs.append(g.reshape(O, n, -1, S).sum(2) if layout == "last" else g.reshape(O, n, S, -1).sum(3))
    return [("vector", torch.cat(gs, dim=2))]


def _transposed_windows(m: nn.modules.conv._ConvTransposeNd, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``∂f/∂W[c_i, c_o, k] = Σ_l x[c_i, l] δ[c_o, l·s − p + k·d]``: a ConvTranspose is a dense layer over input
    locations ``l`` with the signal windows ``δ[:, l·s − p + k·d]`` (zero outside), ``(o, n, L, C_out, K)``."""
    O, n = delta.shape[:2]
    lin = tuple(x.shape[2:])
    assert not isinstance(m.padding, str)  # typed on _ConvNd; transposed convs take numbers only
    pads = [q for p in reversed(m.padding) for q in (p, p)]
    d = nn.functional.pad(delta.reshape((O * n,) + tuple(delta.shape[2:])), pads)
    # output_padding / output_size only lengthen the output at the end: the first len(x) windows
    w = _windows(d, m.kernel_size, m.dilation, m.stride, lin)  # (o·n, C_out, L..., K...)
    return w.reshape(O, n, m.out_channels, math.prod(lin), -1).transpose(2, 3)


def bag_input(m: nn.EmbeddingBag, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    r"""An ``nn.EmbeddingBag`` call as padded bags ``(ids (B, T), c (B, T))``, ``z_b = Σ_t c_{b,t} W[ids_{b,t}]``
    (``c``: the per-sample weight or ``1/|bag|``, 0 on padding); ``None`` for calls of other forms."""
    names = ("input", "offsets", "per_sample_weights")
    inp, offsets, psw = (args[i] if i < len(args) else kwargs.get(k) for i, k in enumerate(names))
    if not isinstance(inp, torch.Tensor) or inp.dim() not in (1, 2):
        return None
    inp = inp.detach()
    psw = None if psw is None else psw.detach()
    if inp.dim() == 2:
        ids, valid = inp, torch.ones(inp.shape, dtype=torch.bool, device=inp.device)
    else:
        if not isinstance(offsets, torch.Tensor):
            return None
        N, offsets = inp.shape[0], offsets.detach().long()
        starts = offsets[:-1] if m.include_last_offset else offsets
        ends = offsets[1:] if m.include_last_offset else torch.cat([offsets[1:], offsets.new_tensor([N])])
        T = max(1, int((ends - starts).max())) if starts.numel() else 1
        pos = starts[:, None] + torch.arange(T, device=inp.device)[None]
        valid = pos < ends[:, None]
        pos = pos.clamp(max=max(N - 1, 0))
        ids = inp[pos] if N else torch.zeros(pos.shape, dtype=inp.dtype, device=inp.device)
        psw = None if psw is None else psw[pos] * valid
        ids = ids * valid  # padding slots hold id 0 with c = 0
    mask = valid if m.padding_idx is None else valid & (ids != m.padding_idx)
    dt = m.weight.dtype
    if m.mode == "mean":
        c = mask.to(dt) / mask.sum(1, keepdim=True).clamp(min=1).to(dt)
    else:
        c = mask.to(dt) if psw is None else psw.to(dt) * mask
    return ids.long(), c


def bag_gram(r1: tuple, r2: tuple, diag: bool) -> torch.Tensor:
    r"""The example-pair weights ``W_{ij} = Σ_{t,s} [id_{it} = id'_{js}] c_{it} c'_{js} = h_i·h'_j`` of two bag
    records (``h``: histograms of ``c`` over the shared ids; ``W_{ii}`` only when ``diag``)."""
    ids1, c1, ids2, c2 = r1[1], r1[2], r2[1], r2[2]
    inv = torch.unique(torch.cat([ids1.reshape(-1), ids2.reshape(-1)]), return_inverse=True)[1]
    U = int(inv.max()) + 1 if inv.numel() else 1
    h1 = c1.new_zeros(ids1.shape[0], U).scatter_add_(1, inv[: ids1.numel()].view(ids1.shape), c1)
    h2 = h1 if r1 is r2 else c2.new_zeros(ids2.shape[0], U).scatter_add_(1, inv[ids1.numel() :].view(ids2.shape), c2)
    return (h1 * h2).sum(1) if diag else h1 @ h2.T


def _with_globals(fn, g: dict):
    f = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    f.__kwdefaults__ = fn.__kwdefaults__
    return f


def _tapped_mha(calls: list):
    """torch's ``F.multi_head_attention_forward`` with its ``linear`` calls recorded in ``calls``."""
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
    """While active, ``F.multi_head_attention_forward`` records its ``F.linear`` calls in ``calls`` as
    ``(input, weight, bias, output)``."""

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types=(), args=(), kwargs=None):
        if func is nn.functional.multi_head_attention_forward:
            return _tapped_mha(self.calls)(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _slice_of(t: torch.Tensor | None, params: Mapping[str, torch.Tensor]) -> str | None:
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
    forward on ``n`` examples (sequence-first inputs), or ``None`` when a call does not fit."""
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
    ``deltas[k]``: ``(o, *z_k.shape)``)."""
    recs = []
    for (kw, kb, a, _z), d in zip(taps, deltas):
        n, L = a.shape[:2]
        d = d.reshape(d.shape[0], L, n, d.shape[-1]).transpose(1, 2)
        w_on, b_on = kw in covered, kb is not None and kb in covered
        if w_on or b_on:
            recs.append(("dense", a, d, 1.0, w_on, b_on))
    return recs


def tied_use(kind: str, m: nn.Module, x: Any, delta: torch.Tensor) -> tuple:
    """One use of a weight several modules share, for :func:`widthscope.linear.gram.tied_gradients`:
    ``("linear", a, δ, m)``, ``("conv1d", a, δ, 1)`` (``W`` is ``(in, out)``) or ``("embed", ids, δ, 1)``."""
    O, n = delta.shape[:2]
    if kind == "embedding":
        rec = records(kind, m, x, delta, {"weight"}, None)[0]
        return ("embed", rec[1], rec[2], 1.0)
    a, d = x.reshape(n, -1, x.shape[-1]), delta.reshape(O, n, -1, delta.shape[-1])
    return ("conv1d", a, d, 1.0) if type(m).__name__ == "Conv1D" else ("linear", a, d, multiplier(m))
