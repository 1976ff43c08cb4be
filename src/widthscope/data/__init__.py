"""Offline datasets (:data:`DATASETS`; file layouts in ``docs/models-data.md``): :func:`load` returns
a :class:`Split` with disjoint train and test parts and ``meta`` saying how they were cut. Text is
byte-level: ``X`` is ``(n, T)`` int64 in ``[0, 256)`` and ``y`` *is* ``X``.

Example::

    >>> from widthscope.data import load, batches
    >>> split = load("digits", n_train=512, seed=0)
    >>> split.train[0].shape, split.num_classes, split.task
    (torch.Size([512, 64]), 10, 'classification')
    >>> for x, y in batches(split.train, 128, shuffle=True, seed=1):
    ...     pass
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterator

import numpy as np
import torch

from ..errors import WidthscopeError

__all__ = ["Split", "load", "batches", "available", "DATASETS", "record", "describe", "describe_name"]

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass
class Split:
    """A train/test split. ``num_classes`` is the vocabulary size (256) for ``task == "lm"``."""

    train: Pair
    test: Pair
    task: str
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    meta: dict[str, Any]

    def __repr__(self) -> str:
        return (
            f"Split(name={self.name!r}, task={self.task!r}, train={len(self.train[0])}, "
            f"test={len(self.test[0])}, num_classes={self.num_classes}, input_shape={self.input_shape})"
        )


DATASETS: dict[str, str] = {
    "fashion-mnist": "Fashion-MNIST (Zalando clothing images, 28x28 grayscale, 10 classes)",
    "mnist": "MNIST (handwritten digits, 28x28 grayscale, 10 classes)",
    "cifar10": "CIFAR-10 (32x32 colour photos, 10 classes)",
    "cifar100": "CIFAR-100 (32x32 colour photos, 100 classes)",
    "mnist1d": "MNIST-1D (synthetic 1-D digit signals of 40 values, 10 classes)",
    "digits": "scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes)",
    "text": "the Python standard library's own source code (its *.py files), read as bytes",
    "prose": "English prose shipped with Python (the pydoc help topics and Python's LICENSE.txt), read as bytes",
}


def describe_name(name: str) -> str:
    """A dataset name in words, e.g. ``"prose"`` -> "English prose shipped with Python (...)"."""
    return DATASETS.get(str(name), str(name))


def describe(split: Split) -> str:
    """What ``split`` is, in words: corpus, how it was cut, the split and its sizes."""
    meta = split.meta or {}
    n_tr, n_te, seed = len(split.train[0]), len(split.test[0]), meta.get("seed", "?")
    if split.task != "lm":
        shape = "x".join(str(int(v)) for v in split.input_shape)
        parts = f"{n_tr} train / {n_te} held-out examples (disjoint parts, split seed {seed}; inputs {shape})"
        return f"{describe_name(split.name)}: {parts}"
    src = str(meta.get("source", ""))
    stdlib = src.startswith("python stdlib")
    words = describe_name(split.name) if split.name == "prose" or stdlib else f"byte-level text ({src})"
    cut = f"{int(meta.get('bytes', 0)):,} bytes" + (f" of {src}" if stdlib else "")
    cut += f" cut into {int(split.input_shape[-1])}-byte chunks"
    return f"{words}: {cut}; {n_tr} train / {n_te} held-out chunks (disjoint chunk sets, split seed {seed})"


def available() -> list[str]:
    """Names :func:`load` accepts."""
    return list(DATASETS)


def load(
    name: str,
    *,
    root: str | None = None,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    **options: Any,
) -> Split:
    """Load dataset ``name`` from local files; ``n_train`` / ``n_test``: seeded subsets (None: all).
    Options per dataset (``flatten``, ``normalize``, ``seq_len``, ...): docs/models-data.md."""
    if name not in DATASETS:
        raise WidthscopeError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    for key, v in (("n_train", n_train), ("n_test", n_test)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise WidthscopeError(f"{key} must be a positive integer or None, got {v!r}")
    try:
        if name == "digits":
            return _digits(n_train, n_test, seed, **options)
        if name == "mnist1d":
            return _mnist1d(n_train, n_test, seed, **options)
        if name in ("text", "prose"):
            from .text import load_text  # noqa: PLC0415  cycle: widthscope.data.text imports widthscope.data

            if name == "prose" and root is not None:
                raise WidthscopeError("prose is Python's own English prose: it takes no root (use 'text' for files)")
            return load_text(root, n_train, n_test, seed, corpus=name, **options)
        from .files import load_cifar, load_idx  # noqa: PLC0415  cycle: widthscope.data.files imports widthscope.data

        if name in ("fashion-mnist", "mnist"):
            return load_idx(name, root, n_train, n_test, seed, **options)
        return load_cifar(name, root, n_train, n_test, seed, **options)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise WidthscopeError(f"bad option for dataset {name!r}: {exc}") from None
        raise


def record(split: Split) -> dict[str, Any]:
    """What a checkpoint records of its data: text byte ranges with the corpus' SHA-256, else fitted indices."""
    meta = split.meta
    if split.name in ("text", "prose"):
        from .text import spans  # noqa: PLC0415  cycle: widthscope.data.text imports widthscope.data

        L = int(meta["seq_len"])
        return {
            "kind": "text-bytes",
            "corpus": split.name,
            "corpus_sha256": meta["sha256"],
            "corpus_bytes": int(meta["bytes"]),
            "trained_seq_len": L,
            "fitted": spans(meta["train_indices"], L),
            "heldout": spans(meta.get("heldout_part_indices", meta["test_indices"]), L),
        }
    return {"kind": "examples", "dataset": split.name, "fitted_indices": meta.get("train_indices")}


def batches(
    pair: Pair, batch_size: int, *, shuffle: bool = False, seed: int = 0, lm: bool | None = None
) -> Iterator[Any]:
    """One seeded pass over ``(X, y)`` in batches: ``(x, y)``, or the tokens alone for language modelling."""
    X, y = pair
    if batch_size < 1:
        raise WidthscopeError(f"batch_size must be >= 1, got {batch_size}")
    if len(X) != len(y):
        raise WidthscopeError(f"inputs and targets differ in length ({len(X)} vs {len(y)})")
    if lm is None:
        lm = y is X or (
            not X.is_floating_point() and X.dim() == 2 and y.shape == X.shape and y.data_ptr() == X.data_ptr()
        )
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(int(seed))) if shuffle else None
    for start in range(0, len(X), batch_size):
        idx = slice(start, start + batch_size) if order is None else order[start : start + batch_size]
        yield X[idx] if lm else (X[idx], y[idx])


def subset(n_total: int, n: int | None, rng: np.random.Generator, what: str) -> np.ndarray | None:
    """Sorted random subset of ``range(n_total)`` of size ``n`` (None: all, returned as None)."""
    if n is None or n >= n_total:
        if n is not None and n > n_total:
            raise WidthscopeError(
                f"asked for {n} {what} examples but only {n_total} exist; use a value <= {n_total} or None"
            )
        return None
    return np.sort(rng.choice(n_total, size=n, replace=False))


def holdout(
    n: int, n_hold: int, n_train: int | None, n_test: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded (train indices, test indices, whole held-out part) of ``range(n)`` with ``n_hold`` held out."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    test_idx, train_idx = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    te = subset(len(test_idx), n_test, rng, "test")
    tr = subset(len(train_idx), n_train, rng, "train")
    return (train_idx if tr is None else train_idx[tr]), (test_idx if te is None else test_idx[te]), test_idx


def _digits(
    n_train: int | None, n_test: int | None, seed: int, *, normalize: bool = True, test_fraction: float = 0.2
) -> Split:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.tensor(d.data, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    if not 0 < test_fraction < 1:
        raise WidthscopeError(f"test_fraction must be in (0, 1), got {test_fraction}")
    train_idx, test_idx, held = holdout(len(X), int(round(test_fraction * len(X))), n_train, n_test, seed)
    # Statistics of the whole training part, so that every subset sees the same input map.
    whole_train = np.setdiff1d(np.arange(len(X)), held)
    m, s = X[whole_train].double().mean(), X[whole_train].double().std()
    Xtr, Xte = X[train_idx], X[test_idx]
    meta: dict[str, Any] = {
        "source": "sklearn.datasets.load_digits",
        "seed": seed,
        "train_indices": train_idx.tolist(),
        "test_indices": test_idx.tolist(),
    }
    if normalize:
        Xtr, Xte = ((Xtr - m) / s).float(), ((Xte - m) / s).float()
        meta["normalization"] = {"mean": float(m), "std": float(s), "computed_on": "whole train part"}
    return Split((Xtr, y[train_idx]), (Xte, y[test_idx]), "classification", 10, (64,), "digits", meta)


_MNIST1D_CACHE: dict[str, Any] = {}


def _mnist1d(n_train: int | None, n_test: int | None, seed: int) -> Split:
    if "data" not in _MNIST1D_CACHE:
        from mnist1d.data import get_dataset_args, make_dataset

        # make_dataset reseeds Python's and numpy's global RNGs: put them back afterwards.
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            _MNIST1D_CACHE["data"] = make_dataset(get_dataset_args())
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
    d = _MNIST1D_CACHE["data"]
    rng = np.random.default_rng(seed)
    meta: dict[str, Any] = {
        "source": "mnist1d.data.make_dataset(get_dataset_args()) (generator seed 42)",
        "seed": seed,
        "split_rule": "the package's split: first 4000 generated examples train, last 1000 test",
    }
    parts = []
    for part, n, sfx in (("train", n_train, ""), ("test", n_test, "_test")):
        idx = subset(len(d["y" + sfx]), n, rng, part)
        meta[f"{part}_indices"] = None if idx is None else idx.tolist()
        X, y = torch.tensor(d["x" + sfx], dtype=torch.float32), torch.tensor(d["y" + sfx], dtype=torch.int64)
        parts.append((X, y) if idx is None else (X[idx], y[idx]))
    return Split(parts[0], parts[1], "classification", 10, (40,), "mnist1d", meta)
