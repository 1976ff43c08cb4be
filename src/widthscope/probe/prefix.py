r"""Held-out losses after ``E`` steps at a point, running the network before it once.

:func:`stacked_totals` gives ``Σ_i ℓ_i(z + v_e)`` for every step ``e``, replaying the outputs of the
modules that finish before the point (or running the whole network). Details: docs/interventions.md §2.
"""

from __future__ import annotations

import contextlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn as nn

from ..errors import WidthscopeError
from .batches import batch_size_of, cat_batches, take, to_batches
from .collect import EvalMode, float_dtype, hooked, run_batch, split_output, to_device
from .insert import channel_dim
from .offload import input_device

__all__ = ["FnSteps", "KeptPrefix", "capture_outputs", "keep_prefix", "stacked_totals"]


class _Stop(Exception):
    """The capture forward reached the end of the point (skips the rest of the network)."""


class Unsupported(Exception):
    """The cached path cannot be used for this model and point; the message says why."""


@dataclass(frozen=True)
class Plan:
    """The modules whose outputs the stacked pass replays, outermost first, and whether the point's too."""

    cached: tuple[str, ...]
    point_cached: bool

    def kept(self, point: str) -> tuple[str, ...]:
        return self.cached + ((point,) if self.point_cached else ())


def _signature(out: Any) -> tuple | None:
    """Shapes of a tensor / tuple-of-tensors output (None entries kept), or None if unsupported."""
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape),) if out.ndim >= 1 else None
    if isinstance(out, (tuple, list)) and out:
        parts: list[tuple[int, ...] | None] = []
        for o in out:
            if o is not None and not (isinstance(o, torch.Tensor) and o.ndim >= 1):
                return None
            parts.append(None if o is None else tuple(o.shape))
        return tuple(parts) if any(p is not None for p in parts) else None
    return None


def _batch_major(s2: tuple | None, s3: tuple | None) -> bool:
    """Output signatures on 2 and 3 examples: every tensor's first dim is the batch, the rest fixed."""
    if s2 is None or s3 is None or len(s2) != len(s3):
        return False
    return all(
        (a is None) == (b is None) and (a is None or (a[0] == 2 and b[0] == 3 and a[1:] == b[1:]))
        for a, b in zip(s2, s3)
    )


def _map(out: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out)
    parts = [None if o is None else fn(o) for o in out]
    return tuple(parts) if isinstance(out, tuple) else parts


class FnSteps:
    """``E`` steps ``z + coef[e] · fn(z)`` (``fn`` run once, on copy 0); sliced like an ``(E, N)`` tensor."""

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


def _add_steps(z: torch.Tensor, steps: torch.Tensor | FnSteps) -> torch.Tensor:
    """Add ``steps[e]`` (a channel vector) to copy ``e`` of the ``E`` stacked copies in ``z``."""
    if isinstance(steps, FnSteps):
        return steps.add(z)
    E = steps.shape[0]
    c = channel_dim(z)
    shape = [E, 1] + [1] * (z.ndim - 1)
    shape[c + 1] = z.shape[c]
    v = steps.to(z.device, z.dtype).view(shape)
    return (z.view(E, z.shape[0] // E, *z.shape[1:]) + v).view(z.shape)


def _step_hook(point: str, steps: torch.Tensor | FnSteps) -> Callable:
    """A forward hook (also called with ``None, None, out``) adding the steps to the point's output."""

    def hook(_m: Any, _i: Any, out: Any) -> Any:
        z, put = split_output(out, point)
        return put(_add_steps(z, steps))

    return hook


def _forward(model: nn.Module, batch: Any, loss_fn: Callable | None) -> torch.Tensor | None:
    """Per-example losses of one batch; None when a capture hook stopped the forward."""
    try:
        return run_batch(model, batch, loss_fn, 0)[0]
    except _Stop:
        return None


def _record(
    model: nn.Module, points: Sequence[str], batch: Any, loss_fn: Callable | None
) -> dict[str, tuple[dict[str, tuple[int, tuple | None]], tuple | None]]:
    """Per point: (calls, output signature) of each module finished before it started, and its own signature."""
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
                out_point[name] = _signature(out)
                if len(out_point) == len(want):
                    raise _Stop
            ended[name] = (ended.get(name, (0, None))[0] + 1, _signature(out))

        return hook

    with hooked([(m, make(n)) for n, m in modules.items()], pre=[(modules[p], pre(p)) for p in want]):
        _forward(model, batch, loss_fn)
    return {p: (before[p], out_point[p]) for p in points if p in out_point}


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


def plans(
    model: nn.Module, points: Sequence[str], batch2: Any, batch3: Any, loss_fn: Callable | None
) -> dict[str, Plan]:
    """The plan of every point that runs, from two forward passes in all (2 and 3 examples)."""
    r2, r3 = _record(model, points, batch2, loss_fn), _record(model, points, batch3, loss_fn)
    return {p: _plan_from(model, p, r2[p], r3[p]) for p in points if p in r2 and p in r3}


def capture_outputs(model: nn.Module, point: str, p: Plan, batch: Any, loss_fn: Callable | None) -> dict[str, Any]:
    """Outputs (cloned: later in-place ops must not change them) of the planned modules and the point."""
    modules = dict(model.named_modules())
    keep: dict[str, Any] = {}

    def make(name: str) -> Callable:
        def hook(_m: nn.Module, _a: Any, out: Any) -> None:
            if name in keep:
                raise Unsupported(f"{name!r} ran twice before {point!r}")
            keep[name] = _map(out, lambda t: t.detach().clone())
            if name == point:
                raise _Stop

        return hook

    names = list(p.cached) + [point]
    with hooked([(modules[n], make(n)) for n in names]):
        if _forward(model, batch, loss_fn) is not None:
            raise Unsupported(f"{point!r} did not run in the forward pass")
    missing = [n for n in names if n not in keep]
    if missing:
        raise Unsupported(f"{', '.join(missing)} did not run before {point!r} in this batch")
    return keep


@contextmanager
def _replaced(model: nn.Module, point: str, p: Plan, keep: dict[str, Any], steps: Any) -> Iterator[dict[str, int]]:
    """Planned modules return their kept outputs repeated ``E`` times (the point's stepped); yields call counts."""
    E = steps.shape[0]
    put_steps = _step_hook(point, steps)
    calls = dict.fromkeys(p.kept(point), 0)
    saved: list[tuple[nn.Module, bool, Any]] = []

    def stub(name: str) -> Callable:
        def forward(*_a: Any, **_k: Any) -> Any:
            calls[name] += 1
            if calls[name] > 1:
                raise Unsupported(f"{name!r} runs more than once in a forward pass (a shared module)")
            out = _map(keep[name], lambda t: t.repeat(E, *([1] * (t.ndim - 1))))
            return put_steps(None, None, out) if name == point else out

        return forward

    try:
        for name in calls:
            m = model.get_submodule(name)
            saved.append((m, "forward" in m.__dict__, m.__dict__.get("forward")))
            m.forward = stub(name)  # instance attribute: nn.Module.__call__ calls it, hooks still run
        yield calls
    finally:
        for m, had, old in saved:
            if had:
                m.forward = old
            else:
                del m.forward


class KeptPrefix:
    """The first ``n`` rows of every point's planned outputs, recorded in passes the caller runs anyway."""

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
        return list(dict.fromkeys(n for point, p in self.plans.items() for n in p.kept(point)))

    def _fail(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.parts.clear()
        self.outputs.clear()

    def hook(self, name: str) -> Callable:
        def record(_m: nn.Module, _a: Any, out: Any) -> None:
            got = self.count.get(name, 0)
            if self.reason is not None or got >= self.n:
                return
            if _signature(out) is None:
                return self._fail(f"{name!r} returned no batch-major tensors")
            part = _map(out, lambda t: t.detach()[: self.n - got].clone())
            tensors = [t for t in ((part,) if isinstance(part, torch.Tensor) else part) if t is not None]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            if self.bytes > self.max_bytes:
                return self._fail(f"the kept outputs would exceed {self.max_bytes:.3g} bytes")
            self.parts.setdefault(name, []).append(part)
            self.count[name] = got + tensors[0].shape[0]

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
                    joined = [None if c[0] is None else torch.cat(c) for c in zip(*parts)]
                    self.outputs[name] = tuple(joined) if isinstance(parts[0], tuple) else joined
            except (RuntimeError, TypeError, ValueError) as exc:
                return self._fail(f"{name!r}'s outputs differ in shape across batches ({type(exc).__name__})")
        self.parts.clear()

    def covers(self, point: str, n: int) -> bool:
        """Recorded, usable, planned for ``point`` and at least ``n`` rows."""
        return self.done and self.reason is None and point in self.plans and n <= self.n

    def rows(self, point: str, start: int, stop: int) -> dict[str, Any]:
        """The kept outputs of ``point``'s plan for rows ``start:stop`` (as :func:`capture_outputs` gives them)."""
        return {n: _map(self.outputs[n], lambda t: t[start:stop]) for n in self.plans[point].kept(point)}


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
    """Record what every point's cached path captures for the first ``n`` examples of ``data`` during
    the forward passes inside the block (at most ``max_bytes``), for :func:`stacked_totals`."""
    kept = KeptPrefix(n, max_bytes)
    if batch_size_of(data) < 3:
        kept.reason = "fewer than 3 examples"
        yield kept
        return
    with EvalMode(model), torch.no_grad():
        try:
            kept.plans = plans(model, points, to_dev(take(data, 2)), to_dev(take(data, 3)), loss_fn)
        except WidthscopeError as exc:  # the model's own error: the interventions meet it themselves
            kept.reason = str(exc).splitlines()[0]
    modules = dict(model.named_modules())
    try:
        with hooked([(modules[name], kept.hook(name)) for name in kept.names()]):
            yield kept
    finally:
        kept.finish()


def _chunk_rows(
    model: nn.Module,
    point: str,
    steps: Any,
    batch: Any,
    loss_fn: Callable | None,
    bi: int = 0,
    p: Plan | None = None,
    keep: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Per-row losses ``(E·B,)`` of a chunk stacked ``E`` times, ``steps[e]`` added at ``point`` (``p``: cached)."""
    if p is not None and keep is None:
        keep = capture_outputs(model, point, p, batch, loss_fn)
    hooks = [(model.get_submodule(point), _step_hook(point, steps))] if p is None or not p.point_cached else []
    replace: contextlib.AbstractContextManager[dict[str, int]] = (
        contextlib.nullcontext({}) if p is None else _replaced(model, point, p, keep or {}, steps)
    )
    with hooked(hooks), replace as calls:
        losses, _, _ = run_batch(model, cat_batches([batch] * steps.shape[0]), loss_fn, bi)
    skipped = [n for n, c in calls.items() if c != 1]
    if skipped:
        raise Unsupported(f"{', '.join(skipped)} did not call the replaced forward")
    return losses.detach().to("cpu", torch.float64)


def _totals(
    model: nn.Module,
    point: str,
    steps: Any,
    chunks: Iterable[Any],
    loss_fn: Callable | None,
    p: Plan | None = None,
    kept: KeptPrefix | None = None,
    first: torch.Tensor | None = None,
) -> torch.Tensor:
    """The float64 loss sums of ``chunks`` per stacked copy; the first 3 losses must match ``first``."""
    E = steps.shape[0]
    totals = torch.zeros(E, dtype=torch.float64)
    new = torch.zeros(0, dtype=torch.float64)
    dt = float_dtype(model)
    tol = min(64 * torch.finfo(dt if dt is not None and dt.is_floating_point else torch.float32).eps, 1e-3)
    start = 0
    for bi, b in enumerate(chunks):
        B = batch_size_of(b)
        keep = kept.rows(point, start, start + B) if kept is not None else None
        rows = _chunk_rows(model, point, steps, b, loss_fn, bi, p, keep).view(E, -1)
        if first is not None and new.numel() < 3:
            new = torch.cat([new, rows[-1, : 3 - new.numel()]])
            if new.numel() == 3 and not torch.allclose(new, first, rtol=tol, atol=tol):
                raise Unsupported(
                    f"the cached path's losses differ from the full forward's by "
                    f"{float((new - first).abs().max()):.3g} (tolerance {tol:.2g}) on the first 3 examples"
                )
        totals += rows.sum(1)
        start += B
    return totals


def stacked_totals(
    model: nn.Module,
    point: str,
    steps: torch.Tensor | FnSteps,
    data: Any,
    loss_fn: Callable | None,
    batch_size: int,
    dtype: torch.dtype | None,
    *,
    mode: str = "auto",
    kept: KeptPrefix | None = None,
) -> tuple[torch.Tensor, str]:
    """``Σ_i ℓ_i`` over ``data`` with ``steps[e]`` added at ``point`` (float64 ``(E,)``), and ``"cached"`` or
    ``"full: <reason>"`` (``auto`` falls back to full when the cached path fails or differs)."""
    dev = input_device(model)
    per = max(1, batch_size // steps.shape[0])
    chunks = lambda: (to_device(b, dev, dtype) for b in to_batches(data, per))  # moved one at a time

    def full(reason: str) -> tuple[torch.Tensor, str]:
        return _totals(model, point, steps, chunks(), loss_fn), f"full: {reason}"

    if mode == "full":
        return full("requested")
    if batch_size_of(data) < 3:
        return full("fewer than 3 examples")
    three = [to_device(take(data, n), dev, dtype) for n in (2, 3)]
    first = _chunk_rows(model, point, steps[-1:], three[1], loss_fn)  # the model's own errors, first
    try:
        src = kept if kept is not None and kept.covers(point, batch_size_of(data)) else None
        if src is not None:
            p = src.plans[point]
        else:
            got = plans(model, [point], three[0], three[1], loss_fn)
            if point not in got:
                raise Unsupported(f"{point!r} did not run in the forward pass")
            p = got[point]
        if not p.cached and not p.point_cached:
            raise Unsupported("no module before the point can be kept")
        return _totals(model, point, steps, chunks(), loss_fn, p, src, first), "cached"
    except (Unsupported, WidthscopeError) as exc:
        return full(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
