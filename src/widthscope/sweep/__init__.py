"""Width sweeps.

``grid`` is the resumable, shardable cell runner shared by every sweep; ``alignment`` is the
alignment width sweep behind ``widthscope sweep`` (``run``: :func:`~widthscope.sweep.run.run_sweep_file`;
its command line is :mod:`widthscope.cli.sweep`). Example::

    from widthscope.sweep import load_config, run_sweep
    result = run_sweep(load_config("configs/demo-mlp.toml"), "/tmp/demo-mlp")

``widthscope.sweep`` is also the function: ``ws.sweep(config, out_dir)`` calls :func:`run_sweep`
(``config``: a :class:`SweepConfig`, a dict as parsed from TOML, or a TOML path; returns the grid
result, resumable: finished cells are not run again).
"""

from __future__ import annotations

import sys as _sys
import types as _types
from typing import Any

from .alignment import load_config, plan_cells, run_sweep, summary_rows
from .grid import GridResult, load_rows, parse_shard, run_grid
from .schema import SweepConfig

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


class _Callable(_types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run_sweep(*args, **kwargs)


_sys.modules[__name__].__class__ = _Callable
