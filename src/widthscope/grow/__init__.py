"""Growing a trained model: where to insert a block, and whether growing beats training longer.

- ``pipeline``: rank points by a criterion, insert, train the new block, compare (``grow``);
- ``bench``: grow at every point of a model suite beside the equal-FLOPs baselines (``grow-bench``);
- ``compare``: the benchmark's judgement of its rows (Spearman, hit, regret, intervals, ``grow``'s default).

``widthscope.grow`` is also the function: ``ws.grow(model, data)`` calls :func:`grow` (the package
is callable, so the name users call and the subpackage they import from are one object).
"""

import sys as _sys
import types as _types
from typing import Any

from .pipeline import *  # noqa: F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all
from .pipeline import grow as _grow

__all__ = list(_main_all)


class _Callable(_types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _grow(*args, **kwargs)


_sys.modules[__name__].__class__ = _Callable
