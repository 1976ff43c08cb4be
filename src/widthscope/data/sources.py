"""A data source of the input spec in any form (a path, ``hf:NAME``, texts or datasets in memory), read
as documents (:func:`documents_of`) with the same split rules (:func:`choose`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterator

from torch.utils.data import DataLoader

from ..errors import WidthscopeError
from . import DATASETS, hf_datasets
from .corpus import documents, row_documents
from .splits import HELD_OUT, SplitChoice, choose_among, choose_splits, dataset_splits

DATA_OBJECTS = (
    "a list of texts (list[str]: one document each), a datasets.Dataset (a text column, or tokenized "
    "columns input_ids [attention_mask, labels]), a datasets.DatasetDict (its own splits), a "
    "BatchEncoding or mapping of tensors, or a DataLoader"
)


def _types(iterable: bool) -> tuple[tuple[type, ...], tuple[type, ...]]:
    """The ``Dataset`` and ``DatasetDict`` types (``iterable``: their streaming forms too)."""
    import datasets

    if iterable:
        return (datasets.Dataset, datasets.IterableDataset), (datasets.DatasetDict, datasets.IterableDatasetDict)
    return (datasets.Dataset,), (datasets.DatasetDict,)


def is_dataset(obj: Any, iterable: bool = False) -> bool:
    return isinstance(obj, _types(iterable)[0])


def is_dataset_dict(obj: Any, iterable: bool = False) -> bool:
    return isinstance(obj, _types(iterable)[1])


def is_texts(obj: Any) -> bool:
    return isinstance(obj, (list, tuple)) and all(isinstance(t, str) for t in obj)


def is_tokenized_object(obj: Any, text_field: str | None = None) -> bool:
    """A mapping of tensors, a ``DataLoader``, or a dataset with ``input_ids`` (and no ``text_field``)."""
    if (isinstance(obj, Mapping) and not is_dataset_dict(obj)) or isinstance(obj, DataLoader):
        return True
    parts = [obj] if is_dataset(obj) else list(obj.values()) if is_dataset_dict(obj) else []
    return text_field is None and any("input_ids" in (ds.column_names or []) for ds in parts)


def check_object(name: str, obj: Any) -> str | None:
    """Why ``obj`` cannot be the spec's data field ``name`` (None: it can)."""
    if is_texts(obj):
        return None if len(obj) else "the list of texts is empty"
    if is_dataset(obj) or is_dataset_dict(obj) or isinstance(obj, DataLoader):
        return None
    if isinstance(obj, Mapping):
        return None if len(obj) else "the mapping is empty: give input_ids (and attention_mask, labels)"
    if isinstance(obj, (list, tuple)):
        return "a list must hold texts (str) only"
    return f"must be a path, a dataset name or {hf_datasets.SYNTAX}, or an object in memory: {DATA_OBJECTS}"


def describe(src: Any) -> str:
    """The source in words (what messages and results name); a string is itself."""
    if isinstance(src, str):
        return src
    if is_texts(src):
        return f"<in memory: list of {len(src)} texts>"
    if is_dataset_dict(src):
        return f"<in memory: DatasetDict with splits {', '.join(src)}>"
    if is_dataset(src):
        return f"<in memory: Dataset of {len(src)} rows, columns {', '.join(src.column_names or [])}>"
    if isinstance(src, DataLoader):
        return f"<in memory: DataLoader of {len(src)} batches>"
    if isinstance(src, Mapping):
        n = next(iter(src.values())).__len__() if len(src) else 0
        return f"<in memory: {type(src).__name__} of {n} examples ({', '.join(map(str, src))})>"
    return f"<in memory: {type(src).__name__}>"


# ----------------------------------------------------------------------------- splits
def splits_of(src: Any, flag: str = "--data") -> list[str] | None:
    """The source's own split names (None: it has none: one corpus)."""
    if hf_datasets.is_hf_ref(src):
        return hf_datasets.split_names(hf_datasets.parse_ref(src, flag), flag)
    if is_dataset_dict(src):
        return [str(s) for s in src]
    if isinstance(src, str):
        return dataset_splits(src)
    return None


def choose(
    src: Any, train_split: str | None, test_split: str | None, test_fraction: float | None
) -> SplitChoice | None:
    """:func:`widthscope.data.splits.choose_splits` for any source."""
    if isinstance(src, str) and not hf_datasets.is_hf_ref(src):
        return choose_splits(Path(src).expanduser(), train_split, test_split, test_fraction)
    names = splits_of(src)
    if names is None:
        return None
    if not names:
        raise WidthscopeError(f"{describe(src)} has no splits")
    return choose_among(names, describe(src), None, train_split, test_split, test_fraction)


def check_splits_given(
    data: Any, train_data: Any, test_data: Any, train_split: str | None, test_split: str | None
) -> None:
    """Refuse ``--train-split``/``--test-split`` for a source without splits of its own."""
    tr = ("--train-split",) if train_split is not None else ()
    te = ("--test-split",) if test_split is not None else ()
    if train_data is None and test_data is None:
        given = [("--data", data, tr + te)]
    else:
        given = [("--train-data", train_data, tr), ("--test-data", test_data, te)]
    for flag, src, flags in given:
        if src is None or not flags or hf_datasets.is_hf_ref(src):
            continue
        drop = f"drop {'/'.join(flags)}"
        if isinstance(src, str) and src in DATASETS:
            raise WidthscopeError(f"{flag} {src!r} is a named dataset with no splits of its own: {drop}")
        if isinstance(src, str) and not Path(src).expanduser().exists():
            continue
        if splits_of(src, flag) is None:
            what = repr(src) if isinstance(src, str) else describe(src)
            raise WidthscopeError(
                f"{flag} {what} has no splits (only a DatasetDict, a folder of split files such as "
                f"train.jsonl/validation.jsonl, or hf:NAME has them): {drop}"
            )


def default_split_of(src: Any, role: str) -> str | None:
    """The split ``--train-data`` / ``--test-data`` reads (None: the whole source)."""
    names = splits_of(src, "--train-data" if role == "train" else "--test-data")
    if not names or (len(names) == 1 and isinstance(src, str) and not hf_datasets.is_hf_ref(src)):
        return None
    if len(names) == 1:  # a named dataset or a DatasetDict
        return names[0]
    if role == "train":
        return "train" if "train" in names else None
    return next((n for n in HELD_OUT if n in names), None)


def same_source(a: Any, b: Any) -> bool:
    """The same file/folder, the same dataset reference or the same object."""
    if isinstance(a, str) and isinstance(b, str):
        if hf_datasets.is_hf_ref(a) or hf_datasets.is_hf_ref(b):
            return a == b
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return a is b


# ----------------------------------------------------------------------------- documents
def documents_of(
    src: Any,
    *,
    split: str | None,
    text_field: str | None,
    label_field: str | None,
    skipped: list[str],
    whole: bool,
) -> tuple[Iterator[Any], str]:
    """Documents of any text source, and the source in words (``whole``: prepare, not stream)."""
    field = text_field or "text"
    if hf_datasets.is_hf_ref(src):
        ref = hf_datasets.parse_ref(src)
        if split is None:
            raise WidthscopeError(f"{src}: name its split with --train-split/--test-split")
        rows, desc = hf_datasets.rows(ref, split, whole=whole)
        return row_documents(rows, field, label_field, f"{src} split {split!r}"), f"{desc}, field {field!r}"
    if isinstance(src, str):
        return documents(src, text_field=text_field, split=split, label_field=label_field, skipped=skipped)
    if is_texts(src):
        if text_field is not None or label_field is not None:
            raise WidthscopeError(
                "--text-field/--label-field apply to tables and datasets; a list of texts is plain text: "
                "give a datasets.Dataset with text and label columns"
            )
        if split is not None:
            raise WidthscopeError("--train-split/--test-split apply to datasets with splits, not to a list of texts")
        return (iter([t]) for t in src), f"{len(src)} texts in memory"
    if is_dataset_dict(src):
        if split is None or split not in src:
            raise WidthscopeError(f"{describe(src)}: no split {split!r}: choose one with --train-split/--test-split")
        ds, where = src[split], f"DatasetDict split {split!r}"
    else:  # a Dataset: the spec refuses other objects
        if split is not None:
            raise WidthscopeError(f"{describe(src)} has no splits: drop --train-split/--test-split")
        ds, where = src, "Dataset"
    cols = list(ds.column_names or [])
    if field not in cols:
        raise WidthscopeError(
            f"{where} in memory has no column {field!r} (columns: {', '.join(cols)}): pass text_field=NAME"
        )
    return row_documents(iter(ds), field, label_field, f"{where} in memory"), (
        f"{where} in memory ({len(ds)} rows), field {field!r}"
    )
