"""Growing a trained model: where to insert a block, and whether growing beats training longer.

- ``pipeline``: rank points by a criterion, insert, train the new block, compare (``grow``);
- ``bench``: grow at every point of a model suite beside the equal-FLOPs baselines (``grow-bench``);
- ``compare``: the benchmark's judgement of its rows (Spearman, hit, regret, intervals, ``grow``'s default).
The old module paths (``widthscope.grow_bench``, ``widthscope.grow_compare``) still import, with a deprecation warning, for one release.
"""
import importlib as _importlib

from .pipeline import *  # noqa: F401,F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all

_SUBMODULES = ('bench', 'compare')
__all__ = list(_main_all)


def __getattr__(name: str):
    # private helpers other modules take from the old flat module (``from .grow import _x``)
    for sub in ("pipeline", *_SUBMODULES):
        mod = _importlib.import_module(f"{__name__}.{sub}")
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
