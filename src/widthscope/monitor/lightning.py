"""Lightning adapter: the monitor as a ``Callback`` writing to the trainer's loggers at probed steps only.

Usage::

    monitor = AlignmentMonitor(lit.net, train_pool, test_pool, points=["2"], every=50)  # the network
    trainer = lightning.Trainer(callbacks=[AlignmentCallback(monitor)], ...)

The monitor probes the ``LightningModule`` or a network it holds at the optimizer steps its schedule
picks; the values go to every logger's ``log_metrics``. Details: docs/monitor.md §3.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from ..errors import WidthscopeError
from .core import AlignmentMonitor, monitor_from
from .options import MonitorOptions
from .pools import FSDP_FIX, check_not_fsdp
from .rows import lazy_class

__all__ = ["AlignmentCallback"]

_log = logging.getLogger("widthscope.monitor")

if TYPE_CHECKING:  # built on first use by the module __getattr__ below
    AlignmentCallback: type


def _make_class() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:  # the older package name
        try:
            from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
        except ImportError as exc:
            raise WidthscopeError(
                "widthscope.monitor.lightning needs Lightning: pip install 'widthscope[lightning]'"
            ) from exc

    class AlignmentCallback(Callback):  # type: ignore[misc]
        """Probe after the optimizer steps the monitor's schedule picks; write the rows to the loggers.
        Give a ``monitor``, or ``model=`` (e.g. ``lit.net``), ``train=``, ``test=``, ``options=`` / keywords."""

        def __init__(
            self,
            monitor: AlignmentMonitor | None = None,
            prefix: str = "align",
            *,
            model: Any = None,
            train: Any = None,
            test: Any = None,
            options: MonitorOptions | None = None,
            **keywords: Any,
        ) -> None:
            super().__init__()
            self.monitor = monitor_from(monitor, model, train, test, options, keywords, "AlignmentCallback")
            self.prefix = prefix
            self._seen: int | None = None  # the last global_step handled (micro-batches repeat it)

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            _check_strategy(trainer)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            _check_strategy(trainer)
            check_not_fsdp(pl_module, "the alignment monitor")
            _network(self.monitor, pl_module)
            step = int(trainer.global_step)
            self.monitor.bounds(step, _last_step(trainer, step))
            self._step(trainer, pl_module, step)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            step = int(trainer.global_step)
            if step != self._seen:  # once per optimizer step
                self._step(trainer, pl_module, step)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self._step(trainer, pl_module, int(trainer.global_step), final=True)
            if trainer.is_global_zero:
                (_log.warning if self.monitor.skipped else _log.info)(self.monitor.summary())

        def _step(self, trainer: Any, pl_module: Any, step: int, final: bool = False) -> None:
            self._seen = step
            rows = self.monitor.step(_network(self.monitor, pl_module), step, final=final)
            if rows and trainer.is_global_zero:
                metrics = AlignmentMonitor.metrics(rows, self.prefix)
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=step)
                    logger.save()

    return AlignmentCallback


__getattr__ = lazy_class(__name__, "AlignmentCallback", _make_class)


def _check_strategy(trainer: Any) -> None:
    """Refuse Lightning's FSDP strategies (``FSDPStrategy``, ``ModelParallelStrategy`` shards with FSDP2)."""
    name = type(getattr(trainer, "strategy", None)).__name__
    if "FSDP" in name or name == "ModelParallelStrategy":
        raise WidthscopeError(f"the alignment monitor cannot probe a model sharded by Lightning's {name}; {FSDP_FIX}")


def _network(monitor: AlignmentMonitor, pl_module: Any) -> Any:
    """The module the monitor probes: the one it was built on, when it is ``pl_module`` or part of it."""
    net = monitor.model
    if net is pl_module or any(m is net for m in pl_module.modules()):
        return net
    raise WidthscopeError(
        f"the alignment monitor was built on a {type(net).__name__} that is not part of the "
        f"{type(pl_module).__name__} being trained; build it on the module being trained or on "
        "the network it holds (e.g. AlignmentMonitor(lit.net, ...)), not on a copy"
    )


def _last_step(trainer: Any, first: int) -> int | None:
    """The run's last optimizer step, when Lightning knows it (``max_steps`` / ``max_epochs``)."""
    try:
        last = float(trainer.estimated_stepping_batches)
    except Exception:  # noqa: BLE001 - e.g. an iterable dataset without a length and no max_steps
        last = math.inf
    if math.isfinite(last) and int(last) >= first:
        return int(last)
    max_steps = int(getattr(trainer, "max_steps", -1) or -1)
    return max_steps if max_steps >= first else None
