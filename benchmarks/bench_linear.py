"""Linearization costs: the empirical NTK and a linearized training step (MLP, float32).

* ``ntk``: :func:`widthscope.linear.ntk` (all output pairs) vs the ``torch.func`` reference
  ``J = vmap(jacrev(f))(x)`` for all inputs, then ``Θ = Σ_blocks J Jᵀ`` (einsum), on ``n`` inputs.
  ``max_rel_err`` checks both give the same kernel.
* ``step``: one SGD step (forward, backward, update) of :func:`widthscope.linear.linearize`'s
  linear model vs the same step on the plain network: the price of the jvp.

Times are medians of ``repeats`` runs in one process; ratios compare times from the same run.

    python benchmarks/bench_linear.py [--quick]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import markdown_table, median_time  # noqa: E402


def _net(width: int, in_dim: int = 32, out: int = 10) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(in_dim, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, out))


def _reference_ntk(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    from torch.func import functional_call, jacrev, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, xi):
        return functional_call(model, p, (xi[None],))[0]

    J = vmap(jacrev(f), in_dims=(None, 0))(params, x)       # {name: (n, out, *shape)}
    K = None
    for j in J.values():
        j = j.flatten(2)                                      # (n, out, p_b)
        blk = torch.einsum("iap,jbp->ijab", j, j)
        K = blk if K is None else K + blk
    return K


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows ``{bench, width, n, params, ours_s, ref_s, ratio, max_rel_err}`` (ratio = ref/ours)."""
    from widthscope.linear import linearize, ntk

    widths = [64] if quick else [64, 256, 512]
    n, repeats = (32, 3) if quick else (32, 5)
    rows = []
    for width in widths:
        model = _net(width)
        P = sum(p.numel() for p in model.parameters())
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, 32, generator=g)
        y = torch.randn(n, 10, generator=g)
        K = ntk(model, x)
        R = _reference_ntk(model, x)
        err = float((K - R).abs().max() / R.abs().max())
        t_ours = median_time(lambda: ntk(model, x), repeats)
        t_ref = median_time(lambda: _reference_ntk(model, x), repeats)
        rows.append({"bench": "ntk (n×n×out×out)", "width": width, "n": n, "params": P, "ours_s": t_ours,
                     "ref_s": t_ref, "ratio": t_ref / t_ours, "max_rel_err": err})

        lin = linearize(model)
        opt_l = torch.optim.SGD(lin.parameters(), lr=1e-3)
        opt_p = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(m, opt):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()

        with torch.no_grad():
            err_lin = float((lin(x) - model(x)).abs().max())  # at θ = θ₀ the two agree
        t_lin = median_time(lambda: step(lin, opt_l), repeats)
        t_plain = median_time(lambda: step(model, opt_p), repeats)
        rows.append({"bench": "train step: linearized vs plain", "width": width, "n": n, "params": P,
                     "ours_s": t_lin, "ref_s": t_plain, "ratio": t_plain / t_lin, "max_rel_err": err_lin})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, ["bench", "width", "n", "params", "ours_s", "ref_s", "ratio", "max_rel_err"],
                          "`ratio` = ref_s / ours_s (>1: ours faster). For the train step, `ref` is the "
                          "plain network's step, so `ratio` < 1 is the linear model's extra cost; its "
                          "`max_rel_err` column is the absolute output difference at θ₀.")


if __name__ == "__main__":
    print(markdown(run("--quick" in sys.argv)))
