"""How :func:`widthscope.probe.interventions.intervene` evaluates its steps and words the results:
all ``η`` stacked in one pass (:mod:`widthscope.probe.prefix`) or one at a time through the
inserted parameter, the rows, and the float32 re-measurement of steps below the dtype's
resolution."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .._io import progress as _progress
from .collect import float_dtype, to_device
from .insert import ResidualBlock
from .prefix import FnSteps, stacked_totals
from .resolution import loss_rounding, mark_precision, upcast
from .steps import EvalMode, device_of, mean_loss


def block_steps(block: ResidualBlock, G_M: torch.Tensor, etas: Sequence[float]) -> Any:
    return FnSteps(
        torch.tensor([-float(e) for e in etas], dtype=torch.float64), lambda z: block.delta(z, G_M.to(z.device))
    )


def precision_info(
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
    dt = float_dtype(model)
    r, ref = loss_rounding(model, test, loss_fn, batch_size=batch_size, losses=test_losses)
    mark_precision(rows, dt, r)
    idx = [i for i, row in enumerate(rows) if row["below_resolution"]]
    if precision != "float32" or not idx:
        return rows
    dev = device_of(model)
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
            **compare_gain(old["predicted"], actual),
            evaluated_in="float32",
            below_resolution=False,
        )
    return rows


def bias_rows_stacked(
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
    return stacked_rows(
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


def stacked_rows(
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
    dev, dt = device_of(model), float_dtype(model)
    per = max(1, batch_size // len(etas))  # examples per stacked call, so a call holds about batch_size rows
    with EvalMode(model), torch.no_grad():
        totals, how = stacked_totals(
            model, point, steps, test, loss_fn, per, lambda b: to_device(b, dev, dt), mode=prefix, kept=kept
        )
    after = totals / K
    rows = [
        intervention_row(
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


def step_rows(
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
            intervention_row(
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


def compare_gain(predicted: float, actual: float) -> dict[str, Any]:
    return {
        "retention": actual / predicted if predicted != 0 else float("nan"),
        "sign_agrees": bool(predicted != 0 and (actual > 0) == (predicted > 0) and actual != 0),
    }


def intervention_row(
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
        **compare_gain(predicted, actual),
        "M": M,
        "K": K,
        "mu_norm": mu_norm,
        "alignment": align,
        "loss_before": loss_before,
        "act_rms": act_rms,
        "rel_step": rel_step,
    }
