"""Alignment while training: certificates inside the training loop.

:class:`AlignmentMonitor` probes fixed train and held-out pools at chosen optimizer steps and emits
one row per ``(step, point)`` with the certificate of :func:`widthscope.certification.certify_dict`,
restoring the training state exactly; its settings are one :class:`MonitorOptions`. A plain loop calls
``monitor.step(model, step)``; :mod:`.hf` (``transformers.Trainer``) and :mod:`.lightning` are the
framework callbacks. Modules: ``core`` (the monitor and its schedule), ``options``, ``pools`` (fixed
pools, the dry probe), ``state`` (the restore guarantee, FSDP refusal), ``rows``, ``plot``.
"""

from .core import AlignmentMonitor, log_steps
from .options import MonitorOptions
from .state import TrainingState

__all__ = ["AlignmentMonitor", "MonitorOptions", "TrainingState", "log_steps"]
