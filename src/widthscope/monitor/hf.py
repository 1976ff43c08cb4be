"""``transformers.Trainer`` adapter: the monitor as a ``TrainerCallback`` (transformers imported lazily).

Usage::

    from widthscope.monitor.hf import attach
    monitor = AlignmentMonitor(model, train_pool, test_pool, points=["model.layers.1"], every=50)
    attach(trainer, monitor)          # adds the callback and hands it the trainer
    trainer.train()

At a probed step the values are an extra entry of ``state.log_history`` handed to every callback's
``on_log``; the Trainer's own entries are left as they were. Details: docs/monitor.md §2.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import WidthscopeError
from .core import AlignmentMonitor, monitor_from
from .options import MonitorOptions
from .pools import FSDP_FIX, check_not_fsdp
from .rows import lazy_class

__all__ = ["AlignmentCallback", "attach"]

_log = logging.getLogger("widthscope.monitor")

if TYPE_CHECKING:  # built on first use by the module __getattr__ below
    AlignmentCallback: type


def _make_class() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:  # pragma: no cover
        raise WidthscopeError("widthscope.monitor.hf needs transformers: pip install 'widthscope[hf]'") from exc

    class AlignmentCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        """Probes ``monitor.step(model, state.global_step)`` after optimizer steps; logs the rows as extra entries.
        Give a ``monitor``, or ``train=``, ``test=``, ``options=`` / keywords to build one on ``model``
        (default: ``trainer.model``)."""

        def __init__(
            self,
            monitor: AlignmentMonitor | None = None,
            trainer: Any = None,
            prefix: str = "align",
            *,
            model: Any = None,
            train: Any = None,
            test: Any = None,
            options: MonitorOptions | None = None,
            **keywords: Any,
        ) -> None:
            model = model if model is not None else getattr(trainer, "model", None)
            self.monitor = monitor_from(monitor, model, train, test, options, keywords, "AlignmentCallback")
            self.trainer, self.prefix = trainer, prefix
            self._warned = False

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            _check_trainer(args, self.trainer, model)
            step, last = int(state.global_step), int(getattr(state, "max_steps", 0) or 0)
            self.monitor.bounds(step, last if last >= step and last > 0 else None)
            return self._probe(args, state, control, model)  # the first step: before any update

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            return self._probe(args, state, control, model, final=bool(control.should_training_stop))

        def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            # A stop decided after on_step_end (e.g. EarlyStoppingCallback in on_evaluate) ends the run here.
            if control.should_training_stop:
                return self._probe(args, state, control, model, final=True)
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if getattr(state, "is_world_process_zero", True):
                (_log.warning if self.monitor.skipped else _log.info)(self.monitor.summary())
            return control

        def _probe(self, args: Any, state: Any, control: Any, model: Any, final: bool = False) -> Any:
            rows = self.monitor.step(
                model if model is not None else self.monitor.model, int(state.global_step), final=final
            )
            if rows and getattr(state, "is_world_process_zero", True):
                return self._log_entry(args, state, control, AlignmentMonitor.metrics(rows, self.prefix))
            return control

        def _log_entry(self, args: Any, state: Any, control: Any, metrics: dict[str, float]) -> Any:
            """Append the monitor's own entry and hand it to every callback's ``on_log``, leaving
            ``control.should_log`` as it was."""
            logs: dict[str, Any] = dict(metrics)
            if state.epoch is not None:
                logs["epoch"] = state.epoch
            state.log_history.append({**logs, "step": int(state.global_step)})
            handler = getattr(self.trainer, "callback_handler", None)
            if handler is None:
                if not self._warned:
                    warnings.warn(
                        "AlignmentCallback has no trainer: its values go to state.log_history only, "
                        "not to the logging integrations; use widthscope.monitor.hf.attach(trainer, "
                        "monitor)",
                        stacklevel=3,
                    )
                    self._warned = True
                return control
            should_log = control.should_log
            out = handler.on_log(args, state, control, logs=logs)  # it sets control.should_log = False
            control = out if out is not None else control
            control.should_log = should_log
            return control

    return AlignmentCallback


__getattr__ = lazy_class(__name__, "AlignmentCallback", _make_class)


def _check_trainer(args: Any, trainer: Any, model: Any) -> None:
    """Refuse a Trainer configured for FSDP or an FSDP model."""
    fsdp = getattr(args, "fsdp", None)
    if fsdp or getattr(trainer, "is_fsdp_enabled", False) is True:
        raise WidthscopeError(
            f"the alignment monitor cannot probe a Trainer that shards the model with FSDP "
            f"(TrainingArguments.fsdp={fsdp!r}); {FSDP_FIX}"
        )
    check_not_fsdp(model, "the alignment monitor")


def attach(
    trainer: Any,
    monitor: AlignmentMonitor | None = None,
    prefix: str = "align",
    *,
    train: Any = None,
    test: Any = None,
    options: MonitorOptions | None = None,
    **keywords: Any,
) -> Any:
    """Add an :class:`AlignmentCallback` holding ``trainer`` to it (without a ``monitor``, one is built on
    ``trainer.model``); returns the callback."""
    cb = __getattr__("AlignmentCallback")(
        monitor, trainer=trainer, prefix=prefix, train=train, test=test, options=options, **keywords
    )
    trainer.add_callback(cb)
    return cb
