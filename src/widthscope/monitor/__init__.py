"""Alignment while training: certificates inside the training loop (issue 23).

:class:`AlignmentMonitor` probes fixed train and held-out pools every few optimizer steps and
emits one row per ``(step, point)`` with the certificate of :func:`widthscope.certify.certify`
(``d_par``, ``d_2``, ``d_align``, ``b_exact``, ``b_align``, empirical misalignment, the planner's
``M = K``), restoring the training state exactly. Adapters: a plain loop calls
``monitor.step(model, step)``; :mod:`widthscope.monitor.hf` (``transformers.Trainer``) and
:mod:`widthscope.monitor.lightning` (Lightning) import their frameworks lazily.
"""

from .core import AlignmentMonitor, TrainingState, log_steps

__all__ = ["AlignmentMonitor", "TrainingState", "log_steps"]
