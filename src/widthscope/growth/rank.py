"""Ranking the candidate points of a growth decision (the first step of :func:`widthscope.growth.grow`).

:func:`rank_points` computes, at every candidate point, the alignment certificate of a
zero-initialised bias (alignment.md §6), the predicted gain of the chosen criterion and the
planner's ``M = K`` for ``B ≤ δ``; :func:`certification_note` says in one line what is certified.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch.nn as nn

from ..errors import WidthscopeError
from ..options import with_keywords
from ..probe.batches import as_examples, batch_size_of, to_batches
from ..probe.collect import collect
from ..probe.growth import CRITERIA, point_criteria
from ..probe.points import resolve_points
from ..stats import certificate, plan, vacuous_rule
from .options import GrowOptions

__all__ = ["rank_points", "certification_note", "DELTAS"]

DELTAS = (0.1, 0.05, 0.01)


def n_examples(data: Any) -> int:
    return batch_size_of(data)


def rank_pairs(split: Any) -> tuple[Any, Any]:
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
    options: GrowOptions | None = None,
    *,
    loss_fn: Callable | None = None,
    show_progress: bool = True,
    **keywords: Any,
) -> list[dict[str, Any]]:
    """Certificate, predicted gain and sample-size plan for every candidate point, best first.

    ``train``/``test`` are pooled examples (see :func:`widthscope.probe.interventions.as_examples`).
    The settings are ``options`` (a :class:`~widthscope.growth.options.GrowOptions`; keywords
    named like its fields override them): ``points``, ``M``/``K``, ``eta`` (default ``lr``),
    ``batch_size``, ``criterion``, ``block_width`` and ``seed``.
    ``criterion`` (see :data:`widthscope.probe.growth.CRITERIA`) picks the column ranked on;
    ``"bias"`` is the old ranking by ``η aᵀb``. Other criteria add the block's columns of
    :func:`widthscope.probe.growth.point_criteria` (block of width ``block_width``, ``W_in``
    seeded by ``block_seed``, i.e. the block :func:`grow_at` would insert).
    Every row has ``score`` (the ranked value), ``p_improve`` (the ranked certificate's
    ``1 − B_exact``, 0 when vacuous) and ``MK_needed_δ`` (its planner's ``M = K`` for
    ``B_exact ≤ δ``). Returns rows ``kind="growth"``, ``role="candidate"`` with ``rank`` (1 = best).
    """
    opts = with_keywords("rank_points", options, GrowOptions, keywords)
    M, K, eta, criterion, batch_size = opts.M, opts.K, opts.eta_or_lr, opts.criterion, opts.batch_size
    names = resolve_points(model, opts.points)
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
            pc = point_criteria(
                model,
                p,
                train,
                test,
                M=M,
                K=K,
                eta=eta,
                hidden=opts.block_width,
                block_seed=opts.seed,
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
