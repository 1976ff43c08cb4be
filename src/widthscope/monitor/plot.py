"""Monitor rows over training as one PNG: ``d_align`` (a vacuous row leaves a gap), ``b_exact`` and the
empirical misalignment with its 95 % Wilson interval, one line per point against the optimizer step.

Example::

    >>> rows = [{"kind": "row", "step": s, "point": "p", "d_align": None if s else 2.0,
    ...          "b_exact": 1.0 if s else 0.1, "misalignment": 0.5, "misalignment_low": 0.4,
    ...          "misalignment_high": 0.6, "delta": 0.05} for s in (0, 10)]
    >>> series(rows)["p"]["d_align"]
    [2.0, nan]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .._io import read_jsonl
from ..errors import WidthscopeError

__all__ = ["series", "plot"]

COLUMNS = ("d_align", "b_exact", "misalignment", "misalignment_low", "misalignment_high")


def series(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """``{point: {"step": [...], column: [...]}}`` sorted by step; ``None`` becomes NaN (a gap)."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in sorted((r for r in rows if r.get("kind") == "row"), key=lambda r: r["step"]):
        s = out.setdefault(r["point"], {"step": [], **{c: [] for c in COLUMNS}})
        s["step"].append(float(r["step"]))
        for c in COLUMNS:
            v = r.get(c)
            s[c].append(float("nan") if v is None else float(v))
    return out


def plot(rows: Iterable[dict[str, Any]] | str | Path, out: str | Path) -> Path:
    """Write the PNG of the monitor rows (a list, or a JSONL path written by the monitor)."""
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    rows = read_jsonl(rows) if isinstance(rows, (str, Path)) else list(rows)
    data = series(rows)
    if not data:
        raise WidthscopeError("no monitor rows to plot (kind='row'); run the monitor first")
    delta = next((r.get("delta") for r in rows if r.get("kind") == "row"), None)
    fig = Figure(figsize=(12.6, 3.4), dpi=90, layout="constrained")
    ax_d, ax_b, ax_m = fig.subplots(1, 3, sharex=True)
    for i, (point, s) in enumerate(data.items()):
        color = f"C{i % 10}"
        ax_d.plot(s["step"], s["d_align"], "o-", color=color, label=point)
        ax_b.plot(s["step"], s["b_exact"], "o-", color=color, label=point)
        ax_m.plot(s["step"], s["misalignment"], "o-", color=color, label=f"{point} empirical")
        ax_m.fill_between(s["step"], s["misalignment_low"], s["misalignment_high"], color=color, alpha=0.2)
        ax_m.plot(s["step"], s["b_exact"], "--", color=color, label=f"{point} b_exact")
    for ax, title in (
        (ax_d, "d_align (two populations; gap = vacuous)"),
        (ax_b, "b_exact at (M, K)"),
        (ax_m, "misalignment (95% Wilson) vs b_exact"),
    ):
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("optimizer step")
        ax.set_title(title, fontsize=10)
    if delta is not None:
        for ax in (ax_b, ax_m):
            ax.axhline(delta, color="grey", linestyle=":", linewidth=1)
    if any(v == v for s in data.values() for v in s["d_align"]):  # d_align > 0 wherever defined
        ax_d.set_yscale("log")
    for ax in (ax_b, ax_m):
        ax.set_ylim(0, 1.02)
    ax_d.legend(fontsize=8)
    ax_m.legend(fontsize=7)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
