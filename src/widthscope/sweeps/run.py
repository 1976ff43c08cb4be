"""What ``widthscope sweep`` does: :func:`run_sweep_file` runs (or resumes) the alignment sweep or model
suite of a TOML config, or plans it. Python::

    from widthscope.sweeps.run import run_sweep_file
    run_sweep_file("configs/demo-mlp.toml", out="/tmp/mlp-sweep", shard="2/4")  # a quarter of the grid
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any, Callable

from .._io import format_table, read_toml
from ..planning import CellPlan, plan_alignment, print_cell_plans
from ..validate import check_dir_writable, check_outputs
from . import alignment as sweep_alignment  # run_sweep looked up at call time (tests replace it)
from .alignment import check_structure, load_config, plan_cells
from .config import SweepConfig
from .grid import GridResult, cell_id, cell_state, finish_after_ranks, shard_for_run
from .placement import placement_text
from .results import check_fingerprint, is_record, print_summary, read_record
from .suite import SuiteConfig, load_suite, plan_suite, print_suite_plan, run_suite

__all__ = ["run_sweep_file", "print_config_plan"]


def run_sweep_file(
    config: str | os.PathLike,
    *,
    out: str | os.PathLike | None = None,
    shard: str | None = None,
    dry_run: bool = False,
    threads: int | None = None,
    show_progress: bool = True,
    plan: bool = False,
) -> GridResult | None:
    """The sweep of ``config`` (a TOML config, or a finished sweep's folder or ``sweep.json``) in ``out``
    (default: its ``out_dir``), shard ``"k/n"`` (default: one per ``torchrun`` rank), at ``threads``.
    ``dry_run``: print the grid and the cost plan, run nothing, return None; ``plan``: the same, timing
    one batch per distinct model. Otherwise run this shard, print the summary and return its result."""
    recorded = read_record(config) if is_record(config) else None
    if recorded is None:
        raw = read_toml(Path(config), "sweep config", "examples in configs/, reference in docs/sweeps.md")
    else:
        raw = recorded[0]
    cfg: SweepConfig | SuiteConfig
    if "suite" in raw:
        cfg = load_suite(raw, stem="sweep" if recorded else Path(config).stem, out_dir=out)
    else:
        cfg = load_config(raw if recorded else config, out_dir=out)
    if recorded is not None:
        check_fingerprint(cfg.fingerprint(), *recorded[1:])
    if threads is not None:
        cfg.threads = threads
    go = (shard, dry_run or plan, show_progress)
    if isinstance(cfg, SuiteConfig):
        return _drive("suite", cfg, plan_suite(cfg), partial(print_suite_plan, timed=plan), run_suite, *go)
    check_structure(cfg, device=not dry_run)
    return _drive("sweep", cfg, plan_cells(cfg), partial(_print_plan, timed=plan), sweep_alignment.run_sweep, *go)


def print_config_plan(cfg: SweepConfig, *, timed: bool = False) -> list[CellPlan]:
    """Print what ``--dry-run`` (``timed``: ``--plan``) prints for the whole grid; returns the plan's rows."""
    check_structure(cfg, device=False)
    cells = plan_cells(cfg)
    return _print_plan(cfg, list(enumerate(cells)), len(cells), Path(cfg.out_dir), (1, 1), timed=timed)


def _print_plan(
    cfg: SweepConfig,
    mine: list[tuple[int, dict[str, Any]]],
    n_cells: int,
    out: Path,
    shard: tuple[int, int],
    *,
    timed: bool = False,
) -> list[CellPlan]:
    """``--dry-run``: this shard's cells, which are finished, the families' settings and the cost plan."""
    k, n = shard
    table = [
        {
            "#": i,
            **{k: c[k] for k in ("family", "width", "seed", "budget")},
            "cell_id": cell_id(c),
            "done": cell_state(out, c),
        }
        for i, c in mine
    ]
    print(format_table(table, title=f"sweep {cfg.name}: {len(mine)} of {n_cells} cells in shard {k}/{n}"))
    print(f"(M, K): {cfg.MK}; results dir: {out}")
    for fam in cfg.families:
        if fam.placement:
            print(f"placement ({fam.name}): {placement_text(fam.placement)} (the probe; training on {cfg.device})")
        if changed := cfg.certify_changes(fam):
            print(f"certify options ({fam.name}): {', '.join(f'{k} = {v}' for k, v in changed.items())}")
        if fam.monitor is not None:
            m = fam.monitor
            print(
                f"monitor ({fam.name}): steps {m['steps']}, (M, K) = ({m['M']}, {m['K']}), pools "
                f"{m['n_train']} + {m['n_test']}, delta {m['delta']}"
            )
    costs = plan_alignment(cfg, [c for _, c in mine], lambda c: cell_state(out, c) is True, timed_run=timed)
    print_cell_plans(costs, shard, cfg.device)
    return costs


def _drive(
    kind: str,
    cfg: Any,
    cells: list[dict[str, Any]],
    print_plan: Callable[..., object],
    run: Callable[..., GridResult],
    shard: str | None,
    dry_run: bool,
    show_progress: bool,
) -> GridResult | None:
    """This rank's shard of ``cells``: the plan with ``dry_run``, else run them and print the summary."""
    which = shard_for_run(shard)
    out_path = Path(cfg.out_dir)
    check_dir_writable(out_path)
    _check_offload_folders(cfg, out_path)
    k, n = which
    mine = [(i, c) for i, c in enumerate(cells) if i % n == k - 1]
    if dry_run:
        print_plan(cfg, mine, len(cells), out_path, which)
        return None
    print(f"{kind} {cfg.name}: {len(mine)} of {len(cells)} cells in shard {k}/{n} -> {out_path}", flush=True)
    result = run(cfg, out_path, shard=which, show_progress=show_progress)
    print(f"ran {len(result.done)} cell(s), {len(result.skipped)} already finished", flush=True)

    def finish() -> None:
        print_summary(run(cfg, out_path, shard=(1, 1), show_progress=False).rows, out_path)

    if finish_after_ranks(shard, finish):
        print_summary(result.rows, out_path)
    return result


def _check_offload_folders(cfg: SweepConfig | SuiteConfig, out: Path) -> None:
    """Refuse an ``offload_folder`` that is (or lies inside) the results folder or a model or data path read."""
    if isinstance(cfg, SuiteConfig):
        folders = [("[suite] offload_folder", cfg.inputs.get("offload_folder"))]
        inputs = [("[suite] model", m) for m in cfg.models]
        inputs += [(f"[suite] {k}", v) for k, v in cfg.inputs.items() if k != "offload_folder" and isinstance(v, str)]
    else:
        folders = [("[sweep] offload_folder", cfg.placement.get("offload_folder"))]
        folders += [(f"family {f.name!r} offload_folder", f.placement.get("offload_folder")) for f in cfg.families]
        inputs = [(f"family {f.name!r} data_options.{k}", v) for f in cfg.families for k, v in f.data_options.items()]
        inputs = [(flag, v) for flag, v in inputs if isinstance(v, str)]
    for flag, folder in folders:
        if folder:
            check_outputs(inputs, [(flag, str(folder)), ("results folder (--out)", str(out))], "sweep")
            check_dir_writable(folder, flag)
