"""Growing a block and its baseline (the second step of :func:`widthscope.growth.grow`).

:func:`grow_at` inserts a zero-``W_out`` block at a point of a copy of the model, trains it
(AdamW, eval mode) and measures the held-out loss before and after; :func:`continue_training`
trains the original model whole for the same FLOPs (:func:`step_flops`).

A model dispatched by accelerate is copied with its placement
(:func:`widthscope.probe.offload.copy_model`); the new block lives where its point runs. Offloaded
weights cannot be trained (accelerate reloads them at every forward), so ``train_all`` and
:func:`continue_training` refuse a model with offloaded modules, before any work.
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
    """Refuse training every parameter of a model with offloaded modules, in one line: ``what``
    names the setting that asks for it, ``fix`` the way out."""
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
    """AdamW on ``params`` with mini-batches of ``train`` (eval mode: fixed BN stats, no dropout);
    ``after_step(k)`` is called after the ``k``-th step (1-based)."""
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
    """FLOPs of one training step (forward + backward, eval mode) on ``batch`` of the parameters
    that have ``requires_grad``, as ``torch.utils.flop_counter.FlopCounterMode`` totals them
    (element-wise work is not counted). Frozen parameters cost no weight gradient and nothing
    upstream of the first trainable one is back-propagated. The forwards an offloaded model's
    blocks rerun in the backward are not counted."""
    fc = TotalFlops()  # FlopCounterMode's count; its module hooks would defeat the recomputation
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
    """Train *all* parameters of a copy of ``model`` (AdamW, the block's learning rate and batch
    order) for ``max(1, round(flops / step_flops))`` steps; a row with the held-out loss before and
    after on ``evaluate``. Refused for a model with offloaded modules."""
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
    eval_steps: Sequence[int] = (),
    block_seed: int | None = None,
    loss_before: float | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Insert a block at ``point`` of a *copy* of ``model``, train it, measure held-out loss.

    ``eval_steps``: also measure the held-out loss after these step counts (``loss_at``, keyed by
    the step as a string). ``block_seed`` seeds ``W_in`` (default ``seed``, which also orders the
    mini-batches); ``loss_before`` skips re-measuring the ungrown model.
    """
    if train_all:
        check_trainable(model, *TRAIN_ALL)
    grown = copy_model(model)
    if loss_before is None:
        loss_before = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)
    insert(grown, point, "block", width=width, hidden=block_width, seed=seed if block_seed is None else block_seed)
    block = block_of(grown, point)
    G_M = w_out_grad(grown, point, probe_train, loss_fn, batch_size)
    G_K = w_out_grad(grown, point, probe_test, loss_fn, batch_size)
    new = list(block.parameters())
    params = trainable(grown, None if train_all else new)
    f_step = step_flops(grown, first_batch(train, batch_size), loss_fn)
    loss_at: dict[str, float] = {}
    wanted = {int(k) for k in eval_steps if 0 < int(k) < steps}

    def after_step(k: int) -> None:
        if k in wanted:
            loss_at[str(k)] = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)

    fit: dict[str, Any] = dict(lr=lr, batch_size=batch_size, seed=seed, loss_fn=loss_fn, show_progress=show_progress)
    train_new_block(grown, params, train, steps=steps, after_step=after_step, **fit)
    trainable(grown)
    loss_after = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)
    loss_at[str(steps)] = loss_after
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
        "loss_at": loss_at,
        "flops": steps * f_step,
    }
