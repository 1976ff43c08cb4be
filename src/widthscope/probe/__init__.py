"""widthscope.probe: insertion points and per-example activation gradients.

* :func:`insertion_points` / :func:`all_points` / :func:`resolve_points` (``points.py``)
* :func:`collect` -> ``{point: Tensor (n, d)}`` (``collect.py``)
* :func:`insert` / :func:`intervene` (``intervene.py``, issue 4), imported on first use.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe import collect, insertion_points
    >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> insertion_points(mlp)
    ['0', '1']
    >>> q = collect(mlp, [(torch.randn(6, 4), torch.randint(0, 3, (6,)))], progress=False)
    >>> {k: tuple(v.shape) for k, v in q.items()}
    {'0': (6, 8), '1': (6, 8)}
"""

from __future__ import annotations

import importlib
from typing import Any

from .collect import POOLS, ProbeResult, batched, causal_lm_loss, collect, coupling_layers, default_loss
from .points import all_points, insertion_points, resolve_points

__all__ = [
    "insertion_points",
    "all_points",
    "resolve_points",
    "collect",
    "ProbeResult",
    "batched",
    "causal_lm_loss",
    "default_loss",
    "coupling_layers",
    "POOLS",
    "insert",
    "intervene",
]

try:  # bound eagerly so the name `intervene` is the function, never the submodule
    from .intervene import insert, intervene
except ModuleNotFoundError as _exc:  # intervene.py (issue 4) not present in this tree
    if _exc.name != f"{__name__}.intervene":
        raise


def __getattr__(name: str) -> Any:
    # insert/intervene live in intervene.py (another module, issue 4); import lazily so the
    # probe works whether or not it is present.
    if name in ("insert", "intervene"):
        mod = importlib.import_module(".intervene", __name__)
        # Importing the submodule binds the *module* as widthscope.probe.intervene; bind the
        # functions over it so `widthscope.probe.intervene(...)` is the function.
        globals().update(insert=mod.insert, intervene=mod.intervene)
        return globals()[name]
    raise AttributeError(f"module 'widthscope.probe' has no attribute {name!r}")
