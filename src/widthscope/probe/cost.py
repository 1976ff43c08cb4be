"""Counting one pass of a model without running its arithmetic where it can (the cost plans of
``certify --plan``, ``grow --plan``, ``linearize --plan``, ...): FLOPs, saved bytes, live peak.

:func:`count_pass` counts the probe's pass (forward, one backward to the insertion points with the
parameters frozen, a zero leaf added to each point's output); :func:`count_step` one training step
(forward, backward to the trainable parameters). Both run on meta or real tensors and form the loss
as :func:`widthscope.probe.collect` forms it, without the data checks that cannot run on meta
tensors.

Attention is counted twice, on purpose: FLOPs through its matmuls (the math kernel:
``FlopCounterMode`` does not count the fused CPU kernel), memory as the kernel the run will take
(:class:`RunAttention`): on a CPU the fused flash kernel, which keeps no ``(L x L)`` matrix per
head, is what ``scaled_dot_product_attention`` picks for every float dtype; a model loaded with
``attn_implementation="eager"`` never calls it and keeps its matrices, and is counted so.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..errors import WidthscopeError
from .losses import default_loss, logits_of

__all__ = ["count_pass", "count_step", "live_peak", "RunAttention", "optimizer_bytes", "OPTIMIZER_STATES"]

# optimizer state per trainable parameter, in parameter-sized tensors
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1}


def optimizer_bytes(optimizer: str, trainable_bytes: int) -> int:
    """Bytes of the optimizer's state: Adam/AdamW two moments, SGD with momentum one buffer, plain
    SGD none (each the size of the trainable parameters)."""
    key = optimizer.lower()
    if key not in OPTIMIZER_STATES:
        raise WidthscopeError(f"optimizer {optimizer!r}: the plan knows {', '.join(OPTIMIZER_STATES)}")
    return OPTIMIZER_STATES[key] * trainable_bytes


def _lm_loss(logits: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """The causal-LM loss's operations without its data checks (they cannot run on meta tensors)."""
    B, T, V = logits.shape
    x = logits[:, :-1].reshape(-1, V)
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    targets = (labels if labels is not None else ids)[:, 1:].clamp_min(0).reshape(-1)
    return F.cross_entropy(x, targets, reduction="none").view(B, T - 1).mean(1)


def losses(model: nn.Module, batch: Any, loss_fn: Callable | None) -> torch.Tensor:
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


def live_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), peak)``: the most bytes of tensors ``fn`` held at once (those it made; what existed
    before it is not counted), counted as :class:`_Live` counts a pass. The memory of work the cost
    plans run for real on a small size (a growth ranking, a linearization cell)."""
    live = _Live()
    with live:
        out = fn()
    return out, live.peak


# ----------------------------------------------------------------------------- attention as the run takes it
_MATH, _FLASH, _EFFICIENT = (
    SDPBackend.MATH.value,
    SDPBackend.FLASH_ATTENTION.value,
    SDPBackend.EFFICIENT_ATTENTION.value,
)


def _proxy(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tiny real tensor of ``t``'s rank and dtype on ``device`` (the kernel choice reads the
    dtype, the rank, the head size and the mask's kind, not the sequence length)."""
    shape = list(t.shape)
    shape = [min(s, 2) for s in shape[:-1]] + [shape[-1]] if t.ndim else shape
    return torch.zeros(shape, dtype=t.dtype, device=device)


def _fused_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, device: torch.device) -> int:
    """The backend ``scaled_dot_product_attention`` takes on ``device`` for tensors like these."""
    if device.type == "cuda" and not torch.cuda.is_available():
        return _MATH
    m = None
    if isinstance(mask, torch.Tensor):
        m = torch.zeros([min(s, 2) for s in mask.shape], dtype=mask.dtype, device=device)
    try:
        a, b, c = (_proxy(t, device) for t in (q, k, v))
        # a broadcast mask keeps its own leading sizes (1 or 2); torch's stub types this private op loosely
        return int(torch._fused_sdp_choice(a, b, c, m, 0.0, False))  # type: ignore[call-arg, arg-type, call-overload]
    except RuntimeError:  # no fused kernel for these shapes on this device
        return _MATH


class RunAttention(TorchFunctionMode):
    """``scaled_dot_product_attention`` on meta tensors as the run's device will take it: the fused
    kernel's operation (which keeps only its output and a log-sum-exp per row) where that device
    would pick it, the math kernel otherwise. Real tensors take their own device's choice."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.device = torch.device(device)
        self.fused = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or not args or args[0].device.type != "meta":
            return func(*args, **kwargs)
        q, k, v = args[:3]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        dropout = float(kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0))
        causal = bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False))
        scale = kwargs.get("scale")
        if kwargs.get("enable_gqa") and q.shape[-3] != k.shape[-3]:  # grouped heads: each key/value head shared
            group = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
        choice = _fused_choice(q, k, v, mask, self.device)
        if self.device.type == "cpu" and choice == _FLASH:
            self.fused += 1
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout, causal, attn_mask=mask, scale=scale
            )[0]
        if self.device.type == "cuda" and choice == _EFFICIENT:
            self.fused += 1
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, True, dropout, causal, scale=scale
            )[0]
        return func(*args, **kwargs)


@contextmanager
def _memory_kernels(batch_device: torch.device, run_device: torch.device | None) -> Iterator[None]:
    """Attention for the memory count: the run's kernel (meta: :class:`RunAttention`)."""
    with RunAttention(run_device or (batch_device if batch_device.type != "meta" else torch.device("cpu"))):
        yield


def _device_of(batch: Any) -> torch.device:
    if isinstance(batch, torch.Tensor):
        return batch.device
    if isinstance(batch, Mapping):
        return _device_of(next(iter(batch.values())))
    return _device_of(batch[0])


# ----------------------------------------------------------------------------- the probe's pass
def _forward_peak(model: nn.Module, batch: Any, loss_fn: Callable | None, device: torch.device | None) -> int:
    """The live peak of a forward and its loss without gradients (the interventions' passes)."""
    with torch.no_grad(), _memory_kernels(_device_of(batch), device), _Live() as live:
        losses(model, batch, loss_fn)
    return live.peak


def _probe_flops(model: nn.Module, batch: Any, names: list[str], loss_fn: Callable | None) -> dict[str, Any]:
    """FLOPs of the probe's pass, attention through its matmuls; the forward FLOPs after each point."""
    leaves: dict[str, torch.Tensor] = {}
    with _frozen_with_leaves(model, names, leaves), torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd:
            modules = dict(model.named_modules())
            upto: dict[str, int] = {}  # forward FLOPs up to the end of each point

            def mark(name: str) -> Callable[..., None]:
                def hook(module: nn.Module, inputs: Any, output: Any) -> None:
                    upto.setdefault(name, int(fwd.get_total_flops()))

                return hook

            marks = [modules[n].register_forward_hook(mark(n)) for n in names]
            try:
                out = losses(model, batch, loss_fn)
            finally:
                for h in marks:
                    h.remove()
        missing = [n for n in names if n not in leaves]
        if missing:
            raise WidthscopeError(f"insertion point(s) {', '.join(missing)} did not run in the forward pass")
        with FlopCounterMode(display=False) as bwd:
            torch.autograd.grad(out.sum(), [leaves[n] for n in names], allow_unused=True)
    total = int(fwd.get_total_flops())
    return {
        "flops_forward": total,
        "flops_backward": int(bwd.get_total_flops()),
        "flops_after": {n: total - int(upto.get(n, 0)) for n in names},
    }


def _standalone(batch: Any) -> Any:
    """``batch`` with each tensor copied to a storage of its own: a saved tensor is counted by its whole
    storage, and an example sliced from a data set (``index_batch(train, slice(0, 1))``) shares the data
    set's, which would count it whole (issue 32)."""
    if isinstance(batch, torch.Tensor):
        return batch.clone(memory_format=torch.contiguous_format)
    if isinstance(batch, MutableMapping):
        out = copy.copy(batch)
        for k, v in batch.items():
            out[k] = _standalone(v)
        return out
    if isinstance(batch, Mapping):
        return {k: _standalone(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_standalone(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_standalone(v) for v in batch)
    return batch


def count_pass(
    model: nn.Module,
    batch: Any,
    names: list[str],
    loss_fn: Callable | None = None,
    *,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """FLOPs and memory of one probe pass over ``batch`` (meta or real tensors; the pass runs on a copy
    of it: :func:`_standalone`): ``flops_forward``, ``flops_backward`` (to the points' outputs only,
    parameters frozen), ``saved_bytes`` (autograd's saved tensors, weights excluded, each tensor's
    storage once) and ``gradient_bytes`` (the activation gradients at the points); ``peak_bytes``:
    the live peak of the whole pass (forward and backward, transients included);
    ``forward_peak_bytes``: that of a forward and its loss without gradients; ``shapes``: each
    point's output shape; ``flops_after``: the forward FLOPs after each point (what the
    interventions' cached steps rerun). ``device``: where the run will compute (the attention kernel
    of the memory counts; default the batch's, CPU for meta)."""
    run_device = None if device is None else torch.device(device)
    batch = _standalone(batch)
    flops = _probe_flops(model, batch, names, loss_fn)
    params = {id(p) for p in model.parameters()}
    saved: dict[int, tuple[torch.Tensor, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) not in params and id(base) not in params:
            saved.setdefault(id(base), (base, base.untyped_storage().nbytes()))  # kept alive: ids stay unique
        return t

    leaves: dict[str, torch.Tensor] = {}
    live = _Live()
    with _frozen_with_leaves(model, names, leaves), torch.enable_grad():
        with _memory_kernels(_device_of(batch), run_device), live:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = losses(model, batch, loss_fn)
            torch.autograd.grad(out.sum(), [leaves[n] for n in names], allow_unused=True)
    return {
        **flops,
        "saved_bytes": sum(b for _, b in saved.values()),
        "gradient_bytes": sum(leaves[n].numel() * leaves[n].element_size() for n in names),
        "peak_bytes": live.peak,
        "forward_peak_bytes": _forward_peak(model, batch, loss_fn, run_device),
        "shapes": {n: tuple(leaves[n].shape) for n in names},
    }


# ----------------------------------------------------------------------------- a training step
def _step_once(
    model: nn.Module, batch: Any, loss_fn: Callable | None, params: Sequence[nn.Parameter], device: torch.device | None
) -> int:
    """The live peak of one training step (forward, backward to ``params``; the gradients stay)."""
    live = _Live()
    with torch.enable_grad(), _memory_kernels(_device_of(batch), device), live:
        loss = losses(model, batch, loss_fn).mean()
        torch.autograd.grad(loss, list(params), allow_unused=True)
    return live.peak


@contextmanager
def _trainable(model: nn.Module, params: Sequence[nn.Parameter] | None) -> Iterator[list[nn.Parameter]]:
    """``params`` (default: every parameter) trainable, the others frozen, eval mode; restored after."""
    chosen = list(model.parameters()) if params is None else list(params)
    ids = {id(p) for p in chosen}
    flags = [(p, p.requires_grad) for p in model.parameters()]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        for p, _ in flags:
            p.requires_grad_(id(p) in ids)
        yield chosen
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        for m, mode in modes.items():
            m.training = mode


def count_step(
    model: nn.Module,
    batches: tuple[Any, Any],
    loss_fn: Callable | None = None,
    *,
    params: Sequence[nn.Parameter] | None = None,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """FLOPs and memory of one training step (eval mode: the mean loss of a mini-batch, its backward
    to ``params``, default every parameter; the others frozen: no weight gradient, and nothing
    upstream of the first trainable one is back-propagated).

    ``batches``: the same data at two sizes ``(b1, b2)``, ``b1 < b2``; the memory is the chord
    ``fixed_bytes + activation_bytes_per_example * b`` through the live peaks at both sizes, exact at
    both (the weight gradients set the peak of small batches, the activations that of large ones,
    so pass one example and the run's batch). FLOPs are per example, from ``b1`` (attention
    through its matmuls)."""
    run_device = None if device is None else torch.device(device)
    small, large = batches
    n1, n2 = _rows(small), _rows(large)
    if not n1 < n2:
        raise WidthscopeError(f"count_step: the second batch must be larger than the first (got {n1} and {n2})")
    with _trainable(model, params) as chosen:
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            with FlopCounterMode(display=False) as fwd:
                loss = losses(model, small, loss_fn).mean()
            with FlopCounterMode(display=False) as bwd:
                if loss.requires_grad:
                    torch.autograd.grad(loss, chosen, allow_unused=True)
        peaks = [_step_once(model, b, loss_fn, chosen, run_device) for b in (small, large)]
    per_example = max(0, (peaks[1] - peaks[0]) // (n2 - n1))
    trainable = sum(p.numel() * p.element_size() for p in chosen)
    return {
        "flops_forward": int(fwd.get_total_flops()) // n1,
        "flops_backward": int(bwd.get_total_flops()) // n1,
        "activation_bytes_per_example": per_example,
        "fixed_bytes": max(0, peaks[0] - per_example * n1),
        "trainable": sum(p.numel() for p in chosen),
        "trainable_bytes": trainable,
    }


def _rows(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        return _rows(next(iter(batch.values())))
    return _rows(batch[0])
