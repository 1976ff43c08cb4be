"""``widthscope sweep CONFIG.toml [--out DIR] [--shard k/n] [--dry-run]``.

Runs (or resumes) an alignment width sweep; see :mod:`widthscope.sweep.alignment` and
docs/sweeps.md. Example::

    widthscope sweep configs/demo-mlp.toml --out /tmp/mlp-sweep
    widthscope sweep configs/demo-mlp.toml --out /tmp/mlp-sweep --shard 2/4   # a quarter of the grid
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import format_table
from .grid import _cell_path, cell_id, finish_after_ranks, shard_for_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="TOML sweep config (see docs/sweeps.md and configs/)")
    parser.add_argument("--out", default=None, help="results directory (default: [sweep].out_dir)")
    parser.add_argument(
        "--shard",
        default=None,
        metavar="k/n",
        help="run only cells k-1, k-1+n, ... of the grid (for several processes/machines)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the grid and what is finished; run nothing")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads (overrides [sweep].threads); 1 is best on busy machines",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars inside cells")


def run(args: argparse.Namespace) -> int:
    from .alignment import check_structure, load_config, plan_cells, print_summary, run_sweep

    cfg = load_config(args.config, out_dir=args.out)
    check_structure(cfg, device=not args.dry_run)  # every cell's model and points, before any work
    if args.threads is not None:  # checked by widthscope.validate.check_args
        cfg.threads = args.threads
    shard = shard_for_run(args.shard)
    out = Path(cfg.out_dir)
    from ..validate import check_dir_writable

    check_dir_writable(out)  # before any cell trains: a read-only or file --out is one error line
    cells = plan_cells(cfg)
    k, n = shard
    mine = [(i, c) for i, c in enumerate(cells) if i % n == k - 1]
    if args.dry_run:
        from .grid import read_cell

        def state(c: dict) -> str | bool:
            path = _cell_path(out, cell_id(c))
            if not path.exists():
                return False
            why = read_cell(path)[1]  # a damaged cell file is not a finished cell: the run sets it aside
            return "damaged: runs again" if why else True

        table = [
            {
                "#": i,
                **{key: c[key] for key in ("family", "width", "seed", "budget")},
                "cell_id": cell_id(c),
                "done": state(c),
            }
            for i, c in mine
        ]
        print(format_table(table, title=f"sweep {cfg.name}: {len(mine)} of {len(cells)} cells in shard {k}/{n}"))
        print(f"(M, K): {cfg.MK}; results dir: {out}")
        for fam in cfg.families:
            if fam.monitor is not None:
                m = fam.monitor
                print(
                    f"monitor ({fam.name}): steps {m['steps']}, (M, K) = ({m['M']}, {m['K']}), pools "
                    f"{m['n_train']} + {m['n_test']}, delta {m['delta']}"
                )
        return 0
    print(f"sweep {cfg.name}: {len(mine)} of {len(cells)} cells in shard {k}/{n} -> {out}", flush=True)
    result = run_sweep(cfg, out, shard=shard, show_progress=not args.no_progress)
    print(f"ran {len(result.done)} cell(s), {len(result.skipped)} already finished", flush=True)

    def finish() -> None:  # rank 0 under torchrun, once every rank's shard is done
        print_summary(run_sweep(cfg, out, shard=(1, 1), show_progress=False).rows, out)

    if finish_after_ranks(args.shard, finish):
        print_summary(result.rows, out)
    return 0
