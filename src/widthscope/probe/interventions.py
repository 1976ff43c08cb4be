r"""Direct residual interventions: does one first-order step at an insertion point do what
the alignment statistic predicts?

Bias probe: step ``v = −η μ_M`` predicts ``ΔL = −η μ_Mᵀ g_K + O(η²)``, so ``retention = ΔL_actual / ΔL_pred → 1``.
Block probe: step ``W_out = −η G_M`` predicts ``−η ⟨G_M, G_K⟩_F``. Maths: docs/interventions.md §2.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe.interventions import intervene
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    >>> x, y = torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,))
    >>> rows = intervene(net, "1", [(x[:32], y[:32])], [(x[32:], y[32:])], progress=False)
    >>> abs(rows[0]["retention"] - 1) < 0.01      # smallest η
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from .. import _args
from .._io import progress as _progress
from ..errors import WidthscopeError
from ..registry import INTERVENTION_KINDS
from ..stats import certificate, wilson_interval
from .batches import as_examples, batch_size_of, index_batch, take
from .blocks import block_features, w_out_grad
from .collect import EvalMode, activation_rms, float_dtype
from .insert import Inserted, ResidualBlock, inserted, resolve_module
from .prefix import FnSteps, stacked_totals
from .resolution import (
    RESOLUTION_FACTOR,
    dtype_name,
    loss_rounding,
    mark_precision,
    projected_rounding,
    sample_errors,
    upcast,
)
from .steps import (
    check_etas,
    check_rel_step,
    default_etas,
    mean_loss,
    per_example_losses,
    point_activation_rms,
    point_samples,
)


@dataclasses.dataclass
class InterventionInputs:
    """What an intervention kind (``fn(inputs) -> Measured``) measures from, with :func:`intervene`'s settings."""

    model: nn.Module
    point: str
    kind: str
    train: Any  # the first M train examples, one batch
    test: Any  # the first K held-out examples, one batch
    M: int
    K: int
    act_rms: float  # RMS entry of the activation at the point (train examples)
    width: int  # its channel width
    test_losses: torch.Tensor  # per-example held-out losses before the step, float64 on the CPU
    loss_fn: Callable | None
    batch_size: int
    etas: Sequence[float] | None
    n_etas: int
    max_rel_step: float
    block_width: int | None
    seed: int
    progress: bool
    reuse: dict[str, Any]
    prefix: str
    precision: str

    @property
    def loss_before(self) -> float:
        return float(self.test_losses.mean())

    def etas_for(self, step_norm: float) -> Sequence[float]:
        """The given ``etas``, or the default grid for a step whose RMS entry per unit ``η`` is ``step_norm``."""
        return self.etas or default_etas(step_norm, self.act_rms, self.n_etas, high=self.max_rel_step)

    def row(
        self, eta: float, actual: float, align: float, step_norm: float, mu_norm: float, **extra: Any
    ) -> dict[str, Any]:
        """One row: the step ``η``, its predicted ``−η·align`` and ``actual`` held-out loss change."""
        predicted = -eta * align
        return {
            "kind": "intervention",
            "probe": self.kind,
            "point": self.point,
            "eta": eta,
            "predicted": predicted,
            "actual": actual,
            **_gain(predicted, actual),
            "M": self.M,
            "K": self.K,
            "mu_norm": mu_norm,
            "alignment": align,
            "loss_before": self.loss_before,
            "act_rms": self.act_rms,
            # RMS entry of the change over RMS entry of the activation: comparable across points and widths
            "rel_step": eta * step_norm / self.act_rms if self.act_rms > 0 else float("nan"),
            **extra,
        }

    def stacked_rows(
        self, steps: Any, etas: Sequence[float], align: float, step_norm: float, mu_norm: float
    ) -> list[dict[str, Any]]:
        """One row per ``η``, copy ``e`` of the point's output getting ``steps[e]``, in one stacked pass."""
        model, dt, kept = self.model, float_dtype(self.model), self.reuse.get("prefix")
        with EvalMode(model), torch.no_grad():
            totals, how = stacked_totals(
                model, self.point, steps, self.test, self.loss_fn, self.batch_size, dt, mode=self.prefix, kept=kept
            )
        after = totals / self.K
        return [
            self.row(float(eta), float(after[i]) - self.loss_before, align, step_norm, mu_norm, prefix=how)
            for i, eta in enumerate(etas)
        ]

    def step_rows(
        self, param: torch.Tensor, direction: torch.Tensor, etas: Sequence[float], align: float, step_norm: float
    ) -> list[dict[str, Any]]:
        """One row per ``η``, the inserted parameter set to ``−η·direction`` (one forward each)."""
        rows = []
        for eta in _progress(etas, desc=f"intervene {self.kind} {self.point}", disable=None if self.progress else True):
            with torch.no_grad():
                param.copy_((-eta * direction).to(param.dtype))
            after = mean_loss(self.model, self.test, self.loss_fn, batch_size=self.batch_size)
            rows.append(self.row(eta, after - self.loss_before, align, step_norm, float(direction.norm())))
        return rows


def block_steps(block: ResidualBlock, G_M: torch.Tensor, etas: Sequence[float]) -> FnSteps:
    """The block probe's steps ``−η_e·G_M φ(W_in norm(z))`` (the block's output at ``W_out = −η_e G_M``)."""
    coef = torch.tensor([-float(e) for e in etas], dtype=torch.float64)
    return FnSteps(coef, lambda z: block.delta(z, G_M.to(z.device)))


def precision_info(x: InterventionInputs, rows: list[dict[str, Any]], steps: Callable[[], Any]) -> list[dict[str, Any]]:
    """Flag the rows below the dtype's resolution; ``precision="float32"`` re-measures them upcast."""
    model = x.model
    r, ref = loss_rounding(model, x.test, x.loss_fn, batch_size=x.batch_size, losses=x.test_losses)
    mark_precision(rows, float_dtype(model), r)
    idx = [i for i, row in enumerate(rows) if row["below_resolution"]]
    if x.precision != "float32" or not idx:
        return rows
    with upcast(model), EvalMode(model), torch.no_grad():
        low = steps()[torch.tensor(idx)]
        totals, _ = stacked_totals(model, x.point, low, x.test, x.loss_fn, x.batch_size, torch.float32, mode="full")
    assert ref is not None  # rows fall below resolution only for a low-precision model, which has ref
    base = float(ref.mean())
    for j, i in enumerate(idx):
        old = rows[i]
        actual = float(totals[j]) / x.K - base
        old.update(
            actual_in_dtype=old["actual"],
            actual=actual,
            **_gain(old["predicted"], actual),
            evaluated_in="float32",
            below_resolution=False,
        )
    return rows


def _gain(predicted: float, actual: float) -> dict[str, Any]:
    return {
        "retention": actual / predicted if predicted != 0 else float("nan"),
        "sign_agrees": bool(predicted != 0 and (actual > 0) == (predicted > 0) and actual != 0),
    }


@dataclasses.dataclass
class Measured:
    """A kind's rows (one per ``η``), its steps (for the float32 re-measure), alignment and rounding bound."""

    rows: list[dict[str, Any]]
    steps: Callable[[], Any]
    alignment: float
    alignment_bound: float | None = None


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
    """The held-out loss change of first-order steps at ``point`` against their prediction, one row per η,
    on the first ``M``/``K`` examples; ``reuse`` takes a probe of the same batches. Options: docs/interventions.md §2.
    """
    fn = "intervene"  # the types first, before any work
    _args.module(fn, "model", model)
    _args.string(fn, "point", point, empty=True, accepts="a module path (str)")
    _args.batches(fn, "train_batches", train_batches, single=True)
    _args.batches(fn, "test_batches", test_batches, single=True)
    _args.numbers_list(fn, "etas", etas, accepts="a list of positive step sizes or None")
    _args.choice(fn, "kind", kind, INTERVENTION_KINDS)
    _args.function(fn, "loss_fn", loss_fn)
    for name, value in dict(M=M, K=K, n_etas=n_etas, block_width=block_width, batch_size=batch_size).items():
        _args.integer(fn, name, value, lo=1, optional=name in ("M", "K", "block_width"))
    check_rel_step(max_rel_step, fn)
    _args.integer(fn, "seed", seed)
    _args.boolean(fn, "progress", progress)
    _args.mapping(fn, "reuse", reuse)
    _args.choice(fn, "prefix", prefix, ("auto", "full"), values=False)
    _args.choice(fn, "precision", precision, ("mark", "float32"))
    if prefix not in ("auto", "full"):
        raise WidthscopeError(f"prefix must be 'auto' or 'full', got {prefix!r}")
    if etas is not None:
        etas = check_etas(etas)
    if isinstance(resolve_module(model, point), Inserted):
        raise WidthscopeError(
            f"point {point!r} already has an insertion; intervene on the model without it (or on another point)"
        )
    train = take(as_examples(train_batches), M, what="train (M)")
    test = take(as_examples(test_batches), K, what="test (K)")
    M, K = batch_size_of(train), batch_size_of(test)
    reuse = dict(reuse or {})
    probe = reuse if INTERVENTION_KINDS.info(kind).get("reuse_probe") else {}
    if probe.get("act_sq") is not None and len(probe["act_sq"]) >= M:
        act_rms, width = activation_rms(probe["act_sq"], M), int(probe["width"])
    else:
        act_rms, width = point_activation_rms(model, point, train, loss_fn, batch_size)
    if probe.get("test_losses") is not None and len(probe["test_losses"]) >= K:
        test_losses = probe["test_losses"][:K].double().cpu()
    else:  # = mean_loss, keeping the per-example losses for the precision check
        with EvalMode(model):
            test_losses = per_example_losses(model, test, loss_fn, batch_size=batch_size)
    values = locals()  # every field of InterventionInputs is a name here
    x = InterventionInputs(**{f.name: values[f.name] for f in dataclasses.fields(InterventionInputs)})
    return assemble_rows(x, INTERVENTION_KINDS.get(kind)(x))


def measure_bias(x: InterventionInputs) -> Measured:
    """The bias probe: ``v = −η μ_M``, predicted ``−η μ_Mᵀ g_K`` (with its rounding bound in low precision)."""
    if x.reuse.get("train") is not None and x.reuse.get("test") is not None:
        Sa, Sb = x.reuse["train"][: x.M], x.reuse["test"][: x.K]
    else:
        Sa, Sb = (point_samples(x.model, x.point, d, x.loss_fn, x.batch_size) for d in (x.train, x.test))
    mu, g = Sa.mean(0), Sb.mean(0)
    align = float(mu @ g)
    step_norm = float(mu.norm()) / math.sqrt(mu.numel())
    etas = x.etas_for(step_norm)
    steps = torch.stack([-float(e) * mu for e in etas])  # (E, N), float64
    rows = x.stacked_rows(steps, etas, align, step_norm, float(mu.norm()))
    bound = None
    errs = sample_errors(x.model, x.point, x.train, x.test, x.loss_fn, batch_size=x.batch_size)
    if errs is not None:  # a bfloat16/float16 model (None for float32/float64)
        ea, eb = errs
        bound = projected_rounding(ea, g) + projected_rounding(eb, mu)
    return Measured(rows, lambda: steps, align, bound)


def measure_block(x: InterventionInputs) -> Measured:
    """The block probe: ``W_out = −η G_M`` in a zero-``W_out`` block, predicted ``−η⟨G_M, G_K⟩_F``."""
    model, point = x.model, x.point
    with inserted(model, point, "block", width=x.width, hidden=x.block_width, seed=x.seed) as block:
        G_M = w_out_grad(model, point, x.train, x.loss_fn, x.batch_size)
        G_K = w_out_grad(model, point, x.test, x.loss_fn, x.batch_size)
        align = float((G_M * G_K).sum())
        # RMS entry of the block output change per unit η: ‖G_M h‖ ≈ ‖G_M‖_F · rms(h) · √N_h / √N.
        _, h = block_features(model, point, take(x.train, min(x.M, 64)), x.loss_fn, batch_size=x.batch_size)
        h_rms = float(h.pow(2).mean().sqrt())
        N, Hd = block.w_out.shape[0], block.w_out.shape[1]
        step_norm = float(G_M.norm()) * h_rms * math.sqrt(Hd) / math.sqrt(N)
        etas = x.etas_for(step_norm)
        if x.prefix == "full":
            rows = x.step_rows(block.w_out, G_M, etas, align, step_norm)
            for r in rows:
                r["prefix"] = "full: requested"
    if x.prefix != "full":
        # the same steps on the model without the insertion (the block is linear in W_out)
        rows = x.stacked_rows(block_steps(block, G_M, etas), etas, align, step_norm, float(G_M.norm()))
    return Measured(rows, lambda: block_steps(block, G_M, etas), align)


def assemble_rows(x: InterventionInputs, measured: Measured) -> list[dict[str, Any]]:
    """The rows with their precision (:func:`precision_info`) and the alignment's rounding bound."""
    rows = precision_info(x, measured.rows, measured.steps)
    if (bound := measured.alignment_bound) is not None:
        for r in rows:
            r.update(alignment_bound=bound, alignment_within_rounding=abs(measured.alignment) <= bound)
    return rows


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
    r"""How often the bias probe's predicted sign of ``ΔL`` (that of ``−μ_Mᵀ g_K``) is right over random
    ``(M, K)`` draws, beside the misalignment and the certificate (draws below resolution counted apart)."""
    if eta is not None:
        eta = check_etas([eta])[0]
    train, test = as_examples(train_batches), as_examples(test_batches)
    na, nb = batch_size_of(train), batch_size_of(test)
    for name, value, pool in (("M", M, na), ("K", K, nb), ("draws", draws, None)):
        _args.integer("sign_agreement", name, value, lo=1, hi=pool)
    Sa, Sb = (point_samples(model, point, d, loss_fn, batch_size) for d in (train, test))
    act_rms, _ = point_activation_rms(model, point, train, loss_fn, batch_size)
    if eta is None:
        mu = Sa.mean(0)
        eta = default_etas(float(mu.norm()) / math.sqrt(mu.numel()), act_rms, 1, low=1e-3)[0]
    with EvalMode(model):
        base = per_example_losses(model, test, loss_fn, batch_size=batch_size)
    _, ref = loss_rounding(model, test, loss_fn, batch_size=batch_size, losses=base)
    err_sq = None if ref is None else (base - ref).pow(2)
    gen = torch.Generator().manual_seed(int(seed))
    agree = mis = improved = low = 0
    with inserted(model, point, "bias", width=Sa.shape[1]) as ins:
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
                ins.bias.copy_((-eta * mu_M).to(ins.bias.dtype))
            with EvalMode(model):
                after = per_example_losses(model, index_batch(test, J), loss_fn, batch_size=batch_size)
            dL = float((after - base[J]).mean())
            improved += dL < 0
            agree += (dL < 0) == (A > 0) and dL != 0
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
        "dtype": dtype_name(float_dtype(model)),
        "draws_below_resolution": low,
        **{k: getattr(cert, k) for k in ("b_exact", "b_align", "d_align", "expectation")},
        "n_train": na,
        "n_test": nb,
    }
