r"""Probing a model dispatched over devices or offloaded to disk (accelerate's big-model hooks).

A dispatched model (``from_pretrained(device_map=...)`` or :func:`accelerate.dispatch_model`)
keeps the weights of offloaded modules on the ``meta`` device; accelerate's hooks load them
before each module's forward and drop them after. Two things change for the probe:

* **where the inputs go**: the model's first parameter may be on ``meta``; the inputs belong on
  the execution device of the root hook (:func:`input_device`).
* **memory**: the probe's backward needs what autograd saved in the forward — the weights of
  every linear layer among them — so without care every offloaded weight stays resident until
  the backward, and the budget is exceeded by the whole model. :func:`recompute_blocks` makes
  each block of the main stack a *checkpoint* (``torch.utils.checkpoint``, non-reentrant): the
  forward keeps only the block's inputs, the backward runs the block again (accelerate's hooks
  load its weights again) and frees it before the next. Peak memory: the resident part plus one
  block, at the cost of one more forward per block.

Why the numbers do not change: the recomputation runs the same operations on the same weights
and inputs (eval mode: no dropout; the RNG state is restored anyway), so the gradients equal a
plain backward's to float rounding. A block is run plainly (no checkpoint) when gradients are
off, when a forward hook sits strictly inside it (the recomputation would fire the hook twice:
e.g. an insertion point inside the block) or when a key/value cache is passed (the
recomputation would extend it twice).

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

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from .structure import main_stack

__all__ = [
    "input_device",
    "module_device",
    "offloaded_modules",
    "recompute_blocks",
    "restore_blocks",
    "recomputed",
    "recomputing",
]

_MARK = "_widthscope_recompute"  # set on a wrapped forward: the forward it wraps
# keyword arguments through which transformers blocks receive a key/value cache
_CACHE_KEYS = ("cache", "past_key_values", "past_key_value", "layer_past", "cache_params")


def input_device(model: nn.Module) -> torch.device:
    """The device a batch for ``model`` belongs on.

    A dispatched model: the execution device of accelerate's root hook (inputs are moved from
    there to each block's device, and outputs come back to the inputs' device); otherwise the
    device of the first parameter that is not on ``meta``; CPU for a model without parameters.
    """
    hook = getattr(model, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is not None:
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def module_device(model: nn.Module, name: str) -> torch.device:
    """The device module ``name`` computes on: the execution device of its accelerate hook (an
    offloaded module's weights are on ``meta`` between forwards), else its first parameter's
    that is not on ``meta``, else :func:`input_device`. Where a module inserted at ``name``
    belongs (:func:`widthscope.probe.insert.insert`)."""
    module = model.get_submodule(name)
    dev = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if dev is not None:
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return input_device(model)


def offloaded_modules(model: nn.Module) -> list[str]:
    """Names in the model's device map (``hf_device_map``) whose weights live off the execution
    devices: on ``"disk"``, or on ``"cpu"`` while the model executes on an accelerator."""
    dmap = getattr(model, "hf_device_map", None) or {}
    main = input_device(model).type
    return [n for n, d in dmap.items() if d == "disk" or (d == "cpu" and main != "cpu")]


def _inner_hooks(block: nn.Module) -> bool:
    """Whether a forward (pre-)hook sits on a module strictly inside ``block``."""
    for m in block.modules():
        if m is not block and (m._forward_hooks or m._forward_pre_hooks):
            return True
    return False


def _has_cache(kwargs: dict[str, Any]) -> bool:
    return any(kwargs.get(k) is not None for k in _CACHE_KEYS)


def _wrap(block: nn.Module) -> Callable[..., Any]:
    inner = block.forward
    own = "forward" in block.__dict__  # an instance attribute already (accelerate's hooked forward)

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or _has_cache(kwargs) or _inner_hooks(block):
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    setattr(forward, _MARK, (inner, own))
    return forward


def _unwrap(block: nn.Module) -> None:
    inner, own = getattr(block.__dict__["forward"], _MARK)
    if own:
        block.forward = inner  # type: ignore[method-assign]
    else:
        del block.forward  # back to the class's forward


def recompute_blocks(model: nn.Module, blocks: Sequence[str] | None = None) -> list[str]:
    """Make each block a checkpoint (see the module docstring); returns the blocks wrapped.

    ``blocks``: module names (default: the main stack, :func:`~widthscope.probe.structure.main_stack`).
    The wrapper is the module's ``forward`` instance attribute, around whatever ``forward`` was
    (accelerate's hooked one included); blocks already wrapped are left as they are.
    :func:`restore_blocks` undoes it.
    """
    names = list(blocks) if blocks is not None else main_stack(model)
    done = []
    for name in names:
        block = model.get_submodule(name)
        if getattr(block.__dict__.get("forward"), _MARK, None) is None:
            block.forward = _wrap(block)  # type: ignore[method-assign]
        done.append(name)
    return done


def recomputed(model: nn.Module) -> list[str]:
    """Names of the modules whose forward :func:`recompute_blocks` wrapped."""
    return [n for n, m in model.named_modules() if getattr(m.__dict__.get("forward"), _MARK, None) is not None]


def restore_blocks(model: nn.Module) -> list[str]:
    """Undo :func:`recompute_blocks`: each wrapped module gets back the forward it had."""
    names = recomputed(model)
    for name in names:
        _unwrap(model.get_submodule(name))
    return names


@contextmanager
def recomputing(model: nn.Module, blocks: Sequence[str] | None = None) -> Iterator[list[str]]:
    """Within the block, the model's blocks are checkpoints (:func:`recompute_blocks`) and a
    transformers model builds no key/value cache; both restored on exit."""
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
            if name not in before and getattr(block.__dict__.get("forward"), _MARK, None) is not None:
                _unwrap(block)
