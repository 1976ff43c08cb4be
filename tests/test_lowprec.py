"""Low-precision models: pooled gradient statistics of a tiny Llama in bfloat16/float16 stay
within a stated tolerance of float32 (the probe casts to float64 per batch, so only the model's
own arithmetic is low precision).

Tolerance (documented in docs/performance.md), with ``u`` the unit roundoff of the model dtype
(bfloat16 ``2⁻⁸``, float16 ``2⁻¹¹``): relative error of the sample-vector matrix ≤ 4u; of the
first-order quantities ‖μ‖² and E[A] = aᵀb ≤ 8u; of the ratio quantities d_align and B_exact
≤ 16u. Why: each gradient coordinate is a product of a few rounded factors (error ≈ a few u,
partly averaging out); ‖μ‖² and aᵀb are quadratic in the samples (error ≤ 2× the samples'),
d_align = ‖μ‖⁴/max(μᵀΣμ, tr Σ²) is quartic over quadratic (≤ 4–6×), with margin for depth.
"""
from __future__ import annotations

import copy

import pytest
import torch

from widthscope import models, stats
from widthscope.probe import collect

UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = models.build("llama", 32, depth=2, vocab_size=64, max_seq_len=32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (96, 16), generator=g)
    ids[torch.rand(ids.shape, generator=g) < 0.7] = 5  # a shared target: clearly aligned gradients
    batches = [ids[i:i + 16] for i in range(0, 96, 16)]
    ref = collect(copy.deepcopy(model).float(), batches, progress=False)
    return model, batches, ref


def summary(X: torch.Tensor) -> dict[str, float]:
    a, b = X[:48], X[48:]
    c = stats.certificate(a, b, M=16, K=16, populations="two")
    return {"mu_sq": stats.moments(X).mu_sq, "expectation": c.expectation, "d_align": c.d_align,
            "b_exact": c.b_exact}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_statistics_within_tolerance(setup, dtype):
    model, batches, ref = setup
    u = UNIT[dtype]
    low = collect(copy.deepcopy(model).to(dtype), batches, progress=False)
    for point in ref:
        X32, Xlo = ref[point], low[point]
        assert Xlo.dtype == torch.float64  # accumulated in float64 whatever the model dtype
        assert ((Xlo - X32).norm() / X32.norm()).item() <= 4 * u
        s32, slo = summary(X32), summary(Xlo)
        assert s32["expectation"] > 0 and s32["d_align"] > 1  # a non-vacuous certificate to compare
        for key, tol in (("mu_sq", 8 * u), ("expectation", 8 * u), ("d_align", 16 * u), ("b_exact", 16 * u)):
            rel = abs(slo[key] - s32[key]) / abs(s32[key])
            assert rel <= tol, f"{point} {key}: relative error {rel:.2e} > {tol:.2e} in {dtype}"


def test_tolerance_is_not_vacuous(setup):
    """The bound is tight enough to catch real damage: halving a quarter of the sample vectors
    (the size of a scaling bug in pooling) moves d_align by more than the bf16 tolerance."""
    model, batches, ref = setup
    X = ref["model.layers.1"].clone()
    X[::4] *= 0.5
    s32, bad = summary(ref["model.layers.1"]), summary(X)
    assert abs(bad["d_align"] - s32["d_align"]) / s32["d_align"] > 16 * UNIT[torch.bfloat16]
