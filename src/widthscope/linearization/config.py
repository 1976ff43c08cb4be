"""The config of the linearization width sweep (``widthscope linearize CONFIG.toml``): defaults
(:data:`DEFAULTS`; only ``widths`` is required), checks (:func:`validate_config`, one line naming the key,
before any cell runs) and cells. Keys: docs/linearization.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any, Mapping

import torch

from .._io import first_nonfinite, read_toml, to_jsonable
from ..data import DATASETS
from ..errors import WidthscopeError
from ..linear.correlation import parse_correlation_name
from ..linear.trainer import LOSSES, OPTIMIZERS
from ..models import build

__all__ = ["DEFAULTS", "DEMO_CONFIG", "validate_config", "make_cells", "load_toml", "build_mlp"]


DEFAULTS: dict[str, Any] = {
    "name": "linearize",
    "widths": None,
    "seeds": [0, 1, 2, 3, 4],
    "model": {"family": "mlp", "depth": 2, "activation": "relu", "parametrization": "ntk", "sigma_w": 1.0},
    # options: passed to widthscope.data.load
    "data": {"name": "digits", "n_train": 256, "n_test": 256, "seed": 0, "root": None, "options": {}},
    "train": {
        "eta0": 0.1,
        "alphas": [0.0, -0.5, -1.0],
        "steps": 100,
        "log_steps": None,
        "batch_size": 0,
        "optimizer": "sgd",
        "loss": "mse",
        "probe": 8,
        "dtype": "float32",
        "linear": "auto",
        "kernel_prediction": True,
    },
    "correlations": {"measure": ["C02", "C11"], "n_tuples": 16, "output": "random"},
    "fit": {"steps": None},
}

# Small enough for a few minutes on two CPU cores (digits, 30 cells); same as configs/linearize-demo.toml.
DEMO_CONFIG: dict[str, Any] = {
    "name": "linearize-demo",
    "widths": [32, 64, 128, 256, 512],
    "seeds": [0, 1, 2],
    "model": {"depth": 2, "activation": "relu", "parametrization": "ntk"},
    "data": {"name": "digits", "n_train": 128, "n_test": 128},
    "train": {"eta0": 0.5, "alphas": [0.0, -1.0], "steps": 60, "log_steps": [0, 10, 30, 60], "dtype": "float64"},
    "correlations": {"measure": ["C02", "C11"], "n_tuples": 6, "output": "random"},
    "fit": {"steps": [10, 60]},
}


def _merge(defaults: Mapping[str, Any], user: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(defaults))
    for k, v in user.items():
        if k not in defaults:
            raise WidthscopeError(
                f"linearize config: unknown key {where}{k!r}; valid keys here: {', '.join(sorted(defaults))}"
            )
        if isinstance(defaults[k], dict):
            if not isinstance(v, Mapping):
                raise WidthscopeError(f"linearize config: [{where}{k}] must be a table")
            # an empty default table is free-form (e.g. data.options for the loader)
            out[k] = _merge(defaults[k], v, f"{where}{k}.") if defaults[k] else dict(v)
        else:
            out[k] = v
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _must(ok: bool, text: str) -> None:
    if not ok:
        raise WidthscopeError(f"linearize config: {text}")


def _must_count(key: str, v: Any, lo: int, what: str) -> None:
    _must(_count(v, lo), f"{key} must be {what} (got {v!r})")


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Fill defaults and check the config; raises :class:`WidthscopeError` naming the problem."""
    cfg = _merge(DEFAULTS, config, "")
    w = cfg["widths"]
    _must(
        isinstance(w, list) and len(w) >= 5 and all(isinstance(v, int) and v > 0 for v in w),
        f"widths must list at least 5 positive integers (got {w!r}), e.g. widths = [64, 128, 256, 512, 1024]",
    )
    ratios = [b / a for a, b in zip(w, w[1:])]
    _must(all(r > 1 for r in ratios), f"widths must be strictly increasing (got {w})")
    _must(
        max(ratios) / min(ratios) <= 1.5,
        f"widths must be spaced geometrically (constant ratio; got ratios {[round(r, 3) for r in ratios]}), "
        "e.g. doubling",
    )
    seeds = cfg["seeds"]
    _must(
        isinstance(seeds, list)
        and bool(seeds)
        and len(set(seeds)) == len(seeds)
        and all(_count(v, 0) and v < 2**32 for v in seeds),
        f"seeds must be a non-empty list of distinct whole numbers in 0..{2**32 - 1} (got {seeds!r})",
    )
    _must(isinstance(cfg["name"], str) and bool(cfg["name"]), f"name must be a non-empty string (got {cfg['name']!r})")
    tr, c = cfg["train"], cfg["correlations"]
    _must(
        bool(tr["alphas"]) and all(isinstance(a, (int, float)) for a in tr["alphas"]),
        "train.alphas must be a non-empty list of numbers",
    )
    _must(all(_number(a) for a in tr["alphas"]), f"train.alphas must be finite numbers (got {tr['alphas']!r})")
    _must(
        _number(tr["eta0"]) and tr["eta0"] > 0,
        f"train.eta0 must be a finite number > 0 (the learning rate is eta0 * width^alpha; got {tr['eta0']!r})",
    )
    _must(tr["optimizer"] in OPTIMIZERS, f"train.optimizer {tr['optimizer']!r}; use one of {', '.join(OPTIMIZERS)}")
    _must(tr["loss"] in LOSSES, f"train.loss {tr['loss']!r}; use one of {', '.join(LOSSES)}")
    _must_count("train.batch_size", tr["batch_size"], 0, "an integer >= 0 (0 = full batch)")
    _must_count("train.probe", tr["probe"], 1, "an integer >= 1 (kernel-drift inputs)")
    for key in ("n_train", "n_test"):
        if cfg["data"][key] is not None:
            _must_count(f"data.{key}", cfg["data"][key], 1, "a positive integer")
    _must(
        isinstance(c["measure"], list),
        f'correlations.measure must be a list such as ["C02", "C11"] (got {c["measure"]!r})',
    )
    _must_count("correlations.n_tuples", c["n_tuples"], 1, "a positive integer")
    _must(
        c["output"] == "random" or _count(c["output"], 0),
        f"correlations.output must be 'random' or a logit index >= 0 (got {c['output']!r})",
    )
    _must_count("train.steps", tr["steps"], 1, "a positive integer")
    if tr["log_steps"] is None:
        tr["log_steps"] = sorted({0, *[int(round(tr["steps"] * f)) for f in (0.1, 0.3, 1.0)]})
    _must(
        isinstance(tr["log_steps"], list) and all(_count(s, 0) and s <= tr["steps"] for s in tr["log_steps"]),
        f"train.log_steps must be integers in 0..steps={tr['steps']}",
    )
    _must(
        tr["linear"] in ("auto", "weights", "kernel"),
        f"train.linear must be 'auto', 'weights' or 'kernel' (got {tr['linear']!r})",
    )
    _must(
        tr["linear"] != "kernel" or not (tr["batch_size"] or tr["optimizer"] != "sgd" or tr["loss"] != "mse"),
        "train.linear = 'kernel' is exact only for full-batch (batch_size = 0) 'sgd' on the 'mse' loss; "
        "use 'auto' or 'weights'",
    )
    _must(isinstance(tr["kernel_prediction"], bool), "train.kernel_prediction must be true or false")
    _must(tr["dtype"] in ("float32", "float64"), "train.dtype must be 'float32' or 'float64'")
    _must(
        cfg["model"]["family"] == "mlp",
        "model.family must be 'mlp' (the sweep trains fully connected networks; use the Python API for other models)",
    )
    _check_data_and_model(cfg)
    fit_steps = cfg["fit"]["steps"] or [tr["log_steps"][-1]]
    bad = [s for s in fit_steps if s not in tr["log_steps"]]
    _must(not bad, f"fit.steps {bad} are not in train.log_steps {tr['log_steps']}")
    cfg["fit"]["steps"] = fit_steps
    for name in c["measure"]:
        parse_correlation_name(name)
    nonfinite = first_nonfinite(cfg)
    _must(not nonfinite, f"{nonfinite}: must be a finite number (inf and nan are never meaningful here)")
    return cfg


def _check_data_and_model(cfg: Mapping[str, Any]) -> None:
    """The dataset is a known classification dataset, and the MLP builds (on the ``meta`` device)."""
    d = cfg["data"]
    classification = [n for n in DATASETS if n not in ("text", "prose")]
    _must(
        d["name"] in classification,
        f"data.name {d['name']!r} is not a classification dataset; use one of {', '.join(classification)}",
    )
    _must(
        _count(d["seed"], 0) and d["seed"] < 2**32,
        f"data.seed must be a whole number in 0..{2**32 - 1} (got {d['seed']!r})",
    )
    _must(
        d["root"] is None or isinstance(d["root"], str), f"data.root must be a folder path string (got {d['root']!r})"
    )
    for width in cfg["widths"]:
        try:
            with torch.device("meta"):
                build_mlp(cfg, width, 4, 2)
        except WidthscopeError as exc:
            raise WidthscopeError(f"linearize config: [model] {exc}") from None


def build_mlp(cfg: Mapping[str, Any], width: int, in_dim: int, out_dim: int) -> torch.nn.Module:
    """The sweep's MLP of ``width`` with the config's ``[model]`` options."""
    opts = {k: cfg["model"][k] for k in ("depth", "activation", "parametrization", "sigma_w")}
    return build("mlp", width, in_dim=in_dim, out_dim=out_dim, **opts)


def _config_hash(cfg: Mapping[str, Any]) -> str:
    keep = {k: v for k, v in cfg.items() if k not in ("widths", "seeds", "name")}
    # linear: both paths give the same numbers; kernel_prediction only adds columns
    keep["train"] = {k: v for k, v in keep["train"].items() if k not in ("alphas", "linear", "kernel_prediction")}
    # keys added later with an empty default must not invalidate finished cells
    keep["data"] = {k: v for k, v in keep["data"].items() if not (k == "options" and not v)}
    return hashlib.sha256(json.dumps(to_jsonable(keep), sort_keys=True).encode()).hexdigest()[:12]


def make_cells(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Cells ``width × seed × α``; the config hash in each cell keeps stale results apart."""
    h = _config_hash(cfg)
    alphas = [float(a) for a in cfg["train"]["alphas"]]
    return [
        {
            "width": int(w),
            "seed": int(s),
            "alpha": a,
            "config": h,
            "correlations": bool(cfg["correlations"]["measure"]) and a == alphas[0],
        }
        for w in cfg["widths"]
        for s in cfg["seeds"]
        for a in alphas
    ]


def load_toml(path: str) -> dict[str, Any]:
    config = read_toml(path, "linearize config", "see configs/linearize-demo.toml")
    if not config:
        raise WidthscopeError(
            f"linearize config {path!r} sets nothing: at least widths = [...] is needed, e.g. "
            "widths = [64, 128, 256, 512, 1024] (see configs/linearize-demo.toml)"
        )
    return config
