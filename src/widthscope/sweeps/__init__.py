"""Width sweeps: ``grid`` (the resumable, shardable cell runner every sweep shares) and the alignment
width sweep behind ``widthscope sweep`` and ``ws.sweep(config, out_dir)``. Example::

    from widthscope.sweeps import load_config, run_sweep
    result = run_sweep(load_config("configs/demo-mlp.toml"), "/tmp/demo-mlp")
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
