r"""Hugging Face hub ids (``org/name`` at a ``revision``) and hub cache folders (``models--org--name``)
as models: resolved to a local snapshot directory (docs/huggingface.md).

Example (a cache layout built by hand, read offline)::

    >>> import os, pathlib, tempfile
    >>> cache = pathlib.Path(tempfile.mkdtemp())
    >>> repo = cache / "models--org--tiny"
    >>> (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    >>> (repo / "refs").mkdir()
    >>> _ = (repo / "refs" / "main").write_text("a" * 40)
    >>> saved = dict(os.environ)
    >>> os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    >>> where, hub = resolve_model("org/tiny")
    >>> where.name == "a" * 40, hub.record()["revision"]
    (True, 'main')
    >>> resolve_model("org/other")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --model 'org/other': ... fetch it with `hf download org/other` ...
    >>> resolve_model(str(repo))[1].commit == "a" * 40  # the cache folder itself: the snapshot of refs/main
    True
    >>> os.environ.clear(); os.environ.update(saved)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from .errors import WidthscopeError

DEFAULT_REVISION = "main"
# What a checkpoint needs: configs, tokenizer files and the weights (safetensors, else ``.bin``).
ALLOW = ["*.json", "*.txt", "*.model", "*.tiktoken", "model.safetensors", "model-*.safetensors"]
ALLOW_BIN = ["pytorch_model.bin", "pytorch_model-*.bin"]
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclasses.dataclass(frozen=True)
class HubModel:
    """Where a hub model came from: repo, revision asked for, commit and local snapshot."""

    repo_id: str
    revision: str | None
    commit: str
    directory: Path

    def record(self) -> dict[str, Any]:
        """JSON-able: what a results file records (``settings.inputs.hub``)."""
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "snapshot": str(self.directory),
        }


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as ``huggingface_hub`` reads it, now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE


def cache_dir() -> Path:
    """The hub cache ``huggingface_hub`` uses, read from the environment now."""
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not hub:
        home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        hub = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def is_hub_id(text: str) -> bool:
    """``org/name`` as the hub spells repository ids (letters, digits, ``-_.``; no ``--``/``..``)."""
    if not isinstance(text, str) or text.count("/") != 1 or text.startswith((".", "/", "~")):
        return False
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except ValueError:  # HFValidationError
        return False
    return True


def fetch_command(repo_id: str, revision: str | None) -> str:
    """The command that puts ``repo_id`` at ``revision`` into the hub cache."""
    rev = f" --revision {revision}" if revision not in (None, DEFAULT_REVISION) else ""
    return f"hf download {repo_id}{rev}"


def _cache_folder_id(path: Path) -> str | None:
    """``org/name`` of a hub cache folder ``models--org--name`` (None: not one)."""
    if not path.name.startswith("models--") or not (path / "snapshots").is_dir():
        return None
    return "/".join(path.name.split("--")[1:]) or None


def _snapshot_of(path: Path) -> HubModel | None:
    """A path inside a cache folder's ``snapshots/<commit>``: its id and commit (revision unknown)."""
    if path.parent.name != "snapshots":
        return None
    repo = _cache_folder_id(path.parent.parent)
    return HubModel(repo, None, path.name, path) if repo else None


def _check_revision(revision: str | None) -> None:
    if revision is None:
        return
    if not isinstance(revision, str) or not revision.strip():
        raise WidthscopeError(f"--revision {revision!r}: give a branch, tag or commit hash of the model's repository")
    if revision.startswith("/") or ".." in revision.split("/"):
        raise WidthscopeError(f"--revision {revision!r}: a branch, tag or commit hash, not a path")


def _snapshot(
    repo_id: str, revision: str | None, *, cache: Path, local_only: bool, flag: str, folder: Path | None = None
) -> Path:
    """``snapshot_download`` with one error line for every way it can fail."""
    import huggingface_hub
    from huggingface_hub import errors
    from huggingface_hub.utils import logging as hub_logging

    rev = revision or DEFAULT_REVISION
    asked = f"revision {rev!r} of the Hugging Face model {repo_id}"
    fetch = fetch_command(repo_id, revision)
    verbosity = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # "no files matched" and retry chatter: the error below says it all
    try:
        path = Path(
            huggingface_hub.snapshot_download(
                repo_id, revision=rev, cache_dir=str(cache), local_files_only=local_only, allow_patterns=ALLOW
            )
        )
        if not local_only and not any(
            (path / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")
        ):
            path = Path(
                huggingface_hub.snapshot_download(repo_id, revision=rev, cache_dir=str(cache), allow_patterns=ALLOW_BIN)
            )
    except errors.LocalEntryNotFoundError as exc:
        partial = getattr(exc, "snapshot_path", None)
        if partial and Path(partial).is_dir():  # IncompleteSnapshotError: the loaders name the file they miss
            return Path(partial)
        if folder is not None:
            refs = sorted(str(p.relative_to(folder / "refs")) for p in (folder / "refs").rglob("*") if p.is_file())
            raise WidthscopeError(
                f"{flag} {str(folder)!r}: this hub cache folder has no snapshot for revision "
                f"{rev!r} (its refs: {', '.join(refs) or 'none'}; or give a commit hash "
                f"listed in {folder / 'snapshots'}); fetch it with `{fetch}`"
            ) from None
        cause = exc.__cause__
        if local_only or isinstance(cause, errors.OfflineModeIsEnabled):
            why = "HF_HUB_OFFLINE is set, so nothing is downloaded"
            fix = (
                f"fetch it with `{fetch}` (older huggingface_hub: `huggingface-cli download ...`), or unset "
                "HF_HUB_OFFLINE"
            )
        else:
            why = f"the Hub could not be reached ({type(cause).__name__ if cause else 'no connection'})"
            fix = f"check the connection, or fetch it where there is one with `{fetch}` into the same cache"
        raise WidthscopeError(
            f"{flag} {repo_id!r}: no such local file or directory, and {asked} is not in the hub "
            f"cache {cache} ({why}): {fix}"
        ) from None
    except errors.GatedRepoError:
        raise WidthscopeError(
            f"{flag} {repo_id!r} is a gated model: accept its terms on "
            f"https://huggingface.co/{repo_id} and log in (`hf auth login`), then retry"
        ) from None
    except errors.RepositoryNotFoundError:
        raise WidthscopeError(
            f"{flag} {repo_id!r}: no such local file or directory, and no such model on the "
            "Hugging Face Hub (a private one needs `hf auth login`)"
        ) from None
    except errors.RevisionNotFoundError:
        raise WidthscopeError(
            f"--revision {rev!r}: no such branch, tag or commit in the Hugging Face model "
            f"{repo_id}; list them on https://huggingface.co/{repo_id}"
        ) from None
    except (OSError, ValueError) as exc:  # a cache that is not writable, a bad id or revision, the network
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WidthscopeError(
            f"{flag} {repo_id!r} ({asked}): could not be resolved ({type(exc).__name__}: {first[:200]})"
        ) from None
    finally:
        hub_logging.set_verbosity(verbosity)
    return path


def resolve_model(
    model: str, revision: str | None = None, *, flag: str = "--model", local_only: bool | None = None
) -> tuple[Path, HubModel | None]:
    """The local path ``model`` names (a hub cache folder or ``org/name`` id: the snapshot of
    ``revision``), and its hub record; ``local_only``: never download (default: :func:`offline`)."""
    _check_revision(revision)
    path = Path(model).expanduser()
    if path.exists():
        repo = _cache_folder_id(path) if path.is_dir() else None
        if repo is not None:
            where = _snapshot(repo, revision, cache=path.parent, local_only=True, flag=flag, folder=path)
            return where, HubModel(repo, revision or DEFAULT_REVISION, where.name, where)
        if revision is not None:
            raise WidthscopeError(
                f"--revision applies to Hugging Face hub ids (org/name) and hub cache folders "
                f"(models--org--name); {flag} {model!r} is a local "
                f"{'directory' if path.is_dir() else 'file'}: drop --revision"
            )
        return path, (_snapshot_of(path) if path.is_dir() else None)
    if not is_hub_id(model):
        return path, None
    local = offline() if local_only is None else local_only
    where = _snapshot(model, revision, cache=cache_dir(), local_only=local, flag=flag)
    return where, HubModel(model, revision or DEFAULT_REVISION, where.name, where)


def local_directory(model: str, revision: str | None = None) -> Path | None:
    """The local directory of ``model`` without any download and without raising (None: cannot tell)."""
    path = Path(model).expanduser()
    if path.exists() and _cache_folder_id(path) is None:
        return path
    if not path.exists() and not is_hub_id(model):
        return None
    try:
        return resolve_model(model, revision, local_only=True)[0]
    except WidthscopeError:
        return None


def attach(model: Any, hub: HubModel | None) -> Any:
    """Record ``hub`` on a loaded model (``widthscope_hub``, and in ``widthscope_hf``); returns it."""
    if hub is not None:
        record = hub.record()
        model.widthscope_hub = record
        hf = getattr(model, "widthscope_hf", None)
        if isinstance(hf, dict):
            hf["hub"] = record
    return model


def hub_record(model: Any) -> dict[str, Any] | None:
    """The hub record of a loaded model (None: not loaded from the hub)."""
    record = getattr(model, "widthscope_hub", None)
    return record if isinstance(record, dict) else None
