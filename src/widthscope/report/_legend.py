"""Legends and curve counts that stay readable: at most :data:`LEGEND_CAP` legend entries, placed
outside the axes (never over the data), and at most :data:`CURVE_CAP` curves in one panel (more are
thinned to an evenly spaced subset, and the caption says how many are drawn)."""

from __future__ import annotations

from typing import Any, Sequence, TypeVar

__all__ = ["LEGEND_CAP", "CURVE_CAP", "legend_outside", "thin", "thinned_note"]

LEGEND_CAP = 8
CURVE_CAP = 12

T = TypeVar("T")


def legend_outside(ax: Any, *, cap: int = LEGEND_CAP, fontsize: float = 7, **kw: Any) -> int:
    """A legend right of ``ax`` (upper left corner at the axes' upper right) with at most ``cap``
    entries: past ``cap``, the first ``cap - 1`` and one '… N more, not listed' line. Returns the number
    of labelled entries listed (0: no legend drawn)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415  start-up time: matplotlib

    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return 0
    if len(handles) > cap:
        keep = cap - 1
        more = len(handles) - keep
        handles = [*handles[:keep], Line2D([], [], ls="none")]
        labels = [*labels[:keep], f"… {more} more, not listed"]
    else:
        keep = len(handles)
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=fontsize, **kw)
    return keep


def thin(items: Sequence[T], cap: int = CURVE_CAP) -> list[T]:
    """``items`` when at most ``cap``; else ``cap`` of them evenly spaced, first and last included."""
    n = len(items)
    if n <= cap:
        return list(items)
    idx = sorted({round(i * (n - 1) / (cap - 1)) for i in range(cap)})
    return [items[i] for i in idx]


def thinned_note(drawn: int, total: int, what: str = "curves") -> str:
    """' 12 of 62 curves drawn (evenly spaced); ...' or '' when all are drawn."""
    if drawn >= total:
        return ""
    return f" {drawn} of {total} {what} drawn (an evenly spaced subset, so the panel stays readable)."
