"""Growing a trained model: where to insert a block, and whether growing beats training longer.

- ``options``: the settings as typed data (``GrowOptions``, ``GrowBenchOptions``);
- ``pipeline``: ``grow`` (rank points by a criterion, insert, train the new block, compare) and
  ``run_grow`` (a whole ``widthscope grow`` run); its steps: ``rank`` (the candidates), ``block``
  (growing one block, the continue-training baseline, FLOPs), ``inputs`` (the model and pools of a run);
- ``bench``: grow at every point of a model suite beside the equal-FLOPs baselines (``grow-bench``);
  its steps: ``suite`` (the cells, models, data, base training), ``cell`` (one model and seed);
- ``compare``: the benchmark's judgement of its rows (Spearman, hit, regret, intervals, ``grow``'s default);
- ``operators``: function-preserving growth of a trained model (``zero_block``, ``stack_depth``: G_stack
  and its zeroed variant, ``widen``) and the optimiser state after growth (``optimizer_after``);
- ``callback``: growing in place inside a ``transformers.Trainer`` / Lightning run (``GrowthCallback``,
  ``GrowthLightningCallback``), with the optimizer-state rule;
- ``schedule``: when to grow (fixed fractions of a budget, loss plateau, the alignment certificate);
- ``target``, ``target_compare``, ``target_bench``, ``target_plan``: the compute-to-target benchmark
  (``widthscope grow-target``: does small → grow → train reach the from-scratch loss with less
  compute?), its judgement, its run, and its suites at other sizes with their predicted cost.

The public function is ``ws.grow(model, data)`` (:func:`widthscope.api.grow`, this package's
:func:`grow`).
"""

from .options import GrowBenchOptions, GrowTargetOptions
from .pipeline import *  # noqa: F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all

__all__ = [*_main_all, "GrowBenchOptions", "GrowTargetOptions"]
