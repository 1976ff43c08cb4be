"""A finished sweep in a few lines: :func:`summary_rows` averages its alignment rows over seeds (per
probe condition, family, width and point, at the largest ``(M, K)``) and :func:`print_summary` prints
them as the table ``widthscope sweep`` ends with.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from .._io import format_table
from ..stats import vacuous_rule

__all__ = ["summary_rows", "print_summary"]


def _mean(xs: Sequence[float | None]) -> float | None:
    finite = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(finite) / len(finite) if finite else None


def _condition(r: Mapping[str, Any]) -> tuple[Any, Any]:
    """The probe condition of a row: (probe_set, probe length); (None, None) without probes."""
    return r.get("probe_set"), r.get("probe_seq_len")


def summary_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per (probe condition, family, width, point), averaged over seeds, at the largest (M, K).

    Probe conditions (``probe_set``, ``probe_seq_len``) are never averaged together: each line
    carries its condition in ``probe_set`` / ``probe_seq_len``. ``d_align`` follows the reporting
    rule of :func:`widthscope.stats.vacuous_rule`: the mean over the seeds whose certificate is not
    vacuous (``None`` when none is), and ``vacuous`` counts the others, e.g. ``"1/2"``.
    """
    rows = [vacuous_rule(vacuous_rule(dict(r), "one_"), "two_") for r in rows if r.get("kind") == "alignment"]
    if not rows:
        return []
    out = []
    key = lambda r: (_condition(r), r["family"], r.get("budget"), r["width"], r["point_index"])  # noqa: E731
    keys = sorted(
        {(*key(r), r["point"]) for r in rows}, key=lambda k: (str(k[0][0]), k[0][1] or 0, k[1], k[2] or 0, k[3], k[4])
    )
    for cond, fam, budget, w, pi, point in keys:
        sel = [r for r in rows if key(r) == (cond, fam, budget, w, pi)]
        mk = max({(r["M"], r["K"]) for r in sel}, key=lambda t: (t[0] * t[1], t))
        at = [r for r in sel if (r["M"], r["K"]) == mk]
        n_vac = sum(bool(r.get("two_vacuous")) for r in at)
        out.append(
            {
                "probe_set": cond[0],
                "probe_seq_len": cond[1],
                "family": fam,
                "width": w,
                "point": point,
                "seeds": len({r["seed"] for r in at}),
                "d_align": _mean([r.get("two_d_align") for r in at]),
                "vacuous": f"{n_vac}/{len(at)}",
                "d_align_1pop": _mean([r.get("one_d_align") for r in at]),
                "M,K": f"{mk[0]},{mk[1]}",
                "misalign": _mean([r.get("misalignment") for r in at]),
                "B_exact": _mean([r.get("two_b_exact") for r in at]),
                "B_align": _mean([r.get("two_b_align") for r in at]),
                "test_loss": _mean([r.get("test_loss") for r in at]),
            }
        )
    return out


def print_summary(rows: Sequence[Mapping[str, Any]], out_dir: Path, file: IO[str] | None = None) -> None:
    """Print :func:`summary_rows` (one table per probe condition) and where the results are."""
    file = file or sys.stdout
    table = summary_rows(rows)
    cols = [
        "family",
        "width",
        "point",
        "seeds",
        "d_align",
        "vacuous",
        "d_align_1pop",
        "M,K",
        "misalign",
        "B_exact",
        "B_align",
        "test_loss",
    ]
    conds = list(dict.fromkeys((r["probe_set"], r["probe_seq_len"]) for r in table)) or [(None, None)]
    for i, (name, L) in enumerate(conds):
        sel = [r for r in table if (r["probe_set"], r["probe_seq_len"]) == (name, L)]
        where = "" if name is None and L is None else f", probe {name}" + (f" (length {L})" if L is not None else "")
        print(
            ("\n" if i else "")
            + format_table(sel, cols, title=f"alignment sweep{where}: two-population form, mean over seeds"),
            file=file,
        )
    if any(not r["vacuous"].startswith("0/") for r in table):
        print(
            "vacuous: seeds whose certificate is vacuous (an estimate <= 0): their d_align = min(d_par, d_2) is "
            "undefined and left out of the mean; '-' when every seed is vacuous",
            file=file,
        )
    print(f"\nresults: {out_dir / 'results.jsonl'}  (pandas.read_json(path, lines=True))", file=file)
    print(f"report:  widthscope report {out_dir}", file=file)
