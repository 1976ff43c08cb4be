r"""Text corpora a researcher already has, read as documents, tokenized, cut into sequences.

:func:`documents` reads ``.txt``, directories of text files, ``.jsonl``/``.json``, ``.csv``/``.parquet``
(streamed), ``datasets.save_to_disk`` folders and folders of split files, refusing binary files;
:func:`sequences` cuts documents into ``concatenate``, ``per-document`` or ``truncate`` sequences.
Formats, splits and sequence modes: docs/certify.md §6.

Example::

    >>> import tempfile, pathlib
    >>> from widthscope.data.corpus import ByteTokenizer, documents, sequences
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = p.write_text("hello world, " * 20)
    >>> docs, source = documents(p)
    >>> seqs = sequences(docs, ByteTokenizer(), seq_len=16, mode="concatenate", limit=10)
    >>> seqs.ids.shape, seqs.mask is None
    (torch.Size([10, 16]), True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import WidthscopeError
from .sequences import MODES, ByteTokenizer, Sequences, sequences
from .sniff import IMAGE_SUFFIXES, TABULAR, is_dataset_dir, precheck, sniff, unicode_bom
from .splits import (
    HELD_OUT,
    SPLIT_KEYWORDS,
    FileSplits,
    SplitChoice,
    choose_splits,
    dataset_splits,
    default_split,
    split_files,
)

__all__ = [
    "ByteTokenizer",
    "documents",
    "sequences",
    "Sequences",
    "sniff",
    "precheck",
    "unicode_bom",
    "is_dataset_dir",
    "TABULAR",
    "IMAGE_SUFFIXES",
    "MODES",
    "SPLIT_KEYWORDS",
    "HELD_OUT",
    "FileSplits",
    "split_files",
    "SplitChoice",
    "choose_splits",
    "dataset_splits",
    "default_split",
]

_PIECE = 1 << 16  # characters of a text file tokenized at once (reading stops between pieces)


def _text_pieces(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        while True:
            piece = f.read(_PIECE)
            if not piece:
                return
            rest = f.readline()  # finish the line, so pieces end at line ends
            yield piece + rest


def column_text(row: dict[str, Any], field: str, where: str, i: int) -> str:
    if field not in row:
        raise WidthscopeError(
            f"{where} has no field/column {field!r} (it has: {', '.join(map(str, row))}); pass --text-field NAME"
        )
    v = row[field]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise WidthscopeError(
            f"{where}: record {i} has a {type(v).__name__} in {field!r}, not text; "
            "pass --text-field with the column that holds the text"
        )
    return v


def _rows(path: Path, split: str | None) -> tuple[Iterable[dict[str, Any]], str]:
    """Rows of a tabular file or a save_to_disk directory, lazily, through ``datasets`` (local
    files need no network; the user's HF_*_OFFLINE settings are theirs, never set here)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        raise WidthscopeError(
            "reading .jsonl/.csv/.parquet needs the 'datasets' package: pip install datasets"
        ) from None
    datasets.disable_progress_bars()
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise WidthscopeError(
                f"{path} could not be read as a datasets save_to_disk directory "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        if isinstance(ds, datasets.DatasetDict):
            name = split or "train"
            if name not in ds:
                raise WidthscopeError(
                    f"{path} holds splits {', '.join(ds)}, not {name!r}: choose one with --train-split/--test-split"
                )
            return ds[name], f"datasets directory {path} split {name!r}"
        if split is not None and split != "train":
            raise WidthscopeError(f"{path} holds one dataset without splits; --*-split {split!r} does not apply")
        return ds, f"datasets directory {path}"
    builder = TABULAR[path.suffix.lower()]
    reason = sniff(path) if builder in ("json", "csv") else None
    if reason is not None:
        raise WidthscopeError(f"{path} {reason}")
    if builder == "parquet":
        with open(path, "rb") as f:
            if f.read(4) != b"PAR1":
                raise WidthscopeError(f"{path} is named .parquet but is not a Parquet file (no PAR1 magic bytes)")
    try:
        # CSV: no NA conversion, so a text cell "NA", "null", "None" or "NaN" stays that text (as in .jsonl),
        # and blank lines stay rows (empty documents, counted and skipped like empty rows of a .parquet)
        na = {"keep_default_na": False, "na_filter": False, "skip_blank_lines": False} if builder == "csv" else {}
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **na)
    except Exception as exc:
        raise WidthscopeError(
            f"{path} could not be read as {builder} ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None

    def rows() -> Iterator[dict[str, Any]]:
        try:
            yield from ds
        except WidthscopeError:
            raise
        except Exception as exc:  # parse errors surface while streaming
            raise WidthscopeError(
                f"{path} could not be read as {builder} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''})"
            ) from None

    return rows(), f"{builder} file {path}"


def documents(
    path: str | Path,
    *,
    text_field: str | None = None,
    split: str | None = None,
    label_field: str | None = None,
    skipped: list[str] | None = None,
) -> tuple[Iterator[Any], str]:
    """Documents of ``path`` (see the module docstring) and a description of the source.

    Each document is an iterator of text pieces (a long file streams in pieces), or with
    ``label_field`` a ``(pieces, label)`` pair. ``skipped`` collects ``"file: reason"`` for
    binary files skipped in a directory.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise WidthscopeError(
            f"data path {str(path)!r} does not exist; give a text file, a directory, a "
            ".jsonl/.json/.csv/.parquet file or a datasets save_to_disk directory"
        )
    tabular = is_dataset_dir(path) or (path.is_file() and path.suffix.lower() in TABULAR)
    fs = split_files(path) if path.is_dir() and not tabular else None
    if split is not None and fs is None and not is_dataset_dir(path):
        raise WidthscopeError(
            f"--*-split applies to datasets directories and folders of split files "
            f"(train-*.parquet, validation.jsonl, ...), not to {path}"
        )
    where = None
    if fs is not None:  # a folder of split files: the files of ``split`` (None: every data file)
        if split is not None and split not in fs.splits:
            raise WidthscopeError(
                f"{path} holds splits {', '.join(fs.splits)}, not {split!r}: choose one with --train-split/--test-split"
            )
        files, where = (fs.files if split is None else fs.splits[split]), fs.describe(split)
    else:
        files = _files(path) if path.is_dir() and not tabular else []
    tables = _table_files(files, path)
    if text_field is not None and not (tabular or tables):
        raise WidthscopeError(
            f"--text-field {text_field!r} applies to tables (.jsonl/.json/.csv/.parquet, datasets "
            f"directories); {path} is plain text: drop --text-field"
        )
    if label_field is not None and not (tabular or tables):
        raise WidthscopeError(
            f"labels (--label-field) need a table: {path} is not a .jsonl/.json/.csv/.parquet "
            "file or a datasets directory"
        )
    field = text_field or "text"
    if tables:  # a folder of .jsonl/.csv/... files: the records of each, in path order
        src = where or f"{len(tables)} {tables[0].suffix} files under {path}"
        return _table_docs(tables, field, label_field), f"{src}, field {field!r}"
    if tabular:
        rows, source = _rows(path, split)

        def gen() -> Iterator[Any]:
            for i, row in enumerate(rows):
                text = column_text(row, field, str(path), i)
                if label_field is None:
                    yield iter([text])
                    continue
                if label_field not in row:
                    raise WidthscopeError(
                        f"{path} has no label column {label_field!r} (it has: "
                        f"{', '.join(map(str, row))}); pass --label-field NAME"
                    )
                yield iter([text]), row[label_field]

        return gen(), f"{source}, field {field!r}"
    if path.is_file():
        reason = sniff(path)
        if reason is not None:
            raise WidthscopeError(f"{path} {reason}")
        return iter([_text_pieces(path)]), f"text file {path}"
    good = []
    for p in files:
        reason = sniff(p)
        if reason is None:
            good.append(p)
        elif skipped is not None:
            skipped.append(f"{p.relative_to(path)}: {reason.split(':')[0]}")
    if not good:
        raise WidthscopeError(
            f"{path}: none of its {len(files)} files is text (by content); point --data at "
            "a directory of text files, or at a .jsonl/.csv/.parquet file"
        )
    return (_text_pieces(p) for p in good), where or f"{len(good)} text files under {path}"


def _files(path: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )


def _table_files(files: list[Path], path: Path) -> list[Path]:
    """The files of a folder that holds only tables (.jsonl/.json/.csv/.parquet), read record by
    record; [] otherwise (a folder with any other file is a text folder: code corpora hold .json)."""
    if not files or any(p.suffix.lower() not in TABULAR for p in files):
        return []
    kinds = {TABULAR[p.suffix.lower()] for p in files}
    if len(kinds) > 1:
        raise WidthscopeError(f"{path} mixes table formats ({', '.join(sorted(kinds))}): keep one format per folder")
    return files


def _table_docs(tables: list[Path], field: str, label_field: str | None) -> Iterator[Any]:
    for t in tables:
        docs, _ = documents(t, text_field=field, label_field=label_field)
        yield from docs
