r"""Growth decisions: where should a trained model get a new residual block? :func:`rank_points`
scores the points, :func:`grow` grows at the best one, :func:`run_grow` is ``widthscope grow``.

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
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn as nn

from .. import _args
from .._io import atomic_write_json, check_space
from ..data import load
from ..data.inputs import load_model, placement_of, resolve
from ..data.pools import pick_pool
from ..data.spec import InputSpec, PoolSize
from ..errors import WidthscopeError
from ..models import build
from ..options import with_keywords
from ..probe.batches import as_examples, batch_size_of, index_batch, take, to_batches
from ..probe.collect import collect
from ..probe.growth import CRITERIA, point_criteria
from ..probe.points import resolve_points
from ..stats import certificate, plan, vacuous_rule
from ..train import train as train_model
from ..validate import check_pools
from .block import COMPARE, TRAIN_ALL, check_trainable, continue_training, grow_at
from .options import GrowOptions

__all__ = ["grow", "rank_points", "run_grow", "builtin_inputs", "certification_note"]

DELTAS = (0.1, 0.05, 0.01)


# what the committed grow-bench rows say of every criterion (docs/interventions.md §5)
CRITERION_NOTE = (
    "criterion {criterion}: unvalidated; in the committed grow-bench rows no criterion ranks points better than "
    "random, last or middle, and growing at the best point did not beat training the original model longer "
    "(docs/interventions.md section 5)"
)


def rank_pairs(data: Any) -> tuple[Any, Any]:
    """(train, test) pooled examples of ``data`` as :func:`grow` checked it: a Split, a dict or a pair."""
    if hasattr(data, "train") and hasattr(data, "test"):
        return tuple(data.train), tuple(data.test)
    if isinstance(data, dict):
        return as_examples(data["train"]), as_examples(data["test"])
    return as_examples(data[0]), as_examples(data[1])


def rank_points(
    model: nn.Module,
    train: Any,
    test: Any,
    options: GrowOptions | None = None,
    *,
    loss_fn: Callable | None = None,
    show_progress: bool = True,
    **keywords: Any,
) -> list[dict[str, Any]]:
    """Certificate, predicted gain and sample-size plan for every candidate point, best first by
    ``options.criterion`` (``"bias"``: ``η aᵀb``; the others: the block's columns of
    :func:`widthscope.probe.growth.point_criteria`). Rows carry ``score``, ``p_improve``
    (``1 − B_exact``, 0 when vacuous), ``MK_needed_δ`` and ``rank``."""
    opts = with_keywords("rank_points", options, GrowOptions, keywords)
    M, K, eta, criterion, batch_size = opts.M, opts.K, opts.eta_or_lr, opts.criterion, opts.batch_size
    names = resolve_points(model, opts.points)
    S_a = collect(model, to_batches(train, batch_size), points=names, loss_fn=loss_fn, progress=show_progress)
    S_b = collect(model, to_batches(test, batch_size), points=names, loss_fn=loss_fn, progress=show_progress)
    block: dict[str, Any] = dict(
        hidden=opts.block_width, block_seed=opts.seed, loss_fn=loss_fn, batch_size=batch_size, deltas=DELTAS
    )
    rows = []
    for p in names:
        c = certificate(S_a[p], S_b[p], M=M, K=K)
        row: dict[str, Any] = {
            "kind": "growth",
            "role": "candidate",
            "point": p,
            "width": int(S_a[p].shape[1]),
            "M": M,
            "K": K,
            **{k: getattr(c, k) for k in ("expectation", "d_align", "b_exact", "b_align", "vacuous", "reason")},
            "eta": eta,
            "predicted_gain": eta * c.expectation,
        }
        vacuous_rule(row)
        for d in DELTAS:
            pl = plan(S_a[p], S_b[p], target=d)
            row[f"MK_exact_{d:g}"], row[f"MK_align_{d:g}"] = pl.equal_exact, pl.equal_align
        p_improve = 0.0 if c.vacuous or not c.expectation > 0 else 1.0 - c.b_exact
        row.update(criterion=criterion, score=row["predicted_gain"], p_improve=p_improve)
        needed = [row[f"MK_exact_{d:g}"] for d in DELTAS]
        if criterion != "bias":
            pc = point_criteria(model, p, train, test, M=M, K=K, eta=eta, **block)
            row.update({k: v for k, v in pc.items() if k.startswith(("block_", "gradmax", "certified", "ls_"))})
            row.update(score=pc[CRITERIA[criterion]], p_improve=pc["p_improve"])
            needed = [pc[f"block_MK_exact_{d:g}"] for d in DELTAS]
        row.update({f"MK_needed_{d:g}": n for d, n in zip(DELTAS, needed)})
        rows.append(row)

    def key(r: dict[str, Any]) -> tuple[bool, float]:
        v = r["score"] if r["score"] is not None and not math.isnan(r["score"]) else -math.inf  # NaN last
        return (bool(r["vacuous"]) if criterion == "bias" else False, -v)

    order = sorted(rows, key=key)
    for i, r in enumerate(order, 1):
        r["rank"] = i
    return order


def certification_note(cands: Sequence[dict[str, Any]], M: int, K: int, delta: float = 0.1) -> str:
    """Which points are certified at ``δ`` (``B_exact ≤ δ``), or else the ``M = K`` that would certify one."""
    ok = [c["point"] for c in cands if c.get("p_improve", 0.0) >= 1.0 - delta]
    mk = f"M = K = {M}" if M == K else f"M = {M}, K = {K}"
    if ok:
        return f"certified at δ = {delta:g} with {mk} (probability of improvement ≥ {1 - delta:g}): {', '.join(ok)}"
    asked = [c.get(f"MK_needed_{delta:g}") for c in cands]
    need = [n for n in asked if isinstance(n, int)]
    tail = (
        f"collect M = K ≥ {min(need)} to decide"
        if need
        else "the planner finds no M = K either: every certificate is vacuous (estimated gain or a "
        "variance term ≤ 0); rank on more examples (--n-train, --n-test)"
    )
    return f"no point is certified at δ = {delta:g} with {mk}; {tail}"


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

    ``data``: a :class:`widthscope.data.Split` or ``(train_batches, test_batches)``; ``n_rank``
    held-out examples rank, the rest measure; ``n_train`` (default ``max(4M, 256)``) estimate ``a``.
    ``model`` is not modified; keywords override ``options``' fields. Rows have ``kind="growth"``
    and a ``role`` (candidate|best|worst|random|continue).
    """
    fn = "grow"
    _args.module(fn, "model", model)
    _check_data(fn, data)
    opts = with_keywords(fn, options, GrowOptions, keywords)
    _args.integer(fn, "n_train", n_train, lo=1, optional=True)
    _args.boolean(fn, "progress", progress)
    _args.function(fn, "loss_fn", loss_fn)
    check_offloaded(model, opts)
    M, K = opts.M, opts.K
    train, test = rank_pairs(data)
    pools = split_pools(model, train, test, opts, n_train)
    cands = rank_points(model, pools.probe_train, pools.rank_test, opts, loss_fn=loss_fn, show_progress=progress)
    n_eval = pools.n_test - pools.n_rank
    common = {"criterion": opts.criterion, "M": M, "K": K, "n_eval": n_eval}
    fit: dict[str, Any] = dict(lr=opts.lr, batch_size=opts.batch_size, seed=opts.seed, loss_fn=loss_fn)
    fit.update(show_progress=progress)
    probes = dict(
        probe_train=take(pools.probe_train, min(M, pools.n_train)),
        probe_test=index_batch(pools.rank_test, slice(0, min(K, pools.n_rank))),
    )
    block: dict[str, Any] = dict(steps=opts.steps, block_width=opts.block_width, train_all=opts.train_all, **probes)
    growth = []
    for role, cand in chosen_points(cands, opts):
        _, res = grow_at(model, cand["point"], train, pools.evaluate, width=cand["width"], **block, **fit)
        keys = ("rank", "predicted_gain", "d_align", "score", "p_improve", "b_exact", "b_align")
        growth.append({"kind": "growth", "role": role, **{k: cand[k] for k in keys}, **common, **res})
    if opts.compare:
        res = continue_training(model, train, pools.evaluate, flops=growth[0]["flops"], **fit)
        growth.append({"kind": "growth", "role": "continue", "rank": None, "predicted_gain": None, **common, **res})
    fields = ("M", "K", "steps", "lr", "train_all", "criterion", "block_width", "seed")
    return {
        "chosen": cands[0]["point"],
        "candidates": cands,
        "growth": growth,
        "rows": [*cands, *growth],
        "certification": certification_note(cands, M, K),
        "criterion_note": CRITERION_NOTE.format(criterion=opts.criterion),
        "settings": {
            **{k: getattr(opts, k) for k in fields},
            "eta": opts.eta_or_lr,
            "n_train": pools.n_train,
            "n_rank": pools.n_rank,
            "n_eval": n_eval,
        },
        "options": {"grow": opts.to_dict()},
    }


def check_offloaded(model: nn.Module, opts: GrowOptions) -> None:
    """Refuse ``train_all`` and ``compare`` (which train every parameter) on an offloaded model."""
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


def split_pools(model: nn.Module, train: Any, test: Any, opts: GrowOptions, n_train: int | None = None) -> _Pools:
    """The seeded subsets :func:`grow` ranks and evaluates on, checked before any work."""
    n_tr, n_te = batch_size_of(train), batch_size_of(test)
    if n_te < 8:
        raise WidthscopeError(
            f"need at least 8 held-out examples (got {n_te}, --n-test): half rank the points, half measure the loss"
        )
    n_rank = n_te // 2 if opts.n_rank is None else opts.n_rank
    if not 4 <= n_rank <= n_te - 4:
        raise WidthscopeError(f"n_rank must leave at least 4 held-out examples on each side; got {n_rank} of {n_te}")
    n_train = min(n_tr, max(4 * opts.M, 256)) if n_train is None else int(n_train)
    if not 1 <= n_train <= n_tr:
        raise WidthscopeError(f"n_train={n_train}: need between 1 and the {n_tr} training examples given")
    resolve_points(model, opts.points)
    check_pools(opts.M, opts.K, n_train, n_rank, test_pool="held-out ranking pool (half of --n-test)")
    seed = int(opts.seed)
    probe_train = index_batch(
        train, torch.randperm(n_tr, generator=torch.Generator().manual_seed(seed + 1))[:n_train].sort().values
    )
    perm = torch.randperm(n_te, generator=torch.Generator().manual_seed(seed))
    rank_test = index_batch(test, perm[:n_rank].sort().values)
    evaluate = index_batch(test, perm[n_rank:].sort().values)
    return _Pools(probe_train, rank_test, evaluate, n_train, n_rank, n_te)


def chosen_points(cands: list[dict[str, Any]], opts: GrowOptions) -> list[tuple[str, dict[str, Any]]]:
    """The points grown: the best; with ``compare`` also the worst and a seeded random other one."""
    chosen = [("best", cands[0])]
    if opts.compare and len(cands) > 1:
        chosen.append(("worst", cands[-1]))
        others = cands[1:-1]
        if others:
            chosen.append(("random", random.Random(opts.seed).choice(others)))
    return chosen


def builtin_inputs(
    seed: int = 0, n_train: PoolSize | None = None, n_test: PoolSize | None = None
) -> tuple[nn.Module, Any, Any]:
    """The built-in MLP (untrained), its digits split and the pools: seeded subsets of ``n_train`` /
    ``n_test`` examples, or the whole split."""
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
        where = f"the {what} part of digits"
        idx = pick_pool(len(pair[0]), n, s, False, "examples", flag, where, fixes="pass a checkpoint with more data")
        pools.append(tuple(t[idx] for t in pair))
    return model, split, tuple(pools)


def check_builtin(model: nn.Module, pools: Any, opts: GrowOptions, out: str | None) -> None:
    """grow()'s checks on the pools and points, before the built-in model trains."""
    split_pools(model, pools[0], pools[1], opts)
    check_out_space(model, opts.points, out)


def check_out_space(model: nn.Module, points: Sequence[str] | str | None, out: str | None) -> None:
    """Free space for the ``out`` JSON."""
    if out:
        check_space(out, 20_000 + 8_000 * len(resolve_points(model, points)))


def load_inputs(
    spec: InputSpec,
    points: Sequence[str] | str | None = None,
    show: bool = True,
    check: Callable[[nn.Module], None] | None = None,
) -> Any:
    """Model and pools of ``spec``; the points and ``check(model)`` run before the data is read."""
    model = load_model(
        spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision, placement=placement_of(spec)
    )
    resolve_points(model, points)
    if check is not None:
        check(model)
    return resolve(spec, model=model, show_progress=show)


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
    """``widthscope grow``: load and check the model and pools of ``spec`` (``None``: the built-in MLP
    trained 300 steps on digits, cast to ``dtype``), :func:`grow`, write ``out`` (JSON). ``say`` gets
    the input notes; ``report`` the result before it is written."""
    opts = with_keywords("run_grow", options, GrowOptions, keywords)
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
        if placed:
            res["settings"]["placement"] = placed
    if report is not None:
        report(res)
    if out:
        atomic_write_json(out, res)
    return res
