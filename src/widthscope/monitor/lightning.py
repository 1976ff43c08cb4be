"""Lightning adapter: the monitor as a ``Callback`` logging through ``pl_module.log_dict``.

Usage::

    from widthscope.monitor.lightning import AlignmentCallback
    trainer = lightning.Trainer(callbacks=[AlignmentCallback(monitor)], ...)

``on_train_batch_end`` calls ``monitor.step(pl_module, trainer.global_step)``
(``global_step`` counts optimizer steps, so gradient accumulation is respected) and logs the
rows with ``pl_module.log_dict(..., on_step=True, on_epoch=False)``, so every Lightning logger
(TensorBoard, W&B, MLflow, CSV) receives them. Step 0 is probed in ``on_train_start``, where
Lightning allows no logging: its rows are kept in ``monitor.rows`` (and ``out=``) only.
Lightning (``lightning`` or ``pytorch_lightning``) is imported on first use of the class.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core import FSDP_FIX, AlignmentMonitor, check_not_fsdp, lazy_class

__all__ = ["AlignmentCallback"]

if TYPE_CHECKING:  # built on first use by the module __getattr__ below
    AlignmentCallback: type


def _base() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:  # the older package name
        try:
            from pytorch_lightning.callbacks import Callback as LegacyCallback
        except ImportError as exc:
            from ..errors import WidthscopeError

            raise WidthscopeError("widthscope.monitor.lightning needs Lightning: pip install "
                                  "'widthscope[lightning]'") from exc
        return LegacyCallback
    return Callback


def _make_class() -> type:
    class AlignmentCallback(_base()):  # type: ignore[misc]
        """Probe after each optimizer step chosen by the monitor's schedule; log through ``pl_module``."""

        def __init__(self, monitor: AlignmentMonitor, prefix: str = "align") -> None:
            super().__init__()
            self.monitor, self.prefix = monitor, prefix

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            # Before the strategy wraps the module: refuse FSDP before any training.
            _check_strategy(trainer)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            _check_strategy(trainer)
            check_not_fsdp(pl_module, "the alignment monitor")
            self.monitor.step(pl_module, int(trainer.global_step))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            # Every rank probes its share of the pools; the gathered rows are equal on all ranks.
            rows = self.monitor.step(pl_module, int(trainer.global_step))
            if rows:
                pl_module.log_dict(AlignmentMonitor.metrics(rows, self.prefix), on_step=True, on_epoch=False)

    return AlignmentCallback


__getattr__ = lazy_class(__name__, "AlignmentCallback", _make_class)


def _check_strategy(trainer: Any) -> None:
    """Refuse Lightning's FSDP strategies (``FSDPStrategy``, ``ModelParallelStrategy`` shards with FSDP2)."""
    from ..errors import WidthscopeError

    name = type(getattr(trainer, "strategy", None)).__name__
    if "FSDP" in name or name == "ModelParallelStrategy":
        raise WidthscopeError(f"the alignment monitor cannot probe a model sharded by Lightning's {name}; {FSDP_FIX}")
