"""What a finished sweep leaves, read back: its record (``sweep.json``) as a parsed-TOML config again
(:func:`read_record`, so ``widthscope sweep --config`` gets the same cells), its alignment rows
summarised over seeds, and a certify result as sweep rows (:func:`certify_rows`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from .._io import format_table
from ..certification.pipeline import training_record
from ..errors import WidthscopeError
from ..probe.resolution import resolved
from ..stats import vacuous_rule
from .config import CERT_FIELDS

__all__ = [
    "RECORD",
    "is_record",
    "read_record",
    "check_fingerprint",
    "summary_rows",
    "print_summary",
    "certify_rows",
    "cert_columns",
    "smallest_step",
]

RECORD = "sweep.json"
# the [sweep] keys a record holds as they are (M and K: as its MK pairs)
_SWEEP_SAVED = ("name", "out_dir", "seeds", "draws", "estimator", "pool", "data_seed", "device", "interventions")
_MEANS = (("misalign", "misalignment"), ("B_exact", "two_b_exact"), ("B_align", "two_b_align"), ("test_loss",) * 2)
_MISALIGNMENT = (("", "probability"), ("_low", "low"), ("_high", "high"), ("_draws", "draws"))


# ----------------------------------------------------------------------------- the record
def is_record(path: str | os.PathLike) -> bool:
    """A results folder holding ``sweep.json``, or a JSON file (not a TOML config)."""
    p = Path(path).expanduser()
    return (p / RECORD).is_file() if p.is_dir() else p.suffix.lower() == ".json"


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _load(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / RECORD
    fix = "pass a finished sweep's results folder or its sweep.json, or a TOML config"
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WidthscopeError(f"--config {str(p)!r} not found: {fix}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WidthscopeError(f"--config {str(p)!r} is not a JSON file ({type(exc).__name__}): {fix}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("config"), dict) or "fingerprint" not in rec:
        raise WidthscopeError(f"--config {str(p)!r} is not a sweep's record (no 'config' and 'fingerprint'): {fix}")
    return p, rec


def _alignment(config: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed-TOML form of an alignment sweep's record."""
    sweep = _drop_none(
        {k: config[k] for k in _SWEEP_SAVED}
        | {k: config.get(k) for k in ("budgets", "threads", "etas")}
        | {"M": [m for m, _ in config["MK"]], "K": [k for _, k in config["MK"]], "paired": True}
        | (config.get("placement") or {})
    )
    families = []
    for f in config["families"]:
        certify = {"n_probe_train": f["n_probe_train"], "n_probe_test": f["n_probe_test"]}
        certify |= {"batch_size": f["probe_batch_size"], **_drop_none(options["families"][f["name"]])}
        fam = {
            k: f[k] for k in ("name", "model", "widths", "dataset", "n_test", "model_options", "data_options", "train")
        }
        fam |= _drop_none({"n_train": f.get("n_train"), "probe_seq_len": f.get("probe_seq_len")})
        fam["certify"] = certify
        if f.get("probes") is not None:
            fam["probes"] = [_drop_none(c) for c in f["probes"]]
        mon = f.get("monitor")
        if mon is not None:
            fam["monitor"] = _drop_none({k: v for k, v in mon.items() if k != "steps"})
        fam.update(f.get("placement") or {})
        families.append(fam)
    return {"sweep": sweep, "family": families}


def _suite(config: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed-TOML form of a suite's record."""
    revisions = [r for r in config["revisions"] if r is not None]
    suite = _drop_none(
        {k: config[k] for k in ("name", "out_dir", "models", "batch_size", "device")}
        | {"label": config.get("label"), "threads": config.get("threads"), "revisions": revisions or None}
        | {"certify": _drop_none(config["certify"]), **config.get("inputs", {})}
    )
    return {"suite": suite}


def read_record(path: str | os.PathLike) -> tuple[dict[str, Any], str, str]:
    """``(parsed-TOML config, recorded fingerprint, file)`` of a results folder or its ``sweep.json``."""
    p, rec = _load(path)
    kind = rec.get("kind", "alignment")
    try:
        if kind == "suite":
            raw = _suite(rec["config"])
        elif kind == "alignment" and isinstance(rec.get("options"), dict):
            raw = _alignment(rec["config"], rec["options"])
        else:
            raise KeyError("options")
    except (KeyError, TypeError, IndexError) as exc:
        raise WidthscopeError(
            f"--config {str(p)!r}: the record lacks {exc} (written by an older widthscope?): run the sweep from its "
            "TOML config"
        ) from None
    return raw, str(rec["fingerprint"]), str(p)


def check_fingerprint(fingerprint: str, recorded: str, path: str) -> None:
    """Refuse a record whose config no longer gives its own fingerprint (the cells would differ)."""
    if fingerprint != recorded:
        raise WidthscopeError(
            f"--config {path!r}: its config gives fingerprint {fingerprint}, the record says {recorded} (edited by "
            "hand, or written by another widthscope version): run the sweep from its TOML config"
        )


# ----------------------------------------------------------------------------- the summary
def _mean(xs: Sequence[float | None]) -> float | None:
    finite = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(finite) / len(finite) if finite else None


def summary_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per (probe condition, family, width, point), averaged over seeds, at the largest (M, K).

    ``d_align`` is the mean over the seeds whose certificate is not vacuous (:func:`widthscope.stats.vacuous_rule`),
    ``vacuous`` counts the others, e.g. ``"1/2"``.
    """
    rows = [vacuous_rule(vacuous_rule(dict(r), "one_"), "two_") for r in rows if r.get("kind") == "alignment"]
    out = []
    key = lambda r: (
        (r.get("probe_set"), r.get("probe_seq_len")),
        r["family"],
        r.get("budget"),
        r["width"],
        r["point_index"],
    )
    keys = sorted(
        {(*key(r), r["point"]) for r in rows}, key=lambda k: (str(k[0][0]), k[0][1] or 0, k[1], k[2] or 0, k[3], k[4])
    )
    for cond, fam, budget, w, pi, point in keys:
        sel = [r for r in rows if key(r) == (cond, fam, budget, w, pi)]
        mk = max({(r["M"], r["K"]) for r in sel}, key=lambda t: (t[0] * t[1], t))
        at = [r for r in sel if (r["M"], r["K"]) == mk]
        n_vac = sum(bool(r.get("two_vacuous")) for r in at)
        line = {"probe_set": cond[0], "probe_seq_len": cond[1], "family": fam, "width": w, "point": point}
        line |= {"seeds": len({r["seed"] for r in at}), "d_align": _mean([r.get("two_d_align") for r in at])}
        line |= {"vacuous": f"{n_vac}/{len(at)}", "d_align_1pop": _mean([r.get("one_d_align") for r in at])}
        line["M,K"] = f"{mk[0]},{mk[1]}"
        line |= {name: _mean([r.get(col) for r in at]) for name, col in _MEANS}
        out.append(line)
    return out


def print_summary(rows: Sequence[Mapping[str, Any]], out_dir: Path, file: IO[str] | None = None) -> None:
    """Print :func:`summary_rows` (one table per probe condition) and where the results are."""
    file = file or sys.stdout
    table = summary_rows(rows)
    cols = "family width point seeds d_align vacuous d_align_1pop M,K misalign B_exact B_align test_loss".split()
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


# ----------------------------------------------------------------------------- certify results as rows
def smallest_step(ivs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``iv_*`` columns of the smallest step the dtype resolves (``{}`` when there is none)."""
    steps = [
        iv for iv in resolved(ivs) if isinstance(iv.get("eta"), (int, float)) and iv.get("probe") in ("bias", "block")
    ]
    if not steps:
        return {}
    s = min(steps, key=lambda r: r["eta"])
    return {"iv_eta": s["eta"]} | {f"iv_{k}": s.get(k) for k in ("predicted", "actual", "retention", "sign_agrees")}


def cert_columns(
    row: dict[str, Any], one: Mapping[str, Any], two: Mapping[str, Any], mis: Mapping[str, Any]
) -> dict[str, Any]:
    """``row`` with both certificates' :data:`CERT_FIELDS` (``one_*``, ``two_*``, the vacuous rule applied)
    and the ``misalignment*`` columns."""
    for prefix, cert in (("one_", one), ("two_", two)):
        row.update({prefix + f: cert.get(f) for f in CERT_FIELDS})
        vacuous_rule(row, prefix)
    row.update({"misalignment" + s: mis.get(k) for s, k in _MISALIGNMENT})
    return row


def certify_rows(result: Mapping[str, Any], tags: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Alignment rows (one per point x (M, K)) and intervention rows of one certify result, each
    carrying ``tags`` (the caller's: ``family``, ``width``, ``seed``, ``source``, ...)."""
    st: Mapping[str, Any] = result["settings"]
    points = result["points"]
    npts = len(points)
    rows: list[dict[str, Any]] = []
    for pi, pt in enumerate(points):
        base = {
            "kind": "alignment",
            **tags,
            "point": pt["point"],
            "point_index": pi,
            "depth_fraction": (pi + 1) / npts,
            "n_points": npts,
            "d": pt.get("d"),
            "n_probe_train": pt.get("n_train"),
            "n_probe_test": pt.get("n_test"),
            "estimator": st.get("estimator"),
            "pool": st.get("pool"),
            **{k: v for k, v in training_record(st.get("training")).items() if tags.get(k) is None},
        }
        ivs = [iv for iv in pt.get("interventions") or [] if isinstance(iv, dict)]
        iv_cols = smallest_step(ivs)
        for c in pt["certificates"]:
            row = {**base, "M": int(c["M"]), "K": int(c["K"]), **iv_cols}
            rows.append(cert_columns(row, c.get("one") or {}, c.get("two") or {}, c.get("misalignment") or {}))
        for iv in ivs:
            rows.append({**iv, "kind": iv.get("kind", "intervention"), **tags, "point_index": pi})
    return rows
