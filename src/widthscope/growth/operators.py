r"""Growth operators: a bigger copy of a trained model that starts from its weights (:class:`Growth`),
and the optimiser after growth (:func:`optimizer_after`). Details: docs/growth.md.

Example::

    >>> import torch
    >>> from widthscope.models import build
    >>> from widthscope.growth.operators import stack_depth
    >>> small = build("llama", 32, depth=2, heads=2, head_dim=16, kv_heads=1).double().eval()
    >>> x = torch.randint(0, 256, (2, 8))
    >>> g = stack_depth(small, mode="zero")
    >>> g.exact, g.model.config.num_hidden_layers
    (True, 4)
    >>> bool(torch.allclose(g.model(x).logits, small(x).logits, atol=1e-9))
    True
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Sequence

import torch
import torch.nn as nn

from .. import _args
from ..errors import WidthscopeError
from ..probe.insert import insert

__all__ = ["Growth", "zero_block", "stack_depth", "stack_order", "widen", "optimizer_after", "OPT_STATES"]

OPT_STATES = ("reset", "keep")
STACK_MODES = ("copy", "zero")
STACK_LAYOUTS = ("stack", "interleave")

# a parameter's origin: (old parameter name, the slices of the new tensor holding its old values), or None (new)
Source = tuple[str, tuple[slice, ...]] | None


@dataclasses.dataclass
class Growth:
    """A grown model; ``sources`` maps each parameter name to ``(old name, slices)`` (the old values
    sit in ``new[slices]``) or ``None`` (new); ``exact``: the function is unchanged by growth."""

    model: nn.Module
    operator: str
    sources: dict[str, Source]
    exact: bool
    new_parameters: int
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


def _require_llama(fn: str, model: nn.Module) -> None:
    _args.module(fn, "model", model)
    cfg, inner = getattr(model, "config", None), getattr(model, "model", None)
    if getattr(cfg, "model_type", None) != "llama" or not hasattr(inner, "layers"):
        raise WidthscopeError(
            f"{fn}(model=...): needs a LLaMA-style Hugging Face causal LM (LlamaForCausalLM, e.g. "
            f"widthscope.models.build('llama', ...)), got {type(model).__name__}; use zero_block for other models"
        )


def _full(shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _set_config(model: Any, **values: Any) -> None:
    hf = {"width": "hidden_size", "depth": "num_hidden_layers", "ffn": "intermediate_size"}
    hf.update(heads="num_attention_heads", kv_heads="num_key_value_heads")
    for key, value in values.items():
        if key in hf:
            setattr(model.config, hf[key], value)
    cfg = getattr(model, "widthscope_config", None)
    if isinstance(cfg, dict):
        cfg.update(values)


def zero_block(
    model: nn.Module, points: Sequence[str], *, hidden: int | None = None, seed: int = 0, activation: str = "gelu"
) -> Growth:
    """A copy of ``model`` with a zero-``W_out`` residual block at each of ``points`` (seed ``seed + i``)."""
    fn = "zero_block"
    _args.module(fn, "model", model)
    if isinstance(points, str) or not points:
        raise WidthscopeError(f"{fn}(points=...): give a non-empty list of insertion points, got {points!r}")
    grown = copy.deepcopy(model)
    before = {id(p): n for n, p in grown.named_parameters()}
    for i, point in enumerate(points):
        insert(grown, point, "block", hidden=hidden, seed=int(seed) + i, activation=activation)
    sources: dict[str, Source] = {}
    for n, p in grown.named_parameters():
        old = before.get(id(p))
        sources[n] = None if old is None else (old, _full(p.shape))
    return Growth(grown, "zero_block", sources, True, _count(grown) - _count(model), {"points": list(points)})


def stack_order(n_old: int, depth: int, layout: str = "stack") -> list[int]:
    """The old layer indices of a ``depth``-layer stack grown from ``n_old`` layers: ``"stack"``
    repeats the whole stack, ``"interleave"`` each layer in place (the top ``depth % n_old`` once more).

    >>> stack_order(2, 8), stack_order(3, 5), stack_order(2, 5, "interleave")
    ([0, 1, 0, 1, 0, 1, 0, 1], [0, 1, 2, 1, 2], [0, 0, 1, 1, 1])
    """
    fn = "stack_order"
    _args.integer(fn, "n_old", n_old, lo=1)
    _args.integer(fn, "depth", depth, lo=1)
    _args.choice(fn, "layout", layout, STACK_LAYOUTS)
    if depth < n_old:
        raise WidthscopeError(f"{fn}(depth={depth}): the grown stack needs at least the old {n_old} layers")
    k, r = divmod(depth, n_old)
    if layout == "stack":
        return list(range(n_old)) * k + list(range(n_old - r, n_old))
    return [i for i in range(n_old) for _ in range(k + (i >= n_old - r))]


def stack_depth(
    model: nn.Module,
    order: Sequence[int] | None = None,
    *,
    mode: str = "copy",
    depth: int | None = None,
    factor: int | None = None,
    layout: str = "stack",
) -> Growth:
    """A copy of a LLaMA-style decoder whose layers are the old ones in ``order`` (default
    :func:`stack_order` to ``depth``, ``factor × L`` or twice the layers). ``mode="zero"`` zeroes
    ``o_proj`` and ``down_proj`` of every repeat (function-preserving), ``"copy"`` does not."""
    fn = "stack_depth"
    _require_llama(fn, model)
    _args.choice(fn, "mode", mode, STACK_MODES)
    n_old = len(model.model.layers)  # type: ignore[union-attr, arg-type]
    if sum(x is not None for x in (order, depth, factor)) > 1:
        raise WidthscopeError(f"{fn}: give one of order=, depth= or factor=, not several")
    if factor is not None:
        _args.integer(fn, "factor", factor, lo=1)
        depth = int(factor) * n_old
    if order is None:
        order = stack_order(n_old, 2 * n_old if depth is None else depth, layout)
    order = [int(i) for i in order]
    if not order or any(i < 0 or i >= n_old for i in order):
        raise WidthscopeError(f"{fn}(order={order!r}): every entry must be an old layer index in 0..{n_old - 1}")
    if sorted(set(order)) != list(range(n_old)):
        raise WidthscopeError(f"{fn}(order={order!r}): every old layer 0..{n_old - 1} must appear at least once")
    grown: Any = copy.deepcopy(model)
    old_layers = grown.model.layers
    new_layers, seen, zeroed = [], set(), []
    sources: dict[str, Source] = {}
    shapes = {n: p.shape for n, p in model.named_parameters()}
    outputs = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
    for j, i in enumerate(order):
        zero = i in seen and mode == "zero"
        layer = copy.deepcopy(old_layers[i]) if i in seen else old_layers[i]
        layer.self_attn.layer_idx = j  # the key/value cache slot
        if zero:
            with torch.no_grad():
                for n in outputs:
                    layer.get_parameter(n).zero_()
            zeroed.append(j)
        seen.add(i)
        new_layers.append(layer)
        for n, _p in layer.named_parameters():
            old = f"model.layers.{i}.{n}"
            sources[f"model.layers.{j}.{n}"] = None if zero and n in outputs else (old, _full(shapes[old]))
    grown.model.layers = nn.ModuleList(new_layers)
    for n, p in grown.named_parameters():
        if not n.startswith("model.layers."):
            sources[n] = (n, _full(p.shape))
    _set_config(grown, depth=len(order))
    if getattr(grown.config, "layer_types", None) is not None:
        grown.config.layer_types = [grown.config.layer_types[i] for i in order]
    grown.widthscope_points = [f"model.layers.{j}" for j in range(len(order))]
    exact = mode == "zero" or order == list(range(n_old))
    return Growth(
        grown, f"stack_{mode}", sources, exact, _count(grown) - _count(model), {"order": order, "zeroed": zeroed}
    )


def _grow_linear(
    lin: nn.Linear, out_f: int, in_f: int, *, read_new_in: bool, write_new_out: bool, std: float, gen: torch.Generator
) -> None:
    """Enlarge ``lin`` to ``(out_f, in_f)`` keeping the old block; new columns/rows random if asked, else zero."""
    old = lin.weight.detach()
    o, i = old.shape
    w = torch.zeros(out_f, in_f, dtype=old.dtype, device=old.device)
    w[:o, :i] = old
    if read_new_in and in_f > i:
        w[:o, i:] = torch.randn(o, in_f - i, generator=gen, dtype=torch.float64).to(old) * std
    if write_new_out and out_f > o:
        w[o:, :] = torch.randn(out_f - o, in_f, generator=gen, dtype=torch.float64).to(old) * std
    lin.weight = nn.Parameter(w, requires_grad=lin.weight.requires_grad)
    lin.in_features, lin.out_features = in_f, out_f


def _grow_norm(norm: Any, n_new: int) -> None:
    """RMSNorm over ``n_new`` channels, unchanged on the old ones while the new are zero: weights ×
    √(N_old/N_new), ε × N_old/N_new."""
    old = norm.weight.detach()
    r = old.shape[0] / n_new
    w = torch.empty(n_new, dtype=old.dtype, device=old.device)
    w[: old.shape[0]] = old * math.sqrt(r)
    w[old.shape[0] :] = (old * math.sqrt(r)).mean()
    norm.weight = nn.Parameter(w, requires_grad=norm.weight.requires_grad)
    norm.variance_epsilon = norm.variance_epsilon * r


def _widen_sizes(model: nn.Module, width: int | None, ffn: int | None) -> dict[str, int]:
    cfg: Any = model.config
    n, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    width = n if width is None else int(width)
    if width < n:
        raise WidthscopeError(f"widen(width={width}): the new width must be at least the old {n}")
    heads = h
    if h * hd == n and width > n:  # attention as wide as the stream: grow the heads with it
        if width % (hd * (h // kv)):
            raise WidthscopeError(
                f"widen(width={width}): the heads (dimension {hd}, query groups of {h // kv}) must fill the "
                f"new width; choose a multiple of {hd * (h // kv)}"
            )
        heads = width // hd
    group = h // kv
    if ffn is None:
        ffn = f if width == n else max(f, int(round(f * width / n)))
    if ffn < f:
        raise WidthscopeError(f"widen(ffn={ffn}): the new MLP size must be at least the old {f}")
    return {"width": width, "ffn": int(ffn), "heads": heads, "kv_heads": heads // group, "head_dim": hd}


def widen(
    model: nn.Module, width: int | None = None, *, ffn: int | None = None, seed: int = 0, std: float | None = None
) -> Growth:
    """A function-preserving copy of a LLaMA-style decoder with hidden size ``width``, MLP size
    ``ffn`` (default scaled with it) and ``width // head_dim`` heads; ``std``: of the new reading weights."""
    fn = "widen"
    _require_llama(fn, model)
    _args.integer(fn, "width", width, lo=2, optional=True)
    _args.integer(fn, "ffn", ffn, lo=1, optional=True)
    s = _widen_sizes(model, width, ffn)
    grown: Any = copy.deepcopy(model)
    cfg = grown.config
    n, hd = cfg.hidden_size, s["head_dim"]
    std = float(cfg.initializer_range if std is None else std)
    gen = torch.Generator().manual_seed(int(seed))
    old_shapes = {k: p.shape for k, p in model.named_parameters()}
    inner = grown.model
    emb = inner.embed_tokens
    table = torch.zeros(emb.weight.shape[0], s["width"], dtype=emb.weight.dtype, device=emb.weight.device)
    table[:, :n] = emb.weight.detach()
    emb.weight = nn.Parameter(table)
    emb.embedding_dim = s["width"]
    N, q, kv, F = s["width"], s["heads"] * hd, s["kv_heads"] * hd, s["ffn"]
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        for lin, out_f in ((a.q_proj, q), (a.k_proj, kv), (a.v_proj, kv)):
            _grow_linear(lin, out_f, N, read_new_in=True, write_new_out=True, std=std, gen=gen)
        _grow_linear(a.o_proj, N, q, read_new_in=False, write_new_out=False, std=std, gen=gen)
        for lin in (m.gate_proj, m.up_proj):
            _grow_linear(lin, F, N, read_new_in=True, write_new_out=True, std=std, gen=gen)
        _grow_linear(m.down_proj, N, F, read_new_in=False, write_new_out=False, std=std, gen=gen)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            _grow_norm(norm, N)
    _grow_norm(inner.norm, N)
    _grow_linear(grown.lm_head, grown.lm_head.out_features, N, read_new_in=True, write_new_out=False, std=std, gen=gen)
    _set_config(grown, width=N, ffn=F, heads=s["heads"], kv_heads=s["kv_heads"])
    wcfg = getattr(grown, "widthscope_config", None)
    if isinstance(wcfg, dict):
        wcfg["rms_eps_scale"] = wcfg.get("rms_eps_scale", 1.0) * n / N
    sources: dict[str, Source] = {k: (k, _full(old_shapes[k])) for k, _ in grown.named_parameters()}
    return Growth(grown, "widen", sources, True, _count(grown) - _count(model), dict(s, old_width=n))


def optimizer_after(
    growth: Growth,
    old_model: nn.Module,
    old_opt: torch.optim.Optimizer | None,
    *,
    lr: float,
    mode: str = "reset",
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.AdamW:
    """An AdamW over the grown model: fresh (``mode="reset"``) or with ``old_opt``'s moments carried
    into the slices the old values went to (``"keep"``)."""
    fn = "optimizer_after"
    _args.choice(fn, "mode", mode, OPT_STATES)
    params = [p for p in growth.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
    if mode == "reset":
        return opt
    if old_opt is None:
        raise WidthscopeError(f"{fn}(mode='keep'): pass the old optimiser (old_opt)")
    old_params = dict(old_model.named_parameters())
    for name, p in growth.model.named_parameters():
        src = growth.sources.get(name)
        if src is None or not p.requires_grad:
            continue
        old_p = old_params[src[0]]
        st = old_opt.state.get(old_p)
        if not st:
            continue
        new: dict[str, Any] = {"step": st["step"].clone() if torch.is_tensor(st["step"]) else st["step"]}
        for key in ("exp_avg", "exp_avg_sq"):
            t = torch.zeros_like(p)
            t[src[1]] = st[key]
            new[key] = t
        opt.state[p] = new
    return opt
