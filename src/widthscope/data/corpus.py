r"""Text corpora read as documents (:func:`documents`: text files and folders, tables, ``datasets``
folders, folders of split files; binary files refused) and cut into sequences (:func:`sequences`).
Formats, splits and modes: docs/certify.md §6.

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

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from .._io import progress
from ..errors import WidthscopeError
from .sniff import TABULAR, files_under, is_dataset_dir, precheck, sniff, text_only
from .splits import split_files

__all__ = ["ByteTokenizer", "Sequences", "documents", "sequences"]

_PIECE = 1 << 16  # characters of a text file tokenized at once (reading stops between pieces)


def _text_pieces(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        while True:
            piece = f.read(_PIECE)
            if not piece:
                return
            rest = f.readline()  # finish the line, so pieces end at line ends
            yield piece + rest


def _column_text(row: dict[str, Any], field: str, where: str, i: int) -> str:
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
    """Rows of a tabular file or a save_to_disk directory, lazily, through ``datasets``."""
    import datasets

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
    precheck(path)

    def fail(exc: Exception) -> WidthscopeError:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return WidthscopeError(f"{path} could not be read as {builder} ({type(exc).__name__}: {first})")

    try:
        # CSV: "NA"/"null"/... cells stay text and blank lines stay rows (empty documents)
        na = {"keep_default_na": False, "na_filter": False, "skip_blank_lines": False} if builder == "csv" else {}
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **na)
    except Exception as exc:
        raise fail(exc) from None
    return guarded(ds, fail), f"{builder} file {path}"


def guarded(rows: Iterable[Any], fail: Callable[[Exception], WidthscopeError]) -> Iterator[Any]:
    """``rows``, with an error raised while streaming them as ``fail(exc)`` (one line)."""
    try:
        yield from rows
    except WidthscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 - read errors surface while streaming
        raise fail(exc) from None


def documents(
    path: str | Path,
    *,
    text_field: str | None = None,
    split: str | None = None,
    label_field: str | None = None,
    skipped: list[str] | None = None,
) -> tuple[Iterator[Any], str]:
    """Documents of ``path`` (iterators of text pieces, or ``(pieces, label)``) and the source in words."""
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
        files = files_under(path) if path.is_dir() and not tabular else []
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
        docs = (d for t in tables for d in documents(t, text_field=field, label_field=label_field)[0])
        return docs, f"{src}, field {field!r}"
    if tabular:
        rows, source = _rows(path, split)
        return row_documents(rows, field, label_field, str(path)), f"{source}, field {field!r}"
    if path.is_file():
        reason = sniff(path)
        if reason is not None:
            raise WidthscopeError(f"{path} {reason}")
        return iter([_text_pieces(path)]), f"text file {path}"
    good, binary = text_only(files, path)
    if skipped is not None:
        skipped += binary
    if not good:
        raise WidthscopeError(
            f"{path}: none of its {len(files)} files is text (by content); point --data at "
            "a directory of text files, or at a .jsonl/.csv/.parquet file"
        )
    return (_text_pieces(p) for p in good), where or f"{len(good)} text files under {path}"


def row_documents(rows: Any, field: str, label_field: str | None, where: str) -> Iterator[Any]:
    """Rows (dicts) as documents: the ``field`` text (with its label when asked)."""
    for i, row in enumerate(rows):
        text = _column_text(row, field, where, i)
        if label_field is None:
            yield iter([text])
            continue
        if label_field not in row:
            raise WidthscopeError(
                f"{where} has no label column {label_field!r} (it has: {', '.join(map(str, row))}); "
                "pass --label-field NAME"
            )
        yield iter([text]), row[label_field]


def _table_files(files: list[Path], path: Path) -> list[Path]:
    """The files of a folder that holds only tables, else [] (any other file makes it a text folder)."""
    if not files or any(p.suffix.lower() not in TABULAR for p in files):
        return []
    kinds = {TABULAR[p.suffix.lower()] for p in files}
    if len(kinds) > 1:
        raise WidthscopeError(f"{path} mixes table formats ({', '.join(sorted(kinds))}): keep one format per folder")
    return files


# ----------------------------------------------------------------------------- sequences
class ByteTokenizer:
    """Bytes as tokens (vocabulary 256, no special tokens): widthscope's own byte-level models."""

    name = "bytes"

    def __len__(self) -> int:
        return 256

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}


@dataclasses.dataclass
class Sequences:
    """Token sequences ``ids (n, T)``; ``mask`` (per-document mode) or None; ``labels`` or None."""

    ids: torch.Tensor
    mask: torch.Tensor | None
    labels: torch.Tensor | None
    documents: int
    tokens: int
    exhausted: bool
    separator: int | None
    dropped_short: int = 0
    empty_docs: int = 0  # empty or whitespace-only documents read (skipped or kept: see ``empty``)


def sequences(
    docs: Iterator[Any],
    tokenizer: Any,
    *,
    seq_len: int,
    mode: str = "concatenate",
    limit: int | None = None,
    max_tokens: int | None = None,
    labels: bool = False,
    show_progress: bool = False,
    desc: str = "tokenize",
    empty: str = "skip",
) -> Sequences:
    """Cut documents into ``seq_len``-token sequences, up to ``limit`` sequences or ``max_tokens`` tokens."""
    if labels and mode != "per-document":
        raise WidthscopeError("labelled data (sequence classification) needs --sequences per-document")
    eos = getattr(tokenizer, "eos_token_id", None)
    sep = eos if eos is not None else getattr(tokenizer, "sep_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id == sep:
        unk_id = None  # byte-level BPEs name EOS as "unknown"; they have no unknown token
    bar = progress(total=limit, desc=desc, disable=None if show_progress else True, unit="seq")
    c = _Cut(
        tokenizer, seq_len, limit, max_tokens, labels, sep, 0 if pad is None else int(pad), unk_id, empty == "skip", bar
    )
    exhausted = True
    try:
        for doc in docs:
            pieces, y = doc if labels else (doc, None)
            c.n_docs += 1
            taken = c.concatenate(pieces) if mode == "concatenate" else c.document(pieces, y, mode == "truncate")
            if taken and c.full():  # a document not taken: the limits are checked after the next one
                exhausted = False
                break
    finally:
        bar.close()
    _check_tokenizer(c)
    return _assemble(c, mode, exhausted)


@dataclasses.dataclass
class _Cut:
    """The settings of one :func:`sequences` call, what it has cut so far, and its counters."""

    tokenizer: Any
    seq_len: int
    limit: int | None
    max_tokens: int | None
    labels: bool
    sep: int | None
    pad: int
    unk_id: int | None
    skip: bool
    bar: Any
    rows: list[list[int]] = dataclasses.field(default_factory=list)
    masks: list[list[int]] = dataclasses.field(default_factory=list)
    ys: list[Any] = dataclasses.field(default_factory=list)
    buf: list[int] = dataclasses.field(default_factory=list)
    n_docs: int = 0
    n_tokens: int = 0
    short: int = 0
    n_unk: int = 0
    empty: int = 0  # non-blank documents that gave no tokens
    nonblank: int = 0
    blank_docs: int = 0

    def full(self) -> bool:
        """``limit`` sequences cut, or ``max_tokens`` tokens read."""
        return (self.limit is not None and len(self.rows) >= self.limit) or (
            self.max_tokens is not None and self.n_tokens >= self.max_tokens
        )

    def encode(self, text: str, **kw: Any) -> list[int]:
        return list(self.tokenizer(text, **(kw or {"add_special_tokens": False}))["input_ids"])

    def read(self, ids: list[int]) -> None:
        self.n_tokens += len(ids)
        if self.unk_id is not None:
            self.n_unk += ids.count(self.unk_id)

    def concatenate(self, pieces: Iterable[str]) -> bool:
        """One document into the running buffer, then its separator; full chunks become rows."""
        got, has_text = 0, False
        for piece in _nonblank_first(pieces) if self.skip else pieces:
            ids = self.encode(piece)
            self.read(ids)
            got += len(ids)
            has_text = has_text or bool(piece.strip())
            self.buf.extend(ids)
            self._chunks()
            if self.full():
                break  # a long document: stop inside it
        self.nonblank += has_text
        self.empty += has_text and got == 0
        self.blank_docs += not has_text
        if self.sep is not None and (has_text or not self.skip):
            self.buf.append(int(self.sep))
            self._chunks()  # the separator may complete a chunk
        return True

    def _chunks(self) -> None:
        while len(self.buf) >= self.seq_len and (self.limit is None or len(self.rows) < self.limit):
            self.rows.append(self.buf[: self.seq_len])
            del self.buf[: self.seq_len]
            self.bar.update(1)

    def document(self, pieces: Iterable[str], y: Any, truncate: bool) -> bool:
        """One document as one row (``truncate``: its first ``seq_len`` tokens, else padded); False: not taken."""
        text = "".join(pieces)
        if not text.strip():
            self.blank_docs += 1
            if truncate or self.skip:
                return False
        else:
            self.nonblank += 1
            self.empty += not self.encode(text[:2000])
        kw = {"truncation": False, "verbose": False} if truncate else {"truncation": True, "max_length": self.seq_len}
        ids = self.encode(text, add_special_tokens=True, **kw)
        ids = ids if truncate else ids[: self.seq_len]
        self.read(ids)
        if len(ids) < (self.seq_len if truncate else 1 if self.labels else 2):
            self.short += 1  # too short for the rule, or no token to predict
            return False
        ids = ids[: self.seq_len]
        self.rows.append(ids + [self.pad] * (self.seq_len - len(ids)))
        self.masks.append([1] * len(ids) + [0] * (self.seq_len - len(ids)))
        self.ys.append(y)
        self.bar.update(1)
        return True


def _check_tokenizer(c: _Cut) -> None:
    """Refuse a tokenizer that turned most documents into no tokens, or >5% of tokens into unknown."""
    empty, nonblank, n_unk, n_tokens = c.empty, c.nonblank, c.n_unk, c.n_tokens
    name = getattr(c.tokenizer, "name_or_path", None) or getattr(c.tokenizer, "name", "?")
    if nonblank and empty > 0.5 * nonblank:
        raise WidthscopeError(
            f"the tokenizer ({name}) turned {empty} of {nonblank} non-empty documents into no "
            "tokens at all: it cannot read this text (wrong tokenizer?); pass the matching one "
            "with --tokenizer"
        )
    if n_unk > 0.05 * n_tokens:
        raise WidthscopeError(
            f"the tokenizer ({name}) maps {n_unk} of {n_tokens} tokens ({n_unk / n_tokens:.0%}) "
            "to its unknown token: it does not cover this text (wrong tokenizer or language?)"
        )


def _assemble(c: _Cut, mode: str, exhausted: bool) -> Sequences:
    """The rows (and masks, labels) as tensors."""

    def tensor(rows: list[Any]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64) if rows else torch.zeros(0, c.seq_len, dtype=torch.int64)

    bad = [y for y in c.ys if not isinstance(y, int) or isinstance(y, bool)] if c.labels else []
    if bad:
        raise WidthscopeError(
            f"labels must be integer class ids, got {bad[0]!r}: map the label column to 0..num_labels-1 first"
        )
    return Sequences(
        tensor(c.rows),
        tensor(c.masks) if mode == "per-document" else None,
        torch.tensor(c.ys, dtype=torch.int64) if c.labels else None,
        c.n_docs,
        c.n_tokens,
        exhausted,
        c.sep if mode == "concatenate" else None,
        c.short,
        c.blank_docs,
    )


def _nonblank_first(pieces: Iterable[str]) -> Iterator[str]:
    """The pieces of a document once text follows its leading whitespace (blank throughout: nothing)."""
    it, head = iter(pieces), []
    for piece in it:
        head.append(piece)
        if piece.strip():
            yield from head
            yield from it
            return
