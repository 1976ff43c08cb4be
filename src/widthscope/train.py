"""Training loop shared by every command: AdamW/SGD, linear warm-up + cosine decay, gradient
clipping, seeded batch order, divergence detection; and the one definition of the losses.

Per-example losses: classification ``ℓ_i = −log softmax(f(x_i))[y_i]``; causal LM (``x`` a ``(B, T)``
token tensor) the mean over ``t < T`` of ``−log p(x_{i,t+1} | x_{i,≤t})``; ``loss="mse"``
(classification) ``Σ_k (f_k(x_i) − onehot(y_i)_k)²``. The batch loss is their mean. Learning rate at
step ``s`` with ``W`` warm-up steps: ``lr·(s+1)/W`` for ``s < W``, then
``lr·½(1 + cos(π (s−W)/(steps−W)))`` (cosine) or ``lr`` (constant).

Example::

    >>> import torch
    >>> from widthscope.data import load
    >>> from widthscope.models import build
    >>> from widthscope.train import train
    >>> split = load("digits", n_train=256)
    >>> _ = torch.manual_seed(0)
    >>> model = build("mlp", 64, in_dim=64, out_dim=10)
    >>> result = train(model, split, steps=50, lr=1e-2, progress=False)
    >>> result["steps"], result["test_accuracy"] > 0.5
    (50, True)
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ._io import progress as _progress
from .data import Split, batches
from .errors import WidthscopeError
from .probe.collect import logits_of

LOSSES = ("auto", "ce", "mse")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device`` this installation can use, else a WidthscopeError naming it."""
    try:
        dev = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise WidthscopeError(
            f"device {device!r} is not a torch device ({exc}); use e.g. cpu, cuda, cuda:1, mps"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise WidthscopeError(
                f"device {str(dev)!r}: CUDA is not available in this installation "
                f"(torch {torch.__version__}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise WidthscopeError(
                f"device {str(dev)!r}: only {torch.cuda.device_count()} CUDA device(s) "
                f"visible (cuda:0..cuda:{torch.cuda.device_count() - 1})"
            )
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise WidthscopeError(f"device {str(dev)!r}: MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "meta"):
        backend = getattr(torch, dev.type, None)
        if backend is None or not getattr(backend, "is_available", lambda: False)():
            raise WidthscopeError(f"device {str(dev)!r} is not available here; use --device cpu")
    return dev


def per_example_loss(output: Any, target: torch.Tensor, task: str, *, loss: str = "ce") -> torch.Tensor:
    """Per-example losses ``(B,)`` (the module docstring); ``task="lm"``: ``target`` is the tokens."""
    logits = logits_of(output)
    if task == "lm":
        if logits.dim() != 3 or target.dim() != 2:
            raise WidthscopeError(
                f"lm loss needs logits (B, T, V) and tokens (B, T); got {tuple(logits.shape)} and {tuple(target.shape)}"
            )
        B, T, V = logits.shape
        if T < 2:
            raise WidthscopeError("lm loss needs sequences of at least 2 tokens")
        # half-precision logits are upcast: the log-softmax over V is ill-conditioned in 16 bits
        lg = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        tok = nn.functional.cross_entropy(lg[:, :-1].reshape(-1, V), target[:, 1:].reshape(-1), reduction="none")
        return tok.view(B, T - 1).mean(dim=1)
    if task != "classification":
        raise WidthscopeError(f"unknown task {task!r}; valid: classification, lm")
    if loss == "mse":
        onehot = nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)
        return ((logits - onehot) ** 2).sum(dim=-1)
    return nn.functional.cross_entropy(logits, target, reduction="none")


def _forward(
    model: nn.Module, batch: Any, task: str, loss: str, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(per-example losses, logits) of one batch."""
    if task == "lm":
        x = batch.to(device)
        return per_example_loss(model(x), x, task), None
    out = model(batch[0].to(device))
    return per_example_loss(out, batch[1].to(device), task, loss=loss), logits_of(out)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    pair: tuple[torch.Tensor, torch.Tensor],
    task: str,
    batch_size: int = 256,
    *,
    loss: str = "ce",
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """``{"loss", "accuracy"}`` (no accuracy for ``task="lm"``) over ``pair``, in eval mode."""
    was_training = model.training
    model.eval()
    total, correct, n = 0.0, 0, 0
    try:
        for batch in batches(pair, batch_size, lm=(task == "lm")):
            losses, logits = _forward(model, batch, task, loss, device)
            total += float(losses.double().sum())
            n += losses.shape[0]
            if logits is not None:
                correct += int((logits.argmax(-1).cpu() == batch[1]).sum())
    finally:
        model.train(was_training)
    if n == 0:
        raise WidthscopeError("evaluate: the data is empty")
    result = {"loss": total / n}
    if task != "lm":
        result["accuracy"] = correct / n
    return result


def lr_at(step: int, *, steps: int, lr: float, warmup_steps: int, schedule: str) -> float:
    """Learning rate at 0-based ``step`` (see the module docstring)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    span = max(1, steps - warmup_steps)
    return lr * 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / span))


def _stream(pair: tuple[torch.Tensor, torch.Tensor], batch_size: int, seed: int, lm: bool) -> Iterator[Any]:
    """Endless batches: epoch e is a fresh permutation seeded by (seed, e)."""
    if len(pair[0]) == 0:
        raise WidthscopeError("train: the training data is empty")
    epoch = 0
    while True:
        yield from batches(pair, batch_size, shuffle=True, seed=seed * 1_000_003 + epoch, lm=lm)
        epoch += 1


def _check_train(split, steps, lr, warmup, batch_size, loss, schedule) -> None:
    """:func:`train`'s argument checks, before any work."""
    if not all(hasattr(split, a) for a in ("train", "test", "task")):
        raise WidthscopeError(
            f"split must be a widthscope.data.Split (with .train, .test, .task), got "
            f"{type(split).__name__}; e.g. widthscope.data.load('digits')"
        )
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise WidthscopeError(f"steps must be a positive integer, got {steps!r}")
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 and math.isfinite(lr)):
        raise WidthscopeError(f"lr must be > 0, got {lr!r}")
    if not (isinstance(warmup, (int, float)) and math.isfinite(warmup) and warmup >= 0):
        raise WidthscopeError(
            f"warmup must be >= 0 (a fraction of steps when < 1, else a number of steps), got {warmup!r}"
        )
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise WidthscopeError(f"batch_size must be >= 1, got {batch_size!r}")
    if loss not in LOSSES:
        raise WidthscopeError(f"unknown loss {loss!r}; valid: {', '.join(LOSSES)}")
    if schedule not in ("cosine", "constant"):
        raise WidthscopeError(f"unknown schedule {schedule!r}; valid: cosine, constant")
    if loss == "mse" and split.task == "lm":
        raise WidthscopeError("loss='mse' is for classification; language models use 'auto'")


def _optimizer(name: str, params: list, lr: float, weight_decay: float, momentum: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise WidthscopeError(f"unknown optimizer {name!r}; valid: adamw, sgd")


def _final_eval(model, split, task, eval_batch_size, loss_kind, device, steps, seed, train_eval_examples):
    """The final train (a seeded subset) and test evaluations, and how many train examples."""
    train_pair = split.train
    if train_eval_examples is not None and len(train_pair[0]) > train_eval_examples:
        idx = torch.randperm(len(train_pair[0]), generator=torch.Generator().manual_seed(seed))[:train_eval_examples]
        idx = idx.sort().values
        xs = train_pair[0][idx]
        train_pair = (xs, xs) if task == "lm" else (xs, train_pair[1][idx])
    ev_train = evaluate(model, train_pair, task, eval_batch_size, loss=loss_kind, device=device)
    ev_test = evaluate(model, split.test, task, eval_batch_size, loss=loss_kind, device=device)
    for name, value in (("train", ev_train["loss"]), ("test", ev_test["loss"])):
        if not math.isfinite(value):
            raise WidthscopeError(
                f"training ended with a non-finite {name} loss after step {steps}; lower the learning rate"
            )
    return ev_train, ev_test, len(train_pair[0])


def train(
    model: nn.Module,
    split: Split,
    *,
    steps: int,
    lr: float,
    optimizer: str = "adamw",
    batch_size: int = 64,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    warmup: float = 0.1,
    schedule: str = "cosine",
    clip: float | None = 1.0,
    seed: int = 0,
    loss: str = "auto",
    eval_every: int | None = None,
    eval_batch_size: int = 256,
    train_eval_examples: int | None = 8192,
    device: str | torch.device = "cpu",
    progress: bool = True,
    on_step: Callable[[nn.Module, int], Any] | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place on ``split.train`` for ``steps`` steps; returns the final losses
    (and accuracies), ``steps``, ``seconds`` and ``history``. ``warmup``: a fraction of ``steps`` when
    < 1, else steps; ``clip``: max gradient norm (None/0: off); ``on_step(model, s)`` runs before the
    first step and after each; a non-finite loss raises :class:`WidthscopeError`."""
    _check_train(split, steps, lr, warmup, batch_size, loss, schedule)
    device = resolve_device(device)
    task = split.task
    loss_kind = "mse" if loss == "mse" else "ce"
    warmup_steps = max(0, min(int(round(warmup * steps)) if warmup < 1 else int(warmup), steps))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _optimizer(optimizer, params, lr, weight_decay, momentum)

    model.to(device)
    model.train()
    stream = _stream(split.train, batch_size, seed, task == "lm")
    history: list[dict[str, Any]] = []
    log_every = max(1, steps // 100)
    t0 = time.perf_counter()
    bar = _progress(range(steps), desc="train", disable=None if progress else True)
    if on_step is not None:
        on_step(model, 0)
    for step in bar:
        lr_s = lr_at(step, steps=steps, lr=lr, warmup_steps=warmup_steps, schedule=schedule)
        for group in opt.param_groups:
            group["lr"] = lr_s
        losses, _ = _forward(model, next(stream), task, loss_kind, device)
        batch_loss = losses.mean()
        loss_value = batch_loss.item()
        if not math.isfinite(loss_value):
            raise WidthscopeError(
                f"training diverged: loss is {loss_value} at step {step} "
                f"(lr={lr_s:.3g}); lower the learning rate or enable clipping"
            )
        opt.zero_grad(set_to_none=True)
        batch_loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if on_step is not None:
            on_step(model, step + 1)
        row: dict[str, Any] = {"step": step + 1, "lr": lr_s, "loss": loss_value}
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            ev = evaluate(model, split.test, task, eval_batch_size, loss=loss_kind, device=device)
            row.update({f"test_{k}": v for k, v in ev.items()})
            model.train()
        if row.keys() - {"step", "lr", "loss"} or (step + 1) % log_every == 0 or step == 0:
            history.append(row)
        if hasattr(bar, "set_postfix") and (step + 1) % log_every == 0:
            bar.set_postfix(loss=f"{loss_value:.4g}")
    seconds = time.perf_counter() - t0
    ev_train, ev_test, n_train_eval = _final_eval(
        model, split, task, eval_batch_size, loss_kind, device, steps, seed, train_eval_examples
    )
    history.append(
        {
            "step": steps,
            "lr": lr_at(steps - 1, steps=steps, lr=lr, warmup_steps=warmup_steps, schedule=schedule),
            **{f"train_{k}": v for k, v in ev_train.items()},
            **{f"test_{k}": v for k, v in ev_test.items()},
        }
    )
    result: dict[str, Any] = {
        "train_loss": ev_train["loss"],
        "test_loss": ev_test["loss"],
        "steps": steps,
        "seconds": seconds,
        "history": history,
        "optimizer": optimizer,
        "lr": lr,
        "seed": seed,
        "loss": loss_kind,
        "train_eval_examples": n_train_eval,
    }
    if task != "lm":
        result.update(train_accuracy=ev_train["accuracy"], test_accuracy=ev_test["accuracy"])
    model.eval()
    return result
