r"""Growth decisions: where should a trained model get a new residual block?

For each candidate insertion point the alignment certificate of a zero-initialised bias
(alignment.md §6) is computed from ``n_train`` training and ``n_rank`` held-out sample vectors:

* ``expectation`` = ``aᵀb`` (train mean · held-out mean of the activation gradients; the
  two-population form of ``‖μ‖²``), ``d_align``, ``B_exact``/``B_align`` at the user's ``(M, K)``;
* ``predicted_gain`` = ``η aᵀb``: the first-order held-out loss decrease of one bias step
  ``v = −η μ_M`` (``η`` defaults to ``lr``);
* the planner's ``M = K`` needed for ``B ≤ δ``, ``δ ∈ {0.1, 0.05, 0.01}``, under both bounds.

Points are ranked by ``predicted_gain`` (non-vacuous certificates first). A block
``z + W_out φ(W_in norm(z))`` (``W_out = 0``) is inserted at the best point and its parameters
(or, with ``train_all``, all parameters) are trained for ``steps`` AdamW steps. The held-out
loss (on examples *not* used for ranking) before and after is reported beside the block's own
first-order prediction ``−lr ⟨G_M, G_K⟩`` for one plain gradient step. ``compare=True`` repeats
the growth at the worst-ranked point and at a random other point.

Training runs in eval mode, so the trained model's BatchNorm statistics and dropout stay fixed
while the new block learns (and per-example losses stay independent).

Example::

    >>> import torch
    >>> from widthscope.data import load
    >>> from widthscope.models import build
    >>> from widthscope.grow import grow
    >>> split = load("digits", n_train=256, n_test=64)
    >>> _ = torch.manual_seed(0)
    >>> model = build("mlp", 16, in_dim=64, out_dim=10, depth=2).eval()
    >>> res = grow(model, split, M=16, K=16, steps=5, lr=1e-3, compare=True, progress=False)
    >>> res["chosen"] in model.widthscope_points, [g["role"] for g in res["growth"]]
    (True, ['best', 'worst', 'continue'])

Command line::

    widthscope grow --model builtin --steps 200 --compare --out grow.json
    widthscope grow --model runs/llama256 --data text --points model.layers.1,model.layers.3
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .._io import atomic_write_json, progress
from ..data.spec import InputSpec, PoolSize
from ..errors import WidthscopeError
from ..probe.intervene import (
    as_examples,
    block_of,
    index_batch,
    insert,
    mean_loss,
    per_example_losses,
    take,
    to_batches,
    w_out_grad,
)

__all__ = [
    "grow",
    "rank_points",
    "grow_at",
    "run_grow",
    "builtin_inputs",
    "DELTAS",
    "DEFAULT_CRITERION",
    "certification_note",
    "step_flops",
    "continue_training",
]

DELTAS = (0.1, 0.05, 0.01)
# Chosen from the growth benchmark (docs/interventions.md §5, `widthscope grow-bench`).
DEFAULT_CRITERION = "line_search"


def _n(data: Any) -> int:
    from ..probe.intervene import batch_size_of

    return batch_size_of(data)


def _pairs(split: Any) -> tuple[Any, Any]:
    """(train, test) pooled examples from a Split, a dict, or a (train, test) pair."""
    if hasattr(split, "train") and hasattr(split, "test"):
        return tuple(split.train), tuple(split.test)  # type: ignore[return-value]
    if isinstance(split, dict) and "train" in split and "test" in split:
        return as_examples(split["train"]), as_examples(split["test"])
    if isinstance(split, (tuple, list)) and len(split) == 2:
        return as_examples(split[0]), as_examples(split[1])
    raise WidthscopeError(
        "data must be a widthscope.data Split (with .train/.test) or a (train_batches, test_batches) pair"
    )


def rank_points(
    model: nn.Module,
    train: Any,
    test: Any,
    *,
    points: Sequence[str] | str | None = None,
    M: int = 32,
    K: int = 32,
    eta: float = 1e-3,
    loss_fn: Callable | None = None,
    batch_size: int = 64,
    show_progress: bool = True,
    criterion: str = DEFAULT_CRITERION,
    block_width: int | None = None,
    block_seed: int = 0,
) -> list[dict[str, Any]]:
    """Certificate, predicted gain and sample-size plan for every candidate point, best first.

    ``train``/``test`` are pooled examples (see :func:`widthscope.probe.intervene.as_examples`).
    ``criterion`` (see :data:`widthscope.probe.growth.CRITERIA`) picks the column ranked on;
    ``"bias"`` is the old ranking by ``η aᵀb``. Other criteria add the block's columns of
    :func:`widthscope.probe.growth.point_criteria` (block of width ``block_width``, ``W_in``
    seeded by ``block_seed``, i.e. the block :func:`grow_at` would insert).
    Every row has ``score`` (the ranked value), ``p_improve`` (the ranked certificate's
    ``1 − B_exact``, 0 when vacuous) and ``MK_needed_δ`` (its planner's ``M = K`` for
    ``B_exact ≤ δ``). Returns rows ``kind="growth"``, ``role="candidate"`` with ``rank`` (1 = best).
    """
    from ..probe.growth import CRITERIA

    if criterion not in CRITERIA:
        raise WidthscopeError(f"unknown growth criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    from ..probe.collect import collect
    from ..probe.points import resolve_points
    from ..stats import certificate, plan, vacuous_rule

    names = resolve_points(model, points)
    S_a = collect(model, to_batches(train, batch_size), points=names, loss_fn=loss_fn, progress=show_progress)
    S_b = collect(model, to_batches(test, batch_size), points=names, loss_fn=loss_fn, progress=show_progress)
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
            "expectation": c.expectation,
            "d_align": c.d_align,
            "b_exact": c.b_exact,
            "b_align": c.b_align,
            "vacuous": c.vacuous,
            "reason": c.reason,
            "eta": eta,
            "predicted_gain": eta * c.expectation,
        }
        vacuous_rule(row)  # d_align of a vacuous certificate is missing, as in every row
        for d in DELTAS:
            pl = plan(S_a[p], S_b[p], target=d)
            row[f"MK_exact_{d:g}"] = pl.equal_exact
            row[f"MK_align_{d:g}"] = pl.equal_align
        row.update(
            criterion=criterion,
            score=row["predicted_gain"],
            p_improve=0.0 if c.vacuous or not c.expectation > 0 else 1.0 - c.b_exact,
        )
        for d in DELTAS:
            row[f"MK_needed_{d:g}"] = row[f"MK_exact_{d:g}"]
        if criterion != "bias":
            from ..probe.growth import point_criteria

            pc = point_criteria(
                model,
                p,
                train,
                test,
                M=M,
                K=K,
                eta=eta,
                hidden=block_width,
                block_seed=block_seed,
                loss_fn=loss_fn,
                batch_size=batch_size,
                deltas=DELTAS,
            )
            row.update({k: v for k, v in pc.items() if k.startswith(("block_", "gradmax", "certified", "ls_"))})
            row.update(score=pc[CRITERIA[criterion]], p_improve=pc["p_improve"])
            for d in DELTAS:
                row[f"MK_needed_{d:g}"] = pc[f"block_MK_exact_{d:g}"]
        rows.append(row)

    def key(r: dict[str, Any]) -> tuple[bool, float]:
        v = r["score"] if r["score"] is not None and not math.isnan(r["score"]) else -math.inf  # NaN last
        return (bool(r["vacuous"]) if criterion == "bias" else False, -v)

    order = sorted(rows, key=key)
    for i, r in enumerate(order, 1):
        r["rank"] = i
    return order


def certification_note(cands: Sequence[dict[str, Any]], M: int, K: int, delta: float = 0.1) -> str:
    """One plain line: which points the ranked certificate certifies at ``δ`` (``B_exact ≤ δ``),
    or, when none is, the smallest ``M = K`` at which the planner says one would be."""
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


def _train_new(
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
    """AdamW on ``params`` with mini-batches of ``train`` (eval mode: fixed BN stats, no dropout).

    ``after_step(k)`` is called after the ``k``-th step (1-based), e.g. to evaluate a shorter
    budget on the way: the same run then gives both budgets."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    n = _n(train)
    from ..probe.intervene import EvalMode, index_batch

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
    """FLOPs of one training step (forward + backward) on ``batch`` of the parameters that currently
    have ``requires_grad`` (eval mode), as counted by ``torch.utils.flop_counter.FlopCounterMode``
    (matrix products, convolutions and attention; element-wise work is not counted). Frozen
    parameters cost no weight gradient, and nothing upstream of the first trainable one is
    back-propagated, so growing a block late in a network is cheaper than training it all."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..probe.intervene import EvalMode

    fc = FlopCounterMode(display=False)
    with EvalMode(model), fc:
        loss = per_example_losses(model, batch, loss_fn, batch_size=_n(batch), grad=True).mean()
        if loss.requires_grad:
            loss.backward()
    for p in model.parameters():
        p.grad = None
    return int(fc.get_total_flops())


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
    """The practitioner's baseline of a growth: train *all* parameters of a copy of the original
    ``model`` (AdamW, the same learning rate and mini-batch order as the block) for as many steps as
    ``flops`` buys, ``steps = max(1, round(flops / step_flops(original)))``. Returns a row with the
    held-out loss before/after on ``evaluate``."""
    cont = copy.deepcopy(model)
    for p in cont.parameters():
        p.requires_grad_(True)
    probe = index_batch(train, slice(0, min(batch_size, _n(train))))
    f_step = step_flops(cont, probe, loss_fn)
    steps = max(1, int(round(flops / max(f_step, 1))))
    before = mean_loss(cont, evaluate, loss_fn, batch_size=batch_size)
    _train_new(
        cont,
        list(cont.parameters()),
        train,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        loss_fn=loss_fn,
        show_progress=show_progress,
    )
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
    grown = copy.deepcopy(model)
    if loss_before is None:
        loss_before = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)
    insert(grown, point, "block", width=width, hidden=block_width, seed=seed if block_seed is None else block_seed)
    block = block_of(grown, point)
    G_M = w_out_grad(grown, point, probe_train, loss_fn, batch_size)
    G_K = w_out_grad(grown, point, probe_test, loss_fn, batch_size)
    new = list(block.parameters())
    if train_all:
        params = [p for p in grown.parameters()]
        for p in params:
            p.requires_grad_(True)
    else:
        ids = {id(p) for p in new}
        for p in grown.parameters():
            p.requires_grad_(id(p) in ids)
        params = new
    f_step = step_flops(grown, index_batch(train, slice(0, min(batch_size, _n(train)))), loss_fn)
    loss_at: dict[str, float] = {}
    wanted = {int(k) for k in eval_steps if 0 < int(k) < steps}

    def after_step(k: int) -> None:
        if k in wanted:
            loss_at[str(k)] = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)

    _train_new(
        grown,
        params,
        train,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        loss_fn=loss_fn,
        show_progress=show_progress,
        after_step=after_step,
    )
    for p in grown.parameters():
        p.requires_grad_(True)
    loss_after = mean_loss(grown, evaluate, loss_fn, batch_size=batch_size)
    loss_at[str(steps)] = loss_after
    return grown, {
        "point": point,
        "loss_before": loss_before,
        "loss_after": loss_after,
        "delta": loss_after - loss_before,
        "block_alignment": float((G_M * G_K).sum()),
        "predicted_first_step": -lr * float((G_M * G_K).sum()),
        "steps": steps,
        "lr": lr,
        "train_all": bool(train_all),
        "block_width": block.hidden,
        "new_parameters": sum(p.numel() for p in new),
        "loss_at": loss_at,
        "flops": steps * f_step,
    }


def grow(
    model: nn.Module,
    data: Any,
    *,
    points: Sequence[str] | str | None = None,
    M: int = 32,
    K: int = 32,
    steps: int = 200,
    lr: float = 1e-3,
    eta: float | None = None,
    block_width: int | None = None,
    train_all: bool = False,
    compare: bool = False,
    n_train: int | None = None,
    n_rank: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    loss_fn: Callable | None = None,
    progress: bool = True,
    criterion: str = DEFAULT_CRITERION,
) -> dict[str, Any]:
    r"""Rank insertion points by ``criterion``, grow a block at the best one, train it.

    Args:
        model: trained model (not modified; growth happens on copies).
        data: a :class:`widthscope.data.Split` or ``(train_batches, test_batches)``. The first
            ``n_rank`` held-out examples rank the points; the rest measure the loss before/after.
        points: candidate points (default: ``insertion_points(model)``).
        M, K: sample sizes of the certificate (the user's step: ``M`` train, ``K`` held-out).
        steps, lr: AdamW steps and learning rate for the new block (``train_all``: everything).
        eta: step size of the predicted gains (``η aᵀb``, ``η⟨G_M, G_K⟩``, ...; default ``lr``).
        criterion: what ranks the points (:data:`widthscope.probe.growth.CRITERIA`; default
            :data:`DEFAULT_CRITERION`, the benchmark's winner; ``"bias"``: the old ``η aᵀb``).
        block_width: hidden width of the block (default: the point's width).
        compare: also grow at the worst-ranked point and at a random other point, and train the
            original model (all parameters, same lr and batches) for the FLOPs the best point's
            growth used: role ``continue``, the baseline a practitioner compares with.
        n_train: training examples used to estimate ``a`` (default: ``max(4M, 256)``, capped).
        n_rank: held-out examples used to estimate ``b`` (default: half of the held-out set).

    Returns:
        ``{"candidates": [...], "growth": [...], "chosen": point, "rows": candidates + growth}``;
        every row has ``kind="growth"`` and ``role`` in ``candidate|best|worst|random``.
    """
    from .. import _args
    from ..probe.growth import CRITERIA

    fn = "grow"  # the types, before any work
    _args.module(fn, "model", model)
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
    _args.points(fn, "points", points)
    for name, v in (("M", M), ("K", K), ("steps", steps), ("batch_size", batch_size)):
        _args.integer(fn, name, v, lo=1)
    _args.number(fn, "lr", lr, 0.0, lo_open=True, accepts="a positive number")
    _args.number(fn, "eta", eta, 0.0, lo_open=True, optional=True, accepts="a positive number or None (lr)")
    for name, opt in (("block_width", block_width), ("n_train", n_train), ("n_rank", n_rank)):
        _args.integer(fn, name, opt, lo=1, optional=True)
    for name, v in (("train_all", train_all), ("compare", compare), ("progress", progress)):
        _args.boolean(fn, name, v)
    _args.integer(fn, "seed", seed)
    _args.function(fn, "loss_fn", loss_fn)
    _args.choice(fn, "criterion", criterion, CRITERIA, values=False)  # the type; the next line words the value
    if criterion not in CRITERIA:
        raise WidthscopeError(
            f"grow(criterion=...): unknown growth criterion {criterion!r}; choose one of {', '.join(CRITERIA)}"
        )
    for nm, v in (("M", M), ("K", K), ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise WidthscopeError(f"{nm} must be a positive integer, got {v!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise WidthscopeError(f"lr must be a positive number, got {lr!r}")
    eta = lr if eta is None else eta
    if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta > 0):
        raise WidthscopeError(f"eta must be a positive number, got {eta!r}")
    train, test = _pairs(data)
    n_tr, n_te = _n(train), _n(test)
    if n_te < 8:
        raise WidthscopeError(
            f"need at least 8 held-out examples (got {n_te}): half rank the points, half measure the loss"
        )
    n_rank = n_te // 2 if n_rank is None else int(n_rank)
    if not 4 <= n_rank <= n_te - 4:
        raise WidthscopeError(f"n_rank must leave at least 4 held-out examples on each side; got {n_rank} of {n_te}")
    n_train = min(n_tr, max(4 * M, 256)) if n_train is None else int(n_train)
    if not 1 <= n_train <= n_tr:
        raise WidthscopeError(f"n_train={n_train}: need between 1 and the {n_tr} training examples given")
    from ..probe.points import resolve_points
    from ..validate import check_pools

    resolve_points(model, points)  # unknown names first: the clearest error
    # The same rule and message as certify: M/K draw without replacement from their pools.
    check_pools(M, K, n_train, n_rank, test_pool="held-out ranking pool (half of --n-test)")
    probe_train = index_batch(
        train, torch.randperm(n_tr, generator=torch.Generator().manual_seed(int(seed) + 1))[:n_train].sort().values
    )
    # A seeded permutation, not the first half: datasets such as text chunks are ordered by
    # position in the corpus, and ranking and evaluation should see the same distribution.
    perm = torch.randperm(n_te, generator=torch.Generator().manual_seed(int(seed)))
    rank_test = index_batch(test, perm[:n_rank].sort().values)
    evaluate = index_batch(test, perm[n_rank:].sort().values)
    cands = rank_points(
        model,
        probe_train,
        rank_test,
        points=points,
        M=M,
        K=K,
        eta=eta,
        loss_fn=loss_fn,
        batch_size=batch_size,
        show_progress=progress,
        criterion=criterion,
        block_width=block_width,
        block_seed=seed,
    )
    chosen = [("best", cands[0])]
    if compare and len(cands) > 1:
        chosen.append(("worst", cands[-1]))
        others = cands[1:-1]
        if others:
            chosen.append(("random", random.Random(seed).choice(others)))
    growth = []
    for role, cand in chosen:
        _, res = grow_at(
            model,
            cand["point"],
            train,
            evaluate,
            probe_train=take(probe_train, min(M, n_train)),
            probe_test=index_batch(rank_test, slice(0, min(K, n_rank))),
            steps=steps,
            lr=lr,
            block_width=block_width,
            width=cand["width"],
            train_all=train_all,
            batch_size=batch_size,
            seed=seed,
            loss_fn=loss_fn,
            show_progress=progress,
        )
        growth.append(
            {
                "kind": "growth",
                "role": role,
                "rank": cand["rank"],
                "predicted_gain": cand["predicted_gain"],
                "d_align": cand["d_align"],
                "criterion": criterion,
                "score": cand["score"],
                "p_improve": cand["p_improve"],
                "b_exact": cand["b_exact"],
                "b_align": cand["b_align"],
                "M": M,
                "K": K,
                "n_eval": n_te - n_rank,
                **res,
            }
        )
    if compare:  # is growing better than training the original model for the same compute?
        res = continue_training(
            model,
            train,
            evaluate,
            flops=growth[0]["flops"],
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            loss_fn=loss_fn,
            show_progress=progress,
        )
        growth.append(
            {
                "kind": "growth",
                "role": "continue",
                "rank": None,
                "predicted_gain": None,
                "criterion": criterion,
                "M": M,
                "K": K,
                "n_eval": n_te - n_rank,
                **res,
            }
        )
    return {
        "chosen": cands[0]["point"],
        "candidates": cands,
        "growth": growth,
        "rows": [*cands, *growth],
        "certification": certification_note(cands, M, K),
        "settings": {
            "M": M,
            "K": K,
            "steps": steps,
            "lr": lr,
            "eta": eta,
            "train_all": train_all,
            "criterion": criterion,
            "n_train": n_train,
            "n_rank": n_rank,
            "n_eval": n_te - n_rank,
            "block_width": block_width,
            "seed": seed,
        },
    }


# ----------------------------------------------------------------------------- a whole run
def builtin_inputs(
    seed: int = 0, n_train: PoolSize | None = None, n_test: PoolSize | None = None
) -> tuple[nn.Module, Any, Any]:
    """The built-in MLP *untrained* (checked before it trains), its digits split and the pools
    grow uses: the whole split, or seeded subsets of ``n_train`` / ``n_test`` examples."""
    from ..data import load
    from ..data.inputs import pick_pool
    from ..models import build

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


def _check_builtin(
    model: nn.Module, pools: Any, *, points: Sequence[str] | str | None, M: int, K: int, out: str | None
) -> None:
    """grow()'s own checks on the pool sizes and points, before the built-in model trains."""
    from ..probe.points import resolve_points
    from ..validate import check_pools

    resolve_points(model, points)
    n_tr, n_te = _n(pools[0]), _n(pools[1])
    if n_te < 8:
        raise WidthscopeError(
            f"--n-test {n_te}: need at least 8 held-out examples (half rank the points, half measure the loss)"
        )
    check_pools(M, K, min(n_tr, max(4 * M, 256)), n_te // 2, test_pool="held-out ranking pool (half of --n-test)")
    _check_out_space(model, points, out)


def _check_out_space(model: nn.Module, points: Sequence[str] | str | None, out: str | None) -> None:
    """Free space for the ``out`` JSON: candidate and growth rows (about 2 KB each, over-estimated)."""
    if out:
        from .._io import check_space
        from ..probe.points import resolve_points

        check_space(out, 20_000 + 8_000 * len(resolve_points(model, points)))


def _load_inputs(spec: InputSpec, points: Sequence[str] | str | None = None, show: bool = True) -> Any:
    """Model and pools of ``spec`` through the shared input layer; the points are checked before
    the data is read."""
    from ..data.inputs import load_model, resolve
    from ..probe.points import resolve_points

    model = load_model(spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision)
    resolve_points(model, points)  # before the data is read
    return resolve(spec, model=model, show_progress=show)


def run_grow(
    spec: InputSpec | None = None,
    *,
    n_train: PoolSize | None = None,
    n_test: PoolSize | None = None,
    dtype: str = "auto",
    points: Sequence[str] | str | None = None,
    M: int = 32,
    K: int = 32,
    steps: int = 200,
    lr: float = 1e-3,
    eta: float | None = None,
    block_width: int | None = None,
    train_all: bool = False,
    compare: bool = False,
    batch_size: int = 64,
    seed: int = 0,
    criterion: str = DEFAULT_CRITERION,
    out: str | None = None,
    show: bool = True,
    say: Callable[[str], None] = print,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """What ``widthscope grow`` does, from explicit settings: load the model and its pools, check
    them before any training, :func:`grow`, record the inputs, write ``out`` (JSON, atomically).

    ``spec``: the checkpoint and its data (pool sizes as :class:`~widthscope.data.spec.InputSpec`
    says). ``None``: the built-in MLP, trained 300 steps on digits, with seeded subsets of
    ``n_train`` / ``n_test`` examples (default: the whole split), cast to ``dtype``.
    ``say`` gets the input layer's notes; ``report`` is called with the result before it is
    written (the command line prints its tables there)."""
    inputs = None
    if spec is None:
        from ..train import train

        model, full, split = builtin_inputs(seed, n_train, n_test)
        _check_builtin(model, split, points=points, M=M, K=K, out=out)
        train(model, full, steps=300, lr=3e-3, seed=seed, progress=show)
        model.eval()
        if dtype != "auto":
            model.to(getattr(torch, dtype))
        loss_fn = None
    else:
        if spec.model == "builtin":
            raise WidthscopeError("run_grow: the built-in model is spec=None (with n_train, n_test, dtype)")
        inputs = _load_inputs(spec, points, show)
        model, split, loss_fn = inputs.model, (inputs.train, inputs.test), inputs.loss_fn
        _check_out_space(model, points, out)
        for note in inputs.notes:
            say(f"note: {note}")
    res = grow(
        model,
        split,
        points=points,
        M=M,
        K=K,
        steps=steps,
        lr=lr,
        eta=eta,
        block_width=block_width,
        train_all=train_all,
        compare=compare,
        batch_size=batch_size,
        seed=seed,
        loss_fn=loss_fn,
        progress=show,
        criterion=criterion,
    )
    if spec is not None and inputs is not None:
        res["settings"].update(
            model=spec.model, task=inputs.task, inputs=inputs.info, notes=inputs.notes, input_spec=inputs.spec.to_dict()
        )
    if report is not None:
        report(res)
    if out:
        atomic_write_json(out, res)
    return res
