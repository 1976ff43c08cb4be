"""Documents tokenized and cut into sequences (:func:`sequences`): concatenated chunks,
one padded sequence per document, or documents truncated to ``seq_len``; see
:mod:`widthscope.data.corpus` for the rules."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator

import torch

from .._io import progress
from ..errors import WidthscopeError

__all__ = ["ByteTokenizer", "MODES", "Sequences", "sequences"]

MODES = ("concatenate", "per-document", "truncate")


class ByteTokenizer:
    """Bytes as tokens (vocabulary 256, no special tokens): widthscope's own byte-level models."""

    name = "bytes"
    eos_token_id = None
    sep_token_id = None
    pad_token_id = None
    mask_token_id = None
    all_special_ids: list[int] = []

    def __len__(self) -> int:
        return 256

    def encode_plain(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


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
    unknown: int = 0
    empty_docs: int = 0  # empty or whitespace-only documents read (skipped or kept: see ``empty``)


def _encode(tok: Any) -> Callable[[str], list[int]]:
    if isinstance(tok, ByteTokenizer):
        return tok.encode_plain
    return lambda text: tok(text, add_special_tokens=False)["input_ids"]


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
    """Cut documents into sequences of ``seq_len`` tokens (see the module docstring).

    Stops at ``limit`` sequences or after ``max_tokens`` tokens were read (``None``: no limit).
    ``empty``: ``"skip"`` empty / whitespace-only documents, or ``"eos"`` keep them.
    """
    if mode not in MODES:
        raise WidthscopeError(f"--sequences {mode!r}: choose {', '.join(MODES)}")
    if empty not in ("skip", "eos"):
        raise WidthscopeError(f"--empty-docs {empty!r}: choose skip or eos")
    if labels and mode != "per-document":
        raise WidthscopeError("labelled data (sequence classification) needs --sequences per-document")

    encode = _encode(tokenizer)
    sep = getattr(tokenizer, "eos_token_id", None)
    if sep is None:
        sep = getattr(tokenizer, "sep_token_id", None)
    bar = progress(total=limit, desc=desc, disable=None if show_progress else True, unit="seq")
    exhausted = True
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = 0 if pad is None else int(pad)
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id is not None and unk_id in (sep, getattr(tokenizer, "eos_token_id", None)):
        unk_id = None  # byte-level BPEs name EOS as "unknown"; they have no unknown token
    cut = _Cut(
        tokenizer,
        encode,
        seq_len=seq_len,
        limit=limit,
        max_tokens=max_tokens,
        labels=labels,
        sep=sep,
        pad=pad,
        unk_id=unk_id,
        skip=empty == "skip",
        bar=bar,
    )
    step = {"concatenate": _cut_concatenate, "truncate": _cut_truncate}.get(mode, _cut_per_document)
    try:
        for doc in docs:
            pieces, y = doc if labels else (doc, None)
            cut.n_docs += 1
            if not step(cut, pieces, y):
                continue  # a document not taken: the limits are checked after the next one
            if cut.full():
                exhausted = False
                break
    finally:
        bar.close()
    _check_tokenizer(cut)
    return _assemble(cut, mode, exhausted)


@dataclasses.dataclass
class _Cut:
    """The settings of one :func:`sequences` call, what it has cut so far, and its counters."""

    tokenizer: Any
    encode: Callable[[str], list[int]]
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


def _cut_concatenate(c: _Cut, pieces: Iterable[str], y: Any) -> bool:
    """One document into the running buffer, then its separator; full chunks become rows."""
    got, has_text = 0, False
    for piece in _nonblank_first(pieces) if c.skip else pieces:
        ids = c.encode(piece)
        c.n_tokens += len(ids)
        got += len(ids)
        has_text = has_text or bool(piece.strip())
        if c.unk_id is not None:
            c.n_unk += ids.count(c.unk_id)
        c.buf.extend(ids)
        while len(c.buf) >= c.seq_len and (c.limit is None or len(c.rows) < c.limit):
            c.rows.append(c.buf[: c.seq_len])
            del c.buf[: c.seq_len]
            c.bar.update(1)
        if c.full():
            break  # a long document: stop inside it
    c.nonblank += has_text
    c.empty += has_text and got == 0
    c.blank_docs += not has_text
    if c.sep is not None and (has_text or not c.skip):
        c.buf.append(int(c.sep))
        if len(c.buf) >= c.seq_len and (c.limit is None or len(c.rows) < c.limit):
            c.rows.append(c.buf[: c.seq_len])  # the separator completed a chunk
            del c.buf[: c.seq_len]
            c.bar.update(1)
    return True


def _cut_truncate(c: _Cut, pieces: Iterable[str], y: Any) -> bool:
    """The first ``seq_len`` tokens of one document; False if it is blank or too short."""
    tokenizer = c.tokenizer
    text = "".join(pieces)
    if not text.strip():
        c.blank_docs += 1
        return False  # (kept, it would be shorter than seq_len anyway)
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode_plain(text)
    else:
        ids = tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    c.n_tokens += len(ids)
    c.nonblank += 1
    if not isinstance(tokenizer, ByteTokenizer):
        c.empty += 1 if not c.encode(text[:2000]) else 0
    if len(ids) < c.seq_len:
        c.short += 1  # fewer than seq_len tokens: not taken (the published rule)
        if c.unk_id is not None:
            c.n_unk += ids.count(c.unk_id)
        return False
    if c.unk_id is not None:
        c.n_unk += ids.count(c.unk_id)
    c.rows.append(ids[: c.seq_len])
    c.bar.update(1)
    return True


def _cut_per_document(c: _Cut, pieces: Iterable[str], y: Any) -> bool:
    """One document as one padded row (with its mask and label); False if it is not taken."""
    tokenizer, seq_len = c.tokenizer, c.seq_len
    text = "".join(pieces)
    if not text.strip():
        c.blank_docs += 1
        if c.skip:
            return False
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode_plain(text)[:seq_len]
    else:
        ids = tokenizer(text, add_special_tokens=True, truncation=True, max_length=seq_len)["input_ids"]
    c.n_tokens += len(ids)
    if c.unk_id is not None:
        c.n_unk += ids.count(c.unk_id)
    if text.strip():
        c.nonblank += 1
        plain = len(_encode(tokenizer)(text[:2000])) if not isinstance(tokenizer, ByteTokenizer) else 1
        c.empty += 1 if plain == 0 else 0
    if len(ids) < 2 and not c.labels:
        c.short += 1  # no token to predict
        return False
    if not ids:
        c.short += 1
        return False
    c.rows.append(ids + [c.pad] * (seq_len - len(ids)))
    c.masks.append([1] * len(ids) + [0] * (seq_len - len(ids)))
    c.ys.append(y)
    c.bar.update(1)
    return True


def _check_tokenizer(c: _Cut) -> None:
    """Refuse a tokenizer that cannot read the text: most documents gave no tokens, or more
    than 5% of the tokens are its unknown token."""
    tokenizer, empty, nonblank, n_unk, n_tokens = c.tokenizer, c.empty, c.nonblank, c.n_unk, c.n_tokens
    name = getattr(tokenizer, "name_or_path", None) or getattr(tokenizer, "name", "?")
    if nonblank and empty > 0.5 * nonblank:
        raise WidthscopeError(
            f"the tokenizer ({name}) turned {empty} of {nonblank} non-empty documents into no "
            "tokens at all: it cannot read this text (wrong tokenizer?); pass the matching one "
            "with --tokenizer"
        )
    if c.unk_id is not None and n_tokens and n_unk > 0.05 * n_tokens:
        raise WidthscopeError(
            f"the tokenizer ({name}) maps {n_unk} of {n_tokens} tokens ({n_unk / n_tokens:.0%}) "
            "to its unknown token: it does not cover this text (wrong tokenizer or language?)"
        )


def _assemble(c: _Cut, mode: str, exhausted: bool) -> Sequences:
    """The rows (and masks, labels) as tensors."""
    seq_len = c.seq_len
    ids_t = torch.tensor(c.rows, dtype=torch.int64) if c.rows else torch.zeros(0, seq_len, dtype=torch.int64)
    mask_t = (
        None
        if mode != "per-document"
        else (torch.tensor(c.masks, dtype=torch.int64) if c.masks else torch.zeros(0, seq_len, dtype=torch.int64))
    )
    lab_t = None
    if c.labels:
        bad = [y for y in c.ys if not isinstance(y, int) or isinstance(y, bool)]
        if bad:
            raise WidthscopeError(
                f"labels must be integer class ids, got {bad[0]!r}: map the label column to 0..num_labels-1 first"
            )
        lab_t = torch.tensor(c.ys, dtype=torch.int64)
    return Sequences(
        ids_t,
        mask_t,
        lab_t,
        c.n_docs,
        c.n_tokens,
        exhausted,
        None if mode != "concatenate" else c.sep,
        c.short,
        c.n_unk,
        c.blank_docs,
    )


def _nonblank_first(pieces: Iterable[str]) -> Iterator[str]:
    """The pieces of a document, holding back leading whitespace-only pieces until text follows
    (a document that is whitespace throughout yields nothing: it is skipped whole)."""
    seen, pending = False, []
    for piece in pieces:
        if not seen and not piece.strip():
            pending.append(piece)
            continue
        if not seen:
            yield from pending
            pending.clear()
            seen = True
        yield piece
