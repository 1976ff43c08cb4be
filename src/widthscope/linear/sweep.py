"""Linearization width sweep: ``widthscope linearize CONFIG.toml [--out DIR] [--shard k/n]`` (:func:`run_file`).

For every cell ``width × seed × α`` it builds the MLP (``torch.manual_seed(seed)`` before
``widthscope.models.build``), trains it and its linear model side by side with learning rate
``η = η₀·n^α`` (batch order also drawn from ``seed``), and records tidy rows
``kind="linearization"`` (one per logged step). In the cell with the first listed ``α`` it also
measures the derivative correlations at ``η = η₀`` (rows ``kind="correlation"``). Cells run
through :func:`widthscope.sweep.grid.run_grid`: resumable (finished cells are skipped) and
shardable (``--shard k/n``). When the grid is complete, log-log slopes over width
(:func:`widthscope.linear.powerlaw.fit_slope`) are printed next to the reference slopes and
written to ``slopes.json``.

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

Python entry (used by ``widthscope demo``)::

    >>> from widthscope.linear.sweep import run_sweep, DEMO_CONFIG
    >>> result = run_sweep(DEMO_CONFIG, "runs/linearize-demo")          # doctest: +SKIP
    >>> result["slopes"][0]["slope"]                                    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .._io import atomic_write_json, first_nonfinite, format_table, read_toml, to_jsonable
from ..errors import WidthscopeError
from ..sweep.grid import cell_id, finish_after_ranks, lock_out_dir, run_grid, shard_for_run
from .correlation import correlation_summary, parse_correlation_name
from .powerlaw import fit_slope
from .trainer import LOSSES, OPTIMIZERS, train_side_by_side

__all__ = [
    "DEFAULTS",
    "DEMO_CONFIG",
    "PUBLISHED",
    "reference_slope",
    "validate_config",
    "make_cells",
    "run_cell",
    "summarize",
    "cfg_from_rows",
    "run_sweep",
    "run_file",
]

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

# Published slopes of the test MSE between F and F_lin (MNIST, 2-hidden-layer MLP, 100 seeds).
PUBLISHED: dict[float, float] = {0.0: -1.14, -0.25: -1.14, -0.5: -1.30, -0.75: -1.73, -1.0: -2.72}


def reference_slope(metric: str, alpha: float | None = None) -> tuple[float, str]:
    """The theory's slope of ``log metric`` vs ``log n`` (linearization spec §3) and what it is.

    The one table of reference slopes: the sweep summary, the report's figures and the claims
    page all read it. Deviation at ``η = η₀ n^α``: ``α − 1`` (its square ``dev_mse``: ``2(α − 1)``);
    kernel drift ``α − 1/2`` (a heuristic); correlations ``C_{D,d}``: ``−1/2``.
    """
    a = 0.0 if alpha is None else float(alpha)
    if metric in ("dev_rms", "dev_rel"):
        return a - 1, "bound O(n^alpha/n) on F - F_lin" + (", relative to RMS F" if metric == "dev_rel" else "")
    if metric == "dev_mse":
        return 2 * (a - 1), "square of the deviation bound"
    if metric == "kernel_drift":
        return a - 0.5, "heuristic: eta * steps / sqrt(n)"
    if metric == "test_gap":
        return a - 1, "loss gap follows the deviation"
    if metric.startswith("C"):
        return -0.5, "C_{D,d} = O(1/sqrt(n)) (mean |C| or ||C||)"
    raise KeyError(f"no reference slope for metric {metric!r}")


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
    from ..data import DATASETS
    from ..models import build

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


_DATA_CACHE: dict[str, Any] = {}


def _data(cfg: Mapping[str, Any]):
    from ..data import load

    d = cfg["data"]
    key = json.dumps(to_jsonable(d), sort_keys=True) + cfg["train"]["dtype"] + cfg["train"]["loss"]
    if key not in _DATA_CACHE:
        opts = {**d["options"], **({"root": d["root"]} if d["root"] else {})}
        split = load(d["name"], n_train=d["n_train"], n_test=d["n_test"], seed=d["seed"], **opts)
        if split.task != "classification":
            raise WidthscopeError(f"linearize: dataset {d['name']!r} is not a classification dataset")
        dtype = getattr(torch, cfg["train"]["dtype"])
        k = split.num_classes

        def prep(pair):
            X, y = pair
            X = X.reshape(X.shape[0], -1).to(dtype)
            Y = torch.nn.functional.one_hot(y.long(), k).to(dtype) if cfg["train"]["loss"] == "mse" else y.long()
            return X, Y

        from ..data import describe

        _DATA_CACHE[key] = (prep(split.train), prep(split.test), k, describe(split))
    return _DATA_CACHE[key]


def run_cell(cfg: Mapping[str, Any], cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Train one ``(width, seed, α)`` cell; rows for every logged step (+ correlation rows)."""
    from ..models import build

    (X, Y), (Xt, Yt), k, words = _data(cfg)
    m, tr = cfg["model"], cfg["train"]
    width, seed, alpha = cell["width"], cell["seed"], cell["alpha"]
    torch.manual_seed(seed)
    model = build(
        "mlp",
        width,
        in_dim=X.shape[1],
        out_dim=k,
        depth=m["depth"],
        activation=m["activation"],
        parametrization=m["parametrization"],
        sigma_w=m["sigma_w"],
    ).to(getattr(torch, tr["dtype"]))
    lr = tr["eta0"] * width**alpha
    rows = train_side_by_side(
        model,
        (X, Y),
        steps=tr["steps"],
        lr=lr,
        optimizer=tr["optimizer"],
        batch_size=tr["batch_size"] or None,
        loss=tr["loss"],
        test=(Xt, Yt),
        probe=Xt[: tr["probe"]],
        log_steps=tr["log_steps"],
        seed=seed,
        on_nonfinite="stop",
        linear=tr["linear"],
        kernel_prediction=tr["kernel_prediction"] and tr["loss"] == "mse",
    )
    for r in rows:
        r["lr"] = lr
        r["data_description"] = words
    if cell.get("correlations"):
        c = cfg["correlations"]
        for name in c["measure"]:
            D, d = parse_correlation_name(name)
            s = correlation_summary(
                model, X, D=D, d=d, n_tuples=c["n_tuples"], eta=tr["eta0"], output=c["output"], seed=seed
            )
            rows.append(
                {
                    "kind": "correlation",
                    "name": f"C{D}{d}",
                    "data_description": words,
                    **{k2: v for k2, v in s.items() if k2 != "values"},
                }
            )
    return rows


def _where(key: str, value: Any) -> Callable[[dict[str, Any]], bool]:
    """The row selector ``r[key] == value``."""
    return lambda r: r[key] == value


def _matrix(rows, widths, seeds, select, value):
    M = np.full((len(seeds), len(widths)), np.nan)
    wi = {w: j for j, w in enumerate(widths)}
    si = {s: i for i, s in enumerate(seeds)}
    for r in rows:
        if select(r) and r.get("width") in wi and r.get("seed") in si:
            v = r.get(value)
            if isinstance(v, (int, float)) and math.isfinite(v):
                M[si[r["seed"]], wi[r["width"]]] = v
    return M


def summarize(rows: list[dict[str, Any]], cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Slope rows: metric, α, step, slope with 95% interval, reference and published slopes."""
    widths, seeds = cfg["widths"], cfg["seeds"]
    out = []

    def add(metric, alpha, step, M, reference, ref_note, published=None):
        ok = np.isfinite(M).any(0)
        if ok.sum() < 2:
            return
        w = np.asarray(widths, float)[ok]
        fit = fit_slope(w, M[:, ok])
        diverged = int((~np.isfinite(M)).sum())
        out.append(
            {
                "kind": "slope",
                "metric": metric,
                "alpha": alpha,
                "step": step,
                "slope": fit.slope,
                "ci_low": fit.ci_low,
                "ci_high": fit.ci_high,
                "intercept": fit.intercept,
                "reference": reference,
                "reference_note": ref_note,
                "published": published,
                "n_widths": int(ok.sum()),
                "n_seeds": len(seeds),
                "missing": diverged,
            }
        )

    last = cfg["train"]["log_steps"][-1]
    for a in [float(x) for x in cfg["train"]["alphas"]]:
        lin = [r for r in rows if r.get("kind") == "linearization" and r.get("alpha") == a and not r.get("diverged")]
        for step in cfg["fit"]["steps"]:
            sel = _where("step", step)
            for metric in ("dev_rms", "dev_rel", "dev_mse"):
                add(
                    metric,
                    a,
                    step,
                    _matrix(lin, widths, seeds, sel, metric),
                    *reference_slope(metric, a),
                    PUBLISHED.get(a) if metric == "dev_mse" and step == last else None,
                )
        sel = _where("step", last)
        for metric in ("kernel_drift", "test_gap"):
            add(metric, a, last, _matrix(lin, widths, seeds, sel, metric), *reference_slope(metric, a))
    corr = [r for r in rows if r.get("kind") == "correlation"]
    for name in sorted({r["name"] for r in corr}):
        sel = _where("name", name)
        add(name, None, None, _matrix(corr, widths, seeds, sel, "mean"), *reference_slope(name))
    return out


def cfg_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The parts of a config :func:`summarize` needs, recovered from result rows."""
    lin = [r for r in rows if r.get("kind") in ("linearization", "correlation") and "width" in r]
    if not lin:
        return None
    steps = sorted({r["step"] for r in lin if r.get("kind") == "linearization" and not r.get("diverged")})
    alphas = sorted({r["alpha"] for r in lin if r.get("alpha") is not None}, reverse=True)
    fit = [s for s in steps if s > 0][:1] + steps[-1:] if steps else []
    return {
        "widths": sorted({r["width"] for r in lin}),
        "seeds": sorted({r["seed"] for r in lin}),
        "train": {"alphas": alphas, "log_steps": steps or [0]},
        "fit": {"steps": sorted(set(fit))},
    }


def _print_slopes(slopes, file=None) -> None:
    file = file or sys.stdout
    table = [
        {
            "metric": s["metric"],
            "alpha": s["alpha"],
            "step": s["step"],
            "slope": s["slope"],
            "95% CI": f"[{s['ci_low']:.3g}, {s['ci_high']:.3g}]",
            "reference": s["reference"],
            "published": s["published"],
            "widths": s["n_widths"],
        }
        for s in slopes
    ]
    print(
        format_table(
            table,
            floatfmt=".3g",
            title="log-log slopes over width (seeds averaged in log space; 95% t interval over the seeds' slopes)",
        ),
        file=file,
    )


def run_sweep(
    config: Mapping[str, Any], out_dir: str | Path, shard: tuple[int, int] = (1, 1), *, quiet: bool = False
) -> dict[str, Any]:
    """Run (or resume) the sweep in ``out_dir``; returns ``{"rows", "slopes", "complete", "out_dir"}``.

    ``slopes`` is empty until every cell of the grid is finished (all shards).
    """
    cfg = validate_config(config)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WidthscopeError(
            f"linearize: cannot create the results directory {str(out_dir)!r} "
            f"({exc.strerror or exc}); choose another --out"
        ) from None
    cells = make_cells(cfg)
    with lock_out_dir(out_dir, shard, "linearize run"):
        atomic_write_json(out_dir / "linearize_config.json", cfg)
        res = run_grid(
            cells, lambda cell, _dir: run_cell(cfg, cell), out_dir, shard=shard, desc=f"linearize {cfg['name']}"
        )
    rows = res.rows
    done = {r.get("cell_id") for r in rows}
    complete = all(cell_id(c) in done for c in cells)
    slopes: list[dict[str, Any]] = []
    if complete:
        slopes = summarize([r for r in rows if r.get("config") == cells[0]["config"]], cfg)
        atomic_write_json(out_dir / "slopes.json", {"config": cfg, "slopes": slopes})
        if not quiet:
            _print_slopes(slopes)
            print(f"wrote {out_dir / 'results.jsonl'} and {out_dir / 'slopes.json'}")
    elif not quiet:
        print(
            f"{len(done)}/{len(cells)} cells finished in {out_dir}; slopes are fitted when all "
            "shards are done (rerun any shard to finish)."
        )
    return {"rows": rows, "slopes": slopes, "complete": complete, "out_dir": out_dir}


def _load_toml(path: str) -> dict[str, Any]:
    config = read_toml(path, "linearize config", "see configs/linearize-demo.toml")
    if not config:
        raise WidthscopeError(
            f"linearize config {path!r} sets nothing: at least widths = [...] is needed, e.g. "
            "widths = [64, 128, 256, 512, 1024] (see configs/linearize-demo.toml)"
        )
    return config


def run_file(config_path: str, *, out: str | None = None, shard: str | None = None) -> dict[str, Any]:
    """What ``widthscope linearize`` does: the sweep of a TOML config, in ``out`` (default
    ``runs/<config name>``), shard ``shard`` (``"k/n"``; default: one shard per ``torchrun`` rank,
    else the whole grid). Under ``torchrun``, rank 0 fits the slopes once every rank's cells are
    in. Returns :func:`run_sweep`'s result for this process's shard."""
    config = _load_toml(config_path)
    which = shard_for_run(shard)  # under torchrun: one shard per rank
    out_dir = out or str(Path("runs") / str(config.get("name", Path(config_path).stem)))
    res = run_sweep(config, out_dir, which)
    finish_after_ranks(shard, lambda: run_sweep(config, out_dir, (1, 1)))
    return res
