r"""Probing a model dispatched over devices or offloaded to disk (accelerate's big-model hooks).

:func:`recompute_blocks` makes each main-stack block a non-reentrant checkpoint, so the backward
reloads one offloaded block at a time. Details: docs/big-models.md.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe.offload import recompute_blocks, recomputed
    >>> net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    >>> recompute_blocks(net, ["0", "2"])
    ['0', '2']
    >>> recomputed(net)
    ['0', '2']
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from .structure import main_stack

__all__ = [
    "input_device",
    "module_device",
    "offloaded_modules",
    "recompute_blocks",
    "restore_blocks",
    "recomputed",
    "recomputing",
    "copy_model",
    "recompute_flops",
    "TotalFlops",
]

_MARK = "_widthscope_recompute"  # set on a wrapped forward: the forward it wraps
# keyword arguments through which transformers blocks receive a key/value cache
_CACHE_KEYS = ("cache", "past_key_values", "past_key_value", "layer_past", "cache_params")
# set by recompute_flops(): where the FLOPs of each recomputation are written
_RECOMPUTED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("_RECOMPUTED", default=None)


def _placed(module: nn.Module) -> torch.device | None:
    """The execution device of ``module``'s accelerate hook, else its first parameter's not on ``meta``."""
    dev = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if dev is not None:
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    return next((p.device for p in module.parameters() if p.device.type != "meta"), None)


def input_device(model: nn.Module) -> torch.device:
    """The device a batch for ``model`` belongs on (:func:`_placed`, else the CPU)."""
    return _placed(model) or torch.device("cpu")


def module_device(model: nn.Module, name: str) -> torch.device:
    """The device module ``name`` computes on, else :func:`input_device`."""
    return _placed(model.get_submodule(name)) or input_device(model)


def offloaded_modules(model: nn.Module) -> list[str]:
    """Names in ``hf_device_map`` on ``"disk"``, or on ``"cpu"`` while the model executes on an accelerator."""
    dmap = getattr(model, "hf_device_map", None) or {}
    main = input_device(model).type
    return [n for n, d in dmap.items() if d == "disk" or (d == "cpu" and main != "cpu")]


def _inner_hooks(block: nn.Module) -> bool:
    """Whether a forward (pre-)hook sits on a module strictly inside ``block``."""
    return any(m is not block and (m._forward_hooks or m._forward_pre_hooks) for m in block.modules())


class _NoModules(contextlib.nullcontext):
    """Stands in for FlopCounterMode's module tracker: every count goes to the total only."""

    parents = ("Global",)


class TotalFlops(FlopCounterMode):
    """``FlopCounterMode``'s total without its per-module hooks (they hold checkpointed tensors)."""

    def __init__(self) -> None:
        super().__init__(display=False)
        self.mod_tracker = _NoModules()  # type: ignore[assignment]


@contextmanager
def _count_recompute(sink: list[int]) -> Iterator[None]:
    """The recomputation's context: its own FLOP counter, whose total goes to ``sink``."""
    counter = TotalFlops()
    try:
        with counter:
            yield
    finally:  # also when the recomputation stops early (by an exception)
        sink.append(int(counter.get_total_flops()))


def _contexts() -> tuple[Any, Any]:
    sink = _RECOMPUTED.get()
    return contextlib.nullcontext(), (contextlib.nullcontext() if sink is None else _count_recompute(sink))


def _wrap(block: nn.Module) -> Callable[..., Any]:
    inner = block.forward
    own = "forward" in block.__dict__  # an instance attribute already (accelerate's hooked forward)

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or any(kwargs.get(k) is not None for k in _CACHE_KEYS) or _inner_hooks(block):
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, context_fn=_contexts, **kwargs)

    setattr(forward, _MARK, (inner, own))
    return forward


def _wrapped(module: nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), _MARK, None) is not None


def _unwrap(block: nn.Module) -> None:
    inner, own = getattr(block.__dict__["forward"], _MARK)
    if own:
        block.forward = inner  # type: ignore[method-assign]
    else:
        del block.forward  # back to the class's forward


def recompute_blocks(model: nn.Module, blocks: Sequence[str] | None = None) -> list[str]:
    """Make each of ``blocks`` (default: the main stack) a checkpoint; :func:`restore_blocks` undoes it."""
    names = list(blocks) if blocks is not None else main_stack(model)
    for name in names:
        block = model.get_submodule(name)
        if not _wrapped(block):
            block.forward = _wrap(block)  # type: ignore[method-assign]
    return names


def recomputed(model: nn.Module) -> list[str]:
    """Names of the modules whose forward :func:`recompute_blocks` wrapped."""
    return [n for n, m in model.named_modules() if _wrapped(m)]


def restore_blocks(model: nn.Module) -> list[str]:
    """Undo :func:`recompute_blocks`: each wrapped module gets back the forward it had."""
    names = recomputed(model)
    for name in names:
        _unwrap(model.get_submodule(name))
    return names


@contextmanager
def recomputing(model: nn.Module, blocks: Sequence[str] | None = None) -> Iterator[list[str]]:
    """Within the block, :func:`recompute_blocks` and no key/value cache; both restored on exit."""
    before = set(recomputed(model))
    cfg = getattr(model, "config", None)
    use_cache = getattr(cfg, "use_cache", None)
    names = recompute_blocks(model, blocks)
    if use_cache:
        cfg.use_cache = False  # type: ignore[union-attr]
    try:
        yield names
    finally:
        if use_cache:
            cfg.use_cache = use_cache  # type: ignore[union-attr]
        for name in names:
            block = model.get_submodule(name)
            if name not in before and _wrapped(block):
                _unwrap(block)


@contextmanager
def recompute_flops() -> Iterator[list[int]]:
    """Within the block, each recomputation of a wrapped block appends its FLOPs to the yielded list."""
    sink: list[int] = []
    token = _RECOMPUTED.set(sink)
    try:
        yield sink
    finally:
        _RECOMPUTED.reset(token)


def _shared(model: nn.Module) -> dict[int, Any]:
    """A ``deepcopy`` memo of what a copy shares with ``model`` (offloaded weights, tied maps, offload folder)."""
    memo: dict[int, Any] = {}
    for m in model.modules():
        hook = getattr(m, "_hf_hook", None)
        for h in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):
            for attr in ("weights_map", "tied_params_map"):
                value = getattr(h, attr, None)
                if value is not None:
                    memo[id(value)] = value
    holder = model.__dict__.get("_widthscope_offload_folder")
    if holder is not None:
        memo[id(holder)] = holder
    return memo


def copy_model(model: nn.Module) -> nn.Module:
    """A ``deepcopy`` of ``model`` keeping a dispatched model's placement and sharing its offloaded weights."""
    names = restore_blocks(model)
    try:
        new = copy.deepcopy(model, _shared(model))
    finally:
        recompute_blocks(model, names)
    recompute_blocks(new, names)
    return new
