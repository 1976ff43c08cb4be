r"""Growing a model inside a ``transformers.Trainer`` or a Lightning run: growth callbacks.

Usage::

    from widthscope.growth.callback import GrowthCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[GrowthCallback(grow_at_step=1000, operator="stack_copy", target_depth=8)])

The model grows once, in place (:func:`grow_in_place`), after step ``grow_at_step`` (or the first
where ``when(step)``), by a registered operator or a callable ``fn(model) -> Growth``; the optimizer
keeps its state and gains the new parameters (:func:`add_to_optimizer`). Rule: docs/growth.md.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from .. import _args
from ..errors import WidthscopeError
from ..monitor.rows import lazy_class
from ..registry import GROWTH_OPERATORS
from .operators import Growth

__all__ = ["GrowthCallback", "GrowthLightningCallback", "Grower", "grow_in_place", "add_to_optimizer"]

_log = logging.getLogger("widthscope.growth")

if TYPE_CHECKING:  # built on first use by the module __getattr__ below
    GrowthCallback: type
    GrowthLightningCallback: type


def _unwrap(obj: Any, attr: str, base: type) -> Any:
    """The torch object under a wrapper (e.g. accelerate's ``AcceleratedOptimizer.optimizer``)."""
    while obj is not None and not isinstance(obj, base) and hasattr(obj, attr):
        obj = getattr(obj, attr)
    return obj


def grow_in_place(model: nn.Module, growth: Growth) -> dict[int, nn.Parameter | None]:
    """Make ``model`` the grown model of ``growth``, keeping the old parameter objects whose values
    are unchanged. Returns the new parameters (by ``id``) with the old one each grew from, or ``None``."""
    grown = growth.model
    old = dict(model.named_parameters())
    reuse: dict[int, nn.Parameter] = {}
    origin: dict[int, nn.Parameter | None] = {}
    with torch.no_grad():
        for name, p in grown.named_parameters():
            src = growth.sources.get(name)
            q = old.get(src[0]) if src is not None else None
            origin[id(p)] = q
            if q is None or any(id(q) == id(r) for r in reuse.values()) or q.shape != p.shape:
                continue
            full = all(s == slice(0, n) for s, n in zip(src[1], q.shape, strict=False)) if src else False
            if full and torch.equal(q, p):
                reuse[id(p)] = q
    for mod in grown.modules():
        for key, param in list(mod._parameters.items()):
            if param is not None and id(param) in reuse:
                mod._parameters[key] = reuse[id(param)]
    for key in ("_parameters", "_buffers", "_modules"):
        model.__dict__[key] = grown.__dict__[key]
    for key, value in grown.__dict__.items():  # the config, widthscope_config, ...; not wrapped methods
        if not key.startswith("_") and not callable(value) and key != "training":
            model.__dict__[key] = value
    before = {id(p) for p in old.values()}
    return {id(p): origin.get(id(p)) for p in model.parameters() if id(p) not in before}


def add_to_optimizer(
    model: nn.Module, optimizer: Any, scheduler: Any = None, origin: dict[int, nn.Parameter | None] | None = None
) -> int:
    """Drop the parameters ``model`` no longer holds and add its new trainable ones in new groups
    with the settings (and ``scheduler`` entries) of their ``origin``'s group, else the first
    group's; returns the number of entries added."""
    opt = _unwrap(optimizer, "optimizer", torch.optim.Optimizer)
    if not isinstance(opt, torch.optim.Optimizer):
        raise WidthscopeError(f"growth: cannot update a {type(optimizer).__name__}; a torch.optim.Optimizer is needed")
    origin = origin or {}
    group_of = {id(p): k for k, g in enumerate(opt.param_groups) for p in g["params"]}
    held = {id(p) for p in model.parameters()}
    for group in opt.param_groups:
        for p in [p for p in group["params"] if id(p) not in held]:
            opt.state.pop(p, None)
        group["params"] = [p for p in group["params"] if id(p) in held]
    have = {id(p) for g in opt.param_groups for p in g["params"]}
    new: dict[int, list[nn.Parameter]] = {}
    for p in model.parameters():
        if p.requires_grad and id(p) not in have:
            new.setdefault(group_of.get(id(origin.get(id(p))), 0), []).append(p)
    sched = _unwrap(scheduler, "scheduler", torch.optim.lr_scheduler.LRScheduler)
    for k in sorted(new):
        settings = {key: v for key, v in opt.param_groups[k].items() if key != "params"}
        opt.add_param_group({**settings, "params": new[k]})
        for attr in ("base_lrs", "lr_lambdas", "_last_lr"):
            values = getattr(sched, attr, None)
            if isinstance(values, list) and len(values) == len(opt.param_groups) - 1:
                values.append(values[k])
    return sum(p.numel() for ps in new.values() for p in ps)


class Grower:
    """When and how to grow, shared by both callbacks."""

    def __init__(
        self,
        grow_at_step: int | None = None,
        operator: str | Callable[[nn.Module], Growth] = "stack_copy",
        *,
        target_depth: int | None = None,
        target_width: int | None = None,
        when: Callable[[int], bool] | None = None,
        seed: int = 0,
    ) -> None:
        fn = "GrowthCallback"
        _args.integer(fn, "grow_at_step", grow_at_step, lo=0, optional=True)
        if (grow_at_step is None) == (when is None):
            raise WidthscopeError(f"{fn}: give grow_at_step=N or when=fn(step) -> bool (one of them)")
        if not callable(operator):
            axis = GROWTH_OPERATORS.info(operator)["axis"]  # an unknown name is refused here
            size = target_depth if axis == "depth" else target_width
            other = target_width if axis == "depth" else target_depth
            if size is None or other is not None:
                raise WidthscopeError(
                    f"{fn}(operator={operator!r}): grows the {axis}; give target_{axis}=... (and not the other)"
                )
            _args.integer(fn, f"target_{axis}", size, lo=1)
        self.grow_at_step, self.operator, self.when, self.seed = grow_at_step, operator, when, int(seed)
        self.size = target_depth if target_depth is not None else target_width
        self.events: list[dict[str, Any]] = []

    def due(self, step: int) -> bool:
        if self.events:
            return False
        return step == self.grow_at_step if self.when is None else bool(self.when(step))

    def grow(self, model: Any, optimizer: Any, scheduler: Any, step: int) -> dict[str, Any]:
        """Grow ``model`` in place and update ``optimizer`` and ``scheduler``."""
        if model is None or optimizer is None:
            raise WidthscopeError("growth: the callback got no model or no optimizer at the growth step")
        cfg: Any = getattr(model, "config", None)
        layers = getattr(cfg, "num_hidden_layers", None)
        if callable(self.operator):
            g = self.operator(model)
        else:
            cell = {"width": getattr(cfg, "hidden_size", None)}
            g = GROWTH_OPERATORS.get(self.operator)(model, self.size, cell=cell, seed=self.seed)
        if not isinstance(g, Growth):
            raise WidthscopeError(f"growth: the operator returned a {type(g).__name__}, not a Growth")
        if getattr(model, "training", False):
            g.model.train()
        origin = grow_in_place(model, g)
        added = add_to_optimizer(model, optimizer, scheduler, origin)
        event = {
            "step": int(step),
            "operator": g.operator,
            "layers_before": layers,
            "layers_after": getattr(getattr(model, "config", None), "num_hidden_layers", None),
            "new_parameters": g.new_parameters,
            "optimizer_parameters_added": added,
        }
        self.events.append(event)
        _log.info("grew the model at step %d: %s", step, event)
        return event


def _hf_class() -> type:
    from transformers import TrainerCallback  # heavy: imported when the class is first asked for

    class GrowthCallback(TrainerCallback, Grower):  # type: ignore[misc, valid-type]
        """Grows the Trainer's model after an optimizer step (``on_step_end``)."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self.due(int(state.global_step)):
                if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
                    raise WidthscopeError("GrowthCallback cannot grow a model sharded by FSDP or DeepSpeed")
                self.grow(kw.get("model"), kw.get("optimizer"), kw.get("lr_scheduler"), int(state.global_step))
            return control

    return GrowthCallback


def _lightning_class() -> type:
    for package in ("lightning.pytorch.callbacks", "pytorch_lightning.callbacks"):  # the newer name first
        try:
            Callback: Any = importlib.import_module(package).Callback  # optional: the Lightning extra
            break
        except ImportError:
            continue
    else:
        raise WidthscopeError("GrowthLightningCallback needs Lightning: pip install 'widthscope[lightning]'")

    class GrowthLightningCallback(Callback, Grower):  # type: ignore[misc, valid-type]
        """Grows ``model`` (a network inside the ``LightningModule``, default the module) after an
        optimizer step (``on_train_batch_end``), updating ``trainer.optimizers[0]``."""

        def __init__(self, grow_at_step: int | None = None, *a: Any, model: Any = None, **kw: Any) -> None:
            Callback.__init__(self)
            Grower.__init__(self, grow_at_step, *a, **kw)
            self.model = model

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            step = int(trainer.global_step)
            if not self.due(step):
                return
            net = pl_module if self.model is None else self.model
            if net is not pl_module and not any(m is net for m in pl_module.modules()):
                raise WidthscopeError(
                    f"GrowthLightningCallback(model=...): the {type(net).__name__} is not part of the "
                    f"{type(pl_module).__name__} being trained; pass the network it holds (e.g. lit.net)"
                )
            name = type(getattr(trainer, "strategy", None)).__name__
            if "FSDP" in name or "DeepSpeed" in name or name == "ModelParallelStrategy":
                raise WidthscopeError(f"GrowthLightningCallback cannot grow a model sharded by Lightning's {name}")
            configs = getattr(trainer, "lr_scheduler_configs", None) or []
            sched = configs[0].scheduler if configs else None
            self.grow(net, trainer.optimizers[0], sched, step)

    return GrowthLightningCallback


_LAZY = {
    name: lazy_class(__name__, name, make)
    for name, make in (("GrowthCallback", _hf_class), ("GrowthLightningCallback", _lightning_class))
}


def __getattr__(name: str) -> Any:
    return _LAZY.get(name, _LAZY["GrowthCallback"])(name)
