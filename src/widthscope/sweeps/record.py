"""A finished sweep's recorded settings (``sweep.json``) as a config again: ``widthscope sweep --config``.

Every sweep writes ``OUT/sweep.json`` (:func:`widthscope.sweeps.grid.claim_out_dir`): the validated
config (``config``), the certify options (``options``, alignment sweeps), the ``fingerprint`` of
what determines the numbers, and the ``kind`` (``alignment`` or ``suite``). :func:`read_record` turns
it back into the parsed-TOML dict the config loaders check (:func:`widthscope.sweeps.config.load_config`,
:func:`widthscope.sweeps.suite.load_suite`), so a repeated run goes through the same checks as a TOML
and gets the same cells; :func:`check_fingerprint` then refuses a record whose config no longer gives
its fingerprint (edited, or written by another version).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import WidthscopeError

__all__ = ["RECORD", "is_record", "read_record", "check_fingerprint"]

RECORD = "sweep.json"


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
        {
            "name": config["name"],
            "out_dir": config["out_dir"],
            "seeds": config["seeds"],
            "M": [m for m, _ in config["MK"]],
            "K": [k for _, k in config["MK"]],
            "paired": True,
            "draws": config["draws"],
            "estimator": config["estimator"],
            "pool": config["pool"],
            "budgets": config.get("budgets"),
            "data_seed": config["data_seed"],
            "device": config["device"],
            "threads": config.get("threads"),
            "interventions": config["interventions"],
            "etas": config.get("etas"),
            **(config.get("placement") or {}),
        }
    )
    families = []
    for f in config["families"]:
        certify = {
            "n_probe_train": f["n_probe_train"],
            "n_probe_test": f["n_probe_test"],
            "batch_size": f["probe_batch_size"],
            **_drop_none(options["families"][f["name"]]),
        }
        fam = {
            k: f[k] for k in ("name", "model", "widths", "dataset", "n_test", "model_options", "data_options", "train")
        }
        fam.update(_drop_none({"n_train": f.get("n_train"), "probe_seq_len": f.get("probe_seq_len")}))
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
        {
            "name": config["name"],
            "label": config.get("label"),
            "out_dir": config["out_dir"],
            "models": config["models"],
            "revisions": revisions or None,
            "batch_size": config["batch_size"],
            "device": config["device"],
            "threads": config.get("threads"),
            "certify": _drop_none(config["certify"]),
            **config.get("inputs", {}),
        }
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
