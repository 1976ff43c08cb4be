"""The growth benchmark's suite (:func:`cells`), the context a cell runs in, and its models and data."""

from __future__ import annotations

import copy
import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn as nn

from .._env import environment, torch_threads
from .._io import atomic_write_text
from ..data import load
from ..errors import WidthscopeError
from ..models import build
from ..probe.batches import batch_size_of, index_batch
from ..probe.blocks import block_of
from ..probe.insert import insert
from ..probe.steps import mean_loss, per_example_losses
from ..sweeps.grid import cell_id

__all__ = ["SUITES", "SEEDS", "cells", "reproducible", "teacher_student", "train_to_plateau"]

# every cell's defaults: the learning-rate grids (block, all parameters), block seeds, plateau rule
_DEFAULTS = dict(
    block_lrs=(1e-3, 3e-3, 1e-2),
    continue_lrs=(3e-4, 1e-3, 3e-3),
    block_seeds=(0, 1, 2),
    eval_every=50,
    patience=3,
    tol=0.01,
)
_LLAMA = dict(
    family="llama",
    data="text",
    depth=4,
    seq_len=32,
    base_lr=3e-3,
    max_steps=1500,
    batch_size=16,
    long=30,
    n_train=1024,
    n_test=1024,
    n_probe=128,
    scratch=False,
    block_lrs=(3e-3, 1e-2, 3e-2),
    continue_lrs=(1e-4, 3e-4, 1e-3),
)
_MLP = dict(
    family="mlp",
    width=64,
    data="digits",
    depth=4,
    base_lr=3e-3,
    max_steps=3000,
    batch_size=32,
    long=160,
    n_probe=256,
    scratch=True,
    block_lrs=(3e-4, 1e-3, 3e-3),
)
_RESNET = dict(
    family="resnet20",
    width=0.25,
    data="digits-images",
    base_lr=3e-3,
    max_steps=1000,
    batch_size=32,
    long=30,
    n_probe=128,
    scratch=False,
    block_lrs=(3e-4, 1e-3, 3e-3),
)
# planted blocks: the teacher's block is never the grown one (other seed and width)
_TEACHER = dict(
    family="teacher",
    width=24,
    depth=4,
    missing=2,
    teacher_hidden=8,
    teacher_seed=7,
    max_steps=0,
    batch_size=32,
    long=160,
    n_train=512,
    n_test=512,
    n_probe=256,
    scratch=False,
    block_lrs=(3e-3, 1e-2, 3e-2),
    continue_lrs=(1e-3, 3e-3, 1e-2),
)
_TEACHER_LAST = {
    **_TEACHER,
    "model": "teacher-last",
    "depth": 3,
    "teacher_hidden": 16,
    "teacher_seed": 5,
    "damp": 0.3,
}
# cheap cells first: a run cut short still has every planted case and the MLP
SUITES: dict[str, list[dict[str, Any]]] = {
    "full": [
        {**_TEACHER, "model": "teacher-student"},
        _TEACHER_LAST,
        {**_MLP, "model": "mlp-64"},
        *({**_LLAMA, "model": f"llama-{w}", "width": w} for w in (16, 32)),
        {**_RESNET, "model": "resnet20-0.25"},
    ],
    "quick": [
        {
            **_LLAMA,
            "model": "llama-16",
            "width": 16,
            "depth": 3,
            "seq_len": 16,
            "max_steps": 100,
            "long": 10,
            "n_train": 256,
            "n_test": 256,
            "n_probe": 64,
        },
        {**_MLP, "model": "mlp-32", "width": 32, "depth": 3, "max_steps": 200, "long": 20, "n_probe": 128},
        {**_TEACHER, "model": "teacher-student", "long": 30},
        {**_TEACHER_LAST, "long": 30},
    ],
}
SEEDS = {"full": (0, 1, 2, 3, 4), "quick": (0, 1, 2)}


def cells(suite: str = "full", seeds: Sequence[int] | None = None, *, M: int = 32, K: int = 32) -> list[dict[str, Any]]:
    if suite not in SUITES:
        raise WidthscopeError(f"unknown growth suite {suite!r}; choose one of {', '.join(SUITES)}")
    seeds = SEEDS[suite] if seeds is None else tuple(seeds)
    return [{**_DEFAULTS, **spec, "seed": int(s), "M": M, "K": K} for spec in SUITES[suite] for s in seeds]


@contextmanager
def reproducible(threads: int = 1) -> Iterator[dict[str, Any]]:
    """``threads`` torch threads and deterministic algorithms inside; yields :func:`widthscope._env.environment`."""
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    with torch_threads(int(threads)):
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield environment()
        finally:
            torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def own_cells(out_dir: Path, grid: Sequence[Mapping[str, Any]], what: str) -> set[str]:
    """The ids of ``grid``'s cells; refuses an ``out_dir`` holding cells of another run (``what``)."""
    ids = {cell_id(c) for c in grid}
    foreign = [p.stem for p in (out_dir / "cells").glob("*.json") if p.stem not in ids]
    if foreign:
        raise WidthscopeError(
            f"{out_dir} holds {len(foreign)} finished cell(s) of another {what}; pass a new --out, or the options "
            "of that run"
        )
    return ids


def write_table(out_dir: Path, table: Sequence[Mapping[str, Any]]) -> None:
    """``out_dir/comparison.jsonl``: one JSON line per row of ``table``."""
    atomic_write_text(out_dir / "comparison.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in table))


def teacher_student(
    seed: int,
    *,
    width: int = 24,
    depth: int = 4,
    missing: int = 2,
    hidden: int | None = None,
    block_seed: int = 0,
    n_train: int = 512,
    n_test: int = 256,
    teacher_seed: int | None = None,
    damp: float | None = None,
) -> tuple[nn.Module, tuple[Any, Any], str]:
    """(student, (train, test), point): a student MLP lacking one residual block of its teacher at
    ``blocks.{missing}``; targets are the teacher's outputs. ``damp`` scales the linear maps of
    ``blocks.1 … blocks.{missing}``."""
    gen = torch.Generator().manual_seed(1000 + int(seed))
    torch.manual_seed(1000 + int(seed))
    student = build("mlp", width, in_dim=8, out_dim=4, depth=depth, activation="tanh").double().eval()
    if damp is not None:
        with torch.no_grad():
            for i in range(1, missing + 1):
                student.get_parameter(f"blocks.{i}.linear.weight").mul_(damp)
    teacher = build(**student.widthscope_config).double().eval()  # type: ignore[arg-type]
    teacher.load_state_dict(student.state_dict())
    point = f"blocks.{missing}"
    insert(teacher, point, "block", hidden=hidden or width, seed=block_seed if teacher_seed is None else teacher_seed)
    with torch.no_grad():
        w = block_of(teacher, point).w_out
        w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * 0.6)
    x = torch.randn(n_train + n_test, 8, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = teacher(x)
    return student, ((x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])), point


def train_to_plateau(
    model: nn.Module,
    train: Any,
    monitor: Any,
    *,
    lr: float,
    batch_size: int,
    seed: int,
    eval_every: int,
    patience: int,
    tol: float,
    max_steps: int,
) -> dict[str, Any]:
    """AdamW (clipped, warm-up over ``eval_every`` steps) until ``min(last patience evals on monitor)
    > (1 − tol) · min(evals before them)`` or ``max_steps``; restores the best state, eval mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    n = batch_size_of(train)
    hist: list[float] = []
    best, best_state, best_step, step, plateau = math.inf, None, 0, 0, False
    model.train()
    while step < max_steps and not plateau:
        for _ in range(min(eval_every, max_steps - step)):
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / eval_every)
            idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
            loss = per_example_losses(model, index_batch(train, idx), batch_size=batch_size, grad=True).mean()
            if not torch.isfinite(loss):
                raise WidthscopeError(f"base training diverged at step {step} (loss {float(loss)}); lower base_lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
        v = mean_loss(model, monitor, batch_size=64)
        hist.append(v)
        if v < best:
            best, best_step, best_state = v, step, copy.deepcopy(model.state_dict())
        plateau = len(hist) > patience and min(hist[-patience:]) > (1 - tol) * min(hist[:-patience])
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return {
        "base_steps": step,
        "base_best_step": best_step,
        "base_plateau": plateau,
        "base_monitor_loss": best,
        "base_history": hist,
    }


def build_model(cell: Mapping[str, Any], depth: int) -> nn.Module:
    if cell["data"] == "text":
        return build("llama", cell["width"], depth=depth, max_seq_len=cell["seq_len"])
    if cell["data"] == "digits-images":
        return build("resnet20", cell["width"], in_channels=1, num_classes=10)
    return build("mlp", cell["width"], in_dim=64, out_dim=10, depth=depth, activation="tanh")


def cell_data(cell: Mapping[str, Any]) -> tuple[Any, Any, str | None, nn.Module | None]:
    """(train, test) pooled examples; for the teacher cases also the answer and the student."""
    seed = int(cell["seed"])
    if cell["family"] == "teacher":
        sizes = {k: cell[k] for k in ("width", "depth", "missing", "n_train", "n_test")}
        planted = dict(hidden=cell["teacher_hidden"], teacher_seed=cell["teacher_seed"], damp=cell.get("damp"))
        model, (tr, te), point = teacher_student(seed, **sizes, **planted)
        return tr, te, point, model
    if cell["data"] == "text":
        sizes = {k: cell[k] for k in ("n_train", "n_test", "seq_len")}
        split = load("text", seed=seed, max_bytes=400_000, **sizes)
        return split.train[0], split.test[0], None, None  # token ids only
    split = load("digits", seed=seed)
    tr, te = tuple(split.train), tuple(split.test)
    if cell["data"] == "digits-images":
        tr, te = (tr[0].view(-1, 1, 8, 8), tr[1]), (te[0].view(-1, 1, 8, 8), te[1])
    return tr, te, None, None


def split_held_out(cell: Mapping[str, Any], test: Any) -> dict[str, Any]:
    """The held-out pool, seeded: ``rank`` (half: criteria, plateau, learning rates), ``A`` (oracle)
    and ``B`` (gains) a quarter each."""
    n = batch_size_of(test)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(cell["seed"])))
    a, b = n // 2, n // 2 + n // 4
    return {k: index_batch(test, perm[lo:hi].sort().values) for k, lo, hi in (("rank", 0, a), ("A", a, b), ("B", b, n))}
