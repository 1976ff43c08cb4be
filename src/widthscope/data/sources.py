r"""A data source of the input spec in any form (a path, ``hf:NAME[:CONFIG][@REVISION]``, texts or
datasets in memory), read as documents (:func:`documents_of`) with the same split rules (:func:`choose`).
Hugging Face datasets come through ``datasets``' builder from the user's cache (streamed where a
prefix suffices); no dataset scripts run.

Example::

    >>> parse_ref("hf:Salesforce/wikitext:wikitext-2-raw-v1@main")
    HFDatasetRef(name='Salesforce/wikitext', config='wikitext-2-raw-v1', revision='main')
    >>> str(parse_ref("hf:me/tiny"))
    'hf:me/tiny'
    >>> parse_ref("hf:me/tiny:")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --data 'hf:me/tiny:': ... hf:NAME[:CONFIG][@REVISION] ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterable, Iterator

from torch.utils.data import DataLoader

from ..errors import WidthscopeError
from . import DATASETS
from .corpus import documents, guarded, row_documents
from .splits import HELD_OUT, SplitChoice, choose_among, choose_splits, dataset_splits

PREFIX = "hf:"
_REF = re.compile(
    r"^hf:(?P<name>[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?)(?::(?P<config>[^:@/\s]+))?(?:@(?P<revision>[^@\s]+))?$"
)
SYNTAX = "hf:NAME[:CONFIG][@REVISION] (e.g. hf:Salesforce/wikitext:wikitext-2-raw-v1)"


@dataclasses.dataclass(frozen=True)
class HFDatasetRef:
    """A Hugging Face dataset: ``name`` (``org/name``), ``config`` and ``revision`` (None: the default)."""

    name: str
    config: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        return (
            PREFIX
            + self.name
            + (f":{self.config}" if self.config else "")
            + (f"@{self.revision}" if self.revision else "")
        )

    def fetch_command(self) -> str:
        """The command that puts this dataset into the datasets cache."""
        args = [repr(self.name)] + ([repr(self.config)] if self.config else [])
        rev = f", revision={self.revision!r}" if self.revision else ""
        return f'python -c "import datasets; datasets.load_dataset({", ".join(args)}{rev})"'


def is_hf_ref(value: Any) -> bool:
    """A string of the form ``hf:...`` (checked by :func:`parse_ref`)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def parse_ref(value: str, flag: str = "--data") -> HFDatasetRef:
    """``hf:NAME[:CONFIG][@REVISION]`` as a :class:`HFDatasetRef`; one line naming ``flag`` otherwise."""
    m = _REF.match(value)
    if m is None:
        raise WidthscopeError(f"{flag} {value!r}: a Hugging Face dataset is written {SYNTAX}")
    return HFDatasetRef(m["name"], m["config"], m["revision"])


# ----------------------------------------------------------------------------- Hugging Face datasets
@contextlib.contextmanager
def _quiet() -> Iterator[Any]:
    """``datasets`` without its progress bars and cache warnings (restored afterwards)."""
    import datasets

    level = datasets.logging.get_verbosity()
    bars = datasets.utils.are_progress_bars_disabled()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        datasets.logging.set_verbosity(level)
        if not bars:
            datasets.enable_progress_bars()


def _failure(ref: HFDatasetRef, flag: str, exc: Exception) -> WidthscopeError:
    """One line for a dataset that could not be opened (not cached offline, not found, no such config)."""
    import datasets

    text = str(exc).strip()
    first = (text.splitlines() or [type(exc).__name__])[0][:200]
    what = f"{flag} {str(ref)!r}: the Hugging Face dataset {ref.name}" + (
        f" (config {ref.config})" if ref.config else ""
    )
    if "Available configs in the cache" in text or "Couldn't find cache for" in text:
        avail = text.split("Available configs in the cache:")[-1].strip() if "Available" in text else "none"
        return WidthscopeError(
            f"{what} is cached, but not that configuration (cached: {avail}): name one as "
            f"hf:{ref.name}:CONFIG, or fetch it with `{ref.fetch_command()}`"
        )
    if datasets.config.HF_HUB_OFFLINE:
        return WidthscopeError(
            f"{what} is not in the datasets cache {datasets.config.HF_DATASETS_CACHE} (HF_DATASETS_OFFLINE or "
            "HF_HUB_OFFLINE is set, "
            f"so nothing is downloaded): fetch it with `{ref.fetch_command()}` where there is a network, "
            "or unset HF_DATASETS_OFFLINE and HF_HUB_OFFLINE"
        )
    if type(exc).__name__ in ("DatasetNotFoundError", "FileNotFoundError"):
        return WidthscopeError(
            f"{what} was not found on the Hub or in the cache ({first}): check the name (org/name), or log in "
            "(`hf auth login`) for a private or gated dataset"
        )
    if "config" in text.lower() and ref.config:
        return WidthscopeError(f"{what}: no such configuration ({first}); name one of its configurations")
    return WidthscopeError(f"{what} could not be opened ({type(exc).__name__}: {first})")


_REACHED: set[str] = set()  # Hub endpoints that answered (asked once per process)


def _cached(ref: HFDatasetRef) -> bool:
    """Whether the datasets cache holds a copy of the dataset (``datasets``' own lookup; True if unknown)."""
    try:
        from datasets.load import CachedDatasetModuleFactory
    except ImportError:  # pragma: no cover - another datasets version: it decides
        return True
    try:
        CachedDatasetModuleFactory(ref.name).get_module()
    except Exception:  # noqa: BLE001 - FileNotFoundError: not cached
        return False
    return True


def _check_reachable(ref: HFDatasetRef, flag: str) -> None:
    """Refuse at once a dataset neither cached nor reachable (``datasets`` would retry with backoff)."""
    import datasets
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    endpoint = str(datasets.config.HF_ENDPOINT).rstrip("/")
    if endpoint in _REACHED or _cached(ref):
        return
    try:
        get_session().head(endpoint + "/", timeout=constants.HF_HUB_ETAG_TIMEOUT, follow_redirects=False)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the endpoint is the same line
        why = (str(exc).strip().splitlines() or [""])[0][:120]
        raise WidthscopeError(
            f"{flag} {str(ref)!r}: the Hugging Face dataset {ref.name} is not in the datasets cache "
            f"{datasets.config.HF_DATASETS_CACHE} and the Hub at {endpoint} cannot be reached ({type(exc).__name__}"
            f"{': ' + why if why else ''}): check the connection (HF_ENDPOINT, proxy settings), or fetch it "
            f"with `{ref.fetch_command()}` where there is a network"
        ) from None
    _REACHED.add(endpoint)


def _builder(ref: HFDatasetRef, flag: str) -> Any:
    with _quiet() as datasets:
        if not datasets.config.HF_HUB_OFFLINE:
            _check_reachable(ref, flag)
        try:
            return datasets.load_dataset_builder(ref.name, ref.config, revision=ref.revision)
        except Exception as exc:  # noqa: BLE001 - every failure of the lookup becomes one line
            raise _failure(ref, flag, exc) from None


def split_names(ref: HFDatasetRef, flag: str = "--data") -> list[str]:
    """The dataset's own splits (``train``, ``validation``, ...), from its info."""
    b = _builder(ref, flag)
    splits = getattr(b.info, "splits", None)
    if splits:
        return [str(s) for s in splits]
    with _quiet() as datasets:
        try:
            return [str(s) for s in datasets.get_dataset_split_names(ref.name, ref.config, revision=ref.revision)]
        except Exception as exc:  # noqa: BLE001
            raise _failure(ref, flag, exc) from None


def rows(ref: HFDatasetRef, split: str, *, whole: bool, flag: str = "--data") -> tuple[Iterable[dict[str, Any]], str]:
    """The rows of one split (streamed unless ``whole``) and a description with the record."""
    b = _builder(ref, flag)
    with _quiet():
        try:
            if whole:
                b.download_and_prepare()
                ds: Any = b.as_dataset(split=split)
            else:
                ds = b.as_streaming_dataset(split=split)
        except Exception as exc:  # noqa: BLE001
            raise _failure(ref, flag, exc) from None
    rec = record(ref, b, split)
    how = "whole split" if whole else "streamed"
    desc = f"Hugging Face dataset {ref} split {split!r} ({how}; config {rec['config']}, hash {rec['hash']})"
    return guarded(ds, lambda exc: _failure(ref, flag, exc)), desc


def record(ref: HFDatasetRef, builder: Any = None, split: str | None = None) -> dict[str, Any]:
    """What a result records of the dataset: name, config, revision, hash read, cache only or not."""
    import datasets

    builder = _builder(ref, "--data") if builder is None else builder
    rec = {
        "name": ref.name,
        "config": getattr(builder.config, "name", ref.config),
        "revision": ref.revision,
        "hash": getattr(builder, "hash", None),
        "offline": bool(datasets.config.HF_HUB_OFFLINE),
    }
    if split is not None:
        rec["split"] = split
    return rec


# ----------------------------------------------------------------------------- any source
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
    return f"must be a path, a dataset name or {SYNTAX}, or an object in memory: {DATA_OBJECTS}"


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
    if is_hf_ref(src):
        return split_names(parse_ref(src, flag), flag)
    if is_dataset_dict(src):
        return [str(s) for s in src]
    if isinstance(src, str):
        return dataset_splits(src)
    return None


def choose(
    src: Any, train_split: str | None, test_split: str | None, test_fraction: float | None
) -> SplitChoice | None:
    """:func:`widthscope.data.splits.choose_splits` for any source."""
    if isinstance(src, str) and not is_hf_ref(src):
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
        if src is None or not flags or is_hf_ref(src):
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
    if not names or (len(names) == 1 and isinstance(src, str) and not is_hf_ref(src)):
        return None
    if len(names) == 1:  # a named dataset or a DatasetDict
        return names[0]
    if role == "train":
        return "train" if "train" in names else None
    return next((n for n in HELD_OUT if n in names), None)


def same_source(a: Any, b: Any) -> bool:
    """The same file/folder, the same dataset reference or the same object."""
    if isinstance(a, str) and isinstance(b, str):
        if is_hf_ref(a) or is_hf_ref(b):
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
    if is_hf_ref(src):
        ref = parse_ref(src)
        if split is None:
            raise WidthscopeError(f"{src}: name its split with --train-split/--test-split")
        hf_rows, desc = rows(ref, split, whole=whole)
        return row_documents(hf_rows, field, label_field, f"{src} split {split!r}"), f"{desc}, field {field!r}"
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
