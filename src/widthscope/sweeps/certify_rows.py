"""A certify result as sweep rows: one ``kind="alignment"`` row per point x (M, K), in the columns of
a sweep cell's alignment rows (:func:`widthscope.sweeps.cell.run_cell`), and the point's intervention
rows as ``kind="intervention"``.

Shared by the model-suite sweep (:mod:`widthscope.sweeps.suite`: each cell is a certify run) and the
report's width series from certify JSON files (:mod:`widthscope.report.certify_series`).

Example::

    rows = certify_rows(result, {"family": "pythia", "width": 512, "seed": 0})
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..probe.resolution import resolved
from ..stats import vacuous_rule
from .schema import CERT_FIELDS

__all__ = ["certify_rows", "smallest_step", "training_record", "TRAINING_COLUMNS"]

TRAINING_COLUMNS = ("steps", "train_loss", "test_loss")
_TRAINING_NAMES = {"steps": ("steps",), "train_loss": ("train_loss", "loss"), "test_loss": ("test_loss",)}


def training_record(extra: Any) -> dict[str, Any]:
    """``{"steps", "train_loss", "test_loss"}`` (those recorded, finite numbers only) from a
    checkpoint's ``extra`` dict: a sweep's ``extra["train"]`` (:func:`widthscope.train.train`'s
    result), else top-level ``steps`` / ``train_loss`` (or ``loss``) / ``test_loss``. ``{}`` when none
    is recorded (an HF model): the report then shows '–'."""
    if not isinstance(extra, Mapping):
        return {}
    out: dict[str, Any] = {}
    for where in (extra.get("train"), extra):
        if not isinstance(where, Mapping):
            continue
        for key, names in _TRAINING_NAMES.items():
            for n in names:
                v = where.get(n)
                if key not in out and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out[key] = v
    return out


def smallest_step(ivs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``iv_*`` columns a sweep row carries: the smallest step the dtype resolves, where the
    linear prediction is meant to hold (``{}`` when there is none)."""
    steps = [
        iv
        for iv in resolved(ivs)  # steps below the dtype's resolution are not measurements
        if isinstance(iv.get("eta"), (int, float)) and iv.get("probe") in ("bias", "block")
    ]
    if not steps:
        return {}
    s = min(steps, key=lambda r: r["eta"])
    return {
        "iv_eta": s["eta"],
        "iv_predicted": s.get("predicted"),
        "iv_actual": s.get("actual"),
        "iv_retention": s.get("retention"),
        "iv_sign_agrees": s.get("sign_agrees"),
    }


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
            for prefix in ("one", "two"):
                cert = c.get(prefix) or {}
                for f in CERT_FIELDS:
                    row[f"{prefix}_{f}"] = cert.get(f)
                vacuous_rule(row, f"{prefix}_")  # files written before the rule read the same way
            mis = c.get("misalignment") or {}
            row.update(
                misalignment=mis.get("probability"),
                misalignment_low=mis.get("low"),
                misalignment_high=mis.get("high"),
                misalignment_draws=mis.get("draws"),
            )
            rows.append(row)
        for iv in ivs:
            rows.append({**iv, "kind": iv.get("kind", "intervention"), **tags, "point_index": pi})
    return rows
