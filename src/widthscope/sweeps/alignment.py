"""Alignment width sweeps: plan, check and run the grid of cells ``family x budget x width x seed``
(each one :func:`~widthscope.sweeps.cell.run_cell`) through :func:`widthscope.sweeps.grid.run_grid`."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any, Mapping

import torch

from .. import models, probe
from .._io import unwritable
from ..errors import WidthscopeError, WidthscopeTypeError
from ..models.dispatch import check_max_memory, check_visible
from ..train import resolve_device
from .cell import cell_options, run_cell
from .config import LM_DATASETS, SweepConfig, load_config
from .grid import GridResult, claim_out_dir, run_grid
from .pools import fill_model_options

__all__ = ["load_config", "check_structure", "plan_cells", "run_sweep"]


def plan_cells(cfg: SweepConfig) -> list[dict[str, Any]]:
    """The grid in order family, budget, width, seed; each cell carries the config's fingerprint."""
    fp = cfg.fingerprint()
    return [
        {"sweep": cfg.name, "family": fam.name, "width": w, "seed": s, "budget": budget, "config": fp}
        for fam in cfg.families
        for budget in cfg.budgets or [fam.n_train]  # type: ignore[list-item]  # n_train is set without budgets
        for w in fam.widths
        for s in cfg.seeds
    ]


def check_structure(cfg: SweepConfig, *, device: bool = True) -> dict[str, list[str]]:
    """Before any cell trains: every family's model builds at every width (on the ``meta`` device, data
    sizes as placeholders) and has its ``points``; with ``device``, ``[sweep].device`` and the GPUs a
    ``max_memory`` names exist here. Returns ``{family name: insertion points}``."""
    if device:
        try:
            resolve_device(cfg.device)
        except WidthscopeError as exc:
            msg = str(exc).replace("; use --device cpu", "")
            raise WidthscopeError(
                f"[sweep] {msg}; set device = 'cpu' (or a device this machine has) in [sweep]"
            ) from None
        for fam in cfg.families:
            mem = fam.placement.get("max_memory")
            where = f"sweep config family {fam.name!r} max_memory"
            check_visible(check_max_memory(mem, name=where), name=where, text=mem if isinstance(mem, str) else None)
    out = {}
    for fam in cfg.families:
        lm = fam.dataset in LM_DATASETS
        fake = types.SimpleNamespace(input_shape=(16,) if lm else (3, 8, 8), num_classes=256 if lm else 10)
        opts = fill_model_options(fam, fake)
        where = f"sweep config family {fam.name!r}"
        for width in fam.widths:
            try:
                try:
                    with torch.device("meta"):
                        model = models.build(fam.model, width, **opts)
                except (RuntimeError, NotImplementedError):  # an init the meta device cannot run: build it for real
                    model = models.build(fam.model, width, **opts)
            except WidthscopeError as exc:
                raise WidthscopeError(
                    f"{where}: model {fam.model!r} at width {width} with model_options {fam.model_options}: {exc}"
                ) from None
            try:
                out[fam.name] = probe.resolve_points(model, fam.points or None)
            except WidthscopeError as exc:
                raise WidthscopeError(f"{where} certify.points: {exc}") from None
            if fam.monitor is not None and fam.monitor["points"]:
                try:
                    probe.resolve_points(model, fam.monitor["points"])
                except WidthscopeError as exc:
                    raise WidthscopeError(f"{where} monitor.points: {exc}") from None
    return out


def run_sweep(
    config: SweepConfig | Mapping[str, Any] | str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    shard: tuple[int, int] = (1, 1),
    *,
    show_progress: bool = True,
) -> GridResult:
    """Run (or resume) this shard's unfinished cells of ``config`` (a :class:`SweepConfig`, a parsed-TOML
    dict or a TOML path); return the grid result."""
    if not isinstance(config, (SweepConfig, Mapping, str, os.PathLike)):
        raise WidthscopeTypeError(
            f"sweep(config=...): expected a SweepConfig, a dict as parsed from TOML or a TOML path, "
            f"got {type(config).__name__}"
        )
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise WidthscopeTypeError(f"sweep(out_dir=...): expected a folder path, got {type(out_dir).__name__}")
    cfg = config if isinstance(config, SweepConfig) else load_config(config)
    check_structure(cfg)  # before the folder exists: a refused config leaves nothing behind
    out = Path(out_dir if out_dir is not None else cfg.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(out, exc) from None
    claim = {"fingerprint": cfg.fingerprint(), "config": cfg.to_dict(), "options": cfg.options_record()}
    with claim_out_dir(out, {**claim, "kind": "alignment"}, "a sweep", shard, cfg.threads):
        return run_grid(
            plan_cells(cfg),
            lambda c, d: run_cell(cfg, c, d, show_progress=show_progress),
            out,
            shard=shard,
            desc=f"sweep {cfg.name}",
            record=lambda c: (
                {"options": cell_options(cfg, c).to_dict()}
                | ({"placement": dict(fam.placement)} if (fam := cfg.family(c["family"])).placement else {})
            ),
        )
