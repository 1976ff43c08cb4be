"""Byte-level text: the files' bytes concatenated in sorted path order (default: Python's standard
library ``.py`` files), cut into ``seq_len``-byte chunks (chunk ``i`` = bytes ``[i·L, (i+1)·L)``), of
which a seeded permutation holds out ``round(test_fraction · chunks)``."""

from __future__ import annotations

import hashlib
import pydoc_data.topics as topics
import sysconfig
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from ..errors import WidthscopeError
from . import Split, holdout
from .sniff import TABULAR, files_under, sniff, text_only


def _files(root: str | None) -> tuple[list[Path], str, list[str]]:
    """Corpus files in sorted order, their description, and the files skipped (with why)."""
    if root is None:
        base = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(
            (p for p in base.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts),
            key=lambda p: p.relative_to(base).as_posix(),
        )
        return files, f"python stdlib *.py under {base}", []

    path = Path(root).expanduser()
    if path.is_file():
        if path.suffix.lower() in TABULAR:
            raise WidthscopeError(
                f"text: {path} is a {path.suffix} table, not raw text; give it to certify/grow "
                "as --data (its text column is read through the datasets library)"
            )
        reason = sniff(path)
        if reason is not None:  # never read a binary file's bytes as if they were text
            raise WidthscopeError(f"text: {path} {reason}")
        return [path], str(path), []
    if path.is_dir():
        files, skipped = text_only(files_under(path), path)  # text by content, not by suffix
        if not files:
            raise WidthscopeError(
                f"text: none of the files under {path} is text (by content); "
                "point root at a text file or a directory containing some"
            )
        return files, f"text files under {path}", skipped
    raise WidthscopeError(
        f"text: root {str(path)!r} does not exist; give a text file or a directory "
        "of text files (or omit root for the Python standard library)"
    )


def prose() -> tuple[bytes, list[str]]:
    """English prose shipped with Python: the ``pydoc_data.topics`` help texts and LICENSE.txt."""
    parts = [topics.topics[k] for k in sorted(topics.topics)]
    used = ["pydoc_data.topics"]
    lic = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if lic.is_file():
        parts.append(lic.read_text(encoding="utf-8", errors="replace"))
        used.append(str(lic))
    return "\n\n".join(parts).encode("utf-8"), used


def read_corpus(root: str | None, max_bytes: int, corpus: str = "text") -> tuple[bytes, list[str], str, list[str]]:
    """The corpus bytes (up to ``max_bytes``), the files used, a description and the files skipped."""
    if corpus == "prose":
        buf, used = prose()
        return buf[:max_bytes], used, "English prose shipped with Python (pydoc_data.topics, LICENSE.txt)", []
    files, source, skipped = _files(root)
    acc = bytearray()
    used = []
    for f in files:
        if len(acc) >= max_bytes:
            break
        acc += f.read_bytes()[: max_bytes - len(acc)]
        used.append(str(f))
    return bytes(acc), used, source, skipped


def spans(indices: Iterable[int], seq_len: int) -> list[list[int]]:
    """Chunk indices -> merged byte spans ``[[start, end), ...]`` (chunk i = [i·L, (i+1)·L))."""
    out: list[list[int]] = []
    for i in sorted(int(i) for i in indices):
        a, b = i * seq_len, (i + 1) * seq_len
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return out


def chunks_within(n_bytes: int, seq_len: int, ranges: list[list[int]]) -> np.ndarray:
    """Indices of the ``seq_len`` chunks lying wholly inside one of the sorted, disjoint byte ``ranges``."""
    starts = np.arange(n_bytes // seq_len, dtype=np.int64) * seq_len
    if not ranges or not len(starts):
        return np.zeros(0, dtype=np.int64)
    lo = np.array([r[0] for r in ranges], dtype=np.int64)
    hi = np.array([r[1] for r in ranges], dtype=np.int64)
    k = np.searchsorted(lo, starts, side="right") - 1
    ok = (k >= 0) & (starts + seq_len <= hi[np.clip(k, 0, None)])
    return np.nonzero(ok)[0]


def recorded_chunks(record: dict, n_bytes: int, seq_len: int, part: str) -> np.ndarray:
    """Chunks inside a record's ``fitted`` or ``heldout`` byte ranges, or (``train``) outside the held-out ones."""
    if part in ("fitted", "heldout"):
        return chunks_within(n_bytes, seq_len, record[part])
    if part != "train":
        raise ValueError(f"part must be 'fitted', 'heldout' or 'train', got {part!r}")
    ranges, cur = [], 0
    for a, b in record["heldout"]:
        if a > cur:
            ranges.append([cur, a])
        cur = b
    if cur < n_bytes:
        ranges.append([cur, n_bytes])
    return chunks_within(n_bytes, seq_len, ranges)


def corpus_chunks(buf: bytes, seq_len: int, idx: np.ndarray) -> torch.Tensor:
    tokens = torch.tensor(np.frombuffer(buf[: (len(buf) // seq_len) * seq_len], dtype=np.uint8).astype(np.int64))
    return tokens.view(-1, seq_len)[torch.as_tensor(idx, dtype=torch.long)].clone()


def load_text(
    root: str | None,
    n_train: int | None,
    n_test: int | None,
    seed: int,
    *,
    seq_len: int = 64,
    max_bytes: int = 2_000_000,
    test_fraction: float = 0.1,
    corpus: str = "text",
) -> Split:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 2:
        raise WidthscopeError(
            f"text: seq_len must be an integer >= 2 (one input and one predicted token), got {seq_len!r}"
        )
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise WidthscopeError(f"text: max_bytes must be a positive integer, got {max_bytes!r}")
    if not isinstance(test_fraction, (int, float)) or isinstance(test_fraction, bool):
        raise WidthscopeError(f"text: test_fraction must be a number in (0, 1), got {test_fraction!r}")
    if not 0 < test_fraction < 1:
        raise WidthscopeError(f"text: test_fraction must be in (0, 1), got {test_fraction}")
    buf, used, source, skipped = read_corpus(root, max_bytes, corpus)
    n_chunks = len(buf) // seq_len
    if n_chunks < 2:
        raise WidthscopeError(
            f"text: {len(buf)} bytes from {source} make {n_chunks} chunk(s) of "
            f"seq_len={seq_len}; need at least 2 (more text or a smaller seq_len)"
        )
    n_hold = min(max(1, int(round(test_fraction * n_chunks))), n_chunks - 1)
    train_idx, test_idx, heldout_part = holdout(n_chunks, n_hold, n_train, n_test, seed)
    Xtr, Xte = corpus_chunks(buf, seq_len, train_idx), corpus_chunks(buf, seq_len, test_idx)
    meta = {
        "source": source,
        "files": used,
        "bytes": len(buf),
        "seq_len": seq_len,
        "seed": seed,
        "sha256": hashlib.sha256(buf).hexdigest(),
        "skipped_files": skipped,
        "split_rule": "chunk i = corpus bytes [i*seq_len, (i+1)*seq_len); disjoint chunk sets",
        "train_indices": train_idx.tolist(),
        "test_indices": test_idx.tolist(),
        "heldout_part_indices": heldout_part.tolist(),
    }
    return Split((Xtr, Xtr), (Xte, Xte), "lm", 256, (seq_len,), corpus, meta)
