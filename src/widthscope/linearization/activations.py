"""Activation audit: ``max_x |φ^{(k)}(x)| / (k+1)!`` for ``k = 1..K`` (CLI ``widthscope activations``).

The weak-correlation condition for wide networks needs ``sup_x |φ^{(k)}(x)| ≤ O((k+1)!)``. Derivatives
are exact: nested autograd in float64 on a uniform grid. Flags: ``non-smooth`` (some ``φ^{(k)}`` jumps
between grid points by more than ``10·h·max|φ^{(k+1)}|``: ReLU's kink at ``k = 1``), ``ratio grows``
(``r_K > r_{K−1}``) and ``non-finite`` (NaN or inf on the grid: restrict the range to the domain).

Example::

    >>> from widthscope.linearization.activations import audit
    >>> rows = audit(["tanh", "relu"], K=4)
    >>> [r["smooth"] for r in rows]
    [True, False]
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import warnings
from typing import Any, Callable, ClassVar, Sequence

import torch

from .._io import atomic_write_json, check_space, format_table
from ..errors import WidthscopeError
from ..options import Options, option

__all__ = ["BUILTIN", "MAX_K", "resolve", "derivatives", "check_grid", "audit", "ActivationsOptions", "run_audit"]

MAX_K = 10  # highest derivative order audited (time and memory grow steeply with K)
BUILTIN: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "gelu": torch.nn.functional.gelu,
    "softplus": torch.nn.functional.softplus,
    "silu": torch.nn.functional.silu,
}


def resolve(name: str | Callable) -> tuple[str, Callable[[torch.Tensor], torch.Tensor]]:
    """A built-in name, a callable, or ``module:function`` (imported with importlib, never eval'd)."""
    if callable(name):
        return getattr(name, "__name__", "activation"), name
    name = str(name).strip()
    if name in BUILTIN:
        return name, BUILTIN[name]
    if ":" in name:
        mod_name, _, attr = name.partition(":")
        try:
            obj: Any = importlib.import_module(mod_name)
        except ImportError as exc:
            raise WidthscopeError(
                f"activation {name!r}: cannot import module {mod_name!r} ({exc}); check it is on PYTHONPATH"
            ) from None
        for part in attr.split("."):
            if not part.isidentifier() or not hasattr(obj, part):
                raise WidthscopeError(f"activation {name!r}: module {mod_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise WidthscopeError(f"activation {name!r} is not callable")
        return name, obj
    raise WidthscopeError(
        f"unknown activation {name!r}; built-ins: {', '.join(BUILTIN)}; or give "
        "a user function as module:function (e.g. mypkg.acts:swish)"
    )


def derivatives(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, K: int) -> list[torch.Tensor]:
    """``[φ(x), φ'(x), …, φ^{(K)}(x)]`` by nested autograd (``fn`` must act elementwise)."""
    x = x.detach().double().requires_grad_(True)
    name = getattr(fn, "__name__", repr(fn))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. math.* converting the tensor: the error says it
            y = fn(x)
    except Exception as exc:  # noqa: BLE001 - a user function that does not take tensors
        raise WidthscopeError(
            f"activation {name!r} failed on a float64 tensor ({type(exc).__name__}: "
            f"{exc}); it must be a torch function acting elementwise"
        ) from None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise WidthscopeError(f"activation {name!r} must map a tensor to a tensor of the same shape (elementwise)")
    outs = [y]
    for k in range(K):
        g = None  # stays None where the derivative is identically zero from here on (e.g. linear pieces)
        if y.requires_grad:
            try:
                (g,) = torch.autograd.grad(y.sum(), x, create_graph=True, allow_unused=True)
            except RuntimeError as exc:
                raise WidthscopeError(
                    f"activation {name!r}: autograd cannot form derivative {k + 1} "
                    f"({exc}); it must be differentiable with torch operations"
                ) from None
        y = torch.zeros_like(x) if g is None else g
        outs.append(y)
    return [o.detach() for o in outs]


def _kinks(ders: Sequence[torch.Tensor], h: float) -> list[tuple[int, int]]:
    """(order k, grid index i of the location x[i]) of jumps in φ^{(k)} not explained by φ^{(k+1)}."""
    found = []
    for k in range(len(ders) - 1):
        f, g = ders[k], ders[k + 1].abs()
        jump = (f[1:] - f[:-1]).abs()
        gmax = torch.maximum(g[1:], g[:-1])
        # neighbours too, so curvature inside an interval does not trigger a flag
        gmax = torch.maximum(gmax, torch.nn.functional.max_pool1d(g[None, None], 5, 1, 2)[0, 0][1:])
        bad = jump > 10 * h * gmax + 1e-9 * (1 + f.abs().max())
        if bool(bad.any()):
            found.append((k, int(bad.nonzero()[0, 0])))
    return found


def check_grid(K: int, lo: float, hi: float, grid: int) -> None:
    """Check the derivative order and the grid of :func:`audit`."""
    if not 1 <= K <= MAX_K:
        raise WidthscopeError(
            f"activations: --K {K}: must be a whole number in 1..{MAX_K} (each order nests one more "
            f"autograd pass; the graphs grow so fast that order 16 needs over 20 GB)"
        )
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi) or grid < 3:
        raise WidthscopeError(f"activations: need finite lo < hi and grid >= 3 (got range {lo} {hi}, grid {grid})")


def audit(
    names: Sequence[str | Callable] | None = None, *, K: int = 6, lo: float = -5.0, hi: float = 5.0, grid: int = 2001
) -> list[dict[str, Any]]:
    """One row per activation: ``ratio_k = max_x |φ^{(k)}| / (k+1)!``, ``max_k``, flags."""
    check_grid(K, lo, hi, grid)
    x = torch.linspace(lo, hi, grid, dtype=torch.float64)
    h = (hi - lo) / (grid - 1)
    rows = []
    for n in names if names is not None else list(BUILTIN):
        name, fn = resolve(n)
        ders = derivatives(fn, x, K)
        row: dict[str, Any] = {"name": name}
        for k in range(1, K + 1):
            row[f"max_{k}"] = float(ders[k].abs().max())
            row[f"ratio_{k}"] = row[f"max_{k}"] / math.factorial(k + 1)
        bad = [(k, d) for k, d in enumerate(ders) if not bool(torch.isfinite(d).all())]
        row["finite"] = not bad
        flags = []
        if bad:  # NaN/inf (e.g. sqrt or log at x < 0): the table entries are meaningless there
            k_bad, d_bad = bad[0]
            row["nonfinite_order"] = k_bad
            row["nonfinite_at"] = at = float(x[(~torch.isfinite(d_bad)).nonzero()[0, 0]]) + 0.0
            flags.append(f"non-finite: phi^({k_bad}) at x={at:.3g} (restrict --range to the domain)")
        kinks = _kinks(ders, h)
        row["smooth"] = not kinks
        row["kink_order"] = kinks[0][0] if kinks else None
        row["kink_at"] = round(float(x[kinks[0][1]]), 9) + 0.0 if kinks else None
        if kinks:
            flags.append(f"non-smooth: phi^({kinks[0][0]}) jumps near x={row['kink_at']:.3g}")
        row["ratio_grows"] = bool(K >= 2 and row[f"ratio_{K}"] > row[f"ratio_{K - 1}"] * (1 + 1e-9))
        flags += ["ratio grows"] if row["ratio_grows"] else []
        row["flags"] = "; ".join(flags) or "ok"
        rows.append(row)
    return rows


@dataclasses.dataclass(frozen=True)
class ActivationsOptions(Options):
    """The settings of an activation audit (``widthscope activations``; :func:`run_audit`)."""

    NARGS: ClassVar[dict[str, tuple[str, ...]]] = {"range": ("LO", "HI")}

    names: tuple[str, ...] = option(
        tuple(BUILTIN),
        kind="strs",
        help=f"comma-separated built-ins (default {','.join(BUILTIN)}) or module:function paths",
    )
    K: int = option(
        6,
        lo=1,
        hi=MAX_K,
        unit="derivative orders; each nests one more autograd pass, order 16 needs over 20 GB",
        help=f"highest derivative order, 1..{MAX_K} (default 6)",
    )
    range: tuple[float, ...] = option((-5.0, 5.0), kind="floats", help="grid interval (default -5 5)")
    grid: int = option(2001, lo=3, unit="grid points", help="grid points (default 2001)")

    def check(self) -> None:
        if not self.names:
            raise WidthscopeError("activations: --names is empty; give e.g. --names relu,tanh")
        if len(self.range) != 2:
            raise WidthscopeError(f"--range {' '.join(map(str, self.range))}: give two numbers, LO HI")
        check_grid(self.K, self.range[0], self.range[1], self.grid)


def run_audit(options: ActivationsOptions, *, json_out: str | None = None, file: Any = None) -> list[dict[str, Any]]:
    """What ``widthscope activations`` does: the audit's table printed, and with ``json_out`` its rows and
    options written as JSON."""
    lo, hi = options.range
    if json_out:  # room for the table (about 2 numbers per order and name), before computing it
        check_space(json_out, 2000 + len(options.names) * (2 * options.K + 10) * 80)
    rows = audit(list(options.names), K=options.K, lo=lo, hi=hi, grid=options.grid)
    cols = ["name"] + [f"ratio_{k}" for k in range(1, options.K + 1)] + ["flags"]
    title = f"max|phi^(k)| / (k+1)! on [{lo}, {hi}], {options.grid} points"
    print(format_table(rows, cols, floatfmt=".3g", title=title), file=file)
    if json_out:
        record = {"K": options.K, "range": [lo, hi], "grid": options.grid, "rows": rows}
        atomic_write_json(json_out, {**record, "options": {"activations": options.to_dict()}})
        print(f"wrote {json_out}", file=file)
    return rows
