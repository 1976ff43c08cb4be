"""Monte Carlo checks with known truth: unbiasedness on non-Gaussian data, plug-in bias,
and the certificate against simulated misalignment (one and two populations).

Seeds are fixed, so each check is deterministic; tolerances are ~4-5 standard errors.
"""
import math

import numpy as np
import pytest
import torch

from widthscope.stats import CrossMoments, Moments, certificate, cross_moments, moments, wilson_interval

D = torch.float64


def _noise(kind, shape, g):
    """Zero-mean, unit-variance, non-Gaussian noise."""
    if kind == "exp":  # centred exponential (skewed)
        return -torch.log(torch.rand(shape, generator=g, dtype=D)) - 1.0
    if kind == "t5":  # Student-t, 5 degrees of freedom, scaled to unit variance
        chi2 = (torch.randn(*shape, 5, generator=g, dtype=D) ** 2).sum(-1)
        return torch.randn(shape, generator=g, dtype=D) / torch.sqrt(chi2 / 5) * math.sqrt(3 / 5)
    raise ValueError(kind)


def _population(d, seed, mean_scale):
    g = torch.Generator().manual_seed(seed)
    mu = mean_scale * torch.randn(d, generator=g, dtype=D)
    L = torch.randn(d, d, generator=g, dtype=D) * torch.logspace(0, -1, d, dtype=D)  # anisotropic
    return mu, L, L @ L.T


def _sample(kind, mu, L, n, g):
    return mu + _noise(kind, (n, len(mu)), g) @ L.T


def _check_unbiased(est, truth, name):
    est = np.asarray(est)
    se = est.std(ddof=1) / math.sqrt(len(est))
    assert abs(est.mean() - truth) < 4 * se, f"{name}: mean {est.mean():.5g} vs truth {truth:.5g} (se {se:.3g})"


@pytest.mark.parametrize("kind", ["exp", "t5"])
def test_one_population_unbiased_by_monte_carlo(kind):
    d, n, reps = 4, 8, 3000
    mu, L, S = _population(d, seed=1, mean_scale=0.6)
    truth = {"mu_sq": float(mu @ mu), "mu_sigma_mu": float(mu @ S @ mu),
             "tr_sigma_sq": float((S @ S).trace())}
    g = torch.Generator().manual_seed(2)
    rows = {k: [] for k in truth}
    plug = []
    for r in range(reps):
        X = _sample(kind, mu, L, n, g)
        m = moments(X, method="dual" if r % 2 else "primal")
        for k in truth:
            rows[k].append(getattr(m, k))
        plug.append(moments(X, "plugin").mu_sq)
    for k, v in truth.items():
        _check_unbiased(rows[k], v, k)
    # plug-in ‖x̄‖² is biased upward by tr(Σ)/n, and visibly so
    plug = np.asarray(plug)
    se = plug.std(ddof=1) / math.sqrt(reps)
    bias = plug.mean() - truth["mu_sq"]
    assert abs(bias - float(S.trace()) / n) < 4 * se
    assert bias > 4 * se


@pytest.mark.parametrize("kind", ["exp", "t5"])
def test_two_population_unbiased_by_monte_carlo(kind):
    d, na, nb, reps = 4, 6, 5, 3000
    a, La, Sa = _population(d, seed=3, mean_scale=0.6)
    b, Lb, Sb = _population(d, seed=4, mean_scale=0.6)
    b = b + a  # make the means correlated so aᵀb is sizeable
    truth = {"ab": float(a @ b), "b_sigma_a_b": float(b @ Sa @ b), "a_sigma_b_a": float(a @ Sb @ a),
             "tr_sigma_a_sigma_b": float((Sa @ Sb).trace())}
    g = torch.Generator().manual_seed(5)
    rows = {k: [] for k in truth}
    plug = []
    for r in range(reps):
        Xa, Xb = _sample(kind, a, La, na, g), _sample(kind, b, Lb, nb, g)
        c = cross_moments(Xa, Xb, method="dual" if r % 2 else "primal")
        for k in truth:
            rows[k].append(getattr(c, k))
        plug.append(cross_moments(Xa, Xb, "plugin").b_sigma_a_b)
    for k, v in truth.items():
        _check_unbiased(rows[k], v, k)
    # aᵀb has no plug-in bias (independent means), but plug-in b̂ᵀΣ̂_a b̂ is biased upward by
    # tr(Σ_aΣ_b)/n_b: E[b̂ᵀΣ̂_a b̂] = bᵀΣ_a b + tr(Σ_aΣ_b)/n_b.
    plug = np.asarray(plug)
    se = plug.std(ddof=1) / math.sqrt(reps)
    bias = plug.mean() - truth["b_sigma_a_b"]
    assert abs(bias - truth["tr_sigma_a_sigma_b"] / nb) < 4 * se
    assert bias > 4 * se


def _simulate_A(kind, a, La, b, Lb, M, K, reps, seed):
    g = torch.Generator().manual_seed(seed)
    mu_M = a + _noise(kind, (reps, M, len(a)), g).mean(1) @ La.T
    g_K = b + _noise(kind, (reps, K, len(b)), g).mean(1) @ Lb.T
    return (mu_M * g_K).sum(1)


def _check_against_simulation(c, A):
    reps = len(A)
    A = A.numpy()
    se_mean = A.std(ddof=1) / math.sqrt(reps)
    assert abs(A.mean() - c.expectation) < 4.5 * se_mean
    var = A.var(ddof=1)
    se_var = math.sqrt(np.mean((A - A.mean()) ** 4) - var ** 2) / math.sqrt(reps)
    assert abs(var - c.variance) < 4.5 * se_var, (var, c.variance, se_var)
    k = int((A <= 0).sum())
    lo, _ = wilson_interval(k, reps)
    assert 0 < k  # the setting is chosen so misalignment happens
    assert lo <= c.b_exact <= c.b_align
    return k / reps


@pytest.mark.parametrize("kind", ["exp", "t5"])
def test_certificate_one_population_vs_simulation(kind):
    d, M, K = 6, 4, 5
    mu, L, S = _population(d, seed=6, mean_scale=0.35)
    m = Moments(10 ** 6, d, float(mu @ mu), float(mu @ S @ mu), float((S @ S).trace()), "unbiased", "truth")
    c = certificate(m, M=M, K=K)
    assert not c.vacuous and c.populations == "one"
    A = _simulate_A(kind, mu, L, mu, L, M, K, 40000, seed=7)
    p = _check_against_simulation(c, A)
    assert p <= c.b_exact


@pytest.mark.parametrize("kind", ["exp", "t5"])
def test_certificate_two_population_vs_simulation(kind):
    d, M, K = 6, 3, 7
    a, La, Sa = _population(d, seed=8, mean_scale=0.4)
    b, Lb, Sb = _population(d, seed=9, mean_scale=0.2)
    b = b + 0.8 * a
    cm = CrossMoments(10 ** 6, 10 ** 6, d, float(a @ b), float(b @ Sa @ b), float(a @ Sb @ a),
                      float((Sa @ Sb).trace()), "unbiased", "truth")
    c = certificate(cm, M=M, K=K)
    assert not c.vacuous and c.populations == "two"
    A = _simulate_A(kind, a, La, b, Lb, M, K, 40000, seed=10)
    _check_against_simulation(c, A)


def test_estimated_certificate_tracks_simulation():
    """Certificate estimated from a finite sample is close to the one from the truth."""
    d, M, K = 6, 4, 4
    mu, L, S = _population(d, seed=11, mean_scale=0.35)
    g = torch.Generator().manual_seed(12)
    X = _sample("exp", mu, L, 20000, g)
    est = certificate(X, M=M, K=K)
    true = certificate(Moments(1, d, float(mu @ mu), float(mu @ S @ mu), float((S @ S).trace()),
                               "unbiased", "truth"), M=M, K=K)
    assert est.b_exact == pytest.approx(true.b_exact, rel=0.1)
    assert est.d_align == pytest.approx(true.d_align, rel=0.15)
