"""Growing one block (:func:`grow_at`) and its baseline, training the original model whole for the
same FLOPs (:func:`continue_training`, :func:`step_flops`). Offloaded weights cannot be trained
(accelerate reloads them at every forward), so training every parameter refuses them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .._io import progress
from ..errors import WidthscopeError
from ..probe.batches import batch_size_of, index_batch
from ..probe.blocks import block_of, w_out_grad
from ..probe.collect import EvalMode
from ..probe.insert import insert
from ..probe.offload import TotalFlops, copy_model, offloaded_modules, recompute_flops
from ..probe.steps import mean_loss, per_example_losses

__all__ = ["grow_at", "step_flops", "continue_training", "check_trainable", "TRAIN_ALL", "COMPARE"]

# (the setting that trains every parameter, the way out): check_trainable's words
_ROOM = "or raise --max-memory (max_memory) so that nothing is offloaded"
TRAIN_ALL = ("--train-all (train_all=True)", f"train the new block only (drop --train-all), {_ROOM}")
COMPARE = ("the 'continue' baseline of --compare (compare=True)", f"drop --compare, {_ROOM}")


def check_trainable(model: nn.Module, what: str, fix: str) -> None:
    """Refuse training every parameter of a model with offloaded modules (``what`` asks for it)."""
    off = [n for n in offloaded_modules(model) if any(True for _ in model.get_submodule(n).parameters())]
    if off:
        shown = ", ".join(off[:3]) + (f" (+{len(off) - 3} more)" if len(off) > 3 else "")
        raise WidthscopeError(
            f"{what} trains every parameter, but {len(off)} module(s) of the model are offloaded ({shown}): "
            f"accelerate reloads their weights at every forward, so their updates would be lost; {fix}"
        )


def trainable(model: nn.Module, params: Sequence[nn.Parameter] | None = None) -> list[nn.Parameter]:
    """Only ``params`` (default: every parameter) require gradients; returns those that do."""
    ids = None if params is None else {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(ids is None or id(p) in ids)
    return [p for p in model.parameters() if p.requires_grad]


def first_batch(train: Any, batch_size: int) -> Any:
    """The first ``batch_size`` examples of ``train`` (what :func:`step_flops` is counted on)."""
    return index_batch(train, slice(0, min(batch_size, batch_size_of(train))))


def train_new_block(
    model: nn.Module,
    params: list[nn.Parameter],
    train: Any,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    loss_fn: Callable | None,
    show_progress: bool,
    after_step: Callable[[int], None] | None = None,
) -> None:
    """AdamW on ``params`` with mini-batches of ``train`` in eval mode; ``after_step(k)`` after step ``k`` (1-based)."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    n = batch_size_of(train)
    with EvalMode(model):
        for step in progress(range(steps), desc="grow: train", disable=None if show_progress else True):
            idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
            loss = per_example_losses(model, index_batch(train, idx), loss_fn, batch_size=batch_size, grad=True).mean()
            if not torch.isfinite(loss):
                raise WidthscopeError(
                    f"training the new block diverged at step {step} (loss {float(loss)}); lower --lr"
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step(step + 1)


def step_flops(model: nn.Module, batch: Any, loss_fn: Callable | None = None) -> int:
    """FLOPs of one training step (forward + backward, eval mode) on ``batch`` of the parameters that
    require grad, by ``FlopCounterMode`` (recomputed forwards of an offloaded model not counted)."""
    fc = TotalFlops()
    with EvalMode(model), recompute_flops() as rerun, fc:
        loss = per_example_losses(model, batch, loss_fn, batch_size=batch_size_of(batch), grad=True).mean()
        if loss.requires_grad:
            loss.backward()
    for p in model.parameters():
        p.grad = None
    return int(fc.get_total_flops()) - sum(rerun)


def continue_training(
    model: nn.Module,
    train: Any,
    evaluate: Any,
    *,
    flops: float,
    lr: float,
    batch_size: int = 64,
    seed: int = 0,
    loss_fn: Callable | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Train all parameters of a copy of ``model`` for ``flops`` worth of steps; a row with the loss
    on ``evaluate`` before and after."""
    check_trainable(model, *COMPARE)
    cont = copy_model(model)
    params = trainable(cont)
    f_step = step_flops(cont, first_batch(train, batch_size), loss_fn)
    steps = max(1, int(round(flops / max(f_step, 1))))
    before = mean_loss(cont, evaluate, loss_fn, batch_size=batch_size)
    fit: dict[str, Any] = dict(lr=lr, batch_size=batch_size, seed=seed, loss_fn=loss_fn, show_progress=show_progress)
    train_new_block(cont, params, train, steps=steps, **fit)
    after = mean_loss(cont, evaluate, loss_fn, batch_size=batch_size)
    return {
        "point": "(none: train the original longer)",
        "loss_before": before,
        "loss_after": after,
        "delta": after - before,
        "steps": steps,
        "lr": lr,
        "train_all": True,
        "flops": steps * f_step,
        "new_parameters": 0,
    }


def grow_at(
    model: nn.Module,
    point: str,
    train: Any,
    evaluate: Any,
    *,
    probe_train: Any,
    probe_test: Any,
    steps: int,
    lr: float,
    block_width: int | None,
    width: int,
    train_all: bool = False,
    batch_size: int = 64,
    seed: int = 0,
    loss_fn: Callable | None = None,
    show_progress: bool = True,
    loss_before: float | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Insert a block at ``point`` of a copy of ``model``, train it, measure the held-out loss."""
    if train_all:
        check_trainable(model, *TRAIN_ALL)
    grown = copy_model(model)
    if loss_before is None:
        loss_before = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)
    insert(grown, point, "block", width=width, hidden=block_width, seed=seed)
    block = block_of(grown, point)
    G_M = w_out_grad(grown, point, probe_train, loss_fn, batch_size)
    G_K = w_out_grad(grown, point, probe_test, loss_fn, batch_size)
    new = list(block.parameters())
    params = trainable(grown, None if train_all else new)
    f_step = step_flops(grown, first_batch(train, batch_size), loss_fn)
    fit: dict[str, Any] = dict(lr=lr, batch_size=batch_size, seed=seed, loss_fn=loss_fn, show_progress=show_progress)
    train_new_block(grown, params, train, steps=steps, **fit)
    trainable(grown)
    loss_after = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)
    alignment = float((G_M * G_K).sum())
    return grown, {
        "point": point,
        "loss_before": loss_before,
        "loss_after": loss_after,
        "delta": loss_after - loss_before,
        "block_alignment": alignment,
        "predicted_first_step": -lr * alignment,
        "steps": steps,
        "lr": lr,
        "train_all": bool(train_all),
        "block_width": block.hidden,
        "new_parameters": sum(p.numel() for p in new),
        "loss_at": {str(steps): loss_after},
        "flops": steps * f_step,
    }
