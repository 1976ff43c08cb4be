"""Low-precision (bfloat16/float16) resolution: rounding scales of losses and samples, and which steps are resolved."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
import torch.nn as nn

from .batches import as_examples, batch_size_of, take
from .collect import EvalMode, float_dtype
from .steps import per_example_losses, point_samples

LOW_PRECISION = (torch.bfloat16, torch.float16)
# A step is resolved when its predicted change is at least this many rounding scales r (loss_rounding).
RESOLUTION_FACTOR = 8.0


def dtype_name(dt: torch.dtype | None) -> str | None:
    return None if dt is None else str(dt).replace("torch.", "")


@contextmanager
def upcast(model: nn.Module) -> Iterator[nn.Module]:
    """The model's bfloat16/float16 parameters and buffers in float32 within the block, restored on exit."""
    saved = {id(t): (t, t.dtype) for t in [*model.parameters(), *model.buffers()] if t.dtype in LOW_PRECISION}
    for t, _ in saved.values():
        t.data = t.data.float()
    try:
        yield model
    finally:
        for t, dt in saved.values():
            t.data = t.data.to(dt)


def loss_rounding(
    model: nn.Module,
    data: Any,
    loss_fn: Callable | None = None,
    *,
    batch_size: int = 64,
    losses: torch.Tensor | None = None,
) -> tuple[float | None, torch.Tensor | None]:
    r"""Rounding-error scale of the mean loss over ``data`` in the model's low-precision dtype.

    .. math::  r = \sqrt{\textstyle\sum_i e_i^2}\,/\,K,\qquad e_i = ℓ_i^{\rm dtype} − ℓ_i^{\rm float32}

    Returns ``(r, float32 per-example losses)``, or ``(None, None)`` for a float32/float64 model.
    """
    if float_dtype(model) not in LOW_PRECISION:
        return None, None
    with EvalMode(model):
        low = per_example_losses(model, data, loss_fn, batch_size=batch_size) if losses is None else losses.double()
        with upcast(model):
            ref = per_example_losses(model, data, loss_fn, batch_size=batch_size)
    return float((low.cpu() - ref).pow(2).sum().sqrt()) / max(len(ref), 1), ref


def _sample_errors(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None, n: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 pooled samples of the first ``n`` examples, and the model's rounding errors of them."""
    data = as_examples(data)
    sub = take(data, min(n, batch_size_of(data)))
    low = point_samples(model, point, sub, loss_fn, batch_size)
    with upcast(model):
        ref = point_samples(model, point, sub, loss_fn, batch_size)
    return ref, low - ref


def sample_rounding(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None = None, *, n: int = 8, batch_size: int = 64
) -> float | None:
    """Largest ``‖s_i − s_i^{float32}‖/‖s_i^{float32}‖`` of the first ``n`` samples; None for float32/64."""
    if float_dtype(model) not in LOW_PRECISION:
        return None
    ref, err = _sample_errors(model, point, data, loss_fn, n, batch_size)
    return float((err.norm(dim=1) / ref.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)).max())


def sample_errors(
    model: nn.Module,
    point: str,
    train: Any,
    test: Any,
    loss_fn: Callable | None = None,
    *,
    n: int = 16,
    batch_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rounding errors ``(n, d)`` of the first ``n`` train and held-out samples; None for float32/64."""
    if float_dtype(model) not in LOW_PRECISION:
        return None
    ea, eb = (_sample_errors(model, point, d, loss_fn, n, batch_size)[1] for d in (train, test))
    return ea, eb


def projected_rounding(err: torch.Tensor, direction: torch.Tensor) -> float:
    r"""Rounding error of a sample mean along ``direction``: ``|mean t| + 3·sd(t)/√n`` with
    ``t_i = δs_i·direction``."""
    t = err.double() @ direction.double().to(err.device)
    if len(t) < 2:
        return float(t.abs().max()) if len(t) else 0.0
    return abs(float(t.mean())) + 3 * float(t.std()) / math.sqrt(len(t))


def resolved(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows a summary may use: neither ``below_resolution`` nor ``alignment_within_rounding``."""
    return [r for r in rows if not r.get("below_resolution") and not r.get("alignment_within_rounding")]


def precision_note(rows: Iterable[Mapping[str, Any]], where: str = "") -> str | None:
    """One line naming the steps below the model dtype's resolution (or re-measured in float32), or None."""
    rows = [r for r in rows if r.get("kind") == "intervention" and r.get("probe") in ("bias", "block")]
    low = [r for r in rows if r.get("below_resolution")]
    redo = [r for r in rows if r.get("evaluated_in") and r.get("dtype") and r["evaluated_in"] != r["dtype"]]
    zero = list(dict.fromkeys(str(r.get("point", where)) for r in rows if r.get("alignment_within_rounding")))
    if not low and not redo and not zero:
        return None
    dt = next(r.get("dtype") for r in rows if r.get("dtype"))

    def steps(rs: list[Mapping[str, Any]]) -> str:
        by: dict[str, list[str]] = {}
        for r in rs:
            by.setdefault(str(r.get("point", where)), []).append(f"{r.get('rel_step', r.get('eta')):.2g}")
        return "; ".join(f"{p} at rel_step {', '.join(v)}" for p, v in by.items())

    parts = []
    if low:
        parts.append(
            f"{len(low)} of {len(rows)} intervention steps are below {dt} resolution (|predicted dL| < "
            f"{RESOLUTION_FACTOR:g} x the rounding error of the held-out loss in {dt}) and are left out of "
            f"the retention and sign summaries: {steps(low)}"
        )
    if redo:
        parts.append(
            f"{len(redo)} steps below {dt} resolution were measured in float32 instead (the model "
            f"upcast; the {dt} value kept as actual_in_dtype): {steps(redo)}"
        )
    if zero:
        parts.append(
            f"at {', '.join(zero)} the alignment mu_M.g_K is within rounding of zero of the {dt} samples "
            "(not even the predicted sign is resolved): all its steps are left out of the summaries"
        )
    return "interventions: " + "; ".join(parts)


def mark_precision(rows: list[dict[str, Any]], dtype: torch.dtype | None, r: float | None) -> None:
    """Add ``dtype``, ``evaluated_in``, ``resolution`` and ``below_resolution`` to each row."""
    res = None if r is None else RESOLUTION_FACTOR * r
    for row in rows:
        row.update(
            dtype=dtype_name(dtype),
            evaluated_in=dtype_name(dtype),
            resolution=res,
            below_resolution=bool(res is not None and abs(row["predicted"]) < res),
            alignment_bound=None,
            alignment_within_rounding=False,
        )
