"""The monitor's restore guarantee (:class:`TrainingState`) and its refusal of FSDP-sharded models."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..errors import WidthscopeError


class TrainingState:
    """Everything a probe could disturb (RNG states, ``training`` flags, ``requires_grad`` and ``.grad``;
    ``weights=True``: every parameter and buffer), put back exactly by :meth:`restore`, which returns
    the names of the weights it put back."""

    def __init__(self, model: nn.Module, *, weights: bool = False) -> None:
        self.model = model
        self.weights = _weights(model) if weights else None
        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        self.py_rng = random.getstate()
        self.np_rng = np.random.get_state()
        self.modes = [(m, m.training) for m in model.modules()]
        self.params = [
            (p, p.requires_grad, p.grad, None if p.grad is None else p.grad.detach().clone())
            for p in model.parameters()
        ]

    def restore(self) -> list[str]:
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.py_rng)
        np.random.set_state(self.np_rng)
        for m, mode in self.modes:
            m.training = mode
        with torch.no_grad():
            for p, flag, grad, values in self.params:
                p.requires_grad_(flag)
                p.grad = grad
                if grad is not None and values is not None and not torch.equal(grad, values):
                    grad.copy_(values)
        if self.weights is None:
            return []
        now = _weights(self.model)
        changed = [k for k in self.weights if not torch.equal(self.weights[k], now[k])]
        with torch.no_grad():
            for k in changed:
                kind, name = k.split(" ", 1)
                getattr(self.model, f"get_{kind}")(name).copy_(self.weights[k])
        return changed


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer, keyed ``"parameter <name>"`` / ``"buffer <name>"``."""
    out = {f"parameter {n}": p.detach().clone() for n, p in model.named_parameters()}
    out.update({f"buffer {n}": b.detach().clone() for n, b in model.named_buffers()})
    return out


def _fsdp_classes() -> tuple[type, ...]:
    try:
        import torch.distributed.fsdp as fsdp  # noqa: PLC0415  optional: torch builds without distributed
    except ImportError:
        return ()
    found = (getattr(fsdp, name, None) for name in ("FullyShardedDataParallel", "FSDPModule"))
    return tuple(c for c in found if isinstance(c, type))


FSDP_FIX = (
    "probe it unsharded: monitor a DDP (or single-process) run, or save a full state dict at the steps "
    "you want and run widthscope certify on those checkpoints"
)


def check_not_fsdp(model: Any, where: str = "the monitor") -> None:
    """Refuse a model with any FSDP-sharded module (FSDP1 ``FullyShardedDataParallel``, FSDP2 ``fully_shard``)."""
    classes = _fsdp_classes()
    if not classes or not isinstance(model, nn.Module):
        return
    for name, m in model.named_modules():
        if isinstance(m, classes):
            kind = (
                "fully_shard (FSDP2)"
                if type(m).__name__ != "FullyShardedDataParallel"
                else "FullyShardedDataParallel (FSDP1)"
            )
            raise WidthscopeError(
                f"{where} cannot probe an FSDP-sharded model ({name or 'the model'} is wrapped by "
                f"{kind}: its parameters are split across ranks); {FSDP_FIX}"
            )


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / DataParallel (the probe needs no wrapper)."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model
