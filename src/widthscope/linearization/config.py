"""The config of the linearization width sweep (``widthscope linearize CONFIG.toml``): defaults,
checks, cells.

Config (TOML; every key except ``widths`` has a default, see :data:`DEFAULTS`)::

    widths = [64, 128, 256, 512, 1024]     # >= 5, increasing, geometric
    seeds = [0, 1, 2, 3, 4]
    [model]   depth = 2, activation = "relu", parametrization = "ntk", sigma_w = 1.0
    [data]    name = "digits", n_train = 256, n_test = 256, seed = 0, root = (loader default)
    [data.options] grayscale = true        # extra loader options (cifar10 grayscale)
    [train]   eta0 = 0.1, alphas = [0.0, -0.5, -1.0], steps = 100, log_steps = [0, 10, 100],
              batch_size = 0 (0 = full batch), optimizer = "sgd", loss = "mse", probe = 8,
              dtype = "float32", linear = "auto" (closed-form kernel GD where exact, see
              train_side_by_side), kernel_prediction = true (MSE: *_loss_kernel(_inf) columns)
    [correlations] measure = ["C02", "C11"], n_tuples = 16, output = "random"
    [fit]     steps = [10, 100]            # deviation slopes at these logged steps

:func:`validate_config` fills the defaults and checks every key (one line naming the key), the
dataset and the model (built on the ``meta`` device) before any cell runs.
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

__all__ = ["DEFAULTS", "DEMO_CONFIG", "validate_config", "make_cells", "load_toml"]


DEFAULTS: dict[str, Any] = {
    "name": "linearize",
    "widths": None,
    "seeds": [0, 1, 2, 3, 4],
    "model": {"family": "mlp", "depth": 2, "activation": "relu", "parametrization": "ntk", "sigma_w": 1.0},
    "data": {
        "name": "digits",
        "n_train": 256,
        "n_test": 256,
        "seed": 0,
        "root": None,
        "options": {},
    },  # options: passed to widthscope.data.load, e.g. {grayscale = true}
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


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Fill defaults and check the config; raises :class:`WidthscopeError` naming the problem."""
    cfg = _merge(DEFAULTS, config, "")
    w = cfg["widths"]
    if not isinstance(w, list) or len(w) < 5 or not all(isinstance(v, int) and v > 0 for v in w):
        raise WidthscopeError(
            f"linearize config: widths must list at least 5 positive integers "
            f"(got {w!r}), e.g. widths = [64, 128, 256, 512, 1024]"
        )
    ratios = [b / a for a, b in zip(w, w[1:])]
    if any(r <= 1 for r in ratios):
        raise WidthscopeError(f"linearize config: widths must be strictly increasing (got {w})")
    if max(ratios) / min(ratios) > 1.5:
        raise WidthscopeError(
            f"linearize config: widths must be spaced geometrically (constant "
            f"ratio; got ratios {[round(r, 3) for r in ratios]}), e.g. doubling"
        )
    seeds = cfg["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or len(set(seeds)) != len(seeds)
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in seeds)
    ):
        raise WidthscopeError(
            f"linearize config: seeds must be a non-empty list of distinct whole numbers in "
            f"0..{2**32 - 1} (got {seeds!r})"
        )
    if not isinstance(cfg["name"], str) or not cfg["name"]:
        raise WidthscopeError(f"linearize config: name must be a non-empty string (got {cfg['name']!r})")
    tr = cfg["train"]
    if not tr["alphas"] or not all(isinstance(a, (int, float)) for a in tr["alphas"]):
        raise WidthscopeError("linearize config: train.alphas must be a non-empty list of numbers")

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def count(v: Any, lo: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    if not all(number(a) for a in tr["alphas"]):
        raise WidthscopeError(f"linearize config: train.alphas must be finite numbers (got {tr['alphas']!r})")
    if not (number(tr["eta0"]) and tr["eta0"] > 0):
        raise WidthscopeError(
            f"linearize config: train.eta0 must be a finite number > 0 (the learning "
            f"rate is eta0 * width^alpha; got {tr['eta0']!r})"
        )
    if tr["optimizer"] not in OPTIMIZERS:
        raise WidthscopeError(
            f"linearize config: train.optimizer {tr['optimizer']!r}; use one of {', '.join(OPTIMIZERS)}"
        )
    if tr["loss"] not in LOSSES:
        raise WidthscopeError(f"linearize config: train.loss {tr['loss']!r}; use one of {', '.join(LOSSES)}")
    if not count(tr["batch_size"], 0):
        raise WidthscopeError(
            f"linearize config: train.batch_size must be an integer >= 0 (0 = full batch; got {tr['batch_size']!r})"
        )
    if not count(tr["probe"], 1):
        raise WidthscopeError(
            f"linearize config: train.probe (kernel-drift inputs) must be an integer >= 1 (got {tr['probe']!r})"
        )
    for key in ("n_train", "n_test"):
        v = cfg["data"][key]
        if v is not None and not count(v, 1):
            raise WidthscopeError(f"linearize config: data.{key} must be a positive integer (got {v!r})")
    c = cfg["correlations"]
    if not isinstance(c["measure"], list):
        raise WidthscopeError(
            f'linearize config: correlations.measure must be a list such as ["C02", "C11"] (got {c["measure"]!r})'
        )
    if not count(c["n_tuples"], 1):
        raise WidthscopeError(
            f"linearize config: correlations.n_tuples must be a positive integer (got {c['n_tuples']!r})"
        )
    if not (c["output"] == "random" or count(c["output"], 0)):
        raise WidthscopeError(
            f"linearize config: correlations.output must be 'random' or a logit index >= 0 (got {c['output']!r})"
        )
    if not count(tr["steps"], 1):
        raise WidthscopeError(f"linearize config: train.steps must be a positive integer (got {tr['steps']!r})")
    if tr["log_steps"] is None:
        s = tr["steps"]
        tr["log_steps"] = sorted({0, *[int(round(s * f)) for f in (0.1, 0.3, 1.0)]})
    if not isinstance(tr["log_steps"], list) or any(not count(s, 0) or s > tr["steps"] for s in tr["log_steps"]):
        raise WidthscopeError(f"linearize config: train.log_steps must be integers in 0..steps={tr['steps']}")
    if tr["linear"] not in ("auto", "weights", "kernel"):
        raise WidthscopeError(
            f"linearize config: train.linear must be 'auto', 'weights' or 'kernel' (got {tr['linear']!r})"
        )
    if tr["linear"] == "kernel" and (tr["batch_size"] or tr["optimizer"] != "sgd" or tr["loss"] != "mse"):
        raise WidthscopeError(
            "linearize config: train.linear = 'kernel' is exact only for full-batch "
            "(batch_size = 0) 'sgd' on the 'mse' loss; use 'auto' or 'weights'"
        )
    if not isinstance(tr["kernel_prediction"], bool):
        raise WidthscopeError("linearize config: train.kernel_prediction must be true or false")
    if tr["dtype"] not in ("float32", "float64"):
        raise WidthscopeError("linearize config: train.dtype must be 'float32' or 'float64'")
    if cfg["model"]["family"] != "mlp":
        raise WidthscopeError(
            "linearize config: model.family must be 'mlp' (the sweep trains fully "
            "connected networks; use the Python API for other models)"
        )
    _check_data_and_model(cfg)
    fit_steps = cfg["fit"]["steps"] or [tr["log_steps"][-1]]
    bad = [s for s in fit_steps if s not in tr["log_steps"]]
    if bad:
        raise WidthscopeError(f"linearize config: fit.steps {bad} are not in train.log_steps {tr['log_steps']}")
    cfg["fit"]["steps"] = fit_steps
    for name in cfg["correlations"]["measure"]:
        parse_correlation_name(name)
    nonfinite = first_nonfinite(cfg)
    if nonfinite:
        raise WidthscopeError(
            f"linearize config: {nonfinite}: must be a finite number (inf and nan are never meaningful here)"
        )
    return cfg


def _check_data_and_model(cfg: Mapping[str, Any]) -> None:
    """The dataset and the model, before any cell runs or any data loads: the dataset is a
    classification dataset this package knows, and the MLP builds with the config's options
    (on the ``meta`` device, so no memory; the input size, known only from the data, is a placeholder)."""
    d = cfg["data"]
    if d["name"] not in DATASETS or d["name"] in ("text", "prose"):
        raise WidthscopeError(
            f"linearize config: data.name {d['name']!r} is not a classification dataset; use one "
            f"of {', '.join(n for n in DATASETS if n not in ('text', 'prose'))}"
        )
    if isinstance(d["seed"], bool) or not isinstance(d["seed"], int) or not 0 <= d["seed"] < 2**32:
        raise WidthscopeError(
            f"linearize config: data.seed must be a whole number in 0..{2**32 - 1} (got {d['seed']!r})"
        )
    if d["root"] is not None and not isinstance(d["root"], str):
        raise WidthscopeError(f"linearize config: data.root must be a folder path string (got {d['root']!r})")
    m = cfg["model"]
    for width in cfg["widths"]:
        try:
            with torch.device("meta"):
                build(
                    "mlp",
                    width,
                    in_dim=4,
                    out_dim=2,
                    depth=m["depth"],
                    activation=m["activation"],
                    parametrization=m["parametrization"],
                    sigma_w=m["sigma_w"],
                )
        except WidthscopeError as exc:
            raise WidthscopeError(f"linearize config: [model] {exc}") from None


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
