"""Growing a trained model: where to insert a block, and whether growing beats training longer.

- ``pipeline``: ``grow`` (rank the points, grow at the best, compare) and ``run_grow`` (``widthscope
  grow``); ``block``: growing one block, the continue-training baseline, FLOPs; ``options``: the settings;
- ``bench`` (``grow-bench``: grow at every point of the ``suite``) and ``compare`` (its judgement);
- ``operators``: function-preserving growth (``zero_block``, ``stack_depth``, ``widen``) and the
  optimiser state after it; ``callback``: growing inside a Trainer / Lightning run; ``schedule``: when;
- ``target`` (``widthscope grow-target``: the compute-to-target benchmark, its suite files and their
  cost) and ``target_compare`` (its judgement).
"""

from .block import step_flops
from .options import DEFAULT_CRITERION, GrowBenchOptions, GrowOptions, GrowTargetOptions
from .pipeline import builtin_inputs, certification_note, grow, rank_points, run_grow

__all__ = ["grow", "rank_points", "run_grow", "builtin_inputs", "certification_note", "step_flops"]
__all__ += ["DEFAULT_CRITERION", "GrowOptions", "GrowBenchOptions", "GrowTargetOptions"]
