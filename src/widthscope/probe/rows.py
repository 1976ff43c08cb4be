"""What an intervention kind measures from (:class:`InterventionInputs`) and how it evaluates its
steps: all ``η`` stacked in one pass (:mod:`widthscope.probe.prefix`) or one at a time through the
inserted parameter, the rows, and the float32 re-measurement of steps below the dtype's resolution."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .._io import progress as _progress
from .collect import EvalMode, float_dtype
from .insert import ResidualBlock
from .prefix import FnSteps, stacked_totals
from .resolution import loss_rounding, mark_precision, upcast
from .steps import default_etas, mean_loss


@dataclasses.dataclass
class InterventionInputs:
    """What every intervention kind measures from (:func:`~widthscope.probe.interventions.prepare_inputs`):
    the examples, the held-out loss before the step and the activation's scale at the point, with
    ``intervene``'s settings. A kind (:data:`widthscope.registry.INTERVENTION_KINDS`) is ``fn(inputs) -> Measured``."""

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
        """One row per ``η``: copy ``e`` of the point's output gets ``steps[e]`` added, all copies in
        one stacked pass per chunk (:func:`~widthscope.probe.prefix.stacked_totals`, with this call's
        ``prefix`` and the kept prefix in ``reuse``)."""
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
        """Set the inserted parameter to ``−η·direction`` for each ``η`` and measure the held-out loss
        change, one whole forward per ``η``."""
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
    """Flag the rows below the model dtype's resolution; with ``precision="float32"`` measure those
    steps again with the model upcast (the network's full path: kept prefixes are in the dtype)."""
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
