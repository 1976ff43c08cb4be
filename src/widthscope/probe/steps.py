"""Held-out losses, the activation's RMS entry at a point and the ``η`` grid of the interventions."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn

from .. import _args
from ..errors import WidthscopeError
from .batches import to_batches
from .collect import EvalMode, collect, float_dtype, hooked, run_batch, split_output, to_device
from .insert import channel_dim
from .offload import input_device


def batch_losses(model: nn.Module, data: Any, loss_fn: Callable | None, batch_size: int) -> Iterator[torch.Tensor]:
    """Per-example losses of each batch of ``data``, moved to the model's input device and dtype."""
    dev, dt = input_device(model), float_dtype(model)
    for bi, b in enumerate(to_batches(data, batch_size)):
        yield run_batch(model, to_device(b, dev, dt), loss_fn, bi)[0]


def point_samples(model: nn.Module, point: str, data: Any, loss_fn: Callable | None, batch_size: int) -> torch.Tensor:
    """The probe's pooled samples ``(n, d)`` at ``point`` over ``data`` (:func:`~widthscope.probe.collect`)."""
    return collect(model, to_batches(data, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]


def per_example_losses(
    model: nn.Module, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64, grad: bool = False
) -> torch.Tensor:
    """Per-example losses ``(n,)`` exactly as :func:`widthscope.probe.collect` defines them."""
    with torch.enable_grad() if grad else torch.no_grad():
        out = [
            losses if grad else losses.detach().to("cpu", torch.float64)
            for losses in batch_losses(model, data, loss_fn, batch_size)
        ]
    return torch.cat(out)


def mean_loss(model: nn.Module, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64) -> float:
    """Mean per-example loss over ``data`` (eval mode, float64 accumulation)."""
    with EvalMode(model):
        return float(per_example_losses(model, data, loss_fn, batch_size=batch_size).mean())


def point_activation_rms(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None, batch_size: int
) -> tuple[float, int]:
    """Root-mean-square entry of the output at ``point`` over ``data``, and its channel width."""
    acc = [0.0, 0, 0]

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        z, _ = split_output(out, point)
        acc[0] += float(z.detach().double().pow(2).sum())
        acc[1] += z.numel()
        acc[2] = z.shape[channel_dim(z)]

    with hooked([(model.get_submodule(point), hook)]), EvalMode(model):
        per_example_losses(model, data, loss_fn, batch_size=batch_size)
    return math.sqrt(acc[0] / max(acc[1], 1)), int(acc[2])


def default_etas(
    step_norm: float, target_norm: float, n_etas: int = 9, *, low: float = 1e-4, high: float = 1.0
) -> list[float]:
    """Log-spaced ``η`` so that ``η · step_norm`` spans ``[low, high] · target_norm``: relative steps
    ``10^(log10 low + i·(log10 high − log10 low)/(n − 1))``.
    """
    if not (step_norm > 0 and math.isfinite(step_norm)):
        raise WidthscopeError(
            "the step direction is zero (all sample gradients vanish), so no η "
            "grid can be chosen; pass etas=[...] or check the loss"
        )
    target = target_norm if target_norm > 0 else step_norm
    a, b = math.log10(low), math.log10(high)
    ratios = [low] if n_etas == 1 else [10.0 ** (a + i * (b - a) / (n_etas - 1)) for i in range(n_etas)]
    return [r * target / step_norm for r in ratios]


def check_rel_step(value: Any, fn: str = "certify") -> float:
    """``max_rel_step`` (the largest step of the default grid, relative to the activation) as a float."""
    rel = "a finite number above the smallest step 1e-4 (the largest step's RMS entry over the activation's)"
    return float(_args.number(fn, "max_rel_step", value, 1e-4, lo_open=True, accepts=rel))  # type: ignore[arg-type]


def check_etas(etas: Sequence[float]) -> list[float]:
    out = []
    for e in etas:
        try:
            e = float(e)
        except (TypeError, ValueError):
            raise WidthscopeError(f"eta must be a number, got {e!r}") from None
        if not math.isfinite(e) or e <= 0:
            raise WidthscopeError(
                f"eta must be a positive finite step size, got {e!r} (the step is "
                "v = -eta * mu_M; a negative eta would step uphill)"
            )
        out.append(e)
    if not out:
        raise WidthscopeError("etas is empty; pass None for the default grid")
    return sorted(out)
