"""Alignment while training: :class:`AlignmentMonitor` certifies fixed pools at chosen optimizer steps,
one row per ``(step, point)``. A plain loop calls ``monitor.step(model, step)``; :mod:`.hf` and
:mod:`.lightning` are the ``transformers.Trainer`` and Lightning callbacks.
"""

from .core import AlignmentMonitor, log_steps
from .options import MonitorOptions
from .pools import TrainingState

__all__ = ["AlignmentMonitor", "MonitorOptions", "TrainingState", "log_steps"]
