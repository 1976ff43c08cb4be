"""The monitor's fixed pools (:func:`as_batches`) and the dry probe at construction (:func:`dry_probe`)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from ..certification import check_pool, count_examples
from ..errors import WidthscopeError
from ..probe import batched, collect
from .state import TrainingState


def as_batches(pool: Any, what: str, batch_size: int) -> list[Any]:
    """A fixed list of probe batches from full tensors ``(X, Y)`` / ids ``(n, T)`` or batches."""
    if isinstance(pool, torch.Tensor):
        if pool.is_floating_point():
            raise WidthscopeError(
                f"the {what} pool is a float tensor without targets: give (X, Y), token ids (n, T) or a list of batches"
            )
        return batched(pool, batch_size=batch_size)
    if isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(t, torch.Tensor) for t in pool):
        if pool[0].ndim < 1 or pool[1].ndim < 1 or pool[0].shape[0] != pool[1].shape[0]:
            raise WidthscopeError(
                f"the {what} pool (X, Y) has {tuple(pool[0].shape)} inputs but "
                f"{tuple(pool[1].shape)} targets: give one target per example"
            )
        return batched(pool[0], pool[1], batch_size=batch_size)
    if isinstance(pool, Mapping) and isinstance(pool.get("input_ids"), torch.Tensor):
        n = pool["input_ids"].shape[0]
        return [{k: v[i : i + batch_size] for k, v in pool.items()} for i in range(0, n, batch_size)]
    try:
        batches = list(pool)  # a DataLoader is drawn once here: the pool stays fixed
    except TypeError as exc:
        raise WidthscopeError(
            f"the {what} pool is a {type(pool).__name__}: give (X, Y) tensors, token "
            "ids (n, T) or an iterable of batches"
        ) from exc
    if not batches:
        raise WidthscopeError(f"the {what} pool is empty: give it at least 4 examples")
    return batches


def count_safe(batches: list[Any]) -> int | None:
    """The examples in ``batches``, or None when they cannot be counted."""
    try:
        return count_examples(batches)
    except (AttributeError, TypeError, IndexError, KeyError):
        return None


def dry_probe(
    model: nn.Module,
    pools: Sequence[tuple[list[Any], int, str]],
    *,
    points: list[str],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    pool: str,
    clock: Callable[[], float],
) -> tuple[list[str], float]:
    """Probe one batch per pool ``(batches, M or K, "train" / "held-out")`` (``pool="token"``: the whole
    pools, checked against their sizes), refusing a model whose probe changes a parameter or buffer.
    Returns the probe's notes and the predicted seconds of a whole probe."""
    state = TrainingState(model, weights=True)
    whole = pool == "token"
    notes: list[str] = []
    predict_s = 0.0
    try:
        for batches, need, what in pools:
            t1 = clock()
            try:
                q = collect(
                    model,
                    batches if whole else batches[:1],
                    points=points,
                    loss_fn=loss_fn,
                    pool=pool,
                    train_mode="eval",
                    progress=False,
                )
            except (NotImplementedError, WidthscopeError) as exc:  # e.g. a LightningModule without forward()
                _no_forward(model, exc)
                raise
            notes = list(dict.fromkeys(notes + q.notes))
            predict_s += (clock() - t1) * (1 if whole else len(batches))
            if whole:
                check_pool(q[points[0]].shape[0], need, what, f"the {what} pool size", pool)
    finally:
        changed = state.restore()
    if changed:
        raise WidthscopeError(
            f"the monitor cannot restore this model exactly: an eval-mode forward pass changes "
            f"{', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}; make that update happen "
            "only in training mode (or probe a copy of the model with widthscope.certification.certify_dict)"
        )
    return notes, predict_s


def _no_forward(model: nn.Module, exc: Exception) -> None:
    """Refuse, with the fix, a model without ``forward()``; any other error is left to the caller."""
    cause = exc if isinstance(exc, NotImplementedError) else exc.__cause__
    if not isinstance(cause, NotImplementedError) or '"forward"' not in str(cause):
        return
    raise WidthscopeError(
        f"the monitor calls the model on the pools, but {type(model).__name__} has no forward() "
        f"({cause}); build the monitor on the network it wraps, e.g. AlignmentMonitor(module.net, "
        "...) with points named inside it (the Lightning callback probes that network)"
    ) from exc
