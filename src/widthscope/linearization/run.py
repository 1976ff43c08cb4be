"""Linearization width sweep: ``widthscope linearize CONFIG.toml [--out DIR] [--shard k/n]``.

Every cell ``width × seed × α`` trains the seeded MLP and its linear model side by side at ``η = η₀·n^α``
(rows ``kind="linearization"``); the first ``α``'s cells also measure the derivative correlations (rows
``kind="correlation"``). Once the grid is complete the slopes over width are written to ``slopes.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

import torch

from .. import data as wdata  # wdata.load looked up at call time (tests replace it)
from .._io import atomic_write_json, to_jsonable
from ..data import describe
from ..errors import WidthscopeError
from ..linear.correlation import correlation_summary, parse_correlation_name
from ..linear.trainer import train_side_by_side
from ..options import Options, option
from ..sweeps.grid import cell_id, finish_after_ranks, lock_out_dir, parse_shard, run_grid, shard_for_run
from .config import build_mlp, load_toml, make_cells, validate_config
from .summary import print_slopes, summarize

__all__ = ["LinearizeOptions", "run_cell", "run_sweep", "run_linearize", "run_file"]


@dataclasses.dataclass(frozen=True)
class LinearizeOptions(Options):
    """The settings of a linearization sweep (``widthscope linearize``; :func:`run_linearize`): ``sweep``, the
    config's tables (checked by :func:`~widthscope.linearization.config.validate_config`), and ``shard``."""

    shard: str | None = option(
        None, kind="str", metavar="k/n", help="run shard k of n (k/n); cells are split round-robin"
    )
    sweep: Mapping[str, Any] | None = option(
        None,
        kind="table",  # a nested table: checked by validate_config, not field by field
        cli=False,
        help="the sweep config: the TOML's tables (see configs/linearize-demo.toml)",
    )

    def check(self) -> None:
        if self.shard is not None:
            parse_shard(self.shard)
        if self.sweep is not None:
            if not isinstance(self.sweep, Mapping):
                raise WidthscopeError(
                    f"linearize: the sweep config must be a table of settings (as the TOML file's), "
                    f"not {type(self.sweep).__name__}"
                )
            object.__setattr__(self, "sweep", copy.deepcopy(dict(self.sweep)))  # the caller's dict stays theirs
            validate_config(self.sweep)


_DATA_CACHE: dict[str, Any] = {}


def cell_inputs(cfg: Mapping[str, Any]):
    d = cfg["data"]
    key = json.dumps(to_jsonable(d), sort_keys=True) + cfg["train"]["dtype"] + cfg["train"]["loss"]
    if key not in _DATA_CACHE:
        opts = {**d["options"], **({"root": d["root"]} if d["root"] else {})}
        split = wdata.load(d["name"], n_train=d["n_train"], n_test=d["n_test"], seed=d["seed"], **opts)
        if split.task != "classification":
            raise WidthscopeError(f"linearize: dataset {d['name']!r} is not a classification dataset")
        dtype = getattr(torch, cfg["train"]["dtype"])
        k = split.num_classes

        def prep(pair):
            X, y = pair
            X = X.reshape(X.shape[0], -1).to(dtype)
            Y = torch.nn.functional.one_hot(y.long(), k).to(dtype) if cfg["train"]["loss"] == "mse" else y.long()
            return X, Y

        _DATA_CACHE[key] = (prep(split.train), prep(split.test), k, describe(split))
    return _DATA_CACHE[key]


def run_cell(cfg: Mapping[str, Any], cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Train one ``(width, seed, α)`` cell; rows for every logged step (+ correlation rows)."""
    (X, Y), (Xt, Yt), k, words = cell_inputs(cfg)
    tr = cfg["train"]
    width, seed, alpha = cell["width"], cell["seed"], cell["alpha"]
    torch.manual_seed(seed)
    model = build_mlp(cfg, width, X.shape[1], k).to(getattr(torch, tr["dtype"]))
    lr = tr["eta0"] * width**alpha
    rows = train_side_by_side(
        model,
        (X, Y),
        steps=tr["steps"],
        lr=lr,
        batch_size=tr["batch_size"] or None,
        test=(Xt, Yt),
        probe=Xt[: tr["probe"]],
        seed=seed,
        on_nonfinite="stop",
        kernel_prediction=tr["kernel_prediction"] and tr["loss"] == "mse",
        **{k: tr[k] for k in ("optimizer", "loss", "log_steps", "linear")},
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
            s.pop("values")
            rows.append({"kind": "correlation", "name": f"C{D}{d}", "data_description": words, **s})
    return rows


def run_sweep(
    config: Mapping[str, Any], out_dir: str | Path, shard: tuple[int, int] = (1, 1), *, quiet: bool = False
) -> dict[str, Any]:
    """Run (or resume) the sweep in ``out_dir``: ``{"rows", "slopes", "complete", "out_dir"}`` (``slopes`` empty
    until every cell of every shard is finished)."""
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
        # the options of the whole grid (no shard): what made these slopes; --config repeats them
        recorded = {"linearize": LinearizeOptions(sweep=cfg).to_dict()}
        atomic_write_json(out_dir / "slopes.json", {"config": cfg, "slopes": slopes, "options": recorded})
        if not quiet:
            print_slopes(slopes)
            print(f"wrote {out_dir / 'results.jsonl'} and {out_dir / 'slopes.json'}")
    elif not quiet:
        print(
            f"{len(done)}/{len(cells)} cells finished in {out_dir}; slopes are fitted when all "
            "shards are done (rerun any shard to finish)."
        )
    return {"rows": rows, "slopes": slopes, "complete": complete, "out_dir": out_dir}


def run_linearize(options: LinearizeOptions, *, out: str | Path | None = None) -> dict[str, Any]:
    """What ``widthscope linearize`` does: this process's shard (default: one per ``torchrun`` rank) of the sweep
    in ``out`` (default ``runs/<config name>``); :func:`run_sweep`'s result."""
    sweep = options.sweep
    if sweep is None:
        raise WidthscopeError(
            "linearize: no sweep config: give a TOML config (see configs/linearize-demo.toml) or "
            "--config with the slopes.json or linearize_config.json of an earlier run"
        )
    which = shard_for_run(options.shard)  # under torchrun: one shard per rank
    out_dir = out or str(Path("runs") / str(sweep.get("name", "linearize")))
    res = run_sweep(sweep, out_dir, which)
    finish_after_ranks(options.shard, lambda: run_sweep(sweep, out_dir, (1, 1)))
    return res


def run_file(config_path: str, *, out: str | None = None, shard: str | None = None) -> dict[str, Any]:
    """:func:`run_linearize` of a TOML config file (``out`` default: ``runs/<config name or file stem>``)."""
    config = load_toml(config_path)
    out_dir = out or str(Path("runs") / str(config.get("name", Path(config_path).stem)))
    return run_linearize(LinearizeOptions(sweep=config, shard=shard), out=out_dir)
