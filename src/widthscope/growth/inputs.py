"""The inputs of a ``widthscope grow`` run (:func:`widthscope.growth.pipeline.run_grow`): the
built-in model and its pools, a checkpoint's through the shared input layer, and the checks
made on them before any training."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .._io import check_space
from ..data import load
from ..data.inputs import load_model, placement_of, resolve
from ..data.pools import pick_pool
from ..data.spec import InputSpec, PoolSize
from ..errors import WidthscopeError
from ..models import build
from ..probe.points import resolve_points
from ..validate import check_pools
from .options import GrowOptions
from .rank import n_examples

__all__ = ["builtin_inputs", "check_builtin", "check_out_space", "load_inputs"]


def builtin_inputs(
    seed: int = 0, n_train: PoolSize | None = None, n_test: PoolSize | None = None
) -> tuple[nn.Module, Any, Any]:
    """The built-in MLP *untrained* (checked before it trains), its digits split and the pools
    grow uses: the whole split, or seeded subsets of ``n_train`` / ``n_test`` examples."""
    split = load("digits", seed=seed)
    torch.manual_seed(seed)
    model = build("mlp", 64, in_dim=64, out_dim=10, depth=3, activation="tanh")
    pools = []
    for pair, n, s, flag, what in (
        (split.train, n_train, seed, "--n-train", "train"),
        (split.test, n_test, seed + 1, "--n-test", "held-out"),
    ):
        if n is None:
            pools.append(tuple(pair))
            continue
        idx = pick_pool(
            len(pair[0]),
            n,
            s,
            False,
            "examples",
            flag,
            f"the {what} part of digits",
            fixes="pass a checkpoint with more data",
        )
        pools.append(tuple(t[idx] for t in pair))
    return model, split, tuple(pools)


def check_builtin(model: nn.Module, pools: Any, opts: GrowOptions, out: str | None) -> None:
    """grow()'s own checks on the pool sizes and points, before the built-in model trains."""
    M, K, points = opts.M, opts.K, opts.points
    resolve_points(model, points)
    n_tr, n_te = n_examples(pools[0]), n_examples(pools[1])
    if n_te < 8:
        raise WidthscopeError(
            f"--n-test {n_te}: need at least 8 held-out examples (half rank the points, half measure the loss)"
        )
    n_rank = n_te // 2 if opts.n_rank is None else opts.n_rank
    check_pools(M, K, min(n_tr, max(4 * M, 256)), n_rank, test_pool="held-out ranking pool (half of --n-test)")
    check_out_space(model, points, out)


def check_out_space(model: nn.Module, points: Sequence[str] | str | None, out: str | None) -> None:
    """Free space for the ``out`` JSON: candidate and growth rows (about 2 KB each, over-estimated)."""
    if out:
        check_space(out, 20_000 + 8_000 * len(resolve_points(model, points)))


def load_inputs(
    spec: InputSpec,
    points: Sequence[str] | str | None = None,
    show: bool = True,
    check: Callable[[nn.Module], None] | None = None,
) -> Any:
    """Model and pools of ``spec`` through the shared input layer; the points (and ``check``, on
    the loaded model: e.g. what an offloaded model cannot do) are checked before the data is read."""
    model = load_model(
        spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision, placement=placement_of(spec)
    )
    resolve_points(model, points)  # before the data is read
    if check is not None:
        check(model)
    return resolve(spec, model=model, show_progress=show)
