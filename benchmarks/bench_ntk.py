"""Empirical NTK of a 3-layer MLP: the structured kernel (layer Grams) vs Jacobian contraction.

widthscope ``mlp`` (NTK parametrisation, ReLU, 2 hidden layers of width N, 64 inputs, 10
outputs, float32, one thread per process as the machine allows), full kernel ``(n, n, 10, 10)``:

* ``structured_s``: :func:`widthscope.linear.ntk` with ``method="structured"`` (10 backward passes
  and per-layer Gram products, no Jacobian);
* ``jacobian_s``: ``method="jacobian"`` (per-example Jacobians by vmapped reverse passes,
  contracted block by block — what ``auto`` used before), only where it takes seconds.

``speedup`` = jacobian_s / structured_s in the same run; ``max_rel_err`` compares the two kernels.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table  # noqa: E402


def run(quick: bool = False) -> list[dict[str, Any]]:
    from widthscope.linear import ntk
    from widthscope.models import build

    sizes = [(256, 32, True)] if quick else [(256, 64, True), (1024, 32, True), (1024, 256, False),
                                             (4096, 256, False)]
    rows = []
    for width, n, ref in sizes:
        torch.manual_seed(0)
        model = build("mlp", width, in_dim=64, out_dim=10, depth=2, parametrization="ntk")
        x = torch.randn(n, 64)
        ntk(model, x[:2], method="structured")  # one-time costs (dispatch, vmap set-up) are not compared
        t0 = time.perf_counter()
        K = ntk(model, x, method="structured")
        s = time.perf_counter() - t0
        row = {"width": width, "n": n, "params": sum(p.numel() for p in model.parameters()), "structured_s": s,
               "jacobian_s": None, "speedup": None, "max_rel_err": None}
        if ref:
            ntk(model, x[:2], method="jacobian")
            t0 = time.perf_counter()
            R = ntk(model, x, method="jacobian")
            row["jacobian_s"] = time.perf_counter() - t0
            row["speedup"] = row["jacobian_s"] / s
            row["max_rel_err"] = float((K - R).abs().max() / R.abs().max())
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, note="Per layer the structured kernel costs the Gram products "
                                     "O(n²·(N_in + N_out)·out²) after `out` backward passes; the Jacobian route "
                                     "costs O(n·out·P) memory and O(n²·out²·P) contraction.")


if __name__ == "__main__":
    print(markdown(run(quick="--quick" in sys.argv)))
