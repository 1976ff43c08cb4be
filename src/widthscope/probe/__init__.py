"""widthscope.probe: insertion points and per-example activation gradients.

* :func:`insertion_points` / :func:`all_points` / :func:`resolve_points` (``points.py``)
* :func:`collect` -> ``{point: Tensor (n, d)}`` (``collect.py``)
* :func:`insert` (``insert.py``) / :func:`intervene` (``interventions.py``).

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

from .collect import ProbeResult, batched, causal_lm_loss, collect, coupling_layers, default_loss
from .insert import insert
from .interventions import intervene
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
    "insert",
    "intervene",
]
