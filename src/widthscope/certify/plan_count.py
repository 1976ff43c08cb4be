"""One probed example, counted (for :mod:`widthscope.certify.plan`): FLOPs, saved bytes, live peak.

:func:`count_pass` runs the probe's pass (forward, one backward to the insertion points with the
parameters frozen, a zero leaf added to each point's output) on meta or real tensors: the loss is
formed as :func:`widthscope.probe.collect` forms it, without the data checks that cannot run on
meta tensors. Attention runs as the math kernel (its matmuls): ``FlopCounterMode`` does not count
the fused CPU kernel, and meta tensors take the math path anyway.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..errors import WidthscopeError
from ..probe.losses import default_loss, logits_of

__all__ = ["count_pass"]


def _lm_loss(logits: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """The causal-LM loss's operations without its data checks (they cannot run on meta tensors)."""
    B, T, V = logits.shape
    x = logits[:, :-1].reshape(-1, V)
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    targets = (labels if labels is not None else ids)[:, 1:].clamp_min(0).reshape(-1)
    return F.cross_entropy(x, targets, reduction="none").view(B, T - 1).mean(1)


def _losses(model: nn.Module, batch: Any, loss_fn: Callable | None) -> torch.Tensor:
    """Per-example losses of one batch, as :func:`widthscope.probe.collect` forms them."""
    if isinstance(batch, Mapping) or (isinstance(batch, torch.Tensor) and not batch.is_floating_point()):
        ids = batch["input_ids"] if isinstance(batch, Mapping) else batch
        kwargs = {}
        if isinstance(batch, Mapping) and batch.get("attention_mask") is not None:
            kwargs["attention_mask"] = batch["attention_mask"]
        output = model(ids, **kwargs)
        if loss_fn is not None:
            return loss_fn(output, batch)
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        return _lm_loss(logits_of(output), ids, labels)
    x, y = batch
    output = model(**x) if isinstance(x, Mapping) else model(x)
    if loss_fn is not None:
        return loss_fn(output, y)
    if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.ndim == 2 and y.shape == x.shape:
        return _lm_loss(logits_of(output), x, None)
    return default_loss(output, y)


def _hidden(output: Any) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    if isinstance(output, torch.Tensor):
        return output, lambda z: z
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0], lambda z: type(output)([z, *output[1:]])
    for key in ("last_hidden_state", "hidden_states"):
        if isinstance(output, MutableMapping) and isinstance(output.get(key), torch.Tensor):

            def put(z: torch.Tensor, key: str = key) -> Any:
                output[key] = z
                return output

            return output[key], put
    raise WidthscopeError(
        f"an insertion point outputs a {type(output).__name__}, not a tensor or a tuple starting with the "
        "hidden states; choose another point (--points)"
    )


@contextmanager
def _frozen_with_leaves(model: nn.Module, names: list[str], leaves: dict[str, torch.Tensor]) -> Iterator[None]:
    """The probe's set-up: eval mode, parameters frozen, a zero leaf added to each point's output."""
    modules = dict(model.named_modules())
    modes = {m: m.training for m in model.modules()}
    flags = [(p, p.requires_grad) for p in model.parameters()]

    def hook(name: str) -> Callable:
        def add(module: nn.Module, inputs: Any, output: Any) -> Any:
            z, put = _hidden(output)
            leaves[name] = torch.zeros_like(z, requires_grad=True)
            return put(z + leaves[name])

        return add

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        model.eval()
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for h in handles:
            h.remove()
        for p, flag in flags:
            p.requires_grad_(flag)
        for m, mode in modes.items():
            m.training = mode


class _Live(TorchDispatchMode):
    """Bytes of the tensors alive during a pass (each new storage from its op until the tensor dies;
    views and in-place results are not new): the peak a pass needs on top of its inputs. Works on
    meta tensors, whose storages have sizes but no data."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        for ret, t in zip(func._schema.returns, outs):
            if isinstance(t, torch.Tensor) and ret.alias_info is None:
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out


def _forward_peak(model: nn.Module, batch: Any, loss_fn: Callable | None) -> int:
    """The live peak of a forward and its loss without gradients (the interventions' passes)."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), _Live() as live:
        _losses(model, batch, loss_fn)
    return live.peak


def count_pass(model: nn.Module, batch: Any, names: list[str], loss_fn: Callable | None = None) -> dict[str, Any]:
    """FLOPs and memory of one probe pass over ``batch`` (meta or real tensors): ``flops_forward``,
    ``flops_backward`` (to the points' outputs only, parameters frozen), ``saved_bytes`` (autograd's
    saved tensors, weights excluded, each tensor's storage once) and ``gradient_bytes`` (the
    activation gradients at the points); ``peak_bytes``: the live peak of the whole pass (forward and
    backward, transients included); ``forward_peak_bytes``: that of a forward and its loss without
    gradients; ``shapes``: each point's output shape; ``flops_after``: the
    forward FLOPs after each point (what the interventions' cached steps rerun)."""
    params = {id(p) for p in model.parameters()}
    saved: dict[int, tuple[torch.Tensor, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) not in params and id(base) not in params:
            saved.setdefault(
                id(base), (base, base.untyped_storage().nbytes())
            )  # the tensor kept alive: ids stay unique
        return t

    leaves: dict[str, torch.Tensor] = {}
    # attention through its matmuls: FlopCounterMode does not count the fused CPU kernel (meta runs these anyway)
    live = _Live()
    with _frozen_with_leaves(model, names, leaves), torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), live:
        with FlopCounterMode(display=False) as fwd, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            modules = dict(model.named_modules())
            upto: dict[str, int] = {}  # forward FLOPs up to the end of each point

            def mark(name: str) -> Callable[..., None]:
                def hook(module: nn.Module, inputs: Any, output: Any) -> None:
                    upto.setdefault(name, int(fwd.get_total_flops()))

                return hook

            marks = [modules[n].register_forward_hook(mark(n)) for n in names]
            try:
                losses = _losses(model, batch, loss_fn)
            finally:
                for h in marks:
                    h.remove()
        missing = [n for n in names if n not in leaves]
        if missing:
            raise WidthscopeError(f"insertion point(s) {', '.join(missing)} did not run in the forward pass")
        with FlopCounterMode(display=False) as bwd:
            grads = torch.autograd.grad(losses.sum(), [leaves[n] for n in names], allow_unused=True)
    return {
        "flops_forward": int(fwd.get_total_flops()),
        "flops_backward": int(bwd.get_total_flops()),
        "saved_bytes": sum(b for _, b in saved.values()),
        "gradient_bytes": sum(leaves[n].numel() * leaves[n].element_size() for n, g in zip(names, grads)),
        "peak_bytes": live.peak,
        "forward_peak_bytes": _forward_peak(model, batch, loss_fn),
        "shapes": {n: tuple(leaves[n].shape) for n in names},
        "flops_after": {n: int(fwd.get_total_flops()) - int(upto.get(n, 0)) for n in names},
    }
