r"""Growth decisions: where should a trained model get a new residual block?

Each candidate point gets the certificate of a zero-initialised bias (``aᵀb``, ``d_align``,
``B_exact``/``B_align``, ``predicted_gain = η aᵀb``, the planner's ``M = K``), points are ranked
(:mod:`widthscope.growth.rank`), and a zero-output block is inserted at the best and trained;
held-out loss before and after is reported beside its first-order prediction. ``compare=True``
repeats at the worst and a random point. Training runs in eval mode. Details: docs/interventions.md §3.

Example::

    >>> import torch
    >>> from widthscope.data import load
    >>> from widthscope.models import build
    >>> from widthscope.growth import GrowOptions, grow
    >>> split = load("digits", n_train=256, n_test=64)
    >>> _ = torch.manual_seed(0)
    >>> model = build("mlp", 16, in_dim=64, out_dim=10, depth=2).eval()
    >>> res = grow(model, split, M=16, K=16, steps=5, lr=1e-3, compare=True, progress=False)
    >>> GrowOptions.from_dict(res["options"]["grow"]) == GrowOptions(M=16, K=16, steps=5, compare=True)
    True
    >>> res["chosen"] in model.widthscope_points, [g["role"] for g in res["growth"]]
    (True, ['best', 'worst', 'continue'])

Command line::

    widthscope grow --model builtin --steps 200 --compare --out grow.json
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, NamedTuple

import torch
import torch.nn as nn

from .. import _args
from .._io import atomic_write_json
from ..data.spec import InputSpec, PoolSize
from ..errors import WidthscopeError
from ..options import with_keywords
from ..probe.batches import index_batch, take
from ..probe.points import resolve_points
from ..train import train as train_model
from ..validate import check_pools
from .block import COMPARE, TRAIN_ALL, check_trainable, continue_training, grow_at, step_flops
from .inputs import builtin_inputs, check_builtin, check_out_space, load_inputs
from .options import DEFAULT_CRITERION, GrowOptions
from .rank import DELTAS, certification_note, n_examples, rank_pairs, rank_points

__all__ = [
    "grow",
    "rank_points",
    "grow_at",
    "run_grow",
    "builtin_inputs",
    "DELTAS",
    "DEFAULT_CRITERION",
    "GrowOptions",
    "certification_note",
    "step_flops",
    "continue_training",
]

_load_inputs = load_inputs  # the name tests and older callers import from here


def grow_options(fn: str, options: GrowOptions | None, keywords: Mapping[str, Any]) -> GrowOptions:
    """``options`` (default ``GrowOptions()``) with the keyword conveniences of ``fn`` applied, each
    validated by the dataclass and named in the error; an unknown keyword is refused with the list
    of settings (:func:`widthscope.options.with_keywords`)."""
    return with_keywords(fn, options, GrowOptions, keywords)


def _check_data(fn: str, data: Any) -> None:
    parts: tuple[tuple[str, Any], ...]
    if isinstance(data, dict) and "train" in data and "test" in data:
        parts = (("data['train']", data["train"]), ("data['test']", data["test"]))
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        parts = (("data[0]", data[0]), ("data[1]", data[1]))
    elif hasattr(data, "train") and hasattr(data, "test"):
        parts = ()  # a Split: its pools are tensors already
    else:
        raise _args.wrong_type(
            fn,
            "data",
            "a widthscope.data Split (with .train/.test), a (train_batches, test_batches) pair or a "
            "dict with 'train' and 'test'",
            data,
        )
    for name, pool in parts:
        _args.batches(fn, name, pool, single=True)


def grow(
    model: nn.Module,
    data: Any,
    options: GrowOptions | None = None,
    *,
    n_train: int | None = None,
    loss_fn: Callable | None = None,
    progress: bool = True,
    **keywords: Any,
) -> dict[str, Any]:
    r"""Rank insertion points by ``options.criterion``, grow a block at the best one, train it.

    The settings are a :class:`~widthscope.growth.options.GrowOptions` (each field's help says what it
    means); keywords named like its fields override them, any other is refused. ``model`` is not modified
    (growth happens on copies; an offloaded model refuses ``train_all`` and ``compare``). ``data`` is a
    :class:`widthscope.data.Split` or ``(train_batches, test_batches)``: the first ``n_rank`` held-out
    examples rank, the rest measure; ``n_train`` examples estimate ``a`` (default ``max(4M, 256)``).
    Returns ``{"candidates", "growth", "chosen", "rows", "certification", "settings", "options"}``; rows
    have ``kind="growth"`` and a ``role`` (candidate|best|worst|random|continue).
    """
    fn = "grow"  # the types, before any work
    _args.module(fn, "model", model)
    _check_data(fn, data)
    opts = grow_options(fn, options, keywords)
    _args.integer(fn, "n_train", n_train, lo=1, optional=True)
    _args.boolean(fn, "progress", progress)
    _args.function(fn, "loss_fn", loss_fn)
    check_offloaded(model, opts)
    M, K, lr, seed = opts.M, opts.K, opts.lr, opts.seed
    train, test = rank_pairs(data)
    pools = _split_pools(model, train, test, opts, n_train)
    probe_train, rank_test = pools.probe_train, pools.rank_test
    n_train, n_rank, n_te = pools.n_train, pools.n_rank, pools.n_test
    cands = rank_points(model, probe_train, rank_test, opts, loss_fn=loss_fn, show_progress=progress)
    common = {"criterion": opts.criterion, "M": M, "K": K, "n_eval": n_te - n_rank}
    growth = _grow_chosen(model, cands, opts, pools, train, common, loss_fn, progress)
    return {
        "chosen": cands[0]["point"],
        "candidates": cands,
        "growth": growth,
        "rows": [*cands, *growth],
        "certification": certification_note(cands, M, K),
        "settings": {
            "M": M,
            "K": K,
            "steps": opts.steps,
            "lr": lr,
            "eta": opts.eta_or_lr,
            "train_all": opts.train_all,
            "criterion": opts.criterion,
            "n_train": n_train,
            "n_rank": n_rank,
            "n_eval": n_te - n_rank,
            "block_width": opts.block_width,
            "seed": seed,
        },
        "options": {"grow": opts.to_dict()},  # what made it: GrowOptions.from_dict repeats it (grow --config)
    }


def _grow_chosen(model, cands, opts: GrowOptions, pools, train, common, loss_fn, progress) -> list[dict[str, Any]]:
    """Grow and train at the chosen points (:func:`_chosen`), then, with ``compare``, the original model
    trained on for the FLOPs the best point's growth used (role ``continue``): the rows of each."""
    M, K, lr, seed, bs = opts.M, opts.K, opts.lr, opts.seed, opts.batch_size
    growth = []
    for role, cand in _chosen(cands, opts):
        _, res = grow_at(
            model,
            cand["point"],
            train,
            pools.evaluate,
            probe_train=take(pools.probe_train, min(M, pools.n_train)),
            probe_test=index_batch(pools.rank_test, slice(0, min(K, pools.n_rank))),
            steps=opts.steps,
            lr=lr,
            block_width=opts.block_width,
            width=cand["width"],
            train_all=opts.train_all,
            batch_size=bs,
            seed=seed,
            loss_fn=loss_fn,
            show_progress=progress,
        )
        keys = ("rank", "predicted_gain", "d_align", "score", "p_improve", "b_exact", "b_align")
        growth.append({"kind": "growth", "role": role, **{k: cand[k] for k in keys}, **common, **res})
    if opts.compare:  # is growing better than training the original model for the same compute?
        res = continue_training(
            model,
            train,
            pools.evaluate,
            flops=growth[0]["flops"],
            lr=lr,
            batch_size=bs,
            seed=seed,
            loss_fn=loss_fn,
            show_progress=progress,
        )
        growth.append({"kind": "growth", "role": "continue", "rank": None, "predicted_gain": None, **common, **res})
    return growth


def check_offloaded(model: nn.Module, opts: GrowOptions) -> None:
    """Growth on a model with offloaded modules trains the new block only: ``train_all`` and
    ``compare`` (whose 'continue' baseline trains the whole model) are refused, one line each."""
    if opts.train_all:
        check_trainable(model, *TRAIN_ALL)
    if opts.compare:
        check_trainable(model, *COMPARE)


class _Pools(NamedTuple):
    probe_train: Any  # the n_train train examples that estimate a
    rank_test: Any  # the n_rank held-out examples that estimate b
    evaluate: Any  # the other held-out examples: the loss before and after
    n_train: int
    n_rank: int
    n_test: int


def _split_pools(model: nn.Module, train: Any, test: Any, opts: GrowOptions, n_train: int | None) -> _Pools:
    """The seeded subsets :func:`grow` ranks on and evaluates on, checked before any work."""
    n_tr, n_te = n_examples(train), n_examples(test)
    if n_te < 8:
        raise WidthscopeError(
            f"need at least 8 held-out examples (got {n_te}): half rank the points, half measure the loss"
        )
    n_rank = n_te // 2 if opts.n_rank is None else opts.n_rank
    if not 4 <= n_rank <= n_te - 4:
        raise WidthscopeError(f"n_rank must leave at least 4 held-out examples on each side; got {n_rank} of {n_te}")
    n_train = min(n_tr, max(4 * opts.M, 256)) if n_train is None else int(n_train)
    if not 1 <= n_train <= n_tr:
        raise WidthscopeError(f"n_train={n_train}: need between 1 and the {n_tr} training examples given")
    resolve_points(model, opts.points)  # unknown names first: the clearest error
    # The same rule and message as certify: M/K draw without replacement from their pools.
    check_pools(opts.M, opts.K, n_train, n_rank, test_pool="held-out ranking pool (half of --n-test)")
    seed = int(opts.seed)
    probe_train = index_batch(
        train, torch.randperm(n_tr, generator=torch.Generator().manual_seed(seed + 1))[:n_train].sort().values
    )
    # A seeded permutation, not the first half: datasets such as text chunks are ordered by
    # position in the corpus, and ranking and evaluation should see the same distribution.
    perm = torch.randperm(n_te, generator=torch.Generator().manual_seed(seed))
    rank_test = index_batch(test, perm[:n_rank].sort().values)
    evaluate = index_batch(test, perm[n_rank:].sort().values)
    return _Pools(probe_train, rank_test, evaluate, n_train, n_rank, n_te)


def _chosen(cands: list[dict[str, Any]], opts: GrowOptions) -> list[tuple[str, dict[str, Any]]]:
    """The points grown: the best; with ``compare`` also the worst and a seeded random other one."""
    chosen = [("best", cands[0])]
    if opts.compare and len(cands) > 1:
        chosen.append(("worst", cands[-1]))
        others = cands[1:-1]
        if others:
            chosen.append(("random", random.Random(opts.seed).choice(others)))
    return chosen


# ----------------------------------------------------------------------------- a whole run
def run_grow(
    spec: InputSpec | None = None,
    options: GrowOptions | None = None,
    *,
    n_train: PoolSize | None = None,
    n_test: PoolSize | None = None,
    dtype: str = "auto",
    out: str | None = None,
    show: bool = True,
    say: Callable[[str], None] = print,
    report: Callable[[dict[str, Any]], None] | None = None,
    **keywords: Any,
) -> dict[str, Any]:
    """What ``widthscope grow`` does, from typed settings: load the model and its pools, check
    them before any training, :func:`grow`, record the inputs, write ``out`` (JSON, atomically).

    ``spec``: the checkpoint and its data (pool sizes as :class:`~widthscope.data.spec.InputSpec`
    says). ``None``: the built-in MLP, trained 300 steps on digits, with seeded subsets of
    ``n_train`` / ``n_test`` examples (default: the whole split), cast to ``dtype``.
    ``options`` (:class:`~widthscope.growth.options.GrowOptions`) with keyword conveniences as for
    :func:`grow`. ``say`` gets the input layer's notes; ``report`` is called with the result
    before it is written (the command line prints its tables there)."""
    opts = grow_options("run_grow", options, keywords)
    inputs = None
    if spec is None:
        model, full, split = builtin_inputs(opts.seed, n_train, n_test)
        check_builtin(model, split, opts, out)
        train_model(model, full, steps=300, lr=3e-3, seed=opts.seed, progress=show)
        model.eval()
        if dtype != "auto":
            model.to(getattr(torch, dtype))
        loss_fn = None
    else:
        if spec.model == "builtin":
            raise WidthscopeError("run_grow: the built-in model is spec=None (with n_train, n_test, dtype)")
        inputs = load_inputs(spec, opts.points, show, check=lambda m: check_offloaded(m, opts))
        model, split, loss_fn = inputs.model, (inputs.train, inputs.test), inputs.loss_fn
        check_out_space(model, opts.points, out)
        for note in inputs.notes:
            say(f"note: {note}")
    res = grow(model, split, opts, loss_fn=loss_fn, progress=show)
    if spec is not None and inputs is not None:
        res["settings"].update(
            model=spec.to_dict()["model"],
            task=inputs.task,
            inputs=inputs.info,
            notes=inputs.notes,
            input_spec=inputs.spec.to_dict(),
        )
        placed = getattr(model, "widthscope_dispatch", None)
        if placed:  # a dispatched model: where its layers ran, as certify records it (docs/big-models.md)
            res["settings"]["placement"] = placed
    if report is not None:
        report(res)
    if out:
        atomic_write_json(out, res)
    return res


def chosen_points(cands: list[dict[str, Any]], opts: GrowOptions) -> list[tuple[str, dict[str, Any]]]:
    """The points a run grows at (``--plan`` counts them)."""
    return _chosen(cands, opts)


def split_pools(model: nn.Module, train: Any, test: Any, opts: GrowOptions) -> Any:
    """The ranking and evaluation pools a run splits (``--plan`` splits them the same way)."""
    return _split_pools(model, train, test, opts, None)
