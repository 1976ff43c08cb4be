"""Figure conventions of every report section: Agg figures, titles that fit, legends outside the axes
(at most :data:`LEGEND_CAP` entries), at most :data:`CURVE_CAP` curves per panel, log axes labelled at
the values, vacuous bounds drawn hollow at 1."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any, Sequence, TypeVar

import numpy as np

LEGEND_CAP = 8
CURVE_CAP = 12
VACUOUS = 1 - 1e-12  # a bound at least this large says nothing

T = TypeVar("T")


def figure(nrows: int = 1, ncols: int = 1, w: float = 4.2, h: float = 3.2, **kw: Any) -> tuple[Any, Any]:
    """A constrained-layout Agg figure and its 2-D array of axes; ``w``, ``h``: one panel's inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415  start-up time: matplotlib
    from matplotlib.figure import Figure  # noqa: PLC0415  start-up time: matplotlib

    fig = Figure(figsize=(w * ncols, h * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def _titles(fig: Any) -> list[tuple[Any, Any]]:
    """(text, the box it must fit in: its axes, or the figure for a suptitle) of every title."""
    out = [(t, ax) for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title) if t.get_text()]
    if getattr(fig, "_suptitle", None) is not None and fig._suptitle.get_text():
        out.append((fig._suptitle, fig))
    return out


def fit_titles(fig: Any, *, min_size: float = 6.0) -> None:
    """Wrap (then shrink) every title wider than its axes, and a suptitle wider than the figure."""
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415  start-up time: matplotlib

        FigureCanvasAgg(fig)
    for _ in range(3):  # wrapping changes the layout, which changes the room: settle in a few passes
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        changed = False
        for t, box in _titles(fig):
            room = 0.96 * (box.bbox.width if box is fig else box.get_window_extent(renderer).width)
            while t.get_window_extent(renderer).width > room:
                text = t.get_text()
                longest = max(text.split("\n"), key=len)
                width = max(8, int(len(longest) * room / t.get_window_extent(renderer).width) - 1)
                wrapped = textwrap.fill(" ".join(text.split()), width=width, break_long_words=False)
                if wrapped != text and len(wrapped.split("\n")) <= 3:
                    t.set_text(wrapped)
                elif t.get_fontsize() > min_size:
                    t.set_fontsize(max(min_size, t.get_fontsize() * 0.9))
                else:
                    break
                changed = True
        if not changed:
            return


def save_figure(fig: Any, path: str | Path, title: str, caption: str = "", *, suptitle: bool = False) -> dict[str, str]:
    """Fit the titles (``suptitle``: ``title`` heads the figure too) and save the figure; return the
    section entry the page embeds."""
    if suptitle:
        fig.suptitle(title, fontsize=11)
    fit_titles(fig)
    fig.savefig(path)
    return {"title": title, "png": str(path), "caption": caption}


def slugify(text: str) -> str:
    """A file-name part from any text (letters, digits and '-', at most 60 characters)."""
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:60] or "x"


def legend_outside(ax: Any, **kw: Any) -> None:
    """A legend right of ``ax`` with at most :data:`LEGEND_CAP` entries: past it, the first ``LEGEND_CAP - 1``
    and one '… N more, not listed' line."""
    from matplotlib.lines import Line2D  # noqa: PLC0415  start-up time: matplotlib

    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > LEGEND_CAP:
        keep = LEGEND_CAP - 1
        handles = [*handles[:keep], Line2D([], [], ls="none")]
        labels = [*labels[:keep], f"… {len(labels) - keep} more, not listed"]
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def thin(items: Sequence[T], cap: int = CURVE_CAP) -> list[T]:
    """``items`` when at most ``cap``; else ``cap`` of them evenly spaced, first and last included."""
    n = len(items)
    if n <= cap:
        return list(items)
    return [items[i] for i in sorted({round(i * (n - 1) / (cap - 1)) for i in range(cap)})]


def thinned_note(drawn: int, total: int, what: str = "curves") -> str:
    """' 12 of 62 curves drawn, 50 left out (an evenly spaced subset, ...)' or '' when all are drawn."""
    if drawn >= total:
        return ""
    return f" {drawn} of {total} {what} drawn, {total - drawn} left out (an evenly spaced subset, for readability)."


def colors(n: int, cmap: str = "viridis", top: float = 0.9) -> list[Any]:
    """``n`` colours evenly spaced from the start of ``cmap`` to ``top``."""
    from matplotlib import colormaps  # noqa: PLC0415  start-up time: matplotlib

    return [colormaps[cmap](top * i / max(1, n - 1)) for i in range(n)]


def log_x(ax: Any, xs: Sequence[float], *, labelled: bool = True) -> None:
    """Log x axis (symmetric-log when a value is <= 0), labelled exactly at ``xs`` when ``labelled``."""
    from matplotlib.ticker import FixedLocator, NullLocator  # noqa: PLC0415  start-up time: matplotlib

    if len(xs) and min(xs) <= 0:
        ax.set_xscale("symlog", linthresh=1.0)
    else:
        ax.set_xscale("log")
    if len(xs) and labelled:
        ax.xaxis.set_major_locator(FixedLocator(list(xs)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{x:g}" for x in xs], fontsize=7)


def auto_y(ax: Any, ys: Sequence[float]) -> None:
    """Log y where the positive values span more than a decade; one plain tick where they are one value."""
    ys = [y for y in ys if math.isfinite(y) and y > 0]
    if ys and max(ys) / min(ys) > 10:
        ax.set_yscale("log")
    elif ys and max(ys) - min(ys) <= 1e-9 * max(ys):
        ax.set_yticks([ys[0]])
        ax.set_yticklabels([f"{ys[0]:.3g}"])


def plot_bound(
    ax: Any,
    xs: Sequence[float],
    ys: Sequence[float],
    fmt: str,
    color: Any,
    *,
    ms: float = 3,
    floor: float = 0.0,
    label: str | None = None,
) -> int:
    """A bound against ``xs`` (values below ``floor`` drawn at it); a vacuous value (>= 1) is a hollow
    marker at 1, not joined to the data. Returns how many were vacuous."""
    real = [(x, max(y, floor)) for x, y in zip(xs, ys) if not y >= VACUOUS]
    hollow = [x for x, y in zip(xs, ys) if y >= VACUOUS]
    ax.plot([x for x, _ in real], [y for _, y in real], fmt, color=color, ms=ms, label=label)
    if hollow:
        ax.plot(hollow, [1.0] * len(hollow), fmt[0], mfc="none", color=color, ms=ms + 2)
    return len(hollow)


def yerr(m: Any, lo: Any, hi: Any) -> np.ndarray:
    """Error-bar lengths around ``m``, never negative or NaN (matplotlib refuses < 0)."""
    m, lo, hi = (np.asarray(v, float) for v in (m, lo, hi))
    return np.nan_to_num(np.vstack([np.clip(m - lo, 0, None), np.clip(hi - m, 0, None)]))
