"""What ``widthscope sweep`` does, from explicit settings: :func:`run_sweep_file`.

Runs (or resumes) an alignment width sweep (:mod:`widthscope.sweeps.alignment`) or a model suite
(:mod:`widthscope.sweeps.suite`) of a TOML config; see docs/sweeps.md. Python::

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
    """The sweep of ``config`` in ``out`` (default: its ``out_dir``), shard ``shard`` (``"k/n"``;
    default: one shard per ``torchrun`` rank, else the whole grid), at ``threads`` torch CPU
    threads (default: the config's). ``config``: a TOML sweep config, or a finished sweep's results
    folder or its ``sweep.json`` (:func:`~widthscope.sweeps.results.read_record`: the same cells).
    ``dry_run``: print the grid, what is finished and the cost plan, run nothing, return ``None``;
    ``plan``: the same, timing one batch per distinct model to predict the wall time. Otherwise
    runs this shard, prints the summary (rank 0, once every rank is done) and returns its result."""
    recorded: tuple[str, str] | None = None
    if is_record(config):
        raw, fingerprint, where = read_record(config)
        recorded, stem = (fingerprint, where), "sweep"
    else:
        raw = read_toml(Path(config), "sweep config", "examples in configs/, reference in docs/sweeps.md")
        stem = Path(config).stem
    if "suite" in raw:
        suite = load_suite(raw, stem=stem, out_dir=out)
        if recorded is not None:
            check_fingerprint(suite.fingerprint(), *recorded)
        if threads is not None:
            suite.threads = threads
        show = partial(print_suite_plan, timed=plan)
        return _drive("suite", suite, plan_suite(suite), show, run_suite, shard, dry_run or plan, show_progress)
    cfg = load_config(raw if recorded is not None else config, out_dir=out)
    if recorded is not None:
        check_fingerprint(cfg.fingerprint(), *recorded)
    check_structure(cfg, device=not dry_run)  # every cell's model and points, before any work
    if threads is not None:  # checked by widthscope.cli.checks.check_args
        cfg.threads = threads
    printer = partial(_print_plan, timed=plan)
    run = sweep_alignment.run_sweep
    return _drive("sweep", cfg, plan_cells(cfg), printer, run, shard, dry_run or plan, show_progress)


def print_config_plan(cfg: SweepConfig, *, timed: bool = False) -> list[CellPlan]:
    """What ``--dry-run`` prints (``timed``: ``--plan``) for a loaded config, its whole grid in one
    shard; runs nothing, writes nothing; returns the plan's rows (one per distinct model)."""
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
    """``--dry-run``: this shard's cells and whether each is finished, the monitor settings, the
    placement and the cost plan."""
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
        changed = cfg.certify_changes(fam)  # a family's certify table that changes [sweep]'s statistics
        if changed:
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
    """This rank's shard of ``cells``: the plan with ``dry_run``, else run them and print the
    summary (rank 0 under torchrun, once every rank's shard is done)."""
    which = shard_for_run(shard)
    out_path = Path(cfg.out_dir)
    check_dir_writable(out_path)  # before any cell trains: a read-only or file --out is one error line
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
    """An ``offload_folder`` is an output: refused, before any cell runs, when it is the results
    folder, or a local model or data path the sweep reads, or lies inside one of those folders."""
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
            # the results folder as one more output: the two may not be one folder
            check_outputs(inputs, [(flag, str(folder)), ("results folder (--out)", str(out))], "sweep")
            check_dir_writable(folder, flag)  # a file or a read-only place: one line before any cell
