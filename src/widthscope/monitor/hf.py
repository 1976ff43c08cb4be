"""``transformers.Trainer`` adapter: the monitor as a ``TrainerCallback`` (transformers imported lazily).

Usage::

    from widthscope.monitor import AlignmentMonitor
    from widthscope.monitor.hf import attach
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    monitor = AlignmentMonitor(model, train_pool, test_pool, points=["model.layers.1"], every=50)
    attach(trainer, monitor)          # adds the callback and hands it the trainer
    trainer.train()

**How the values reach TensorBoard / W&B / MLflow.** A ``TrainerCallback`` receives ``args``,
``state``, ``control`` and ``model`` but not the trainer, and the integrations are themselves
callbacks that act in ``on_log``, registered *before* any user callback, so a callback that
edits the ``logs`` dict in its own ``on_log`` comes too late for them. The callback therefore
holds the trainer (:func:`attach` sets it) and, in ``on_step_end`` at a monitored step, calls
``trainer.log(metrics)``: that appends to ``state.log_history`` and runs every callback's
``on_log``, integrations included, exactly as the Trainer's own loss logging does. Without a
trainer (a callback built by hand) the metrics are appended to ``state.log_history`` only,
with a warning. The step is ``state.global_step`` (optimizer steps done), so with gradient
accumulation the monitor probes after the optimizer step, never between micro-batches. Under
several processes every rank probes its share of the pools and the main process logs.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from .core import FSDP_FIX, AlignmentMonitor, check_not_fsdp, lazy_class

__all__ = ["AlignmentCallback", "attach"]

if TYPE_CHECKING:  # built on first use by the module __getattr__ below
    AlignmentCallback: type


def _base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:  # pragma: no cover - transformers is a core dependency
        from ..errors import WidthscopeError

        raise WidthscopeError("widthscope.monitor.hf needs transformers: pip install 'widthscope[hf]'") from exc
    return TrainerCallback


def _make_class() -> type:
    base = _base()

    class AlignmentCallback(base):  # type: ignore[misc, valid-type]
        """Runs ``monitor.step(model, state.global_step)`` after each optimizer step and logs the rows."""

        def __init__(self, monitor: AlignmentMonitor, trainer: Any = None, prefix: str = "align") -> None:
            self.monitor, self.trainer, self.prefix = monitor, trainer, prefix
            self._warned = False

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            # The first hook that sees the prepared model: refuse FSDP before the first update.
            _check_trainer(args, self.trainer, model)
            # Step 0 (before any update) is a monitored step of the default log schedule.
            return self._probe(state, control, model)

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            return self._probe(state, control, model)

        def _probe(self, state: Any, control: Any, model: Any) -> Any:
            # Every rank probes (its share of the pools; the samples are gathered), one logs.
            rows = self.monitor.step(model if model is not None else self.monitor.model, int(state.global_step))
            if rows and getattr(state, "is_world_process_zero", True):
                metrics = AlignmentMonitor.metrics(rows, self.prefix)
                if self.trainer is not None:
                    self.trainer.log(metrics)
                else:
                    if not self._warned:
                        warnings.warn("AlignmentCallback has no trainer: its values go to state.log_history only, "
                                      "not to the logging integrations; use widthscope.monitor.hf.attach(trainer, "
                                      "monitor)", stacklevel=2)
                        self._warned = True
                    state.log_history.append({**metrics, "step": int(state.global_step)})
            return control

    return AlignmentCallback


__getattr__ = lazy_class(__name__, "AlignmentCallback", _make_class)


def _check_trainer(args: Any, trainer: Any, model: Any) -> None:
    """Refuse a Trainer configured for FSDP (``args.fsdp`` / accelerate's FSDP plugin) or an FSDP model."""
    from ..errors import WidthscopeError

    fsdp = getattr(args, "fsdp", None)
    if fsdp or getattr(trainer, "is_fsdp_enabled", False) is True:
        raise WidthscopeError(f"the alignment monitor cannot probe a Trainer that shards the model with FSDP "
                              f"(TrainingArguments.fsdp={fsdp!r}); {FSDP_FIX}")
    check_not_fsdp(model, "the alignment monitor")


def attach(trainer: Any, monitor: AlignmentMonitor, prefix: str = "align") -> Any:
    """Add an :class:`AlignmentCallback` holding ``trainer`` to it; returns the callback."""
    cb = __getattr__("AlignmentCallback")(monitor, trainer=trainer, prefix=prefix)
    trainer.add_callback(cb)
    return cb
