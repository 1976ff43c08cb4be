"""Probe pools from tokenized objects in an input spec: a ``BatchEncoding`` or mapping of tensors,
a ``DataLoader`` (drawn once; its batches joined, right-padded), a ``datasets.Dataset`` with
``input_ids`` columns, or a ``DatasetDict`` of them (:func:`object_pools`).

They are examples already, so the text options (``seq_len``, ``sequences``, ``max_tokens``,
``empty_docs``) do not apply. The pools follow the rules of files: ``data`` alone is split into
train / held-out by a seeded permutation of its examples (``test_fraction``), or — a
``DatasetDict`` — by its own splits (train; validation, else test; never pooled and re-split);
``train_data`` / ``test_data`` give one pool each; then seeded subsets of ``n_train`` / ``n_test``
(train ``seed``, held-out ``seed + 1``; ``first``: the first ones). A masked LM's tokens are masked
and a classifier's labels split off as :mod:`widthscope.data.objects` does for ``ws.certify``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..errors import WidthscopeError
from .loading import check_ids
from .objects import check_positions, dataset_pool, from_mapping, pad_id_of, prepare_objects
from .pools import pick_pool, pool_size, refuse_given, take_rows
from .sources import choose, default_split_of, describe, is_dataset_dict, same_source
from .spec import InputSpec

__all__ = ["object_pools"]

TEXT_OPTIONS = ("seq_len", "sequences", "max_tokens", "empty_docs", "label_field")


def _pad_value(key: str, pad_id: int) -> int:
    return {"attention_mask": 0, "labels": -100, "token_type_ids": 0}.get(key, pad_id)


def _join(batches: list[Any], pad_id: int, where: str) -> Any:
    """The batches of a ``DataLoader`` as one pool: dicts key by key (2-D tensors right-padded to
    the longest), ``(x, y)`` pairs part by part, tensors along dim 0."""
    first = batches[0]
    if isinstance(first, Mapping):
        keys = list(first)
        if any(not isinstance(b, Mapping) or list(b) != keys for b in batches):
            raise WidthscopeError(f"{where}: the DataLoader's batches have different keys")
        out = {}
        for k in keys:
            parts = [torch.as_tensor(b[k]) for b in batches]
            if parts[0].ndim == 2:
                T = max(p.shape[1] for p in parts)
                parts = [torch.nn.functional.pad(p, (0, T - p.shape[1]), value=_pad_value(k, pad_id)) for p in parts]
            try:
                out[k] = torch.cat(parts)
            except RuntimeError as exc:
                raise WidthscopeError(f"{where}: the batches' {k!r} tensors do not join ({exc})") from None
        return out
    if isinstance(first, (tuple, list)) and len(first) == 2:
        return tuple(torch.cat([torch.as_tensor(b[i]) for b in batches]) for i in range(2))
    if isinstance(first, torch.Tensor):
        return torch.cat(batches)
    raise WidthscopeError(
        f"{where}: the DataLoader gives {type(first).__name__} batches: give dicts of tensors, (x, y) pairs or tensors"
    )


def _whole(obj: Any, split: str | None, task: str, tok: Any, where: str) -> tuple[Any, str]:
    """One tokenized source (a split of it) as one pool of raw examples, and its description."""
    if is_dataset_dict(obj):
        if split is None or split not in obj:
            raise WidthscopeError(f"{where}: the DatasetDict has no split {split!r} (splits: {', '.join(obj)})")
        pool, _, what = dataset_pool(obj[split], task, tok, None, None, where)
        return pool, f"DatasetDict split {split!r}: {what}"
    if split is not None:
        raise WidthscopeError(f"{where}: {describe(obj)} has no splits: drop --train-split/--test-split")
    if isinstance(obj, DataLoader):
        batches = [b for b in obj]  # drawn once: the pool stays fixed
        if not batches:
            raise WidthscopeError(f"{where}: the DataLoader gave no batches")
        return _join(batches, pad_id_of(tok), where), f"DataLoader of {len(batches)} batches"
    if isinstance(obj, Mapping):
        pool = from_mapping(obj, where)
        return pool, f"{type(obj).__name__} of {next(iter(pool.values())).shape[0]} examples"
    pool, _, what = dataset_pool(obj, task, tok, None, None, where)
    return pool, what


def _ready(raw: Any, task: str, tok: Any, seed: int, model: nn.Module, where: str) -> Any:
    """Raw examples made into what the task's batches hold (masking, labels split off), checked."""
    pool = prepare_objects(raw, task, tok, seed, where, from_text=False) if isinstance(raw, dict) else raw
    ids = pool.get("input_ids") if isinstance(pool, dict) else None
    if isinstance(pool, tuple) and isinstance(pool[0], dict):
        ids = pool[0].get("input_ids")
    if isinstance(ids, torch.Tensor):
        check_positions(model, ids, where)
        check_ids(ids, model, where)
    return pool


def _sources(spec: InputSpec) -> tuple[Any, str | None, Any, str | None, str, Any]:
    """(train source, split, held-out source, split, how, SplitChoice or None), as for text."""
    if (spec.train_data is None) != (spec.test_data is None):
        raise WidthscopeError("give train_data and test_data together, or one data object to split")
    if spec.train_data is not None:
        if spec.data is not None:
            raise WidthscopeError("data and train_data/test_data both given: give one object (data) or two")
        refuse_given(spec, ("test_fraction",), "train_data/test_data (two sources, nothing is split)")
        if same_source(spec.train_data, spec.test_data) and spec.train_split == spec.test_split:
            raise WidthscopeError(
                "train_data and test_data are the same object: the held-out pool must be other examples"
            )
        return (
            spec.train_data,
            spec.train_split or default_split_of(spec.train_data, "train"),
            spec.test_data,
            spec.test_split or default_split_of(spec.test_data, "test"),
            "two sources",
            None,
        )
    frac = spec.test_fraction if spec.is_given("test_fraction") else None
    choice = choose(spec.data, spec.train_split, spec.test_split, frac)
    if choice is not None:
        return spec.data, choice.train, spec.data, choice.test, choice.how, choice
    if spec.train_split or spec.test_split:
        raise WidthscopeError(f"{describe(spec.data)} has no splits: drop train_split/test_split")
    return spec.data, None, spec.data, None, "one corpus", None


def object_pools(
    spec: InputSpec, model: nn.Module, task: str, tok: Any, seed: int
) -> tuple[Any, Any, dict[str, Any], list[str]]:
    """Both probe pools from tokenized objects (see the module docstring): (train, held-out, info, notes)."""
    given = [f"{d}" for d in TEXT_OPTIONS if spec.is_given(d)]
    if given:
        raise WidthscopeError(
            f"InputSpec({given[0]}=...) applies to text; the data are tokenized examples "
            "(a BatchEncoding, mapping, DataLoader or tokenized Dataset): drop it (tokenize with it instead)"
        )
    tr_src, tr_split, te_src, te_split, how, choice = _sources(spec)
    notes: list[str] = list(choice.notes) if choice is not None else []
    info: dict[str, Any] = {"split": how}
    tr_raw, tr_what = _whole(
        tr_src, tr_split, task, tok, "InputSpec(data=...)" if how != "two sources" else "train_data"
    )
    if te_split is None and how != "two sources":  # one source cut into both pools
        frac = spec.test_fraction
        assert frac is not None  # a filled spec has one
        n = pool_size(tr_raw)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
        n_hold = min(max(1, int(round(frac * n))), n - 1) if n > 1 else 0
        te_idx, tr_idx = perm[:n_hold].sort().values, perm[n_hold:].sort().values
        if spec.first:
            tr_idx, te_idx = torch.arange(n - n_hold), torch.arange(n - n_hold, n)
        te_raw = take_rows(tr_raw, te_idx)
        tr_raw = take_rows(tr_raw, tr_idx)
        te_what = tr_what
        info["rule"] = f"examples of one object split by a seeded permutation (seed {seed}, held-out fraction {frac})"
        info["heldout_integrity"] = (
            f"one object, split here ({info['rule']}): the pools share no example; held-out only if the "
            "model never trained on it"
        )
    else:
        where = "test_data" if how == "two sources" else "InputSpec(data=...)"
        te_raw, te_what = _whole(te_src, te_split, task, tok, where)
        info["heldout_integrity"] = (
            choice.integrity
            if choice is not None
            else f"two sources: held-out pool only from {describe(te_src)}; held-out only if the model never "
            "trained on it"
        )
    info["train"], info["test"] = {"source": f"{tr_what} (in memory)"}, {"source": f"{te_what} (in memory)"}
    a = pick_pool(pool_size(tr_raw), spec.n_train, seed, spec.first, "train examples", "--n-train",
                  describe(tr_src), spec.cap_pools, "give more examples")  # fmt: skip
    b = pick_pool(pool_size(te_raw), spec.n_test, seed + 1, spec.first, "held-out examples", "--n-test",
                  describe(te_src), spec.cap_pools, "give more examples")  # fmt: skip
    train = _ready(take_rows(tr_raw, a), task, tok, seed, model, "train pool")
    test = _ready(take_rows(te_raw, b), task, tok, seed + 1, model, "held-out pool")
    info.update(
        n_train=pool_size(train),
        n_test=pool_size(test),
        first=bool(spec.first),
        pool_rule="first examples" if spec.first else f"seeded random subsets (seeds {seed}, {seed + 1})",
    )
    return train, test, info, notes
