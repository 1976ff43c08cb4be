"""Batches as the probe and the interventions see them: ``(x, y)``, token ids, or a dict with
``input_ids``; pooling, indexing and re-batching them (shared by interventions and the prefix cache)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from ..errors import WidthscopeError

__all__ = ["as_examples", "take", "to_batches"]


def batch_size_of(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, Mapping):
        return next(iter(batch.values())).shape[0]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch_size_of(batch[0])
    raise WidthscopeError(
        f"a batch must be (x, y), a LongTensor of token ids or a dict with 'input_ids'; got {type(batch).__name__}"
    )


def cat_batches(parts: list[Any]) -> Any:
    first = parts[0]
    try:
        if isinstance(first, torch.Tensor):
            return torch.cat(parts, 0)
        if isinstance(first, Mapping):
            return {k: torch.cat([p[k] for p in parts], 0) for k in first}
        return tuple(cat_batches([p[i] for p in parts]) for i in range(len(first)))
    except RuntimeError as exc:
        raise WidthscopeError(
            f"batches of different shapes cannot be pooled ({exc}); give sequences of one length (pad on the right)"
        ) from None


def index_batch(data: Any, idx: torch.Tensor | slice) -> Any:
    if isinstance(data, torch.Tensor):
        return data[idx]
    if isinstance(data, Mapping):
        return {k: v[idx] for k, v in data.items()}
    return tuple(index_batch(d, idx) for d in data)


def as_examples(batches: Iterable[Any] | Any) -> Any:
    """Pool a list of batches (or one batch) into one batch-shaped object of all examples."""
    if isinstance(batches, (torch.Tensor, Mapping)) or (
        isinstance(batches, tuple)
        and len(batches) == 2
        and isinstance(batches[0], (torch.Tensor, Mapping))
        and isinstance(batches[1], torch.Tensor)
    ):
        return batches  # already one batch: (x, y) with x a tensor or a dict of tensors
    parts = list(batches)
    if not parts:
        raise WidthscopeError("no batches given: pass a non-empty list of batches")
    return cat_batches(parts)


def take(data: Any, n: int | None, *, what: str = "examples") -> Any:
    """The first ``n`` examples of pooled ``data`` (all when ``n`` is None)."""
    total = batch_size_of(data)
    if n is None:
        return data
    if not isinstance(n, int) or n < 1:
        raise WidthscopeError(f"{what}: the number of examples must be a positive integer, got {n!r}")
    if n > total:
        raise WidthscopeError(
            f"{what}: asked for {n} examples but only {total} were given; pass more batches or a smaller value"
        )
    return index_batch(data, slice(0, n))


def to_batches(data: Any, batch_size: int = 64) -> list[Any]:
    n = batch_size_of(data)
    return [index_batch(data, slice(i, i + batch_size)) for i in range(0, n, batch_size)]
