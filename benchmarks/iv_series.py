"""Tables and numbers of the LLaMA-style intervention width series (docs/interventions.md §4).

From the committed rows under ``benchmarks/results/llama-interventions/``: ``results.jsonl``
(``widthscope sweep configs/llama-interventions.toml``, compacted by ``docnumbers.py --compact``:
``kind="intervention"`` rows, one per point, seed and step on 9 half-decades up to 1; ``kind=
"alignment"`` rows per point and ``(M, K)``) and ``sign.jsonl`` (``benchmarks/sign_agreement.py``
on the sweep's checkpoints). ``docnumbers.py`` renders the marked spans with these functions.
"""
from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MINUS, fixed, sci  # noqa: E402

Rows = Sequence[dict[str, Any]]


def _near(a: float, b: float) -> bool:
    return abs(math.log10(a / b)) < 1e-6


def steps(rows: Rows, rel: float) -> list[dict[str, Any]]:
    """The intervention rows at relative step ``rel`` (one per width, seed and point)."""
    return [r for r in rows if r.get("kind") == "intervention" and r["rel_step"] > 0 and _near(r["rel_step"], rel)]


def widths(rows: Rows) -> list[int]:
    return sorted({int(r["width"]) for r in rows})


def _mean_range(v: Sequence[float], d: int) -> str:
    return f"{fixed(mean(v), d)} [{fixed(min(v), d)}, {fixed(max(v), d)}]"


def _span(lo: str, hi: str) -> str:
    """``lo–hi``; ``lo to hi`` when ``lo`` is negative (a dash after a minus reads as a sign)."""
    return lo if lo == hi else (f"{lo} to {hi}" if lo.startswith(MINUS) else f"{lo}–{hi}")


def _count(rs: Rows, pred: Callable[[dict[str, Any]], bool]) -> str:
    return f"{sum(bool(pred(r)) for r in rs)}/{len(rs)}"


def _by_width(rs: Rows) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rs:
        out[int(r["width"])].append(r)
    return dict(sorted(out.items()))


def _loss(rows: Rows) -> dict[int, float]:
    """Held-out loss per width: the mean over seeds (one alignment row per cell)."""
    cells = {r["cell_id"]: r for r in rows if r.get("kind") == "alignment" and r.get("test_loss") is not None}
    return {w: mean(float(r["test_loss"]) for r in rs) for w, rs in _by_width(list(cells.values())).items()}


def retention_table(rows: Rows) -> list[str]:
    head = ["N", "parameters", "held-out loss", "retention at 1e-4 rel. (smallest η): mean [range]",
            "at 1e-3 rel.", "at 1e-2 rel.", "sign right at 1e-4 / 1e-2 / 1e-1 rel."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    loss = _loss(rows)
    at = {rel: _by_width(steps(rows, rel)) for rel in (1e-4, 1e-3, 1e-2, 1e-1)}
    for w in widths(steps(rows, 1e-4)):
        params = next(int(r["n_params"]) for r in rows if int(r["width"]) == w)
        ret = [_mean_range([r["retention"] for r in at[rel][w]], d) for rel, d in ((1e-4, 3), (1e-3, 3), (1e-2, 2))]
        sign = ", ".join(_count(at[rel][w], lambda r: r["sign_agrees"]) for rel in (1e-4, 1e-2, 1e-1))
        lines.append(f"| {w} | {params:,} | {loss[w]:.2f} | " + " | ".join(ret) + f" | {sign} |")
    return lines


def sign_table(sign: Rows) -> list[str]:
    head = ["N", "seeds", "draws", "sign agreement", "misaligned (μ_Mᵀg_K ≤ 0)", "ΔL < 0 (loss fell)", "B_exact",
            "B_align", "vacuous certificates"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, rs in _by_width(sign).items():
        seeds = ", ".join(str(s) for s in sorted({int(r["seed"]) for r in rs}))
        draws = _span(str(min(r["draws"] for r in rs)), str(max(r["draws"] for r in rs)))
        cells = [_mean_range([r[k] for r in rs], d) for k, d in (("agree_rate", 3), ("misaligned_rate", 2))]
        cells.append(fixed(mean(r["improved_rate"] for r in rs), 2))
        cells.append(_mean_range([r["b_exact"] for r in rs], 2))
        cells.append(fixed(mean(r["b_align"] for r in rs), 2))
        cells.append(_count(rs, lambda r: r["b_exact"] >= 1 - 1e-12))
        lines.append(f"| {w} | {seeds} | {draws} | " + " | ".join(cells) + " |")
    return lines


def quantity(rows: Rows, sign: Rows, what: str) -> str:
    """Prose numbers. ``ret_means/<rel>``: range of the per-width mean retentions; ``ret_range/<rel>``:
    all values; ``pred_range/<rel>``: range of ``|ΔL_pred|``; ``sign/<rel>``: sign right, of all; ``curves``: (point, seed) pairs per width, all
    widths; ``params``; ``loss``; ``agree_pooled``; ``agree_points``: per-point agreement range (%);
    ``improved``: range of the per-width ΔL < 0 rates (%); ``b_exact_min``; ``b_align_min``;
    ``d_align_max``; ``seconds/<width>``: cell seconds; ``intervene_s/<width>``."""
    kind, _, arg = what.partition("/")
    if kind in ("ret_means", "ret_range", "sign"):
        at = steps(rows, float(arg))
        if kind == "sign":
            return _count(at, lambda r: r["sign_agrees"])
        if kind == "ret_range":
            return f"[{fixed(min(r['retention'] for r in at), 3)}, {fixed(max(r['retention'] for r in at), 3)}]"
        means = [mean(r["retention"] for r in rs) for rs in _by_width(at).values()]
        d = 3 if float(arg) < 1e-2 else 2
        return _span(fixed(min(means), d), fixed(max(means), d))
    if kind == "pred_range":
        v = [abs(r["predicted"]) for r in steps(rows, float(arg))]
        return _span(sci(min(v)), sci(max(v)))
    if kind == "curves":
        return str(len(steps(rows, 1e-4)))
    if kind == "params":
        p = sorted({int(r["n_params"]) for r in rows})
        return f"{p[0] / 1e3:.0f} k – {p[-1] / 1e6:.1f} M"
    if kind == "loss":
        return ", ".join(f"{v:.2f}" for v in _loss(rows).values())
    if kind == "agree_pooled":
        a = sum(round(r["agree_rate"] * r["draws"]) for r in sign)
        n = sum(r["draws"] for r in sign)
        return f"{a}/{n} = {a / n:.3f}"
    if kind == "agree_points":
        return _span(f"{100 * min(r['agree_rate'] for r in sign):.0f}", f"{100 * max(r['agree_rate'] for r in sign):.0f}") + "%"
    if kind == "improved":
        v = [100 * mean(r["improved_rate"] for r in rs) for rs in _by_width(sign).values()]
        return _span(f"{min(v):.0f}", f"{max(v):.0f}") + "%"
    if kind == "b_exact_min":
        return fixed(min(r["b_exact"] for r in sign), 2)
    if kind == "b_align_min":
        return fixed(min(r["b_align"] for r in sign), 3)
    if kind == "d_align_max":
        v = [r["d_align"] for r in sign if r.get("d_align") is not None]
        return sci(max(v)) if v else "none"
    if kind in ("seconds", "intervene_s"):
        col = "cell_seconds" if kind == "seconds" else "intervene_s"
        cells = {r["cell_id"]: r for r in rows if int(r["width"]) == int(arg)}
        v = [float(r[col]) for r in cells.values()]
        return _span(f"{min(v):.0f}", f"{max(v):.0f}")
    raise KeyError(what)
