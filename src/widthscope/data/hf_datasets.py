r"""Hugging Face datasets by name: ``--data hf:NAME[:CONFIG][@REVISION]`` (Hub id, configuration,
branch/tag/commit), read through ``datasets``' builder from the user's cache: streamed where a prefix
suffices, prepared for a whole split. No dataset scripts run.

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
from typing import Any, Iterable, Iterator

from ..errors import WidthscopeError

__all__ = ["HFDatasetRef", "is_hf_ref", "parse_ref", "split_names", "rows", "record"]

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


# ----------------------------------------------------------------------------- loading
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
    return _guarded(ds, ref, flag), desc


def _guarded(ds: Iterable[dict[str, Any]], ref: HFDatasetRef, flag: str) -> Iterator[dict[str, Any]]:
    try:
        yield from ds
    except WidthscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 - read errors surface while streaming
        raise _failure(ref, flag, exc) from None


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
