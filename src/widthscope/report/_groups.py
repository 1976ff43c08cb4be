"""Alignment rows grouped into probe regimes, and each regime's label: shared by the alignment section
and the claims page (so both judge the same groups)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

__all__ = ["groups"]


def groups(rows: Iterable[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    """Rows split by (sweep, family, budget, probe condition, probe length), in first-seen order:
    each probe regime gets its own figures, table and verdict."""
    from ..stats import vacuous_rule  # noqa: PLC0415  start-up time: torch

    out: dict[tuple, list] = {}
    for r in rows:
        if r.get("kind", "alignment") != "alignment":
            continue
        # Copies under the one reporting rule: a vacuous certificate's d_align is missing (NaN here).
        out.setdefault(
            (r.get("sweep", ""), r.get("family", "?"), r.get("budget"), r.get("probe_set"), r.get("probe_seq_len")), []
        ).append(vacuous_rule(vacuous_rule(dict(r), "one_"), "two_"))
    return out


def group_label(key: tuple, all_keys: Sequence[tuple]) -> str:
    sweep, fam, budget, probe, plen = key
    label = str(fam)
    if len({k[0] for k in all_keys if k[1] == fam}) > 1:
        label = f"{sweep}/{fam}"
    if len({k[2] for k in all_keys if k[:2] == key[:2]}) > 1:
        label += f" (n_train={budget})"
    if probe is not None and len({(k[3], k[4]) for k in all_keys if k[:3] == key[:3]}) > 1:
        label += f" · probe {probe}" + (f", length {plen}" if plen is not None else "")
    return label
