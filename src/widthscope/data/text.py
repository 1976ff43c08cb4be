"""Byte-level text: files -> fixed-length sequences of byte tokens (vocabulary 256).

The corpus is the concatenation of the files' bytes (in sorted path order), cut into
non-overlapping chunks of ``seq_len`` bytes (the tail shorter than ``seq_len`` is dropped).
A seeded permutation assigns ``round(test_fraction · chunks)`` chunks to test and the rest to
train, so the two parts never share a byte position; ``meta`` records both chunk-index lists
(chunk ``i`` covers corpus bytes ``[i·seq_len, (i+1)·seq_len)``).

Default corpus: the ``.py`` files of Python's standard library
(``sysconfig.get_paths()["stdlib"]``, excluding site/dist-packages), sorted by relative path,
read until ``max_bytes`` — it exists wherever Python runs, so the default needs no download.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch

from ..errors import WidthscopeError
from . import Split, subset

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")


def _files(root: str | None) -> tuple[list[Path], str]:
    if root is None:
        base = Path(sysconfig.get_paths()["stdlib"])
        files = sorted((p for p in base.rglob("*.py")
                        if "site-packages" not in p.parts and "dist-packages" not in p.parts),
                       key=lambda p: p.relative_to(base).as_posix())
        return files, f"python stdlib *.py under {base}"
    path = Path(root).expanduser()
    if path.is_file():
        from .corpus import TABULAR, sniff

        if path.suffix.lower() in TABULAR:
            raise WidthscopeError(f"text: {path} is a {path.suffix} table, not raw text; give it to certify/grow "
                                  "as --data (its text column is read through the datasets library)")
        reason = sniff(path)
        if reason is not None:  # never read a binary file's bytes as if they were text
            raise WidthscopeError(f"text: {path} {reason}")
        return [path], str(path)
    if path.is_dir():
        from .corpus import sniff

        files = sorted((p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                        and sniff(p) is None), key=lambda p: p.relative_to(path).as_posix())
        if not files:
            raise WidthscopeError(f"text: no {'/'.join(TEXT_SUFFIXES)} files under {path}; "
                                  "point root at a text file or a directory containing some")
        return files, f"{'/'.join(TEXT_SUFFIXES)} files under {path}"
    raise WidthscopeError(f"text: root {str(path)!r} does not exist; give a text file or a directory "
                          "of .txt/.md/.py files (or omit root for the Python standard library)")


def load_text(root: str | None, n_train: int | None, n_test: int | None, seed: int, *,
              seq_len: int = 64, max_bytes: int = 2_000_000, test_fraction: float = 0.1) -> Split:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 2:
        raise WidthscopeError(f"text: seq_len must be an integer >= 2 (one input and one predicted token), "
                              f"got {seq_len!r}")
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise WidthscopeError(f"text: max_bytes must be a positive integer, got {max_bytes!r}")
    if not isinstance(test_fraction, (int, float)) or isinstance(test_fraction, bool):
        raise WidthscopeError(f"text: test_fraction must be a number in (0, 1), got {test_fraction!r}")
    if not 0 < test_fraction < 1:
        raise WidthscopeError(f"text: test_fraction must be in (0, 1), got {test_fraction}")
    files, source = _files(root)
    buf = bytearray()
    used = []
    for f in files:
        if len(buf) >= max_bytes:
            break
        data = f.read_bytes()[: max_bytes - len(buf)]
        buf += data
        used.append(str(f))
    n_chunks = len(buf) // seq_len
    if n_chunks < 2:
        raise WidthscopeError(f"text: {len(buf)} bytes from {source} make {n_chunks} chunk(s) of "
                              f"seq_len={seq_len}; need at least 2 (more text or a smaller seq_len)")
    tokens = torch.tensor(np.frombuffer(bytes(buf[: n_chunks * seq_len]), dtype=np.uint8).astype(np.int64))
    chunks = tokens.view(n_chunks, seq_len)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_chunks)
    n_hold = min(max(1, int(round(test_fraction * n_chunks))), n_chunks - 1)
    test_idx, train_idx = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    sub = subset(len(test_idx), n_test, rng, "test")
    if sub is not None:
        test_idx = test_idx[sub]
    sub = subset(len(train_idx), n_train, rng, "train")
    if sub is not None:
        train_idx = train_idx[sub]
    Xtr, Xte = chunks[train_idx].clone(), chunks[test_idx].clone()
    meta = {"source": source, "files": used, "bytes": len(buf), "seq_len": seq_len, "seed": seed,
            "split_rule": "chunk i = corpus bytes [i*seq_len, (i+1)*seq_len); disjoint chunk sets",
            "train_indices": train_idx.tolist(), "test_indices": test_idx.tolist()}
    return Split((Xtr, Xtr), (Xte, Xte), "lm", 256, (seq_len,), "text", meta)
