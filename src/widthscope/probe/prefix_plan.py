"""The cached path's plan and capture (the first steps of :mod:`widthscope.probe.prefix`).

What a module returned (:func:`output_signature`: shapes, checked batch-major on 2 and 3 examples), the
steps added at the point (:func:`add_steps`, :class:`FnSteps`), :func:`plan` / :func:`plans` (which
outermost modules finish before the point and can be kept), :func:`capture_outputs` (their outputs on a
chunk) and :class:`Replaced` (their ``forward`` replaced by the kept outputs during the stacked pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .collect import run_batch
from .insert import channel_dim


class _Stop(Exception):
    """The capture forward reached the end of the point (skips the rest of the network)."""


class Unsupported(Exception):
    """The cached path cannot be used for this model and point; the message says why."""


@dataclass(frozen=True)
class Plan:
    """Which modules the stacked pass takes from the capture (``cached``), outermost first in
    module order, and whether ``point``'s own forward is skipped too (``point_cached``)."""

    cached: tuple[str, ...]
    point_cached: bool


# ----------------------------------------------------------------------------- module outputs
def output_signature(out: Any) -> tuple | None:
    """Shapes of a tensor / tuple-of-tensors output (None entries kept), or None if unsupported."""
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape),) if out.ndim >= 1 else None
    if isinstance(out, (tuple, list)) and out:
        parts: list[tuple[int, ...] | None] = []
        for o in out:
            if o is None:
                parts.append(None)
            elif isinstance(o, torch.Tensor) and o.ndim >= 1:
                parts.append(tuple(o.shape))
            else:
                return None
        return tuple(parts) if any(p is not None for p in parts) else None
    return None


def _batch_major(s2: tuple | None, s3: tuple | None) -> bool:
    """Output signatures on 2 and 3 examples: every tensor's first dim is the batch, the rest fixed."""
    if s2 is None or s3 is None or len(s2) != len(s3):
        return False
    for a, b in zip(s2, s3):
        if (a is None) != (b is None):
            return False
        if a is not None and not (a[0] == 2 and b[0] == 3 and a[1:] == b[1:]):
            return False
    return True


def map_output(out: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out)
    parts = [None if o is None else fn(o) for o in out]
    return tuple(parts) if isinstance(out, tuple) else parts


def _repeat(out: Any, E: int) -> Any:
    return map_output(out, lambda t: t.repeat(E, *([1] * (t.ndim - 1))))


class FnSteps:
    """``E`` steps along a function of the point's output: copy ``e`` of ``z`` becomes
    ``z + coef[e] · fn(z)`` (the block probe: ``fn(z) = G_M φ(W_in norm(z))``, ``coef = −η``).
    ``fn`` runs once, on the first copy: the copies are equal before the step. Sliced like the
    ``(E, N)`` tensor of bias steps (``steps[-1:]``, ``steps.shape[0]``)."""

    def __init__(self, coef: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.coef, self.fn = coef, fn
        self.shape = tuple(coef.shape)

    def __getitem__(self, idx: Any) -> FnSteps:
        return FnSteps(self.coef[idx], self.fn)

    def add(self, z: torch.Tensor) -> torch.Tensor:
        E = self.coef.shape[0]
        zz = z.view(E, z.shape[0] // E, *z.shape[1:])
        c = self.coef.to(z.device, z.dtype).view(E, *([1] * z.ndim))
        return (zz + c * self.fn(zz[0])).view(z.shape)


def add_steps(z: torch.Tensor, steps: torch.Tensor | FnSteps) -> torch.Tensor:
    """``z`` holds ``E = len(steps)`` stacked copies of a batch; add ``steps[e]`` (a channel
    vector, broadcast over positions) to copy ``e`` (or what :class:`FnSteps` says)."""
    if isinstance(steps, FnSteps):
        return steps.add(z)
    E = steps.shape[0]
    c = channel_dim(z)
    shape = [E, 1] + [1] * (z.ndim - 1)
    shape[c + 1] = z.shape[c]
    v = steps.to(z.device, z.dtype).view(shape)
    return (z.view(E, z.shape[0] // E, *z.shape[1:]) + v).view(z.shape)


# ----------------------------------------------------------------------------- plan / capture
def _forward(model: nn.Module, batch: Any, loss_fn: Callable | None) -> torch.Tensor | None:
    """Per-example losses of one batch; None when a capture hook stopped the forward."""
    try:
        return run_batch(model, batch, loss_fn, 0)[0]
    except _Stop:
        return None


def _until_point(model: nn.Module, point: str, batch: Any, loss_fn: Callable | None, handles: list) -> None:
    """Forward ``batch`` with the hooks ``handles`` (one stops the pass at the end of ``point``), then remove them."""
    try:
        if _forward(model, batch, loss_fn) is not None:
            raise Unsupported(f"{point!r} did not run in the forward pass")
    finally:
        for h in handles:
            h.remove()


def _record_all(
    model: nn.Module, points: Sequence[str], batch: Any, loss_fn: Callable | None
) -> dict[str, tuple[dict[str, tuple[int, tuple | None]], tuple | None]]:
    """Forward ``batch`` until every point of ``points`` has finished once: for each point that
    ran, name -> (calls, output signature) of every module that finished before it started,
    and its own output signature. One pass serves all points."""
    modules = dict(model.named_modules())
    want = set(points)
    ended: dict[str, tuple[int, tuple | None]] = {}
    before: dict[str, dict[str, tuple[int, tuple | None]]] = {}
    out_point: dict[str, tuple | None] = {}

    def pre(name: str) -> Callable:
        def hook(_m: nn.Module, _a: Any) -> None:
            before.setdefault(name, dict(ended))

        return hook

    def make(name: str) -> Callable:
        def hook(_m: nn.Module, _a: Any, out: Any) -> None:
            if name in want and name in before and name not in out_point:
                out_point[name] = output_signature(out)
                if len(out_point) == len(want):
                    raise _Stop
            ended[name] = (ended.get(name, (0, None))[0] + 1, output_signature(out))

        return hook

    handles = [modules[p].register_forward_pre_hook(pre(p)) for p in want]
    handles += [m.register_forward_hook(make(n)) for n, m in modules.items()]
    try:
        _forward(model, batch, loss_fn)
    finally:
        for h in handles:
            h.remove()
    return {p: (before[p], out_point[p]) for p in points if p in out_point}


def _record(
    model: nn.Module, point: str, batch: Any, loss_fn: Callable | None
) -> tuple[dict[str, tuple[int, tuple | None]], tuple | None]:
    """:func:`_record_all` of one point (which must run)."""
    got = _record_all(model, [point], batch, loss_fn)
    if point not in got:
        raise Unsupported(f"{point!r} did not run in the forward pass")
    return got[point]


def _plan_from(model: nn.Module, point: str, r2: tuple, r3: tuple) -> Plan:
    """The plan of ``point`` from its records on 2 and 3 examples."""
    (e2, p2), (e3, p3) = r2, r3
    ok = {n for n in e2 if n in e3 and e2[n][0] == 1 and e3[n][0] == 1 and _batch_major(e2[n][1], e3[n][1])}
    cached: list[str] = []

    def walk(prefix: str, module: nn.Module) -> None:
        for child, sub in module.named_children():
            name = f"{prefix}.{child}" if prefix else child
            if name == point:
                continue
            if name in ok:
                cached.append(name)
            elif name in e2 or point.startswith(name + "."):
                walk(name, sub)  # finished before but not keepable, or an ancestor of the point

    walk("", model)
    return Plan(tuple(cached), _batch_major(p2, p3))


def plan(model: nn.Module, point: str, batch2: Any, batch3: Any, loss_fn: Callable | None) -> Plan:
    """Outermost modules that finish before ``point`` starts, run once and return batch-major
    tensors (checked on 2 and 3 examples); descends into those that finish before but do not."""
    return _plan_from(model, point, _record(model, point, batch2, loss_fn), _record(model, point, batch3, loss_fn))


def plans(
    model: nn.Module, points: Sequence[str], batch2: Any, batch3: Any, loss_fn: Callable | None
) -> dict[str, Plan]:
    """:func:`plan` of every point that runs, from two forward passes in all (2 and 3 examples)."""
    r2, r3 = _record_all(model, points, batch2, loss_fn), _record_all(model, points, batch3, loss_fn)
    return {p: _plan_from(model, p, r2[p], r3[p]) for p in points if p in r2 and p in r3}


def capture_outputs(model: nn.Module, point: str, p: Plan, batch: Any, loss_fn: Callable | None) -> dict[str, Any]:
    """Outputs (cloned: later in-place ops must not change them) of the planned modules and the point."""
    modules = dict(model.named_modules())
    keep: dict[str, Any] = {}

    def make(name: str) -> Callable:
        def hook(_m: nn.Module, _a: Any, out: Any) -> None:
            if name in keep:
                raise Unsupported(f"{name!r} ran twice before {point!r}")
            keep[name] = map_output(out, lambda t: t.detach().clone())
            if name == point:
                raise _Stop

        return hook

    names = list(p.cached) + [point]
    handles = [modules[n].register_forward_hook(make(n)) for n in names]
    _until_point(model, point, batch, loss_fn, handles)
    missing = [n for n in names if n not in keep]
    if missing:
        raise Unsupported(f"{', '.join(missing)} did not run before {point!r} in this batch")
    return keep


class Replaced:
    """Within the block: each planned module's ``forward`` returns its kept output repeated
    ``E`` times, the point's adds the steps; restored on exit. :meth:`verify` then checks that
    each ran exactly once (a shared module, or a class that bypasses ``forward``, is caught)."""

    def __init__(
        self,
        model: nn.Module,
        point: str,
        p: Plan,
        keep: dict[str, Any],
        steps: torch.Tensor,
        put_steps: Callable[[Any], Any],
    ):
        E = steps.shape[0]
        self.modules = dict(model.named_modules())
        self.calls = dict.fromkeys(list(p.cached) + ([point] if p.point_cached else []), 0)

        def value(n: str) -> Callable[[], Any]:
            return lambda: _repeat(keep[n], E)

        self.values: dict[str, Callable[[], Any]] = {n: value(n) for n in p.cached}
        if p.point_cached:
            self.values[point] = lambda: put_steps(_repeat(keep[point], E))
        self.point = point
        self.saved: list[tuple[nn.Module, bool, Any]] = []

    def _stub(self, name: str) -> Callable:
        def forward(*_a: Any, **_k: Any) -> Any:
            self.calls[name] += 1
            if self.calls[name] > 1:
                raise Unsupported(f"{name!r} runs more than once in a forward pass (a shared module)")
            return self.values[name]()

        return forward

    def __enter__(self) -> Replaced:
        for name in self.calls:
            m = self.modules[name]
            self.saved.append((m, "forward" in m.__dict__, m.__dict__.get("forward")))
            m.forward = self._stub(name)  # instance attribute: nn.Module.__call__ calls it, hooks still run
        return self

    def __exit__(self, *exc: Any) -> None:
        for m, had, old in self.saved:
            if had:
                m.forward = old
            else:
                del m.forward
        self.saved.clear()

    def verify(self) -> None:
        skipped = [n for n, c in self.calls.items() if c != 1]
        if skipped:
            raise Unsupported(f"{', '.join(skipped)} did not call the replaced forward")
