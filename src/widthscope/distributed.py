"""Merging statistics across ``torch.distributed`` ranks.

Everything here is a no-op in a single process, so pipelines call these functions
unconditionally. Under ``torchrun`` (``gloo`` on CPU, ``nccl`` on GPU) each rank handles a
deterministic shard of the examples and the results are merged exactly.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

__all__ = ["is_distributed", "rank", "world_size", "is_main", "shard", "all_gather_rows", "barrier"]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: positions ``rank, rank + W, ...`` (deterministic)."""
    return list(items[rank()::world_size()])


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's ``(n_r, d)`` rows along dim 0, in rank order (sizes may differ).

    Rows are stored rank-interleaved by :func:`shard`, so callers that need the original
    example order must undo that themselves; every statistic here is permutation-invariant.
    """
    if not is_distributed():
        return x
    n = torch.tensor([x.shape[0]], dtype=torch.long, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world_size())]
    dist.all_gather(sizes, n)
    m = int(max(s.item() for s in sizes))
    padded = torch.zeros((m, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    out = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(out, padded)
    return torch.cat([o[: int(s.item())] for o, s in zip(out, sizes)], dim=0)


def barrier() -> None:
    if is_distributed():
        dist.barrier()
