"""Alignment while training: certificates inside the training loop.

:class:`AlignmentMonitor` probes fixed train and held-out pools every few optimizer steps and
emits one row per ``(step, point)`` with the certificate of :func:`widthscope.certification.certify_dict`
(``d_par``, ``d_2``, ``d_align``, ``b_exact``, ``b_align``, empirical misalignment, the planner's
``M = K``), restoring the training state exactly. Its settings are one :class:`MonitorOptions`.
Adapters: a plain loop calls ``monitor.step(model, step)``; :mod:`widthscope.monitor.hf`
(``transformers.Trainer``) and :mod:`widthscope.monitor.lightning` (Lightning) import their
frameworks lazily.

Modules: ``core`` (the monitor: construction, resume, the probe), ``options`` (:class:`MonitorOptions`),
``schedule`` (steps, first/last, the time budget), ``pools`` (fixed pools, the dry probe), ``state``
(the restore guarantee, FSDP refusal), ``rows`` (rows, events, logger metrics), ``plot``.
"""

from .core import AlignmentMonitor, TrainingState, log_steps
from .options import MonitorOptions

__all__ = ["AlignmentMonitor", "MonitorOptions", "TrainingState", "log_steps"]
