"""Brute-force oracle shared by the cost-probe tests: the bytes autograd saves in a pass."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn


@contextlib.contextmanager
def saved_bytes(net: nn.Module) -> Iterator[dict[int, int]]:
    """Record, while the block runs with grad enabled, every distinct storage autograd saves (parameters of
    ``net`` excluded, each storage once at its largest use): ``sum(seen.values())`` afterwards."""
    weights = {p.untyped_storage().data_ptr() for p in net.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = max(seen.get(ptr, 0), t.numel() * t.element_size())
        return t.detach()  # packed as itself, a graph dropped without backward would stay alive

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen
