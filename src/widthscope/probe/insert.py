"""Function-preserving residual insertions at an insertion point.

The output ``z`` at ``point`` becomes ``z + b`` (``b = 0``) or ``z + W_out φ(W_in norm(z))`` (``W_out = 0``)
on the channel dimension; records in ``model.widthscope_config["insertions"]`` feed :func:`apply_insertions`.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe.insert import insert
    >>> m = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).eval()
    >>> x = torch.randn(5, 3); y0 = m(x)
    >>> m = insert(m, "1", kind="block", hidden=16)
    >>> torch.allclose(m(x), y0)
    True
"""

from __future__ import annotations

import inspect
import itertools
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _args
from ..errors import WidthscopeError
from ..options import INTERVENTION_KINDS
from .offload import module_device
from .points import insertion_points, resolve_points

__all__ = [
    "insert",
    "remove_insertion",
    "apply_insertions",
    "inserted_state",
    "inserted_parameters",
    "inserted",
    "Inserted",
    "ResidualBias",
    "ResidualBlock",
    "channel_dim",
]

NORMS = ("rms", "layer", "none")
STYLES = ("auto", "mlp", "conv1x1", "conv3x3")
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "tanh": torch.tanh,
    "silu": F.silu,
    "identity": lambda x: x,
}


def channel_dim(z: torch.Tensor, style: str = "auto") -> int:
    """The dimension a residual insertion acts on: ``auto`` takes dim 1 of 4-D and larger conv
    maps, else the last; ``conv1x1``/``conv3x3`` force dim 1, ``mlp`` the last."""
    if style == "conv3x3" and z.dim() != 4:
        raise WidthscopeError(
            f"style='conv3x3' needs a (batch, channels, height, width) output, got shape "
            f"{tuple(z.shape)}; use style='mlp' or 'auto'"
        )
    if style in ("conv1x1", "conv3x3"):
        if z.dim() < 3:
            raise WidthscopeError(
                f"style={style!r} needs a conv map (batch, channels, ...), got "
                f"shape {tuple(z.shape)}; use style='mlp' or 'auto'"
            )
        return 1
    if style == "mlp":
        return z.dim() - 1
    return 1 if z.dim() >= 4 else z.dim() - 1


class _ChannelNorm(nn.Module):
    """RMSNorm / LayerNorm over the channel dimension (which may be dim 1 of a conv map)."""

    def __init__(self, width: int, kind: str, eps: float = 1e-6):
        super().__init__()
        self.kind = kind
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))
        if kind == "layer":
            self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, z: torch.Tensor, dim: int) -> torch.Tensor:
        zc = z.movedim(dim, -1)
        if self.kind == "rms":
            out = zc * torch.rsqrt(zc.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        else:
            out = F.layer_norm(zc, (zc.shape[-1],), self.weight, self.bias, self.eps)
        return out.movedim(-1, dim)


class ResidualBias(nn.Module):
    """``z ↦ z + b`` with ``b ∈ R^N`` broadcast over every position (``b = 0`` at insertion)."""

    def __init__(self, width: int, *, style: str = "auto"):
        super().__init__()
        self.width = width
        self.style = style
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        dim = _width_dim(z, self.style, self.width)
        shape = [1] * z.dim()
        shape[dim] = self.width
        return z + self.bias.view(shape).to(z.dtype)


class ResidualBlock(nn.Module):
    """``z ↦ z + W_out φ(W_in norm(z))`` on the channel dimension, ``W_out = 0`` at insertion.

    ``W_in ~ N(0, init_scale²/fan_in)`` from ``seed``; ``keep_hidden`` keeps ``φ(W_in norm(z))`` in ``last_hidden``.
    """

    def __init__(
        self,
        width: int,
        hidden: int,
        *,
        activation: str = "gelu",
        norm: str = "rms",
        style: str = "auto",
        init_scale: float = 1.0,
        seed: int = 0,
    ):
        super().__init__()
        self.width, self.hidden, self.style = width, hidden, style
        self.activation = activation
        self.norm = None if norm == "none" else _ChannelNorm(width, norm)
        k = 3 if style == "conv3x3" else 1
        gen = torch.Generator().manual_seed(int(seed))
        w_in = torch.randn(hidden, width, k, k, generator=gen) * (init_scale / math.sqrt(width * k * k))
        if style == "conv3x3":
            self.w_in = nn.Parameter(w_in)
            self.w_out = nn.Parameter(torch.zeros(width, hidden, 3, 3))
        else:
            self.w_in = nn.Parameter(w_in[:, :, 0, 0].contiguous())
            self.w_out = nn.Parameter(torch.zeros(width, hidden))
        self.keep_hidden = False
        self.last_hidden: torch.Tensor | None = None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.delta(z)

    def delta(self, z: torch.Tensor, w_out: torch.Tensor | None = None) -> torch.Tensor:
        """``W_out φ(W_in norm(z))``, with ``w_out`` in place of ``self.w_out`` if given."""
        dim = _width_dim(z, self.style, self.width)
        u = self.norm(z, dim) if self.norm is not None else z
        act = ACTIVATIONS[self.activation]
        w_in, w_out = self.w_in.to(z.dtype), (self.w_out if w_out is None else w_out).to(z.dtype)
        conv = self.style == "conv3x3"
        h = act(F.conv2d(u, w_in, padding=1) if conv else u.movedim(dim, -1) @ w_in.T)  # mlp: channel last
        if self.keep_hidden:
            self.last_hidden = h
        return F.conv2d(h, w_out, padding=1) if conv else (h @ w_out.T).movedim(-1, dim)


def _width_dim(z: torch.Tensor, style: str, width: int) -> int:
    """:func:`channel_dim`, checked to hold ``width`` channels."""
    dim = channel_dim(z, style)
    if z.shape[dim] != width:
        raise WidthscopeError(
            f"the output at this insertion point has {z.shape[dim]} channels (shape "
            f"{tuple(z.shape)}, channel dim {dim}) but the insertion was built for width={width}; "
            f"pass width={z.shape[dim]} (or omit width to infer it)"
        )
    return dim


class Inserted(nn.Module):
    """Adds a residual insertion to ``inner``'s output; attributes missing here are looked up on ``inner``."""

    def __init__(self, inner: nn.Module, insertion: nn.Module, spec: Mapping[str, Any]):
        super().__init__()
        self.inner = inner
        self.widthscope_insert = insertion
        self.widthscope_spec = dict(spec)
        self.enabled = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        if not self.enabled:
            return out
        if isinstance(out, torch.Tensor):
            if not out.is_floating_point():
                raise WidthscopeError(
                    f"point {self.widthscope_spec.get('point')!r} outputs a {out.dtype} tensor; "
                    "insert at a point whose output is a float activation"
                )
            return self.widthscope_insert(out)
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            return (self.widthscope_insert(out[0]), *out[1:])
        raise WidthscopeError(
            f"point {self.widthscope_spec.get('point')!r} returns {type(out).__name__}, not a "
            "tensor (or a tuple starting with the hidden state), so it cannot take a residual "
            "insertion; choose a block-output point (see widthscope.probe.insertion_points)"
        )

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self._modules.get("inner")
            if inner is None:
                raise
            return getattr(inner, name)


def resolve_module(model: nn.Module, point: str) -> nn.Module:
    """The module at ``point``; an unknown point's error lists the valid names, closest first."""
    named = isinstance(point, str) and bool(point)
    if named:
        try:
            return model.get_submodule(point)
        except AttributeError:
            resolve_points(model, [point])  # raises, listing the valid names closest first
    try:  # the declared or default points, else the first module names
        valid = list(getattr(model, "widthscope_points", None) or insertion_points(model))
    except Exception:  # noqa: BLE001 - only used to build an error message
        valid = [n for n, _ in model.named_modules() if n][:50]
    what = "unknown insertion point" if named else "insertion point must be a non-empty module path, got"
    raise WidthscopeError(f"{what} {point!r}; valid points: {', '.join(valid)}")


def _infer_width(module: nn.Module) -> int | None:
    """Output width of ``module`` from its structure (verified again at the first forward)."""
    if isinstance(module, Inserted):
        module = module.inner

    def own(m: nn.Module) -> int | None:
        for attr in ("out_features", "out_channels", "num_features", "embedding_dim"):
            v = getattr(m, attr, None)
            if isinstance(v, int):
                return v
        ns = getattr(m, "normalized_shape", None)
        if isinstance(ns, (tuple, list)) and len(ns) == 1:
            return int(ns[0])
        return None

    w = own(module)
    if w is not None:
        return w
    for attr in ("hidden_size", "width", "channels"):
        v = getattr(module, attr, None)
        if isinstance(v, int):
            return v
    cfg = getattr(module, "config", None)
    if cfg is not None and isinstance(getattr(cfg, "hidden_size", None), int):
        return cfg.hidden_size
    for m in reversed(list(module.modules())[1:]):  # last registered layer usually writes the output
        w = own(m)
        if w is not None:
            return w
        weight = getattr(m, "weight", None)
        if type(m).__name__.endswith(("RMSNorm", "LayerNorm")) and weight is not None:
            return int(weight.shape[0])
    return None


def _keeps_width(m: nn.Module) -> bool:
    """A parameter-free module that leaves the channel width unchanged (activation, dropout, identity)."""
    if isinstance(m, Inserted):
        return True
    if any(True for _ in m.parameters()):
        return False
    return (
        isinstance(m, (nn.Identity, nn.modules.dropout._DropoutNd))
        or type(m).__module__ == "torch.nn.modules.activation"
    )


def _infer_point_width(model: nn.Module, point: str, target: nn.Module) -> int | None:
    """Width at ``point``: the module's own, else (width-keeping, in a ``Sequential``) the previous sibling's."""
    w = _infer_width(target)
    if w is not None:
        return w
    inner = target.inner if isinstance(target, Inserted) else target
    if not _keeps_width(inner):
        return None
    parent_path, _, name = point.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not isinstance(parent, nn.Sequential) or not name.isdigit():
        return None
    for i in range(int(name) - 1, -1, -1):
        w = _infer_width(parent[i])
        if w is not None:
            return w
        if not _keeps_width(parent[i]):
            return None  # a layer of unknown output width (e.g. Flatten): do not guess past it
    return None


def insert(
    model: nn.Module,
    point: str,
    kind: str = "bias",
    *,
    width: int | None = None,
    hidden: int | None = None,
    activation: str = "gelu",
    norm: str = "rms",
    style: str = "auto",
    init_scale: float = 1.0,
    seed: int = 0,
    record: bool = True,
) -> nn.Module:
    """Add a zero-initialised residual bias or block to the output of ``model.<point>``, in place.

    ``width`` is inferred if omitted, ``hidden`` defaults to it; ``style`` as for :func:`channel_dim`;
    ``record`` appends the insertion to ``model.widthscope_config["insertions"]``.
    """
    fn = "insert"
    _args.module(fn, "model", model)
    _args.string(fn, "point", point, empty=True, accepts="a module path (str)")  # "": resolve_module lists the points
    _args.choice(fn, "kind", kind, INTERVENTION_KINDS)
    _args.integer(fn, "width", width, lo=1, optional=True)
    _args.integer(fn, "hidden", hidden, lo=1, optional=True)
    _args.choice(fn, "activation", activation, sorted(ACTIVATIONS))
    _args.choice(fn, "norm", norm, NORMS)
    _args.choice(fn, "style", style, STYLES)
    _args.number(fn, "init_scale", init_scale, 0.0, lo_open=True)
    _args.integer(fn, "seed", seed)
    _args.boolean(fn, "record", record)
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules()):
        raise WidthscopeError(
            "the model is in training mode and has BatchNorm layers, which couple the examples "
            "of a batch (per-example gradients and function preservation need fixed statistics); "
            "call model.eval() before inserting"
        )
    target = resolve_module(model, point)
    if isinstance(target, Inserted):
        raise WidthscopeError(
            f"point {point!r} already has a {target.widthscope_spec['kind']} insertion; remove it "
            "first with widthscope.probe.insert.remove_insertion(model, point)"
        )
    width = int(width) if width is not None else _infer_point_width(model, point, target)
    if width is None or width <= 0:
        raise WidthscopeError(
            f"cannot infer the output width of point {point!r} ({type(target).__name__}); "
            "pass width=<channels of its output>"
        )
    init_scale, seed = float(init_scale), int(seed)
    if kind == "block":
        hidden = int(hidden) if hidden is not None else width
        ins: nn.Module = ResidualBlock(
            width, hidden, activation=activation, norm=norm, style=style, init_scale=init_scale, seed=seed
        )
    else:
        hidden = None
        if style == "conv3x3":
            raise WidthscopeError("style='conv3x3' applies to kind='block' only; a bias has no kernel")
        ins = ResidualBias(width, style=style)
    ref = next(itertools.chain(target.parameters(), model.parameters()), None)
    if ref is not None:
        # an offloaded point's weights sit on "meta" between forwards: its hook knows where it runs
        ins = ins.to(device=module_device(model, point), dtype=ref.dtype if ref.is_floating_point() else None)
    values = locals()  # the recorded spec: every option but model and record, in signature order
    spec = {k: values[k] for k in inspect.signature(insert).parameters if k not in ("model", "record")}
    wrapper = Inserted(target, ins, spec)
    wrapper.train(target.training)
    _set_submodule(model, point, wrapper)
    if record:
        cfg = getattr(model, "widthscope_config", None)
        if not isinstance(cfg, dict):
            cfg = {}
            model.widthscope_config = cfg  # type: ignore[assignment]
        cfg.setdefault("insertions", []).append(dict(spec))
    return model


def _set_submodule(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if isinstance(parent, (nn.ModuleList, nn.Sequential)) and name.isdigit():
        parent[int(name)] = new
    else:
        setattr(parent, name, new)


def remove_insertion(model: nn.Module, point: str) -> nn.Module:
    """Undo :func:`insert` at ``point``: restore the original module and drop the record."""
    try:
        target = model.get_submodule(point)
    except AttributeError:
        target = None
    if not isinstance(target, Inserted):
        raise WidthscopeError(f"point {point!r} has no insertion to remove")
    _set_submodule(model, point, target.inner)
    cfg = getattr(model, "widthscope_config", None)
    if isinstance(cfg, dict) and cfg.get("insertions"):
        cfg["insertions"] = [s for s in cfg["insertions"] if s.get("point") != point]
    return model


@contextmanager
def inserted(model: nn.Module, point: str, kind: str, **options: Any) -> Iterator[Any]:
    """A temporary, unrecorded :func:`insert`: yields the inserted bias or block, removed on exit."""
    insert(model, point, kind, record=False, **options)
    try:
        yield model.get_submodule(point).widthscope_insert
    finally:
        remove_insertion(model, point)


def apply_insertions(model: nn.Module, config: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> nn.Module:
    """Re-create recorded insertions (``config["insertions"]`` or the list) on a freshly built model."""
    specs = config.get("insertions", []) if isinstance(config, Mapping) else list(config)
    for spec in specs or []:
        spec = dict(spec)
        point = spec.pop("point")
        kind = spec.pop("kind", "bias")
        try:
            insert(model, point, kind, **spec)
        except TypeError as exc:
            raise WidthscopeError(f"bad recorded insertion {spec!r} at {point!r}: {exc}") from None
    return model


def inserted_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters of all insertions (for training only the new parameters)."""
    return [p for n, p in model.named_parameters() if ".widthscope_insert." in f".{n}"]


def inserted_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of the inserted parameters, with the full ``<point>.widthscope_insert.*`` names."""
    return {n: t.detach().clone() for n, t in model.state_dict().items() if ".widthscope_insert." in f".{n}"}
