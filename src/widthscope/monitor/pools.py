"""What the monitor probes and leaves untouched: its fixed pools (:func:`as_batches`), the dry probe at
construction (:func:`dry_probe`), the exact restore (:class:`TrainingState`) and the FSDP refusal."""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from ..certification import check_pool, count_examples
from ..errors import WidthscopeError
from ..probe import batched, collect


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
            fsdp1 = type(m).__name__ == "FullyShardedDataParallel"
            kind = "FullyShardedDataParallel (FSDP1)" if fsdp1 else "fully_shard (FSDP2)"
            raise WidthscopeError(
                f"{where} cannot probe an FSDP-sharded model ({name or 'the model'} is wrapped by "
                f"{kind}: its parameters are split across ranks); {FSDP_FIX}"
            )


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / DataParallel (the probe needs no wrapper)."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model
