r"""Pool sizes ``all`` and empty documents: what the published scripts' chunking needs.

The alignment authors' scripts (``compute_alignment_dimension.py``, ``compute_flip_probability.py``)
skip every record whose text is empty or whitespace-only (``not text.strip()``) before they
tokenize, and take *every* chunk when asked for ``0`` samples. Here:

- :func:`pool_size` parses ``--n-train`` / ``--n-test``: a whole number or ``all`` (every
  sequence the source gives; the whole source is read);
- ``--empty-docs skip`` (the default, and the published rule) drops empty / whitespace-only
  documents before tokenizing; ``eos`` keeps them as documents (in concatenated chunks each adds
  its EOS separator), widthscope's earlier rule; :func:`empty_note` says how many there were.
"""
from __future__ import annotations

import argparse
from typing import Any

__all__ = ["ALL", "EMPTY_DOCS", "pool_size", "is_all", "empty_note", "settle_all"]

ALL = "all"
EMPTY_DOCS = ("skip", "eos")


def pool_size(text: str) -> int | str:
    """``argparse`` type of ``--n-train`` / ``--n-test``: an integer or ``"all"``."""
    if str(text).strip().lower() == ALL:
        return ALL
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number or 'all' (every sequence there is)") from None


def is_all(n: Any) -> bool:
    return isinstance(n, str) and n == ALL


def empty_note(info: dict[str, Any], what: str) -> str | None:
    """One line naming the empty / whitespace-only documents of a source and what became of them."""
    n = info.get("empty_documents") or 0
    if not n:
        return None
    rule = info.get("empty_rule")
    fate = ("skipped before tokenizing (--empty-docs skip, the published scripts' rule)" if rule == "skip" else
            "kept as documents (--empty-docs eos: each adds its EOS separator in concatenated chunks)")
    return f"{what}: {n} of {info.get('documents_read')} documents read were empty or whitespace-only: {fate}"


def settle_all(args: argparse.Namespace, n_train: int, n_test: int) -> None:
    """After the pools are built, ``all`` becomes the number of sequences taken (so the sizes a
    run records, checks and fingerprints are numbers)."""
    if is_all(args.n_train):
        args.n_train = int(n_train)
    if is_all(args.n_test):
        args.n_test = int(n_test)
