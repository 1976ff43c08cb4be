"""The data of a sweep cell: its split, the model options read from it, and the seeded probe pools of each
probe condition (in-domain, another dataset, a shifted copy, another text length)."""

from __future__ import annotations

import functools
import json
import math
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import data as wdata
from ..data.spec import InputSpec
from ..data.text import corpus_chunks, read_corpus, recorded_chunks
from ..errors import WidthscopeError
from .config import FamilySpec, SweepConfig, parse_shift

if TYPE_CHECKING:
    from ..data import Split

__all__ = ["apply_shift", "cell_input_spec", "in_domain_condition", "probe_conditions", "probe_lengths"]


def apply_shift(pair: tuple[Any, Any], shift: str | None, input_shape: tuple[int, ...], seed: int) -> tuple[Any, Any]:
    """Corrupt image inputs: ``noise:σ`` adds seeded Gaussian noise, ``contrast:c`` scales each input about
    its mean by ``c``, ``blur`` averages each pixel's 3×3 neighbourhood, ``classes:a,b`` keeps those classes."""
    if shift is None:
        return pair
    kind, arg = parse_shift(shift, "shift")
    X, y = pair
    if not X.is_floating_point() or y is X:
        raise WidthscopeError(f"shift {shift!r} applies to image/feature inputs with labels, not to token ids")
    if kind == "classes":
        keep = torch.isin(y, torch.tensor(arg))
        return X[keep], y[keep]
    if kind == "noise":
        g = torch.Generator().manual_seed(int(seed) + 7919)
        return X + arg * torch.randn(X.shape, generator=g, dtype=X.dtype), y
    if kind == "contrast":
        mean = X.reshape(len(X), -1).mean(1).view(-1, *([1] * (X.dim() - 1)))
        return mean + arg * (X - mean), y
    shape = X.shape[1:] if X.dim() == 4 else tuple(input_shape)
    if len(shape) != 3:
        side = int(round(math.sqrt(X.shape[1])))
        if X.dim() != 2 or side * side != X.shape[1]:
            raise WidthscopeError("blur needs images (C, H, W) or square flattened images")
        shape = (1, side, side)
    img = X.reshape(len(X), *shape)
    out = F.avg_pool2d(F.pad(img, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    return out.reshape(X.shape), y


_SPLITS: dict[str, Split] = {}


def load_split(fam: FamilySpec, budget: int, cfg: SweepConfig) -> Split:
    """The dataset split (memoised: every width and seed sees the same one)."""
    key = json.dumps([fam.dataset, fam.data_options, budget, fam.n_test, cfg.data_seed], sort_keys=True, default=str)
    if key not in _SPLITS:
        _SPLITS.clear()  # one split at a time keeps memory flat
        _SPLITS[key] = wdata.load(
            fam.dataset, n_train=budget, n_test=fam.n_test, seed=cfg.data_seed, **fam.data_options
        )
    return _SPLITS[key]


# the options a model family reads from the data: (name, from the input shape), the class count's name
_DATA_OPTIONS: dict[str, tuple[str, Callable[[tuple[int, ...]], int], str]] = {
    "mlp": ("in_dim", math.prod, "out_dim"),
    "resnet20": ("in_channels", lambda shape: shape[0], "num_classes"),
    "llama": ("max_seq_len", lambda shape: shape[-1], "vocab_size"),
    "pythia": ("max_seq_len", lambda shape: shape[-1], "vocab_size"),
}


def fill_model_options(fam: FamilySpec, split: Any) -> dict[str, Any]:
    """The model options with its data-dependent ones (input size, classes, vocabulary) from the split."""
    opts = dict(fam.model_options)
    shape = tuple(split.input_shape or ())
    ncls = split.num_classes
    if fam.model in _DATA_OPTIONS:
        size, of_shape, classes = _DATA_OPTIONS[fam.model]
        if shape:
            opts.setdefault(size, int(of_shape(shape)))
        if ncls:
            opts.setdefault(classes, int(ncls))
    return opts


def take_examples(pair: Sequence[Any], n: int, seed: int) -> tuple[Any, ...]:
    """A seeded random subset of ``n`` examples, in their original order."""
    total = len(pair[0])
    idx = torch.randperm(total, generator=torch.Generator().manual_seed(int(seed)))[:n].sort().values
    return tuple(t[idx] for t in pair)


def in_domain_condition(fam: FamilySpec) -> dict[str, Any]:
    """The probe condition of the training data, in-domain."""
    return {"name": "in-domain", "data": fam.dataset, "test_data": None, "data_options": {}, "shift": None}


def probe_conditions(fam: FamilySpec) -> list[dict[str, Any]]:
    """The family's probe conditions; without ``probes``, the training data in-domain."""
    return fam.probes or [in_domain_condition(fam)]


def probe_lengths(fam: FamilySpec, cond: Mapping[str, Any]) -> list[int | None]:
    """The probe lengths of one condition (``None``: the training length)."""
    return list(cond.get("seq_len") or fam.probe_seq_len or [None])


def probe_len(pair: Sequence[Any], split: Any) -> int | None:
    """The probe sequence length of a text pool (None for other data)."""
    X = pair[0]
    return int(X.shape[1]) if split.task == "lm" and hasattr(X, "shape") and X.dim() == 2 else None


def _in_domain(
    fam: FamilySpec, L: int | None, split: Any, cfg: SweepConfig
) -> tuple[tuple[Any, ...], tuple[Any, ...], dict[str, Any] | None, str]:
    """Both pools from the training data (fitted examples, held-out part); at another text length ``L`` the
    corpus re-cut inside the recorded fitted / held-out byte ranges."""
    seed = cfg.data_seed
    train_len = int(split.input_shape[-1]) if split.task == "lm" else None
    if L is None or L == train_len:
        return (
            take_examples(split.train, fam.n_probe_train, seed),
            take_examples(split.test, fam.n_probe_test, seed + 1),
            None,
            f"{fam.dataset} (in-domain: fitted examples / held-out part)",
        )
    rec = wdata.record(split)
    opts = dict(fam.data_options)
    buf, _, _, _ = read_corpus(opts.get("root"), int(opts.get("max_bytes", 2_000_000)), split.name)
    tr, te = (recorded_chunks(rec, len(buf), L, p) for p in ("fitted", "heldout"))
    for what, idx, n in (("fitted", tr, fam.n_probe_train), ("held-out", te, fam.n_probe_test)):
        if len(idx) < n:
            raise WidthscopeError(
                f"family {fam.name!r}: at probe_seq_len {L} only {len(idx)} chunks lie wholly "
                f"inside the {what} text (trained at {train_len}); lower n_probe or the length"
            )
    g = lambda s_: torch.Generator().manual_seed(int(s_))  # noqa: E731
    a = np.sort(tr[torch.randperm(len(tr), generator=g(seed))[: fam.n_probe_train].numpy()])
    b = np.sort(te[torch.randperm(len(te), generator=g(seed + 1))[: fam.n_probe_test].numpy()])
    A, B = corpus_chunks(buf, L, a), corpus_chunks(buf, L, b)
    return (
        (A, A),
        (B, B),
        {"train": a * L, "test": b * L},
        f"{fam.dataset} (in-domain, re-cut at {L} inside the fitted / held-out byte ranges)",
    )


def probe_pools(
    fam: FamilySpec, cond: Mapping[str, Any], L: int | None, split: Any, cfg: SweepConfig
) -> tuple[tuple[Any, ...], tuple[Any, ...], str, dict[str, Any] | None]:
    """(train pool, held-out pool, description, corpus byte offsets or None) of one probe condition at
    length ``L``: ``data``'s train part and ``test_data``'s held-out part (the training dataset: in-domain),
    then ``shift`` applied."""
    seed = cfg.data_seed
    data, test = cond["data"], cond.get("test_data") or cond["data"]
    inside = _in_domain(fam, L, split, cfg) if fam.dataset in (data, test) else None

    @functools.cache
    def other(name: str) -> Any:
        opts = dict(cond.get("data_options", {})) | ({} if L is None else {"seq_len": L})
        got = wdata.load(name, seed=seed, **opts)
        if got.task != split.task or (split.task == "lm" and got.num_classes != split.num_classes):
            raise WidthscopeError(
                f"family {fam.name!r}: probe {cond['name']!r} data {name!r} does not fit the "
                f"model trained on {fam.dataset!r}"
            )
        return got

    def part(name: str, i: int, n: int, seed_: int, words: tuple[str, str]) -> tuple[Any, str]:
        if inside is not None and name == fam.dataset:
            return inside[i], words[0]
        pool = other(name).test if i else other(name).train
        return take_examples(pool, min(n, len(pool[0])), seed_), f"{name} {words[1]}"

    pa, desc_a = part(data, 0, fam.n_probe_train, seed, ("fitted examples", "train part"))
    pb, desc_b = part(test, 1, fam.n_probe_test, seed + 1, ("held-out part", "held-out part"))
    desc, offsets = f"{desc_a} / {desc_b}", None
    if inside is not None:  # data or test is the training dataset
        desc = inside[3] if data == test else desc
        if inside[2] is not None:  # byte offsets of the pools cut from the training corpus
            offsets = {k: v for k, v in inside[2].items() if (data, test)[k == "test"] == fam.dataset}
    if cond.get("shift"):
        pa = apply_shift(tuple(pa), cond["shift"], tuple(split.input_shape), seed)
        pb = apply_shift(tuple(pb), cond["shift"], tuple(split.input_shape), seed + 1)
        desc += f", shift {cond['shift']}"
    return tuple(pa), tuple(pb), desc, offsets


def probe_words(cond: Mapping[str, Any], pa: Sequence[Any], pb: Sequence[Any], split: Any) -> str:
    """The probe pools of one condition in words: corpus, length, pool sizes (for the report)."""
    data, test = cond["data"], cond.get("test_data") or cond["data"]
    src = wdata.describe_name(data) + ("" if test == data else f" / held-out pool: {wdata.describe_name(test)}")
    L = probe_len(pa, split)
    unit = f"{L}-byte chunks" if L is not None else "examples"
    where = (
        "the training data's fitted / held-out parts" if data == test == split.name else "its train / held-out parts"
    )
    return f"{src}; {len(pa[0])} train-pool / {len(pb[0])} held-out-pool {unit} from {where}" + (
        f", shift {cond['shift']}" if cond.get("shift") else ""
    )


def pool_batches(pair: tuple[Any, ...], task: str, batch_size: int) -> list[Any]:
    return list(wdata.batches(pair, batch_size, shuffle=False, lm=(task == "lm")))


def cell_input_spec(cfg: SweepConfig, cell: Mapping[str, Any], cell_dir: str | os.PathLike) -> InputSpec:
    """The :class:`~widthscope.data.spec.InputSpec` that probes this cell's checkpoint with ``widthscope certify``
    (the sweep's train pool; the held-out pool from the whole held-out part)."""
    fam = cfg.family(cell["family"])
    return InputSpec(model=str(cell_dir), n_train=fam.n_probe_train, n_test=fam.n_probe_test, seed=cfg.data_seed)
