r"""Pool sizes ``all`` and empty documents: what the published scripts' chunking needs.

The alignment authors' scripts (``compute_alignment_dimension.py``, ``compute_flip_probability.py``)
skip every record whose text is empty or whitespace-only (``not text.strip()``) before they
tokenize, and take *every* chunk when asked for ``0`` samples. Here:

- a pool size ``all`` (``--n-train all``, parsed by :func:`widthscope.cli.inputs.pool_size`) takes
  every sequence the source gives (the whole source is read);
- ``--empty-docs skip`` (the default, and the published rule) drops empty / whitespace-only
  documents before tokenizing; ``eos`` keeps them as documents (in concatenated chunks each adds
  its EOS separator); :func:`empty_note` says how many there were.
"""

from __future__ import annotations

from typing import Any

from .spec import EMPTY_DOCS  # noqa: F401  (the choices live with the spec)

__all__ = ["ALL", "EMPTY_DOCS", "is_all", "empty_note"]

ALL = "all"


def is_all(n: Any) -> bool:
    return isinstance(n, str) and n == ALL


def empty_note(info: dict[str, Any], what: str) -> str | None:
    """One line naming the empty / whitespace-only documents of a source and what became of them."""
    n = info.get("empty_documents") or 0
    if not n:
        return None
    rule = info.get("empty_rule")
    fate = (
        "skipped before tokenizing (--empty-docs skip, the published scripts' rule)"
        if rule == "skip"
        else "kept as documents (--empty-docs eos: each adds its EOS separator in concatenated chunks)"
    )
    return f"{what}: {n} of {info.get('documents_read')} documents read were empty or whitespace-only: {fate}"
