r"""Held-out losses after ``E`` bias steps at a point, running the network before it once.

:func:`stacked_totals` gives ``Σ_i ℓ_i(z + v_e)`` for every step ``e``: ``full`` runs the whole network
``E`` times; ``cached`` replays the kept outputs of the modules that finished before ``point`` (exact
while examples are independent; ``auto`` checks 3 examples against a full forward and falls back with
the reason). :func:`keep_prefix` records those outputs during a forward the caller runs anyway. The
plan and capture live in :mod:`~widthscope.probe.prefix_plan` and :mod:`~widthscope.probe.prefix_keep`.
Details: docs/interventions.md §2.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from ..errors import WidthscopeError
from .batches import batch_size_of, cat_batches, take, to_batches
from .collect import float_dtype, run_batch, split_output
from .prefix_keep import KeptPrefix, keep_prefix
from .prefix_plan import FnSteps, Plan, Replaced, Unsupported, add_steps, capture_outputs, plan, plans

__all__ = [
    "PREFIX_MODES",
    "FnSteps",
    "KeptPrefix",
    "Plan",
    "Unsupported",
    "add_steps",
    "check_tolerance",
    "keep_prefix",
    "plan",
    "plans",
    "stacked_totals",
]

PREFIX_MODES = ("auto", "full")


# ----------------------------------------------------------------------------- stacked losses
def _chunks(data: Any, per: int) -> Iterator[Any]:
    yield from to_batches(data, per)


def _full_totals(
    model: nn.Module,
    point: str,
    steps: torch.Tensor,
    data: Any,
    loss_fn: Callable | None,
    per: int,
    to_dev: Callable[[Any], Any],
) -> torch.Tensor:
    """``full`` path: Σ over examples of the loss in each of the ``E`` stacked copies, float64."""
    E = steps.shape[0]
    totals = torch.zeros(E, dtype=torch.float64)
    for bi, b in enumerate(_chunks(data, per)):
        totals += _full_rows(model, point, steps, b, loss_fn, to_dev, bi).view(E, -1).sum(1)
    return totals


def _cached_losses(
    model: nn.Module,
    point: str,
    p: Plan,
    steps: torch.Tensor,
    batch: Any,
    loss_fn: Callable | None,
    to_dev: Callable[[Any], Any],
    bi: int,
    keep: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``cached`` path for one chunk: per-row losses ``(E·B,)`` of the stacked pass; ``keep``:
    the planned outputs of this chunk's rows recorded earlier (:class:`KeptPrefix`), else captured."""
    E = steps.shape[0]
    b = to_dev(batch)
    if keep is None:
        keep = capture_outputs(model, point, p, b, loss_fn)

    def put_steps(out: Any) -> Any:
        z, put = split_output(out, point)
        return put(add_steps(z, steps))

    def hook(_m: nn.Module, _i: Any, out: Any) -> Any:
        return put_steps(out)

    h = None if p.point_cached else model.get_submodule(point).register_forward_hook(hook)
    try:
        with Replaced(model, point, p, keep, steps, put_steps) as rep:
            losses, _, _ = run_batch(model, cat_batches([b] * E), loss_fn, bi)
        rep.verify()
    finally:
        if h is not None:
            h.remove()
    return losses.detach().to("cpu", torch.float64)


def check_tolerance(dtype: torch.dtype | None) -> float:
    """Tolerance of the ``auto`` check on per-row losses (relative and absolute):
    ``min(64·eps, 1e-3)`` of the model's float dtype (float64 1.4e-14, float32 7.6e-6; half
    precisions 1e-3). The two paths differ only in how rows are batched, which on the CPUs we
    tried changes no bit; a wrongly kept module moves the largest step's loss by far more."""
    dt = dtype if dtype is not None and dtype.is_floating_point else torch.float32
    return min(64 * torch.finfo(dt).eps, 1e-3)


def stacked_totals(
    model: nn.Module,
    point: str,
    steps: torch.Tensor,
    data: Any,
    loss_fn: Callable | None,
    per: int,
    to_dev: Callable[[Any], Any],
    *,
    mode: str = "auto",
    kept: KeptPrefix | None = None,
) -> tuple[torch.Tensor, str]:
    """``Σ_i ℓ_i`` over ``data`` with ``steps[e]`` added at ``point``, for every ``e`` (float64 ``(E,)``),
    and how: ``"cached"`` or ``"full: <reason>"``. ``per`` examples are stacked per pass.

    ``auto`` plans on the first 2 and 3 examples (or takes the plan and the outputs from ``kept``,
    recorded over the first rows of ``data`` by :func:`keep_prefix`), then requires the cached
    path's per-row losses of the first 3 examples at the largest step (part of the first chunk's
    stacked pass) to equal a full forward of them within :func:`check_tolerance`; any failure of
    the cached path (its check, a replaced module misbehaving, a model error under replacement)
    reruns everything on the full path, whose own errors are the model's and propagate."""
    if mode == "full":
        return _full_totals(model, point, steps, data, loss_fn, per, to_dev), "full: requested"
    if batch_size_of(data) < 3:
        return _full_totals(model, point, steps, data, loss_fn, per, to_dev), "full: fewer than 3 examples"
    old = _full_rows(model, point, steps[-1:], take(data, 3), loss_fn, to_dev)  # the model's own errors, first
    try:
        src = kept if kept is not None and kept.covers(point, batch_size_of(data)) else None
        p = (
            src.plans[point]
            if src is not None
            else plan(model, point, to_dev(take(data, 2)), to_dev(take(data, 3)), loss_fn)
        )
        if not p.cached and not p.point_cached:
            raise Unsupported("no module before the point can be kept")
        tol = check_tolerance(float_dtype(model))
        E = steps.shape[0]
        totals = torch.zeros(E, dtype=torch.float64)
        new = torch.zeros(0, dtype=torch.float64)
        start = 0
        for bi, b in enumerate(_chunks(data, per)):
            B = batch_size_of(b)
            keep = src.rows(point, start, start + B) if src is not None else None
            rows = _cached_losses(model, point, p, steps, b, loss_fn, to_dev, bi, keep).view(E, -1)
            if new.numel() < 3:  # the check: the first 3 examples at the largest step
                new = torch.cat([new, rows[-1, : 3 - new.numel()]])
                if new.numel() == 3 and not torch.allclose(new, old, rtol=tol, atol=tol):
                    raise Unsupported(
                        f"the cached path's losses differ from the full forward's by "
                        f"{float((new - old).abs().max()):.3g} (tolerance {tol:.2g}) on the first 3 "
                        "examples"
                    )
            totals += rows.sum(1)
            start += B
        return totals, "cached"
    except (Unsupported, WidthscopeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _full_totals(model, point, steps, data, loss_fn, per, to_dev), f"full: {reason}"


def _full_rows(
    model: nn.Module,
    point: str,
    steps: torch.Tensor,
    batch: Any,
    loss_fn: Callable | None,
    to_dev: Callable[[Any], Any],
    bi: int = 0,
) -> torch.Tensor:
    """Per-row losses ``(E·B,)`` of the ``full`` path for one chunk: the batch stacked ``E``
    times, a forward hook adding ``steps[e]`` to copy ``e`` at ``point``."""

    def hook(_m: nn.Module, _i: Any, out: Any) -> Any:
        z, put = split_output(out, point)
        return put(add_steps(z, steps))

    h = model.get_submodule(point).register_forward_hook(hook)
    try:
        losses, _, _ = run_batch(model, to_dev(cat_batches([batch] * steps.shape[0])), loss_fn, bi)
    finally:
        h.remove()
    return losses.detach().to("cpu", torch.float64)
