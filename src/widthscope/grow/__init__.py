"""Growing a trained model: where to insert a block, and whether growing beats training longer.

- ``pipeline``: rank points by a criterion, insert, train the new block, compare (``grow``);
- ``bench``: grow at every point of a model suite beside the equal-FLOPs baselines (``grow-bench``);
- ``compare``: the benchmark's judgement of its rows (Spearman, hit, regret, intervals, ``grow``'s default).
The old module paths (``widthscope.grow_bench``, ``widthscope.grow_compare``) still import, with a deprecation warning, for one release.
"""
from .._moved import from_submodules
from .pipeline import *  # noqa: F401,F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all

__all__ = list(_main_all)
# private helpers other modules take from the old flat module (``from widthscope.grow import _x``)
__getattr__ = from_submodules(__name__, ("pipeline", "bench", "compare"))
