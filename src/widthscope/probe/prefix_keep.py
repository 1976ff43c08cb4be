"""The outputs the cached path needs, recorded during the caller's own forward passes (the last
step of :mod:`widthscope.probe.prefix`): :func:`keep_prefix` -> :class:`KeptPrefix`, so that the
interventions need no capture forward (certify wraps its held-out probe in it).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn

from ..errors import WidthscopeError
from .batches import batch_size_of, take
from .prefix_plan import Plan, map_output, output_signature, plans


class KeptPrefix:
    """The planned outputs of every point's cached path over the first ``n`` examples, recorded
    by forward hooks during passes the caller runs anyway (:func:`keep_prefix`).

    ``plans``: point -> :class:`Plan`; ``outputs``: module -> its output over the ``n`` rows
    (batch-major, as the plan checked); ``reason``: why nothing is usable (``None`` if usable).
    Recording stops (and frees what it held) once it would exceed ``max_bytes``."""

    def __init__(self, n: int, max_bytes: float):
        self.n, self.max_bytes = int(n), float(max_bytes)
        self.plans: dict[str, Plan] = {}
        self.parts: dict[str, list[Any]] = {}
        self.count: dict[str, int] = {}
        self.outputs: dict[str, Any] = {}
        self.bytes = 0
        self.reason: str | None = None
        self.done = False

    def names(self) -> list[str]:
        """Modules whose outputs some plan takes (a point's own only where its output is batch-major)."""
        out: dict[str, None] = {}
        for point, p in self.plans.items():
            out.update(dict.fromkeys(p.cached + ((point,) if p.point_cached else ())))
        return list(out)

    def _fail(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.parts.clear()
        self.outputs.clear()

    def hook(self, name: str) -> Callable:
        def record(_m: nn.Module, _a: Any, out: Any) -> None:
            got = self.count.get(name, 0)
            if self.reason is not None or got >= self.n:
                return
            sig = output_signature(out)
            if sig is None:
                return self._fail(f"{name!r} returned no batch-major tensors")
            part = map_output(out, lambda t: t.detach()[: self.n - got].clone())
            part_sig = output_signature(part)
            assert part_sig is not None  # rows of out, which has one
            rows = next(s for s in part_sig if s is not None)[0]
            self.bytes += sum(
                t.numel() * t.element_size()
                for t in ((part,) if isinstance(part, torch.Tensor) else part)
                if t is not None
            )
            if self.bytes > self.max_bytes:
                return self._fail(f"the kept outputs would exceed {self.max_bytes:.3g} bytes")
            self.parts.setdefault(name, []).append(part)
            self.count[name] = got + rows

        return record

    def finish(self) -> None:
        """Concatenate each module's parts; a module short of ``n`` rows (or ragged) makes it unusable."""
        self.done = True
        if self.reason is not None:
            return
        for name in self.names():
            parts = self.parts.get(name, [])
            if self.count.get(name, 0) != self.n:
                return self._fail(f"{name!r} ran on {self.count.get(name, 0)} of {self.n} examples")
            try:
                if isinstance(parts[0], torch.Tensor):
                    self.outputs[name] = torch.cat(parts)
                else:
                    cols = list(zip(*parts))
                    joined = [None if c[0] is None else torch.cat(c) for c in cols]
                    self.outputs[name] = tuple(joined) if isinstance(parts[0], tuple) else joined
            except (RuntimeError, TypeError, ValueError) as exc:
                return self._fail(f"{name!r}'s outputs differ in shape across batches ({type(exc).__name__})")
        self.parts.clear()

    def covers(self, point: str, n: int) -> bool:
        """Recorded, usable, planned for ``point`` and at least ``n`` rows."""
        return self.done and self.reason is None and point in self.plans and n <= self.n

    def rows(self, point: str, start: int, stop: int) -> dict[str, Any]:
        """The kept outputs of ``point``'s plan for rows ``start:stop`` (as the capture,
        :func:`~widthscope.probe.prefix_plan._capture`, returns them)."""
        p = self.plans[point]
        names = p.cached + ((point,) if p.point_cached else ())
        return {n: map_output(self.outputs[n], lambda t: t[start:stop]) for n in names}


@contextmanager
def keep_prefix(
    model: nn.Module,
    points: Sequence[str],
    data: Any,
    n: int,
    loss_fn: Callable | None = None,
    to_dev: Callable[[Any], Any] = lambda b: b,
    *,
    max_bytes: float = 2**30,
) -> Iterator[KeptPrefix]:
    """Record, during the forward passes run inside the block, what the cached path of every
    point in ``points`` would capture for the first ``n`` examples of ``data`` (which those passes
    must run first and in order: certify wraps its held-out probe in it). Plans each point on the
    first 2 and 3 examples of ``data`` in eval mode before (two passes for all points); a point
    that does not run there is left out (its interventions plan and capture themselves). Memory: the outputs of the
    modules before the last point for ``n`` examples, at most ``max_bytes`` (beyond it nothing is kept).
    Hand the result to :func:`stacked_totals` (``kept=``) after the block."""
    kept = KeptPrefix(n, max_bytes)
    if batch_size_of(data) < 3:
        kept.reason = "fewer than 3 examples"
        yield kept
        return
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            try:
                kept.plans = plans(model, points, to_dev(take(data, 2)), to_dev(take(data, 3)), loss_fn)
            except WidthscopeError as exc:  # the model's own error: the interventions meet it themselves
                kept.reason = str(exc).splitlines()[0]
    finally:
        for m, mode in modes.items():
            m.training = mode
    modules = dict(model.named_modules())
    handles = [modules[name].register_forward_hook(kept.hook(name)) for name in kept.names()]
    try:
        yield kept
    finally:
        for h in handles:
            h.remove()
        kept.finish()
