"""A width series from the JSON files of several ``widthscope certify`` runs
(``widthscope report c256.json c512.json --out report/``).

Each file becomes alignment and intervention rows as a sweep writes them, tagged ``sweep="certify"``,
``family`` (the architecture), ``width`` (the settings', else the largest point dimension), ``seed``,
``source`` and the training record. Points are matched across files by name; files of one family must
share (M, K) pairs, estimator and pool, and give distinct (width, seed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import cut_off
from ..certification.pipeline import training_record
from ..errors import WidthscopeError
from ..sweeps.results import certify_rows

__all__ = ["is_certify_json", "rows_from_certify", "series_rows", "describe", "check_suite"]

_FIX = (
    "pass the JSON file that `widthscope certify --out FILE` wrote, a sweep results directory, or a results.jsonl file"
)


def _read(path: Path) -> Any:
    """The parsed file; damage is refused, never skipped (a series missing one width plots as if whole)."""

    def refuse(why: str) -> WidthscopeError:
        return WidthscopeError(f"{str(path)!r} {why} {_FIX}")

    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise refuse("does not exist:") from None
    except UnicodeDecodeError:
        raise refuse("is not UTF-8 text (a binary or damaged file?):") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc}):") from None
    if not text.strip():
        raise refuse("is empty (an interrupted write?): rerun certify, or")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if cut_off(text, exc):
            raise refuse(
                f"is truncated: its JSON stops after {len(text.rstrip())} characters (an interrupted copy or "
                "write?); rerun certify, or"
            ) from None
        raise refuse(f"is not readable JSON ({exc}):") from None


def _looks_like_certify(obj: Any) -> bool:
    if not (isinstance(obj, dict) and isinstance(obj.get("settings"), dict) and isinstance(obj.get("points"), list)):
        return False
    return bool(obj["points"]) and all(
        isinstance(p, dict) and "point" in p and isinstance(p.get("certificates"), list) for p in obj["points"]
    )


def is_certify_json(path: str | os.PathLike) -> bool:
    """True when ``path`` is a ``.json`` file holding a certify result (settings + certified points)."""
    p = Path(path)
    if not (p.is_file() and p.suffix == ".json"):
        return False
    try:
        return _looks_like_certify(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def _width(settings: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> tuple[float, str]:
    """(width, where it came from): the settings' width, else the largest point dimension d."""
    w = settings.get("width")
    if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0:
        return w, "settings"
    ds = [int(p["d"]) for p in points if isinstance(p.get("d"), (int, float))]
    if not ds:
        raise WidthscopeError("certify result records neither settings['width'] nor any point's 'd'")
    return max(ds), "largest point d"


def _training(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Training steps and final losses: certify's ``settings["training"]``, else those in the named local
    checkpoint's ``config.json``, else ``{}``."""
    got = training_record(settings.get("training"))
    if got:
        return got
    model = settings.get("model")
    if not isinstance(model, str) or not model:
        return {}
    p = Path(model)
    cfg = p / "config.json" if p.is_dir() else (p.parent / "config.json" if p.is_file() else None)
    try:
        obj = json.loads(cfg.read_text(encoding="utf-8")) if cfg is not None and cfg.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return training_record(obj.get("extra")) if isinstance(obj, dict) else {}


def rows_from_certify(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Alignment rows (one per point x (M, K)) plus intervention rows of one certify JSON file."""
    p = Path(path)
    res = _read(p)
    if not _looks_like_certify(res):
        hint = " (a sweep's marker file: pass the folder that holds it)" if p.name == "sweep.json" else ""
        raise WidthscopeError(
            f"{str(p)!r} is not a `widthscope certify` result: it lacks 'settings' and "
            f"'points' with 'certificates'{hint}; {_FIX}"
        )
    st: Mapping[str, Any] = res["settings"]
    points = res["points"]
    try:
        width, width_from = _width(st, points)
    except WidthscopeError as exc:
        raise WidthscopeError(f'{str(p)!r}: {exc}; rerun certify, or add "width" to its settings') from None
    tags = {
        "sweep": "certify",
        "family": st.get("architecture") or "certify",
        "width": width,
        "seed": st.get("seed"),
        "source": str(p),
        "model": st.get("model"),
        "dataset": st.get("data"),
        "depth": st.get("depth"),
        "width_from": width_from,
        "data_description": st.get("data_description"),
        **_training(st),
    }
    return certify_rows(res, tags)


def describe(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Certify file -> one line naming it and the settings that produced it (for the report's header)."""
    out: dict[str, str] = {}
    for r in rows:
        if "width_from" not in r or r.get("kind") != "alignment" or r["source"] in out:  # certify rows only
            continue
        bits = [
            f"model {r.get('model') or '?'}",
            f"data {r.get('dataset') or '?'}",
            f"width {r['width']:g}" + (" (largest point d)" if r.get("width_from") != "settings" else ""),
        ]
        if r.get("family") != "certify":
            bits.insert(0, str(r["family"]))
        if r.get("depth") is not None:
            bits.append(f"depth {r['depth']}")
        out[r["source"]] = f"{r['source']} ({', '.join(bits)})"
    return out


_SHARED = (  # what files drawn together must share: (what, its value in a row, why)
    (
        "(M, K) pairs",
        lambda r: (r["M"], r["K"]),
        "the misalignment panels and table would compare widths at different sample sizes; rerun certify "
        "with the same --M/--K",
    ),
    ("estimators", lambda r: r.get("estimator"), "their d_align are not comparable; rerun with the same --estimator"),
    ("pooling", lambda r: r.get("pool"), "their sample vectors differ; rerun with the same --pool"),
)


def _check_series(
    rows: Sequence[Mapping[str, Any]], *, group: str = "family", file_key: str = "source", unique: bool = True
) -> None:
    """Files of one ``group`` share (M, K) pairs, estimator and pooling (``unique``: and no (width, seed))."""
    fams: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "alignment":
            fams.setdefault(str(r[group]), []).append(r)
    for fam, sel in fams.items():
        for what, get, why in _SHARED:
            per_file: dict[str, set] = {}
            for r in sel:
                per_file.setdefault(r[file_key], set()).add(get(r))
            by_value: dict[str, list[str]] = {}  # 'v1: f1, f2; v2: f3' says which files differ
            for f, v in per_file.items():
                by_value.setdefault(", ".join(map(str, sorted(v, key=str))), []).append(f)
            if len(by_value) > 1:
                named = "; ".join(f"{v}: {', '.join(fs)}" for v, fs in by_value.items())
                raise WidthscopeError(f"certify files of family {fam!r} mix {what} ({named}): {why}")
        seen: dict[tuple, str] = {}
        for r in sel if unique else ():
            (w, s), f = (r["width"], r.get("seed")), r[file_key]
            if seen.setdefault((w, s), f) != f:
                raise WidthscopeError(
                    f"certify files {seen[(w, s)]} and {f} both give family {fam!r} width {w:g} with seed {s}: "
                    f"the report keeps one value per (width, seed), so one file would be dropped; certify one "
                    f'with another --seed, or set a distinct "architecture" in its settings'
                )


def _renumber_points(rows: list[dict[str, Any]]) -> None:
    """Same point name -> same point_index within a family (the report draws one line per index)."""
    order: dict[str, dict[str, tuple[int, int]]] = {}
    for r in rows:
        names = order.setdefault(str(r["family"]), {})
        name = str(r.get("point"))
        first = names.get(name, (r["point_index"], len(names)))
        names[name] = (min(first[0], r["point_index"]), first[1])
    index = {fam: {n: i for i, n in enumerate(sorted(names, key=names.__getitem__))} for fam, names in order.items()}
    for r in rows:
        r["point_index"] = index[str(r["family"])][str(r.get("point"))]


def series_rows(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Rows of several certify JSON files, checked to be comparable and with points matched by name."""
    rows: list[dict[str, Any]] = []
    for p in dict.fromkeys(str(Path(p)) for p in paths):  # a file named twice counts once
        rows.extend(rows_from_certify(p))
    _check_series(rows)
    _renumber_points(rows)
    return rows


def check_suite(rows: Sequence[Mapping[str, Any]]) -> None:
    """The certify runs of a model-suite sweep (:mod:`widthscope.sweeps.suite`) share (M, K) pairs,
    estimator and pooling; two models of one width are both kept."""
    _check_series([r for r in rows if r.get("suite") is not None], group="suite", file_key="certify_json", unique=False)
