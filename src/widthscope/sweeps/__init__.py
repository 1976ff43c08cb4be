"""Width sweeps.

``grid`` is the resumable, shardable cell runner shared by every sweep; ``alignment`` is the
alignment width sweep behind ``widthscope sweep`` (``run``: :func:`~widthscope.sweeps.run.run_sweep_file`;
its command line is :mod:`widthscope.cli.sweep`). Example::

    from widthscope.sweeps import load_config, run_sweep
    result = run_sweep(load_config("configs/demo-mlp.toml"), "/tmp/demo-mlp")

The public function is ``ws.sweep(config, out_dir)`` (:func:`widthscope.api.sweep`, this package's
:func:`run_sweep`; ``config``: a :class:`SweepConfig`, a dict as parsed from TOML, or a TOML path;
returns the grid result, resumable: finished cells are not run again).
"""

from __future__ import annotations

from .alignment import plan_cells, run_sweep
from .config import SweepConfig, load_config
from .grid import GridResult, load_rows, parse_shard, run_grid
from .results import summary_rows

__all__ = [
    "load_config",
    "plan_cells",
    "run_sweep",
    "summary_rows",
    "load_rows",
    "parse_shard",
    "run_grid",
    "GridResult",
    "SweepConfig",
]
