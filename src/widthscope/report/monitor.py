"""Report section for ``kind="monitor"`` rows (alignment over training, docs/monitor.md §8): per
regime, ``d_align`` and ``B_exact`` against the step, one column per width, and a table of the first
certified step per seed. It describes; verdicts belong on the claims page."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ._fmt import as_number
from ._plot import figure, legend_outside, save_figure, slugify, thin, thinned_note
from .claims import labelled
from .html import table

__all__ = ["figures", "tables", "certified"]


def _points(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(r["point"]) for r in rows))


def _series(rows: Sequence[Mapping[str, Any]], col: str) -> dict[Any, tuple[list[float], list[float]]]:
    """seed -> (steps, values) sorted by step; a missing value (vacuous d_align) is NaN: a gap."""
    per: dict[Any, dict[float, float]] = defaultdict(dict)
    for r in rows:
        per[r.get("seed")][float(r["step"])] = as_number(r.get(col))
    return {s: (sorted(d), [d[k] for k in sorted(d)]) for s, d in per.items()}


def _mean(series: Mapping[Any, tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """Mean over seeds at each step, of the seeds with a value there (NaN where none has one)."""
    at: dict[float, list[float]] = defaultdict(list)
    for steps, vals in series.values():
        for s, v in zip(steps, vals):
            at[s].extend([] if math.isnan(v) else [v])
    steps = sorted(at)
    return steps, [float(np.mean(at[s])) if at[s] else math.nan for s in steps]


def certified(rows: Sequence[Mapping[str, Any]]) -> dict[tuple, tuple[int | None, int | None]]:
    """``(width, point, seed) -> (first, from)`` of :func:`widthscope.sweeps.cell.certified_steps`."""
    from ..sweeps.cell import certified_steps  # noqa: PLC0415  start-up time: torch

    per: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        per[(r.get("width"), str(r["point"]), r.get("seed"))].append(r)
    return {k: certified_steps(v, as_number(v[0].get("delta"))) for k, v in per.items()}


def _caption(sel: Sequence[Mapping[str, Any]]) -> str:
    r0 = sel[0]
    steps = sorted({int(r["step"]) for r in sel})
    total = r0.get("steps_total")
    n_seeds = len({r.get("seed") for r in sel})
    data = r0.get("data_description") or f"dataset {r0.get('dataset')}"
    return (
        f"Alignment over training, recorded by the sweep's monitor (widthscope.monitor): at optimizer steps "
        f"{', '.join(map(str, steps))}"
        + (f" of {total}" if total is not None else "")
        + " (0 = at initialisation), fixed pools, the same at every step: "
        + (
            f"probe {r0['monitor_probe']}: {r0.get('monitor_probe_description')}"
            if r0.get("monitor_probe")
            else f"{r0.get('n_train')} train / {r0.get('n_test')} held-out examples"
        )
        + f"; model {data}. Two-population "
        f"certificate at (M, K) = ({r0.get('M')}, {r0.get('K')}), estimator {r0.get('estimator', '?')}, "
        f"pool {r0.get('pool', '?')}, model in eval mode, training state restored after each probe. "
        f"Columns: widths; colour: insertion point; thin lines: each of {n_seeds} seed(s); thick line: "
        f"mean over seeds (d_align over the seeds whose certificate is not vacuous; a gap where every seed "
        f"is vacuous, i.e. an estimate <= 0). Dotted: delta = {r0.get('delta')}; a star marks the first "
        f"probed step at which a seed's point is certified (B_exact <= delta)."
    )


def figures(rows: list[dict], out_dir: Path) -> list[dict]:
    """One small-multiples PNG per (sweep, family, budget); see the module docstring."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = []
    for label, sel in labelled(rows, "monitor"):
        widths = sorted({r["width"] for r in sel})
        every_pt = _points(sel)
        pts = thin(every_pt)
        fig, axes = figure(2, len(widths), w=max(6.0 / len(widths), 3.1), h=2.7, sharex=True, sharey="row")
        first = {k: v[0] for k, v in certified(sel).items()}
        any_d = False
        for j, w in enumerate(widths):
            for i, pname in enumerate(pts):
                color = f"C{i % 10}"
                these = [r for r in sel if r["width"] == w and str(r["point"]) == pname]
                for row_i, col in enumerate(("d_align", "b_exact")):
                    ax = axes[row_i, j]
                    ser = _series(these, col)
                    for seed, (xs, ys) in ser.items():
                        ax.plot(xs, ys, ".-", color=color, lw=0.8, ms=2.5, alpha=0.45)  # dots: lone values
                        fc = first.get((w, pname, seed))
                        if col == "b_exact" and fc is not None:
                            ax.plot([fc], [ys[xs.index(float(fc))]], "*", color=color, ms=9, mec="k", mew=0.4)
                    xs, ys = _mean(ser)
                    lab = pname if j == len(widths) - 1 and row_i == 0 else None  # the legend's axes: the last
                    ax.plot(xs, ys, "o-", color=color, lw=2, ms=3.5, label=lab)
                    any_d |= col == "d_align" and any(not math.isnan(y) for y in ys)
            axes[0, j].set_title(f"width {w:g}", fontsize=10)
            delta = as_number(sel[0].get("delta"))
            if not math.isnan(delta):
                axes[1, j].axhline(delta, color="grey", ls=":", lw=1)
            for ax in axes[:, j]:
                ax.set_xscale("symlog", linthresh=1.0)
                ax.grid(alpha=0.3)
            axes[1, j].set_xlabel("optimizer step")
        if any_d:
            axes[0, 0].set_yscale("log")
        axes[1, 0].set_ylim(0, 1.03)
        axes[0, 0].set_ylabel("d_align (two-population)")
        axes[1, 0].set_ylabel("B_exact")
        legend_outside(axes[0, -1], title="insertion point", title_fontsize=7)
        title = f"{label}: alignment over training"
        p = out_dir / f"{slugify(label)}-monitor.png"
        fig.suptitle(title, fontsize=11)
        save_figure(fig, p, title)
        cap = _caption(sel) + thinned_note(len(pts), len(every_pt), "insertion points")
        figs.append({"title": title, "png": str(p), "caption": cap})
    return figs


def tables(rows: list[dict]) -> list[dict]:
    """Per group: width × point, the first certified step of each seed and the last step's values."""
    out = []
    for label, sel in labelled(rows, "monitor"):
        cert = certified(sel)
        seeds = sorted({r.get("seed") for r in sel}, key=str)
        last = max(int(r["step"]) for r in sel)
        named = ", ".join(map(str, seeds))
        head = ["width", "point", f"first certified step (seed {named})", f"certified from step on (seed {named})"]
        head += [f"d_align at step {last} (seed mean)", f"B_exact at step {last} (seed mean)"]
        lines = []
        for w in sorted({r["width"] for r in sel}):
            for pname in _points(sel):
                at_last = [r for r in sel if r["width"] == w and str(r["point"]) == pname and int(r["step"]) == last]
                d = [v for v in (as_number(r.get("d_align")) for r in at_last) if not math.isnan(v)]
                b = [as_number(r.get("b_exact")) for r in at_last]
                steps = [cert.get((w, pname, s), (None, None)) for s in seeds]
                lines.append(
                    (f"{w:g}", pname)
                    + tuple(", ".join("never" if c[i] is None else str(c[i]) for c in steps) for i in (0, 1))
                    + (f"{np.mean(d):.3g}" if d else "– (vacuous)", f"{np.mean(b):.3g}" if b else "–")
                )
        out.append(
            {
                "title": f"{label}: first probed step with B_exact <= delta = {sel[0].get('delta')}, and the "
                "step from which every later probed step is ('never': no probed step)",
                "html": table(head, lines, left={1}),
            }
        )
    return out
