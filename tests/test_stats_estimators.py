"""Estimators of widthscope.stats against float64 brute-force oracles.

Oracles: explicit sums over distinct index tuples (itertools.permutations), exact
expectations over every sample of a finite-support population (so "unbiased" is checked
exactly, not statistically), explicit covariance matrices (torch.cov) for plug-in.
"""
import itertools
import math

import numpy as np
import pytest
import torch

from widthscope.errors import WidthscopeError
from widthscope.stats import (
    CrossMoments,
    Moments,
    PrimalMoments,
    cross_moments,
    cross_moments_from_gram,
    gram_sums,
    moments,
    moments_from_gram,
)

D = torch.float64


def _rand(n, d, seed, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=D) + shift * torch.linspace(-1, 2, d, dtype=D)


def brute_one(X):
    """U-statistics by explicit averages over ordered tuples of distinct indices."""
    G = (X @ X.T).tolist()
    n = len(G)
    s2 = math.fsum(G[i][j] for i, j in itertools.permutations(range(n), 2)) / math.perm(n, 2)
    sq = math.fsum(G[i][j] ** 2 for i, j in itertools.permutations(range(n), 2)) / math.perm(n, 2)
    s3 = math.fsum(G[i][j] * G[j][k] for i, j, k in itertools.permutations(range(n), 3)) / math.perm(n, 3)
    s4 = math.fsum(G[i][j] * G[k][l] for i, j, k, l in itertools.permutations(range(n), 4)) / math.perm(n, 4)
    return s2, s3 - s4, sq - 2 * s3 + s4


def brute_two(Xa, Xb):
    """Two-population estimators by explicit averages over distinct index pairs."""
    C = (Xa @ Xb.T).tolist()
    na, nb = len(C), len(C[0])
    pa, pb = list(itertools.permutations(range(na), 2)), list(itertools.permutations(range(nb), 2))
    ab = math.fsum(C[i][j] for i in range(na) for j in range(nb)) / (na * nb)
    e_sq = math.fsum(C[i][j] ** 2 for i in range(na) for j in range(nb)) / (na * nb)
    e_row = math.fsum(C[i][j] * C[i][k] for i in range(na) for j, k in pb) / (na * len(pb))
    e_col = math.fsum(C[i][j] * C[k][j] for i, k in pa for j in range(nb)) / (len(pa) * nb)
    e_both = math.fsum(C[i][j] * C[k][l] for i, k in pa for j, l in pb) / (len(pa) * len(pb))
    return ab, e_row - e_both, e_col - e_both, e_sq - e_row - e_col + e_both


def _vals(m):
    if isinstance(m, Moments):
        return np.array([m.mu_sq, m.mu_sigma_mu, m.tr_sigma_sq])
    return np.array([m.ab, m.b_sigma_a_b, m.a_sigma_b_a, m.tr_sigma_a_sigma_b])


# ----------------------------------------------------------------------------- brute force
@pytest.mark.parametrize("n", [5, 6, 7])
def test_one_population_matches_distinct_index_sums(n):
    X = _rand(n, 3, seed=n)
    want = np.array(brute_one(X))
    for method in ("dual", "primal"):
        got = _vals(moments(X, method=method))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_vals(moments_from_gram(X @ X.T)), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("na,nb", [(2, 3), (4, 5), (5, 4)])
def test_two_population_matches_distinct_index_sums(na, nb):
    Xa, Xb = _rand(na, 3, seed=10 + na), _rand(nb, 3, seed=20 + nb, shift=0.8)
    want = np.array(brute_two(Xa, Xb))
    for method in ("dual", "primal"):
        np.testing.assert_allclose(_vals(cross_moments(Xa, Xb, method=method)), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_vals(cross_moments_from_gram(Xa @ Xb.T)), want, rtol=1e-10, atol=1e-12)


def test_gram_sums_match_definitions_and_batch():
    X = _rand(6, 4, seed=3)
    G = (X @ X.T)
    Gl = G.tolist()
    P = lambda k: itertools.permutations(range(6), k)  # noqa: E731
    S = math.fsum(Gl[i][j] for i, j in P(2))
    A = math.fsum(Gl[i][j] ** 2 for i, j in P(2))
    B = math.fsum(Gl[i][j] * Gl[j][k] for i, j, k in P(3))
    C = math.fsum(Gl[i][j] * Gl[k][l] for i, j, k, l in P(4))
    got = [float(v) for v in gram_sums(G)]
    np.testing.assert_allclose(got, [S, A, B, C], rtol=1e-11)
    Sb, Ab, Bb, Cb = gram_sums(torch.stack([G, 2 * G]))  # batched over leading dims
    np.testing.assert_allclose(Sb.numpy(), [S, 2 * S], rtol=1e-11)
    np.testing.assert_allclose(Cb.numpy(), [C, 4 * C], rtol=1e-10)
    pm = PrimalMoments(4).update(X)
    np.testing.assert_allclose(pm.sums(), [S, A, B, C], rtol=1e-10)


# ----------------------------------------------------------------------------- exact unbiasedness
def _population(k, d, seed, shift):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(k, d, generator=g, dtype=D) + shift
    w = torch.rand(k, generator=g, dtype=D) + 0.2
    w = w / w.sum()
    mu = w @ Z
    cov = ((Z - mu).T * w) @ (Z - mu)  # explicit covariance of the discrete distribution
    return Z, w, mu, cov


def _exact_expectation(Z, w, n, fn):
    """E[fn(X)] over all n-tuples of i.i.d. draws from the discrete distribution (Z, w)."""
    total = 0.0
    for idx in itertools.product(range(len(w)), repeat=n):
        p = float(torch.prod(w[list(idx)]))
        total = total + p * np.asarray(fn(Z[list(idx)]))
    return total


def test_one_population_exactly_unbiased_on_discrete_population():
    Z, w, mu, cov = _population(3, 2, seed=1, shift=0.7)
    truth = [float(mu @ mu), float(mu @ cov @ mu), float((cov @ cov).trace())]
    for method in ("dual", "primal"):
        got = _exact_expectation(Z, w, 4, lambda X: _vals(moments(X, method=method)))
        np.testing.assert_allclose(got, truth, rtol=1e-9, atol=1e-12)
    # plug-in is biased in ‖μ‖² by exactly tr(Σ)/n
    got = _exact_expectation(Z, w, 4, lambda X: _vals(moments(X, "plugin"))[:1])
    np.testing.assert_allclose(got, [truth[0] + float(cov.trace()) / 4], rtol=1e-9)


def test_two_population_exactly_unbiased_on_discrete_populations():
    Za, wa, a, Sa = _population(3, 2, seed=2, shift=0.5)
    Zb, wb, b, Sb = _population(2, 2, seed=3, shift=0.9)
    truth = np.array([float(a @ b), float(b @ Sa @ b), float(a @ Sb @ a), float((Sa @ Sb).trace())])
    na, nb = 3, 3
    total = 0.0
    for ia in itertools.product(range(3), repeat=na):
        pa = float(torch.prod(wa[list(ia)]))
        for ib in itertools.product(range(2), repeat=nb):
            pb = float(torch.prod(wb[list(ib)]))
            total = total + pa * pb * _vals(cross_moments(Za[list(ia)], Zb[list(ib)], method="primal"))
    np.testing.assert_allclose(total, truth, rtol=1e-9, atol=1e-12)


def test_variance_formula_exact_by_enumeration():
    """Var(μ_Mᵀ g_K) = bᵀΣ_a b/M + aᵀΣ_b a/K + tr(Σ_aΣ_b)/(MK), enumerated exactly."""
    from widthscope.stats import certificate

    Za, wa, a, Sa = _population(3, 2, seed=4, shift=0.4)
    Zb, wb, b, Sb = _population(3, 2, seed=5, shift=0.6)
    M, K = 2, 3
    ta = [(float(torch.prod(wa[list(i)])), Za[list(i)].mean(0)) for i in itertools.product(range(3), repeat=M)]
    tb = [(float(torch.prod(wb[list(j)])), Zb[list(j)].mean(0)) for j in itertools.product(range(3), repeat=K)]
    e1 = math.fsum(p * q * float(u @ v) for p, u in ta for q, v in tb)
    e2 = math.fsum(p * q * float(u @ v) ** 2 for p, u in ta for q, v in tb)
    cm = CrossMoments(100, 100, 2, float(a @ b), float(b @ Sa @ b), float(a @ Sb @ a),
                      float((Sa @ Sb).trace()), "unbiased", "dual")
    c = certificate(cm, M=M, K=K)
    assert c.expectation == pytest.approx(e1, rel=1e-12)
    assert c.variance == pytest.approx(e2 - e1 ** 2, rel=1e-9)


# ----------------------------------------------------------------------------- forms agree
@pytest.mark.parametrize("n,d", [(40, 7), (9, 30), (300, 12), (64, 64)])
def test_dual_equals_primal(n, d):
    X = _rand(n, d, seed=n + d, shift=1.5)
    for est in ("unbiased", "plugin"):
        du, pr = moments(X, est, "dual"), moments(X, est, "primal")
        scale = float((X * X).sum(1).mean()) ** 2  # size of the cancelling terms
        np.testing.assert_allclose(_vals(du), _vals(pr), rtol=1e-10, atol=1e-12 * scale)
        assert du.tr_sigma == pytest.approx(pr.tr_sigma, rel=1e-10)
    Y = _rand(n + 3, d, seed=7, shift=1.0)
    for est in ("unbiased", "plugin"):
        du, pr = cross_moments(X, Y, est, "dual"), cross_moments(X, Y, est, "primal")
        np.testing.assert_allclose(_vals(du), _vals(pr), rtol=1e-10, atol=1e-12 * scale)


def test_auto_method_picks_cheaper_form():
    assert moments(_rand(10, 50, 0)).method == "dual"
    assert moments(_rand(50, 10, 0)).method == "primal"
    assert cross_moments(_rand(10, 50, 0), _rand(12, 50, 1)).method == "dual"
    assert cross_moments(_rand(100, 5, 0), _rand(100, 5, 1)).method == "primal"


def test_dual_blocks_match_single_block(monkeypatch):
    import widthscope.stats.estimators as mm

    X = _rand(37, 50, seed=9)
    whole = [moments(X, est, "dual") for est in ("unbiased", "plugin")]
    monkeypatch.setattr(mm, "_BLOCK", 8)
    blocked = [moments(X, est, "dual") for est in ("unbiased", "plugin")]
    for w, b in zip(whole, blocked):
        np.testing.assert_allclose(_vals(w), _vals(b), rtol=1e-11)


def test_merged_shards_equal_whole_and_tensor_round_trip():
    X = _rand(103, 6, seed=11)
    shards = [PrimalMoments(6).update(X[i:i + 25]) for i in range(0, 103, 25)]
    merged = shards[0]
    for s in shards[1:]:
        merged = merged + s
    assert merged.n == 103
    for est in ("unbiased", "plugin"):
        np.testing.assert_allclose(_vals(merged.finalize(est)), _vals(moments(X, est, "primal")), rtol=1e-11)
    # round trip is exact
    back = PrimalMoments.from_tensor(merged.to_tensor(), 6)
    assert back.n == merged.n
    for f in ("s", "M", "v", "q2", "q4"):
        assert torch.equal(getattr(back, f), getattr(merged, f))
    # all_reduce(SUM) of flat tensors == merge
    summed = PrimalMoments.from_tensor(sum(s.to_tensor() for s in shards), 6)
    np.testing.assert_allclose(_vals(summed.finalize()), _vals(merged.finalize()), rtol=1e-11)
    assert merged.to_tensor().shape == (3 + 2 * 6 + 36,)
    assert merged.to_tensor().dtype == D
    # cross moments from merged shards equal those from the samples
    Y = _rand(50, 6, seed=12)
    pb = PrimalMoments(6).update(Y[:20]) + PrimalMoments(6).update(Y[20:])
    np.testing.assert_allclose(_vals(cross_moments(merged, pb)), _vals(cross_moments(X, Y, method="dual")),
                               rtol=1e-10)


def test_inputs_numpy_and_low_precision():
    X = _rand(30, 5, seed=13)
    ref = _vals(moments(X))
    np.testing.assert_allclose(_vals(moments(X.numpy())), ref, rtol=1e-12)
    X32 = X.float()
    np.testing.assert_allclose(_vals(moments(X32)), _vals(moments(X32.double())), rtol=1e-12)


# ----------------------------------------------------------------------------- plug-in / identities
def test_plugin_matches_explicit_covariance():
    X = _rand(25, 4, seed=14)
    mean = X.mean(0)
    cov = torch.cov(X.T)
    want = [float(mean @ mean), float(mean @ cov @ mean), float((cov @ cov).trace())]
    for method in ("dual", "primal"):
        np.testing.assert_allclose(_vals(moments(X, "plugin", method)), want, rtol=1e-11)
    np.testing.assert_allclose(_vals(moments_from_gram(X @ X.T, "plugin")), want, rtol=1e-11)
    Y = _rand(19, 4, seed=15)
    b, covb = Y.mean(0), torch.cov(Y.T)
    want2 = [float(mean @ b), float(b @ cov @ b), float(mean @ covb @ mean), float((cov @ covb).trace())]
    for method in ("dual", "primal"):
        np.testing.assert_allclose(_vals(cross_moments(X, Y, "plugin", method)), want2, rtol=1e-11)


def test_unbiased_mean_norm_is_plugin_minus_trace_over_n():
    """‖μ‖² estimate = ‖x̄‖² − tr(Σ̂)/n with the explicit 1/(n−1) covariance."""
    X = _rand(17, 6, seed=16)
    mean, cov = X.mean(0), torch.cov(X.T)
    m = moments(X)
    assert m.mu_sq == pytest.approx(float(mean @ mean - cov.trace() / 17), rel=1e-11)
    assert m.tr_sigma == pytest.approx(float(cov.trace()), rel=1e-11)


# ----------------------------------------------------------------------------- bad input
def test_too_few_samples():
    with pytest.raises(WidthscopeError, match=r"need at least 4 samples, got n=3"):
        moments(_rand(3, 5, 0))
    with pytest.raises(WidthscopeError, match=r"need at least 4 samples, got n=2"):
        PrimalMoments(5).update(_rand(2, 5, 0)).finalize()
    with pytest.raises(WidthscopeError, match=r"need at least 2 samples, got n=1"):
        cross_moments(_rand(1, 5, 0), _rand(4, 5, 0))


def test_bad_shapes_and_values():
    with pytest.raises(WidthscopeError, match="empty"):
        moments(torch.zeros(0, 4))
    with pytest.raises(WidthscopeError, match="2-D"):
        moments(torch.zeros(10))
    with pytest.raises(WidthscopeError, match="train has dimension d=4 but test has d=5"):
        cross_moments(_rand(6, 4, 0), _rand(6, 5, 0))
    with pytest.raises(WidthscopeError, match="dimension d=5 but 4 was expected"):
        PrimalMoments(4).update(_rand(6, 5, 0))
    with pytest.raises(WidthscopeError, match="cannot merge PrimalMoments of dimension 4 and 5"):
        PrimalMoments(4) + PrimalMoments(5)
    X = _rand(10, 3, 0)
    X[2, 1] = float("nan")
    X[7, 0] = float("inf")
    with pytest.raises(WidthscopeError, match=r"NaN/Inf in 2 row\(s\): 2, 7"):
        moments(X)
    from widthscope.stats import as_matrix

    big = torch.full((4, 3), 1e308, dtype=D)  # finite entries whose sum overflows: accepted
    assert torch.equal(as_matrix(big), big)
    big[1, 2] = float("-inf")
    with pytest.raises(WidthscopeError, match=r"NaN/Inf in 1 row\(s\): 1;"):
        as_matrix(big)
    with pytest.raises(WidthscopeError, match="unknown estimator 'biased'"):
        moments(_rand(10, 3, 0), estimator="biased")
    with pytest.raises(WidthscopeError, match="unknown method 'fast'"):
        moments(_rand(10, 3, 0), method="fast")
    with pytest.raises(WidthscopeError, match="length"):
        PrimalMoments.from_tensor(torch.zeros(10, dtype=D), 3)
    with pytest.raises(WidthscopeError, match="square"):
        moments_from_gram(torch.zeros(5, 4))
    with pytest.raises(WidthscopeError, match="numeric"):
        moments(np.array([["a", "b"]] * 5))
