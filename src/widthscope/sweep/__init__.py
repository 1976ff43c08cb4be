"""Width sweeps.

``grid`` is the resumable, shardable cell runner shared by every sweep; ``alignment`` is the
alignment width sweep behind ``widthscope sweep`` (``run``: :func:`~widthscope.sweep.run.run_sweep_file`;
its command line is :mod:`widthscope.cli.sweep`). Example::

    from widthscope.sweep import load_config, run_sweep
    result = run_sweep(load_config("configs/demo-mlp.toml"), "/tmp/demo-mlp")
"""

from __future__ import annotations

from .alignment import load_config, plan_cells, run_sweep, summary_rows
from .grid import load_rows, parse_shard, run_grid

__all__ = ["load_config", "plan_cells", "run_sweep", "summary_rows", "load_rows", "parse_shard", "run_grid"]
