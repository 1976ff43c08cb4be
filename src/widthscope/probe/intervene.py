r"""Direct residual interventions: does one first-order step at an insertion point do what
the alignment statistic predicts?

**Bias probe.** Insert a zero bias ``b`` at ``point`` (function-preserving, see
:mod:`widthscope.probe.insert`). Its per-example gradient is the pooled sample vector
``s_i = Σ_t q_{i,t}`` from :func:`widthscope.probe.collect`. With ``μ_M`` the mean of ``M``
training sample vectors and ``g_K`` the mean of ``K`` held-out ones, one gradient step
``v = −η μ_M`` changes the held-out loss ``L_K`` (mean over the ``K`` examples) by

.. math::  ΔL = L_K(b = v) − L_K(b = 0) = −η\, μ_Mᵀ g_K + O(η²),

so ``retention = ΔL_actual / ΔL_pred → 1`` as ``η → 0`` and ``|retention − 1| = O(η)``.

**Block probe.** Insert ``z + W_out φ(W_in norm(z))`` with ``W_out = 0``; with ``G_M``, ``G_K``
the mean per-example ``W_out`` gradients, the step ``W_out = −η G_M`` predicts
``ΔL = −η ⟨G_M, G_K⟩_F``. A per-example ``W_out`` gradient is ``Σ_t q_t h_tᵀ``, so the Gram of
those matrices is ``Σ_{t,s} (q_t·q'_s)(h_t·h'_s)`` (:func:`block_gram`): certificates of the
block need no ``N × N_h`` per-example matrices.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe.intervene import intervene
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    >>> x, y = torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,))
    >>> rows = intervene(net, "1", [(x[:32], y[:32])], [(x[32:], y[32:])], progress=False)
    >>> abs(rows[0]["retention"] - 1) < 0.01      # smallest η
    True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from .._io import progress as _progress
from ..errors import WidthscopeError

# batch helpers live in .batches (the prefix cache uses them too); re-exported here
from .batches import _cat, as_examples, batch_size_of, index_batch, take, to_batches  # noqa: F401
from .insert import (
    Inserted,
    ResidualBias,
    ResidualBlock,
    _resolve,
    apply_insertions,
    channel_dim,
    insert,
    inserted_parameters,
    inserted_state,
    insertion_specs,
    remove_insertion,
)

if TYPE_CHECKING:
    from ..stats.estimators import Estimator

__all__ = [
    # insertion (re-exported from widthscope.probe.insert)
    "insert",
    "remove_insertion",
    "apply_insertions",
    "inserted_state",
    "inserted_parameters",
    "insertion_specs",
    # interventions
    "intervene",
    "sign_agreement",
    "default_etas",
    "block_gram",
    "block_features",
    "block_certificate",
    "mean_loss",
    "per_example_losses",
    "as_examples",
    "take",
    "to_batches",
    # precision of the measured loss change (low-precision models)
    "loss_rounding",
    "sample_rounding",
    "sample_errors",
    "projected_rounding",
    "upcast",
    "resolved",
    "precision_note",
    "RESOLUTION_FACTOR",
    "LOW_PRECISION",
]


# ----------------------------------------------------------------------------- losses
def _device(model: nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


class EvalMode:
    """Run the model in eval mode (BatchNorm running statistics, no dropout), then restore."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> nn.Module:
        self.modes = {m: m.training for m in self.model.modules()}
        self.model.eval()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        for m, mode in self.modes.items():
            m.training = mode


def per_example_losses(
    model: nn.Module, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64, grad: bool = False
) -> torch.Tensor:
    """Per-example losses ``(n,)`` exactly as :func:`widthscope.probe.collect` defines them."""
    from .collect import _run_batch, float_dtype, to_device

    dev = _device(model)
    out = []
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        for bi, b in enumerate(to_batches(data, batch_size)):
            losses, _, _ = _run_batch(model, to_device(b, dev, float_dtype(model)), loss_fn, bi)
            out.append(losses if grad else losses.detach().to("cpu", torch.float64))
    return torch.cat(out)


def mean_loss(model: nn.Module, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64) -> float:
    """Mean per-example loss over ``data`` (eval mode, float64 accumulation)."""
    with EvalMode(model):
        return float(per_example_losses(model, data, loss_fn, batch_size=batch_size).mean())


def _activation_rms(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None, batch_size: int
) -> tuple[float, int]:
    """Root-mean-square entry of the output at ``point`` over ``data``, and its channel width."""
    from .collect import _split_output

    acc = [0.0, 0, 0]

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        z, _ = _split_output(out, point)
        acc[0] += float(z.detach().double().pow(2).sum())
        acc[1] += z.numel()
        acc[2] = z.shape[channel_dim(z)]

    h = model.get_submodule(point).register_forward_hook(hook)
    try:
        with EvalMode(model):
            per_example_losses(model, data, loss_fn, batch_size=batch_size)
    finally:
        h.remove()
    return math.sqrt(acc[0] / max(acc[1], 1)), int(acc[2])


def default_etas(
    step_norm: float, target_norm: float, n_etas: int = 9, *, low: float = 1e-4, high: float = 1.0
) -> list[float]:
    """Log-spaced ``η`` so that ``η · step_norm`` spans ``[low, high] · target_norm``.

    For the bias probe ``step_norm = ‖μ_M‖/√N`` (RMS entry of the step direction) and
    ``target_norm`` = RMS entry of the activation at the point, so the smallest step moves the
    stream by 1e-4 of its typical size and the largest by ``high`` of it. The relative steps are
    ``10^(log10 low + i·(log10 high − log10 low)/(n − 1))``: a decade is the same float on every
    grid that contains it (``1e-3`` on the 9 half-decades up to 1 and on the 4 decades up to 0.1).
    """
    if not (step_norm > 0 and math.isfinite(step_norm)):
        raise WidthscopeError(
            "the step direction is zero (all sample gradients vanish), so no η "
            "grid can be chosen; pass etas=[...] or check the loss"
        )
    if n_etas < 1:
        raise WidthscopeError(f"n_etas must be >= 1, got {n_etas}")
    check_rel_step(high, low)
    target = target_norm if target_norm > 0 else step_norm
    a, b = math.log10(low), math.log10(high)
    ratios = [low] if n_etas == 1 else [10.0 ** (a + i * (b - a) / (n_etas - 1)) for i in range(n_etas)]
    return [r * target / step_norm for r in ratios]


def check_rel_step(high: Any, low: float = 1e-4) -> float:
    """``high`` (the largest step of the default grid, relative to the activation) as a float, or
    one error naming it: a finite number above the smallest step ``low``."""
    try:
        h = float(high)
    except (TypeError, ValueError):
        h = float("nan")
    if isinstance(high, bool) or not (math.isfinite(h) and h > low):
        raise WidthscopeError(
            f"max_rel_step must be a finite number above the smallest step {low:g} (the largest "
            f"step's RMS entry over the activation's), got {high!r}"
        )
    return h


def _check_etas(etas: Sequence[float]) -> list[float]:
    out = []
    for e in etas:
        try:
            e = float(e)
        except (TypeError, ValueError):
            raise WidthscopeError(f"eta must be a number, got {e!r}") from None
        if not math.isfinite(e) or e <= 0:
            raise WidthscopeError(
                f"eta must be a positive finite step size, got {e!r} (the step is "
                "v = -eta * mu_M; a negative eta would step uphill)"
            )
        out.append(e)
    if not out:
        raise WidthscopeError("etas is empty; pass None for the default grid")
    return sorted(out)


# ----------------------------------------------------------------------------- precision
LOW_PRECISION = (torch.bfloat16, torch.float16)
# A step is resolved when its predicted change is at least this many rounding scales r (below):
# the measured ΔL was off by < 3r on all 468 steps we calibrated against float64 (docs/
# interventions.md), so an unflagged step's retention carries a rounding error < 3/8 (measured ≤ 0.15).
RESOLUTION_FACTOR = 8.0


def _dtype_name(dt: torch.dtype | None) -> str | None:
    return None if dt is None else str(dt).replace("torch.", "")


class upcast:
    """Context: the model's bfloat16/float16 parameters and buffers cast to float32 in place, and
    back on exit. ``low → float32 → low`` is exact, so the model is restored bit for bit; memory
    is that of a float32 copy of those tensors (no second model is kept)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.saved: list[tuple[torch.Tensor, torch.dtype]] = []

    def __enter__(self) -> nn.Module:
        seen: set[int] = set()
        for t in [*self.model.parameters(), *self.model.buffers()]:
            if id(t) not in seen and t.dtype in LOW_PRECISION:
                seen.add(id(t))
                self.saved.append((t, t.dtype))
                t.data = t.data.float()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        for t, dt in self.saved:
            t.data = t.data.to(dt)
        self.saved = []


def loss_rounding(
    model: nn.Module,
    data: Any,
    loss_fn: Callable | None = None,
    *,
    batch_size: int = 64,
    losses: torch.Tensor | None = None,
) -> tuple[float | None, torch.Tensor | None]:
    r"""Rounding-error scale of the mean loss over ``data`` in the model's low-precision dtype.

    .. math::  r = \sqrt{\textstyle\sum_i e_i^2}\,/\,K,\qquad e_i = ℓ_i^{\rm dtype} − ℓ_i^{\rm float32}

    with ``ℓ_i^{dtype}`` the per-example losses as the model runs (``losses`` if already measured)
    and ``ℓ_i^{float32}`` those of the same weights evaluated in float32 (:class:`upcast`). ``r`` is
    the standard error the rounding adds to a mean of ``K`` such losses when the examples' errors
    are independent; a measured change ``ΔL = L(step) − L`` carries about that much (measured:
    under 3r, see :data:`RESOLUTION_FACTOR`). Returns ``(r, float32 per-example losses)``, or
    ``(None, None)`` for a float32/float64 model (the reference precision: not measured).
    Cost: one float32 forward over ``data`` (and one in the dtype when ``losses`` is None).
    """
    from .collect import float_dtype

    if float_dtype(model) not in LOW_PRECISION:
        return None, None
    with EvalMode(model):
        low = (
            losses.double().cpu()
            if losses is not None
            else per_example_losses(model, data, loss_fn, batch_size=batch_size)
        )
        with upcast(model):
            ref = per_example_losses(model, data, loss_fn, batch_size=batch_size)
    return float((low - ref).pow(2).sum().sqrt()) / max(len(ref), 1), ref


def _sample_errors(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None, n: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled samples of the first ``n`` examples as the model runs, and their rounding errors
    (minus the same weights' samples in float32, :class:`upcast`)."""
    from .collect import collect

    data = as_examples(data)
    sub = take(data, min(n, batch_size_of(data)))
    low = collect(model, to_batches(sub, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]
    with upcast(model):
        ref = collect(model, to_batches(sub, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]
    return ref, low - ref


def sample_rounding(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None = None, *, n: int = 8, batch_size: int = 64
) -> float | None:
    """Largest relative error ``‖s_i − s_i^{float32}‖/‖s_i^{float32}‖`` of the pooled sample vectors
    of the first ``n`` examples of ``data`` at ``point``, the model as it is against the same
    weights in float32 (:class:`upcast`); None for a float32/float64 model. It is not a small
    multiple of ``u`` everywhere: a confidently fitted classifier's gradients cancel (measured
    32u in bfloat16 on a trained MLP, ≤ 3.5u on the tiny Llamas), so it is measured, not assumed
    (``sample_rel_error`` of :func:`widthscope.certify.per_point.statistics`, worst-case mode)."""
    from .collect import float_dtype

    if float_dtype(model) not in LOW_PRECISION:
        return None
    ref, err = _sample_errors(model, point, data, loss_fn, n, batch_size)
    return float((err.norm(dim=1) / ref.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)).max())


def sample_errors(
    model: nn.Module,
    point: str,
    train: Any,
    test: Any,
    loss_fn: Callable | None = None,
    *,
    n: int = 16,
    batch_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Measured rounding errors ``(n, d)`` of the pooled samples of the first ``n`` train and ``n``
    held-out examples at ``point`` (the model as it is minus the same weights in float32,
    :class:`upcast`); None for a float32/float64 model. Cost: 4 probes of ``n`` examples."""
    from .collect import float_dtype

    if float_dtype(model) not in LOW_PRECISION:
        return None
    return (
        _sample_errors(model, point, train, loss_fn, n, batch_size)[1],
        _sample_errors(model, point, test, loss_fn, n, batch_size)[1],
    )


def projected_rounding(err: torch.Tensor, direction: torch.Tensor) -> float:
    r"""Estimated rounding error of a sample mean along ``direction``: the samples' rounding errors
    ``δs_i`` (measured on ``n`` of them, :func:`sample_errors`) give ``t_i = δs_i·direction`` and
    the estimate ``|mean t| + 3·sd(t)/√n`` — the systematic part plus a generous allowance for the
    random part (it only shrinks from ``n`` to the full sample). For ``A = ā·b̄``:
    ``δA ≈ projected_rounding(δa, b̄) + projected_rounding(δb, ā)``; for ``‖μ‖²`` twice the one of
    ``δs`` along ``μ``. A worst-case bound (every error along ``direction``) was 40-150x the actual
    error on the Llamas we tried and flagged alignments bfloat16 had to 3 %: this measures what
    rounding does."""
    t = err.double() @ direction.double().to(err.device)
    if len(t) < 2:
        return float(t.abs().max()) if len(t) else 0.0
    return abs(float(t.mean())) + 3 * float(t.std()) / math.sqrt(len(t))


def resolved(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows a retention or sign summary may use: not ``below_resolution`` and not from an
    alignment whose sign the samples' rounding leaves open (``alignment_within_rounding``)."""
    return [r for r in rows if not r.get("below_resolution") and not r.get("alignment_within_rounding")]


def precision_note(rows: Iterable[Mapping[str, Any]], where: str = "") -> str | None:
    """One line naming the steps below the model dtype's resolution (or re-measured in float32),
    or None when there are none. ``where`` names the point(s) when the rows do not."""
    rows = [r for r in rows if r.get("kind") == "intervention" and r.get("probe") in ("bias", "block")]
    low = [r for r in rows if r.get("below_resolution")]
    redo = [r for r in rows if r.get("evaluated_in") and r.get("dtype") and r["evaluated_in"] != r["dtype"]]
    zero = list(dict.fromkeys(str(r.get("point", where)) for r in rows if r.get("alignment_within_rounding")))
    if not low and not redo and not zero:
        return None
    dt = next(r.get("dtype") for r in rows if r.get("dtype"))

    def steps(rs: list[Mapping[str, Any]]) -> str:
        by: dict[str, list[str]] = {}
        for r in rs:
            by.setdefault(str(r.get("point", where)), []).append(f"{r.get('rel_step', r.get('eta')):.2g}")
        return "; ".join(f"{p} at rel_step {', '.join(v)}" for p, v in by.items())

    parts = []
    if low:
        parts.append(
            f"{len(low)} of {len(rows)} intervention steps are below {dt} resolution (|predicted dL| < "
            f"{RESOLUTION_FACTOR:g} x the rounding error of the held-out loss in {dt}) and are left out of "
            f"the retention and sign summaries: {steps(low)}"
        )
    if redo:
        parts.append(
            f"{len(redo)} steps below {dt} resolution were measured in float32 instead (the model "
            f"upcast; the {dt} value kept as actual_in_dtype): {steps(redo)}"
        )
    if zero:
        parts.append(
            f"at {', '.join(zero)} the alignment mu_M.g_K is within rounding of zero of the {dt} samples "
            "(not even the predicted sign is resolved): all its steps are left out of the summaries"
        )
    return "interventions: " + "; ".join(parts)


def _mark_precision(rows: list[dict[str, Any]], dtype: torch.dtype | None, r: float | None) -> None:
    """Add ``dtype``, ``evaluated_in``, ``resolution`` and ``below_resolution`` to each row."""
    res = None if r is None else RESOLUTION_FACTOR * r
    for row in rows:
        row.update(
            dtype=_dtype_name(dtype),
            evaluated_in=_dtype_name(dtype),
            resolution=res,
            below_resolution=bool(res is not None and abs(row["predicted"]) < res),
            alignment_bound=None,
            alignment_within_rounding=False,
        )


# ----------------------------------------------------------------------------- block probe maths
def _positions(x: torch.Tensor, name: str) -> torch.Tensor:
    """``(n, N)`` -> ``(n, 1, N)``; ``(n, T, N)`` kept; ``(n, C, H, W)`` -> ``(n, H·W, C)``."""
    x = torch.as_tensor(x)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() == 3:
        return x
    if x.dim() == 4:
        return x.flatten(2).transpose(1, 2)
    raise WidthscopeError(f"{name} must be (n, N), (n, T, N) or (n, C, H, W); got shape {tuple(x.shape)}")


def block_gram(
    q: Any, h: Any, q2: Any = None, h2: Any = None, *, method: str = "auto", max_floats: int = 2**23
) -> torch.Tensor:
    r"""Gram of the per-example ``W_out`` gradients ``P_i = Σ_t q_{i,t} h_{i,t}ᵀ`` without forming them.

    .. math::  ⟨P_i, P'_j⟩_F = Σ_{t,s} (q_{i,t}·q'_{j,s})(h_{i,t}·h'_{j,s})

    For single-position inputs (``(n, N)``) this is ``(q q'ᵀ) ⊙ (h h'ᵀ)``.

    Args:
        q: activation gradients at the block output, ``(n, N)``, ``(n, T, N)`` or ``(n, C, H, W)``.
        h: hidden activations of the block, ``(n, N_h)``, ``(n, T, N_h)`` or ``(n, N_h, H, W)``.
        q2, h2: a second population for the cross-Gram ``(n, n2)`` (default: ``q, h``).
        method: ``"gram"`` (position Grams, ``O(n² T² (N + N_h))``), ``"explicit"``
            (materialise ``P_i``, ``O(n T N N_h + n² N N_h)``) or ``"auto"`` (the cheaper).

    Returns: ``(n, n2)`` float64 Gram.

    Example::

        >>> q, h = torch.randn(5, 3, 4), torch.randn(5, 3, 6)
        >>> P = torch.einsum("itn,ith->inh", q, h).flatten(1).double()
        >>> torch.allclose(block_gram(q, h), P @ P.T)
        True
    """
    qa = _positions(q, "q").double()
    ha = _positions(h, "h").double()
    qb = qa if q2 is None else _positions(q2, "q2").double()
    hb = ha if h2 is None else _positions(h2, "h2").double()
    for qq, hh, nm in ((qa, ha, ""), (qb, hb, "2")):
        if qq.shape[:2] != hh.shape[:2]:
            raise WidthscopeError(
                f"q{nm} and h{nm} must have the same examples and positions, got "
                f"{tuple(qq.shape)} and {tuple(hh.shape)}"
            )
    if qa.shape[2] != qb.shape[2] or ha.shape[2] != hb.shape[2]:
        raise WidthscopeError("the two populations have different widths; both must come from the same block")
    n, T, N = qa.shape
    m, T2, _ = qb.shape
    H = ha.shape[2]
    if method not in ("auto", "gram", "explicit"):
        raise WidthscopeError(f"method must be 'auto', 'gram' or 'explicit', got {method!r}")
    if T == 1 and T2 == 1:
        return (qa[:, 0] @ qb[:, 0].T) * (ha[:, 0] @ hb[:, 0].T)
    if method == "auto":
        cost_gram = n * m * T * T2 * (N + H)
        cost_explicit = (n * T + m * T2) * N * H + n * m * N * H
        method = "gram" if cost_gram <= cost_explicit else "explicit"
    if method == "explicit":
        Pa = torch.einsum("itn,ith->inh", qa, ha).reshape(n, -1)
        Pb = Pa if q2 is None and h2 is None else torch.einsum("itn,ith->inh", qb, hb).reshape(m, -1)
        return Pa @ Pb.T
    out = torch.empty(n, m, dtype=torch.float64, device=qa.device)
    rows = max(1, max_floats // max(1, T * m * T2))  # bound the (rows, T, m, T2) temporaries
    for i in range(0, n, rows):
        Qg = torch.einsum("atn,bsn->atbs", qa[i : i + rows], qb)
        Hg = torch.einsum("atn,bsn->atbs", ha[i : i + rows], hb)
        out[i : i + rows] = (Qg * Hg).sum((1, 3))
    return out


def block_of(model: nn.Module, point: str) -> ResidualBlock:
    w = model.get_submodule(point)
    if not isinstance(w, Inserted) or not isinstance(w.widthscope_insert, ResidualBlock):
        raise WidthscopeError(
            f"point {point!r} has no inserted block; call insert(model, {point!r}, kind='block') first"
        )
    return w.widthscope_insert


def block_features(
    model: nn.Module, point: str, data: Any, loss_fn: Callable | None = None, *, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example ``q = ∂ℓ/∂(block output)`` ``(n, T, N)`` and block hidden ``h`` ``(n, T, N_h)``.

    The model must have an MLP-style block inserted at ``point``. Runs in eval mode, one
    batched backward of the summed per-example losses per batch (exact, see ``collect``).
    """
    wrapper = model.get_submodule(point)
    block = block_of(model, point)
    if block.style == "conv3x3":
        raise WidthscopeError(
            "block_features needs an MLP/1x1-style block (its W_out gradient is "
            "Σ_t q_t h_tᵀ); a 3x3 block has no such form"
        )
    from .collect import _run_batch, float_dtype, to_device

    dev = _device(model)
    state: dict[str, torch.Tensor] = {}

    def hook(_m: nn.Module, _i: Any, out: Any) -> Any:
        z = out[0] if isinstance(out, tuple) else out
        leaf = torch.zeros_like(z, requires_grad=True)
        state["b"] = leaf
        return (z + leaf, *out[1:]) if isinstance(out, tuple) else z + leaf

    qs, hs = [], []
    handle = wrapper.register_forward_hook(hook)
    block.keep_hidden = True
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with EvalMode(model), torch.enable_grad():
            for bi, b in enumerate(to_batches(data, batch_size)):
                losses, _, _ = _run_batch(model, to_device(b, dev, float_dtype(model)), loss_fn, bi)
                (g,) = torch.autograd.grad(losses.sum(), [state["b"]])
                dim = channel_dim(g, block.style)
                B = g.shape[0]
                qs.append(g.movedim(dim, -1).reshape(B, -1, g.shape[dim]).detach().double().cpu())
                h = block.last_hidden
                assert h is not None  # keep_hidden: this forward set it
                hs.append(h.reshape(B, -1, h.shape[-1]).detach().double().cpu())
    finally:
        handle.remove()
        block.keep_hidden = False
        block.last_hidden = None
        for p, f in flags:
            p.requires_grad_(f)
    return torch.cat(qs), torch.cat(hs)


def block_certificate(
    model: nn.Module,
    point: str,
    train: Any,
    test: Any,
    *,
    M: int,
    K: int,
    loss_fn: Callable | None = None,
    batch_size: int = 64,
    estimator: Estimator = "unbiased",
) -> Any:
    """Two-population certificate of an inserted block's ``W_out`` step, from Gram products only."""
    from ..stats import certificate, cross_moments_from_gram

    qa, ha = block_features(model, point, train, loss_fn, batch_size=batch_size)
    qb, hb = block_features(model, point, test, loss_fn, batch_size=batch_size)
    C = block_gram(qa, ha, qb, hb)
    return certificate(cross_moments_from_gram(C, estimator), M=M, K=K, estimator=estimator)


def w_out_grad(model: nn.Module, point: str, data: Any, loss_fn: Callable | None, batch_size: int) -> torch.Tensor:
    """Mean per-example gradient of ``W_out`` (= gradient of the mean loss), float64."""
    block = block_of(model, point)
    n = batch_size_of(data)
    total = torch.zeros(block.w_out.shape, dtype=torch.float64)
    from .collect import _run_batch, float_dtype, to_device

    dev = _device(model)
    with EvalMode(model), torch.enable_grad():
        for bi, b in enumerate(to_batches(data, batch_size)):
            losses, _, _ = _run_batch(model, to_device(b, dev, float_dtype(model)), loss_fn, bi)
            (g,) = torch.autograd.grad(losses.sum(), [block.w_out])
            total += g.detach().double().cpu()
    return total / n


# ----------------------------------------------------------------------------- intervene
def intervene(
    model: nn.Module,
    point: str,
    train_batches: Iterable[Any],
    test_batches: Iterable[Any],
    *,
    etas: Sequence[float] | None = None,
    kind: str = "bias",
    loss_fn: Callable | None = None,
    M: int | None = None,
    K: int | None = None,
    n_etas: int = 9,
    max_rel_step: float = 1.0,
    block_width: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = True,
    reuse: Mapping[str, Any] | None = None,
    prefix: str = "auto",
    precision: str = "mark",
) -> list[dict[str, Any]]:
    r"""Measure the held-out loss change of one first-order step at ``point`` against its prediction.

    Args:
        model: the trained model (left unchanged: the insertion is removed afterwards).
        point: insertion point (module path).
        train_batches, test_batches: batches as for :func:`widthscope.probe.collect`; the first
            ``M`` / ``K`` examples are used (default: all).
        etas: step sizes (> 0). Default: ``n_etas`` log-spaced values so the step's RMS entry
            spans 1e-4…``max_rel_step`` (default 1) times the RMS entry of the activation at
            ``point`` (:func:`default_etas`; the rows' ``rel_step``).
        kind: ``"bias"`` (``v = −η μ_M``) or ``"block"`` (``W_out = −η G_M``, block of width
            ``block_width``, ``W_in`` seeded by ``seed``).
        reuse: what a probe of the same batches already measured (``certify`` passes it):
            ``train``/``test`` pooled sum samples of this point (their first ``M``/``K`` rows give
            ``μ_M``, ``g_K``), ``test_losses`` (per-example held-out losses), ``act_sq`` (per
            train example Σz² and count at the point) and ``width`` (its channel width). The bias probe then runs
            only the forward passes at each ``η``, all ``η`` of a batch in one stacked pass. ``prefix``: a
            :class:`~widthscope.probe.prefix.KeptPrefix` recorded during the probe's held-out
            forward (:func:`~widthscope.probe.prefix.keep_prefix`), so the network before the
            point does not run again at all.
        prefix: how the ``E`` steps are evaluated (the block probe's step at ``point`` is
            ``−η G_M φ(W_in norm(z))``, its inserted block's output at ``W_out = −η G_M``; the
            same path as the bias probe's). ``"auto"`` (default): the network
            before ``point`` runs once per chunk of held-out examples (or not at all, with
            ``reuse["prefix"]``) and only the modules after it run ``E`` times
            (:mod:`widthscope.probe.prefix`); the cached losses of the first 3 examples at the
            largest ``η`` must equal a full forward's, and if this check or the model's structure
            rules the cached path out, the full path runs and the rows say why. Cost: one prefix
            + ``E`` suffixes per chunk instead of ``E`` full forwards, plus the check (3 full
            forwards, 5 short prefixes); memory: the outputs of the modules before the point,
            kept for one chunk. ``"full"``: the whole network ``E`` times (no check, nothing kept;
            for a model whose modules keep state the check cannot see).
        precision: what to do, for a bfloat16/float16 model, with a step whose predicted change
            is below the dtype's resolution: ``|predicted| < RESOLUTION_FACTOR · r``, ``r`` the
            rounding-error scale of the held-out mean loss in that dtype (:func:`loss_rounding`:
            per-example losses in the dtype against the same weights in float32; one extra
            float32 forward over the ``K`` held-out examples). ``"mark"`` (default): the row gets
            ``below_resolution=True`` and summaries leave it out (:func:`resolved`);
            ``"float32"``: such steps are measured again with the model upcast to float32
            (:class:`upcast`, exact round trip; ``actual``/``retention``/``sign_agrees`` then
            come from float32, ``evaluated_in="float32"``, the dtype's value kept as
            ``actual_in_dtype``). float32/float64 models are the reference: nothing is measured.

    Returns:
        One row per η: ``kind="intervention"``, ``probe`` (bias|block), ``point``, ``eta``,
        ``predicted`` (``−η μ_Mᵀ g_K`` or ``−η⟨G_M, G_K⟩``), ``actual`` (``L_K(step) − L_K``),
        ``retention`` (actual/predicted), ``sign_agrees``, ``M``, ``K``, ``mu_norm``
        (``‖μ_M‖`` or ``‖G_M‖_F``), ``alignment`` (``μ_Mᵀ g_K``), ``loss_before``, ``act_rms``,
        ``prefix`` (``"cached"``, or ``"full: <reason>"``), ``dtype`` (the model's),
        ``evaluated_in`` (the dtype ``actual`` was measured in), ``resolution`` (the smallest
        ``|predicted|`` the dtype resolves, ``RESOLUTION_FACTOR · r``; None for float32/float64
        models) and ``below_resolution`` (the row's ``actual`` cannot be trusted; always False
        for float32/float64 models); ``alignment_bound`` and ``alignment_within_rounding``: the
        estimated rounding error of ``μ_Mᵀ g_K`` from the samples' rounding (bias probe of a
        bfloat16/float16 model, measured on 16 + 16 examples in float32: :func:`projected_rounding`;
        None/False otherwise) and whether ``|μ_Mᵀ g_K|`` is within it (then not even the
        predicted sign is resolved). :func:`resolved` drops both
        kinds; :func:`precision_note` words them in one line.
    """
    from .insert import check_intervene_args

    check_intervene_args(locals())  # types, before any work
    if kind not in ("bias", "block"):
        raise WidthscopeError(f"kind must be 'bias' or 'block', got {kind!r}")
    if prefix not in ("auto", "full"):
        raise WidthscopeError(f"prefix must be 'auto' or 'full', got {prefix!r}")
    if precision not in ("mark", "float32"):
        raise WidthscopeError(f"precision must be 'mark' or 'float32', got {precision!r}")
    if etas is not None:
        etas = _check_etas(etas)
    max_rel_step = check_rel_step(max_rel_step)
    if isinstance(_resolve(model, point), Inserted):
        raise WidthscopeError(
            f"point {point!r} already has an insertion; intervene on the model without it (or on another point)"
        )
    train = take(as_examples(train_batches), M, what="train (M)")
    test = take(as_examples(test_batches), K, what="test (K)")
    M, K = batch_size_of(train), batch_size_of(test)
    reuse = dict(reuse or {})
    if kind == "bias" and reuse.get("act_sq") is not None and len(reuse["act_sq"]) >= M:
        from .collect import activation_rms

        act_rms, width = activation_rms(reuse["act_sq"], M), int(reuse["width"])
    else:
        act_rms, width = _activation_rms(model, point, train, loss_fn, batch_size)
    if kind == "bias" and reuse.get("test_losses") is not None and len(reuse["test_losses"]) >= K:
        test_losses = reuse["test_losses"][:K].double().cpu()
    else:  # = mean_loss, keeping the per-example losses for the precision check
        with EvalMode(model):
            test_losses = per_example_losses(model, test, loss_fn, batch_size=batch_size)
    loss_before = float(test_losses.mean())
    rows: list[dict[str, Any]] = []
    if kind == "bias":
        from .collect import collect

        if reuse.get("train") is not None and reuse.get("test") is not None:
            Sa, Sb = reuse["train"][:M], reuse["test"][:K]
        else:
            Sa = collect(model, to_batches(train, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]
            Sb = collect(model, to_batches(test, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]
        mu, g = Sa.mean(0), Sb.mean(0)
        align = float(mu @ g)
        step_norm = float(mu.norm()) / math.sqrt(mu.numel())
        bias_etas = etas or default_etas(step_norm, act_rms, n_etas, high=max_rel_step)
        rows = _bias_rows_stacked(
            model,
            point,
            mu,
            bias_etas,
            align,
            test,
            loss_fn,
            batch_size,
            M,
            K,
            loss_before,
            act_rms,
            step_norm,
            prefix,
            reuse.get("prefix"),
        )
        rows = _precision(
            rows,
            model,
            point,
            lambda: torch.stack([-float(e) * mu for e in bias_etas]),
            test,
            loss_fn,
            batch_size,
            K,
            test_losses,
            precision,
        )
        errs = sample_errors(model, point, train, test, loss_fn, batch_size=batch_size)
        if errs is not None:  # a bfloat16/float16 model (None for float32/float64)
            ea, eb = errs
            bound = projected_rounding(ea, g) + projected_rounding(eb, mu)
            for r in rows:
                r.update(alignment_bound=bound, alignment_within_rounding=abs(align) <= bound)
        return rows
    insert(model, point, "block", width=width, hidden=block_width, seed=seed, record=False)
    try:
        block = block_of(model, point)
        G_M = w_out_grad(model, point, train, loss_fn, batch_size)
        G_K = w_out_grad(model, point, test, loss_fn, batch_size)
        align = float((G_M * G_K).sum())
        # RMS entry of the block output change per unit η: ‖G_M h‖ ≈ ‖G_M‖_F · rms(h) · √N_h / √N.
        q, h = block_features(model, point, take(train, min(M, 64)), loss_fn, batch_size=batch_size)
        h_rms = float(h.pow(2).mean().sqrt())
        N, Hd = block.w_out.shape[0], block.w_out.shape[1]
        step_norm = float(G_M.norm()) * h_rms * math.sqrt(Hd) / math.sqrt(N)
        etas = etas or default_etas(step_norm, act_rms, n_etas, high=max_rel_step)
        if prefix == "full":
            rows = _step_rows(
                "block",
                model,
                point,
                block.w_out,
                G_M,
                etas,
                align,
                test,
                loss_fn,
                batch_size,
                M,
                K,
                loss_before,
                act_rms,
                step_norm,
                progress,
            )
            for r in rows:
                r["prefix"] = "full: requested"
    finally:
        remove_insertion(model, point)
    if prefix == "full":
        return _precision(
            rows,
            model,
            point,
            lambda: _block_steps(block, G_M, etas),
            test,
            loss_fn,
            batch_size,
            K,
            test_losses,
            precision,
        )
    # The same steps on the model without the insertion: copy e of the point's output z gets
    # −η_e·G_M φ(W_in norm(z)), the inserted block's output at W_out = −η_e G_M (linear in W_out).
    rows = _stacked_rows(
        "block",
        model,
        point,
        _block_steps(block, G_M, etas),
        etas,
        align,
        test,
        loss_fn,
        batch_size,
        M,
        K,
        loss_before,
        act_rms,
        step_norm,
        float(G_M.norm()),
        prefix,
        reuse.get("prefix"),
    )
    return _precision(
        rows, model, point, lambda: _block_steps(block, G_M, etas), test, loss_fn, batch_size, K, test_losses, precision
    )


def _block_steps(block: ResidualBlock, G_M: torch.Tensor, etas: Sequence[float]) -> Any:
    from .prefix import FnSteps

    return FnSteps(
        torch.tensor([-float(e) for e in etas], dtype=torch.float64), lambda z: block.delta(z, G_M.to(z.device))
    )


def _precision(
    rows: list[dict[str, Any]],
    model: nn.Module,
    point: str,
    steps: Callable[[], Any],
    test: Any,
    loss_fn: Callable | None,
    batch_size: int,
    K: int,
    test_losses: torch.Tensor,
    precision: str,
) -> list[dict[str, Any]]:
    """Flag the rows below the model dtype's resolution; with ``precision="float32"`` measure those
    steps again with the model upcast (the network's full path: kept prefixes are in the dtype)."""
    from .collect import float_dtype, to_device
    from .prefix import stacked_totals

    dt = float_dtype(model)
    r, ref = loss_rounding(model, test, loss_fn, batch_size=batch_size, losses=test_losses)
    _mark_precision(rows, dt, r)
    idx = [i for i, row in enumerate(rows) if row["below_resolution"]]
    if precision != "float32" or not idx:
        return rows
    dev = _device(model)
    sub = steps()[torch.tensor(idx)]
    with upcast(model), EvalMode(model), torch.no_grad():
        totals, _ = stacked_totals(
            model,
            point,
            sub,
            test,
            loss_fn,
            max(1, batch_size // len(idx)),
            lambda b: to_device(b, dev, torch.float32),
            mode="full",
        )
    assert ref is not None  # rows fall below resolution only for a low-precision model, which has ref
    base = float(ref.mean())
    for j, i in enumerate(idx):
        old = rows[i]
        actual = float(totals[j]) / K - base
        old.update(
            actual_in_dtype=old["actual"],
            actual=actual,
            **_compare(old["predicted"], actual),
            evaluated_in="float32",
            below_resolution=False,
        )
    return rows


def _bias_rows_stacked(
    model: nn.Module,
    point: str,
    mu: torch.Tensor,
    etas: Sequence[float],
    align: float,
    test: Any,
    loss_fn: Callable | None,
    batch_size: int,
    M: int,
    K: int,
    loss_before: float,
    act_rms: float,
    step_norm: float,
    prefix: str = "auto",
    kept: Any = None,
) -> list[dict[str, Any]]:
    """Held-out loss after the bias step ``−η μ_M`` for every ``η`` at once: each chunk runs as
    ``E`` stacked copies, copy ``e`` getting ``−η_e μ_M`` added at ``point`` (the same function as
    an inserted zero bias set to that value, without E model calls). ``prefix="auto"`` runs the
    network before ``point`` once per chunk and only the rest ``E`` times
    (:mod:`widthscope.probe.prefix`), ``"full"`` the whole network ``E`` times."""
    steps = torch.stack([-float(e) * mu for e in etas])  # (E, N), float64
    return _stacked_rows(
        "bias",
        model,
        point,
        steps,
        etas,
        align,
        test,
        loss_fn,
        batch_size,
        M,
        K,
        loss_before,
        act_rms,
        step_norm,
        float(mu.norm()),
        prefix,
        kept,
    )


def _stacked_rows(
    probe: str,
    model: nn.Module,
    point: str,
    steps: Any,
    etas: Sequence[float],
    align: float,
    test: Any,
    loss_fn: Callable | None,
    batch_size: int,
    M: int,
    K: int,
    loss_before: float,
    act_rms: float,
    step_norm: float,
    mu_norm: float,
    prefix: str,
    kept: Any,
) -> list[dict[str, Any]]:
    """Rows of ``E`` steps evaluated by :func:`widthscope.probe.prefix.stacked_totals`."""
    from .collect import float_dtype, to_device
    from .prefix import stacked_totals

    dev, dt = _device(model), float_dtype(model)
    per = max(1, batch_size // len(etas))  # examples per stacked call, so a call holds about batch_size rows
    with EvalMode(model), torch.no_grad():
        totals, how = stacked_totals(
            model, point, steps, test, loss_fn, per, lambda b: to_device(b, dev, dt), mode=prefix, kept=kept
        )
    after = totals / K
    rows = [
        _row(
            probe,
            point,
            float(eta),
            -float(eta) * align,
            float(after[i]) - loss_before,
            M,
            K,
            mu_norm,
            align,
            loss_before,
            act_rms,
            step_norm,
        )
        for i, eta in enumerate(etas)
    ]
    for r in rows:
        r["prefix"] = how
    return rows


def _step_rows(
    probe: str,
    model: nn.Module,
    point: str,
    param: torch.Tensor,
    direction: torch.Tensor,
    etas: Sequence[float],
    align: float,
    test: Any,
    loss_fn: Callable | None,
    batch_size: int,
    M: int,
    K: int,
    loss_before: float,
    act_rms: float,
    step_norm: float,
    progress: bool,
) -> list[dict[str, Any]]:
    """Set the inserted parameter to ``−η·direction`` for each ``η`` and measure the held-out
    loss change against the first-order prediction ``−η·align``."""
    rows = []
    for eta in _progress(etas, desc=f"intervene {probe} {point}", disable=None if progress else True):
        with torch.no_grad():
            param.copy_((-eta * direction).to(param.dtype))
        after = mean_loss(model, test, loss_fn, batch_size=batch_size)
        rows.append(
            _row(
                probe,
                point,
                eta,
                -eta * align,
                after - loss_before,
                M,
                K,
                float(direction.norm()),
                align,
                loss_before,
                act_rms,
                step_norm,
            )
        )
    return rows


def _compare(predicted: float, actual: float) -> dict[str, Any]:
    return {
        "retention": actual / predicted if predicted != 0 else float("nan"),
        "sign_agrees": bool(predicted != 0 and (actual > 0) == (predicted > 0) and actual != 0),
    }


def _row(
    probe: str,
    point: str,
    eta: float,
    predicted: float,
    actual: float,
    M: int,
    K: int,
    mu_norm: float,
    align: float,
    loss_before: float,
    act_rms: float,
    step_norm: float,
) -> dict[str, Any]:
    # Step size relative to the stream: RMS entry of the change over RMS entry of the activation,
    # comparable across points and widths (raw η is not).
    rel_step = eta * step_norm / act_rms if act_rms > 0 else float("nan")
    return {
        "kind": "intervention",
        "probe": probe,
        "point": point,
        "eta": eta,
        "predicted": predicted,
        "actual": actual,
        **_compare(predicted, actual),
        "M": M,
        "K": K,
        "mu_norm": mu_norm,
        "alignment": align,
        "loss_before": loss_before,
        "act_rms": act_rms,
        "rel_step": rel_step,
    }


# ----------------------------------------------------------------------------- sign agreement
def sign_agreement(
    model: nn.Module,
    point: str,
    train_batches: Iterable[Any],
    test_batches: Iterable[Any],
    *,
    M: int,
    K: int,
    eta: float | None = None,
    draws: int = 200,
    loss_fn: Callable | None = None,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = True,
) -> dict[str, Any]:
    r"""How often the bias probe's predicted sign of ``ΔL`` is right, over random ``(M, K)`` draws.

    Each draw picks ``M`` train and ``K`` held-out examples without replacement from the
    pools, steps ``v = −η μ_M`` and measures ``ΔL`` on those ``K`` examples. The predicted sign
    is that of ``−μ_Mᵀ g_K``. Reported beside the certificate for the same ``(M, K)``: the
    fraction of draws with ``μ_Mᵀ g_K ≤ 0`` (empirical misalignment) and ``B_exact``/``B_align``
    (two-population, from the pools).

    ``eta`` default: the step whose RMS entry is 1e-3 of the activation's, for the pool mean
    (small enough that the first-order term dominates on the small LLaMA models we tried,
    where retention is already ≈ 0.35 at 1e-2; large enough to stay clear of float32 rounding).

    Returns a dict (``kind="intervention"``, ``probe="sign_agreement"``) with ``agree_rate`` (+95% Wilson ``agree_low``,
    ``agree_high``), ``misaligned_rate``, ``improved_rate`` (actual ``ΔL < 0``), ``b_exact``,
    ``b_align``, ``d_align``, ``expectation``, ``draws``, ``M``, ``K``, ``eta``, ``dtype`` and
    ``draws_below_resolution`` (draws whose ``|η μ_Mᵀ g_K|`` is below the model dtype's resolution on
    their ``K`` examples, as in :func:`intervene`; always 0 for float32/float64 models).
    ``agree_rate``, its interval and ``improved_rate`` count only the other draws (None if none
    is left); ``misaligned_rate`` needs no loss and counts all.
    """
    from ..stats import certificate, wilson_interval
    from .collect import collect, float_dtype

    if eta is not None:
        eta = _check_etas([eta])[0]
    train = as_examples(train_batches)
    test = as_examples(test_batches)
    na, nb = batch_size_of(train), batch_size_of(test)
    for nm, v, pool in (("M", M, na), ("K", K, nb)):
        if not isinstance(v, int) or v < 1 or v > pool:
            raise WidthscopeError(f"{nm} must be an integer in 1..{pool} (the pool size), got {v!r}")
    if not isinstance(draws, int) or draws < 1:
        raise WidthscopeError(f"draws must be a positive integer, got {draws!r}")
    Sa = collect(model, to_batches(train, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]
    Sb = collect(model, to_batches(test, batch_size), points=[point], loss_fn=loss_fn, progress=False)[point]
    act_rms, _ = _activation_rms(model, point, train, loss_fn, batch_size)
    if eta is None:
        mu = Sa.mean(0)
        eta = default_etas(float(mu.norm()) / math.sqrt(mu.numel()), act_rms, 1, low=1e-3)[0]
    with EvalMode(model):
        base = per_example_losses(model, test, loss_fn, batch_size=batch_size)
    _, ref = loss_rounding(model, test, loss_fn, batch_size=batch_size, losses=base)
    err_sq = None if ref is None else (base - ref).pow(2)
    gen = torch.Generator().manual_seed(int(seed))
    agree = mis = improved = low = 0
    insert(model, point, "bias", width=Sa.shape[1], record=False)
    try:
        wrapper = model.get_submodule(point)
        assert isinstance(wrapper, Inserted) and isinstance(wrapper.widthscope_insert, ResidualBias)  # just inserted
        bias = wrapper.widthscope_insert.bias
        for _ in _progress(range(draws), desc=f"sign agreement {point}", disable=None if progress else True):
            I = torch.randperm(na, generator=gen)[:M]
            J = torch.randperm(nb, generator=gen)[:K]
            mu_M, g_K = Sa[I].mean(0), Sb[J].mean(0)
            A = float(mu_M @ g_K)
            mis += A <= 0
            if err_sq is not None and eta * abs(A) < RESOLUTION_FACTOR * float(err_sq[J].sum().sqrt()) / K:
                low += 1  # the rounding of this draw's loss could carry its whole change
                continue
            with torch.no_grad():
                bias.copy_((-eta * mu_M).to(bias.dtype))
            with EvalMode(model):
                after = per_example_losses(model, index_batch(test, J), loss_fn, batch_size=batch_size)
            dL = float((after - base[J]).mean())
            improved += dL < 0
            agree += (dL < 0) == (A > 0) and dL != 0
    finally:
        remove_insertion(model, point)
    cert = certificate(Sa, Sb, M=M, K=K)
    n = draws - low
    lo, hi = wilson_interval(agree, n) if n else (None, None)
    return {
        "kind": "intervention",
        "probe": "sign_agreement",
        "point": point,
        "M": M,
        "K": K,
        "eta": eta,
        "draws": draws,
        "agree_rate": agree / n if n else None,
        "agree_low": lo,
        "agree_high": hi,
        "misaligned_rate": mis / draws,
        "improved_rate": improved / n if n else None,
        "dtype": _dtype_name(float_dtype(model)),
        "draws_below_resolution": low,
        "b_exact": cert.b_exact,
        "b_align": cert.b_align,
        "d_align": cert.d_align,
        "expectation": cert.expectation,
        "n_train": na,
        "n_test": nb,
    }
