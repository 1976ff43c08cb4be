"""Growing a trained model: where to insert a block, and whether growing beats training longer.

- ``options``: the settings as typed data (``GrowOptions``, ``GrowBenchOptions``);
- ``pipeline``: ``grow`` (rank points by a criterion, insert, train the new block, compare) and
  ``run_grow`` (a whole ``widthscope grow`` run); its steps: ``rank`` (the candidates), ``block``
  (growing one block, the continue-training baseline, FLOPs), ``inputs`` (the model and pools of a run);
- ``bench``: grow at every point of a model suite beside the equal-FLOPs baselines (``grow-bench``);
  its steps: ``suite`` (the cells, models, data, base training), ``cell`` (one model and seed);
- ``compare``: the benchmark's judgement of its rows (Spearman, hit, regret, intervals, ``grow``'s default).

``widthscope.grow`` is also the function: ``ws.grow(model, data)`` calls :func:`grow` (the package
is callable, so the name users call and the subpackage they import from are one object).
"""

import sys as _sys
import types as _types
from typing import Any

from .options import GrowBenchOptions
from .pipeline import *  # noqa: F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all
from .pipeline import grow as _grow

__all__ = [*_main_all, "GrowBenchOptions"]


class _Callable(_types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _grow(*args, **kwargs)


_sys.modules[__name__].__class__ = _Callable
