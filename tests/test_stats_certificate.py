"""Certificate, planner, misalignment resampling and Wilson interval of widthscope.stats."""
import doctest
import importlib
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from widthscope.errors import WidthscopeError
from widthscope.stats import (
    CrossMoments,
    Moments,
    certificate,
    cross_moments,
    misalignment,
    misalignment_from_gram,
    moments,
    plan,
    wilson_interval,
)
from widthscope.stats.resample import _draw_indices

D = torch.float64


def _data(n, d, seed, shift=0.3, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * (torch.randn(n, d, generator=g, dtype=D) + shift)


# ----------------------------------------------------------------------------- certificate
def test_certificate_formulas_one_population():
    X = _data(200, 10, 0)
    m = moments(X)
    c = certificate(X, M=16, K=8)
    E, p, t = m.mu_sq, m.mu_sigma_mu, m.tr_sigma_sq
    V = (1 / 16 + 1 / 8) * p + t / 128
    assert c.populations == "one" and not c.vacuous and c.reason is None
    assert c.expectation == pytest.approx(E) and c.variance == pytest.approx(V)
    assert c.d_par == pytest.approx(E ** 2 / p) and c.d_2 == pytest.approx(E ** 2 / t)
    assert c.n_eff == pytest.approx(128 / 25)
    assert c.b_exact == pytest.approx(V / (V + E ** 2))
    assert c.b_align == pytest.approx(1 / (1 + 128 / 25 * min(E ** 2 / p, E ** 2 / t)))


def test_certificate_two_population_and_auto():
    Xa, Xb = _data(150, 8, 1), _data(120, 8, 2, shift=0.5)
    c = certificate(Xa, Xb, M=4, K=64)
    cm = cross_moments(Xa, Xb)
    assert c.populations == "two" and (c.n_train, c.n_test) == (150, 120)
    E, p, q, t = cm.ab, cm.b_sigma_a_b, cm.a_sigma_b_a, cm.tr_sigma_a_sigma_b
    assert c.variance == pytest.approx(p / 4 + q / 64 + t / 256)
    assert c.d_par == pytest.approx(E ** 2 / max(p, q))
    assert c.b_exact <= c.b_align
    # precomputed inputs give the same numbers (exact: certificate() makes the very same moments call)
    assert certificate(cm, M=4, K=64) == c
    assert certificate(Xa, Xb, M=4, K=64, populations="one") == certificate(Xa, M=4, K=64)
    assert certificate(moments(Xa), M=4, K=64) == certificate(Xa, M=4, K=64)


def test_two_population_dpar_with_max_keeps_b_exact_below_b_align():
    """The counter-example to averaging p and q: M = 1, K large, q ≪ p."""
    cm = CrossMoments(100, 100, 3, 1.0, 10.0, 0.01, 0.5, "unbiased", "truth")
    c = certificate(cm, M=1, K=10 ** 6)
    assert c.b_exact <= c.b_align
    avg_dpar = 1.0 / ((10.0 + 0.01) / 2)
    n_eff = 10 ** 6 / (10 ** 6 + 2)
    assert c.b_exact > 1 / (1 + n_eff * min(avg_dpar, 1 / 0.5))  # the average would be violated


def test_vacuous_when_mean_is_zero():
    hits = 0
    for seed in range(12):
        X = _data(12, 5, seed, shift=0.0)
        m = moments(X)
        c = certificate(X, M=8, K=8)
        fields = [c.expectation, c.variance, c.d_par, c.d_2, c.d_align, c.n_eff, c.b_exact, c.b_align]
        assert all(math.isfinite(v) for v in fields)
        if m.mu_sq <= 0:
            hits += 1
            assert c.vacuous and c.b_exact == 1.0 and c.b_align == 1.0
            assert c.d_par == c.d_2 == c.d_align == 0.0
            assert "‖μ‖²" in c.reason
        if c.vacuous:
            named = [nm for nm, v in (("‖μ‖²", m.mu_sq), ("μᵀΣμ", m.mu_sigma_mu), ("tr(Σ²)", m.tr_sigma_sq))
                     if v <= 0]
            assert named and all(nm in c.reason for nm in named)
    assert hits >= 2  # the seeds do exercise the vacuous path


def test_vacuous_two_population_and_degenerate():
    Xa, Xb = _data(20, 4, 3), -_data(20, 4, 4)  # opposite means: aᵀb < 0
    c = certificate(Xa, Xb, M=5, K=5)
    assert c.vacuous and "aᵀb" in c.reason and c.b_exact == 1.0
    # all rows identical: zero covariance, certificate is vacuous, not a ZeroDivisionError
    c = certificate(torch.ones(10, 3), M=2, K=2)
    assert c.vacuous and "μᵀΣμ" in c.reason and math.isfinite(c.variance)
    m = Moments(10, 3, 1e-300, 1e-300, 1e-300, "unbiased", "x")  # underflow in E²
    c = certificate(m, M=2, K=2)
    assert c.vacuous and math.isfinite(c.b_align)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(6, 30), d=st.integers(1, 12),
       c=st.floats(1e-3, 1e3), shift=st.floats(-1, 1), M=st.integers(1, 300), K=st.integers(1, 300),
       two=st.booleans())
def test_properties_scale_permutation_and_ordering(seed, n, d, c, shift, M, K, two):
    X = _data(n, d, seed, shift=shift)
    Y = _data(n + 3, d, seed + 1, shift=shift) if two else None
    base = certificate(X, Y, M=M, K=K)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    variants = [certificate(c * X, None if Y is None else c * Y, M=M, K=K),
                certificate(X[perm], None if Y is None else Y.flip(0), M=M, K=K)]
    for v in variants:
        assert v.vacuous == base.vacuous or abs(base.expectation) < 1e-9
        if not base.vacuous and not v.vacuous:
            for f in ("d_par", "d_2", "d_align", "b_exact", "b_align"):
                assert getattr(v, f) == pytest.approx(getattr(base, f), rel=1e-7, abs=1e-12)
    if not base.vacuous:
        assert base.b_exact <= base.b_align * (1 + 1e-12)
        assert 0 < base.b_exact < 1 and 0 < base.b_align < 1
    else:
        assert base.b_exact == base.b_align == 1.0 and base.reason


def test_certificate_bad_inputs():
    X = _data(20, 4, 0)
    with pytest.raises(WidthscopeError, match="M must be a positive integer"):
        certificate(X, M=0, K=4)
    with pytest.raises(WidthscopeError, match="K must be a positive integer"):
        certificate(X, M=4, K=2.5)
    with pytest.raises(WidthscopeError, match="needs held-out samples"):
        certificate(X, M=4, K=4, populations="two")
    with pytest.raises(WidthscopeError, match="test=None"):
        certificate(moments(X), X, M=4, K=4)
    with pytest.raises(WidthscopeError, match="unknown populations"):
        certificate(X, M=4, K=4, populations="three")
    with pytest.raises(WidthscopeError, match="need at least 4 samples, got n=3"):
        certificate(X[:3], M=4, K=4)
    with pytest.raises(WidthscopeError, match="not finite"):
        certificate(Moments(10, 3, float("nan"), 1.0, 1.0, "unbiased", "x"), M=4, K=4)


# ----------------------------------------------------------------------------- plan
@pytest.mark.parametrize("two", [False, True])
def test_plan_returns_smallest_sample_sizes(two):
    X = _data(300, 16, 5, shift=0.15)
    Y = _data(300, 16, 6, shift=0.15) if two else None
    m = certificate(X, Y, M=1, K=1)
    assert not m.vacuous
    for target in (0.3, 0.05):
        p = plan(X, Y, target=target, K=2000)
        checks = [("exact_M", "b_exact", lambda v: (v, 2000)), ("align_M", "b_align", lambda v: (v, 2000)),
                  ("equal_exact", "b_exact", lambda v: (v, v)), ("equal_align", "b_align", lambda v: (v, v))]
        for field, bound, mk in checks:
            v = getattr(p, field)
            assert v is not None, (field, p)
            Mv, Kv = mk(v)
            assert getattr(certificate(X, Y, M=Mv, K=Kv), bound) <= target
            if v > 1:
                Mv, Kv = mk(v - 1)
                assert getattr(certificate(X, Y, M=Mv, K=Kv), bound) > target
        assert p.equal_exact <= p.equal_align  # B_exact ≤ B_align, so it needs no more samples


def test_plan_unreachable_at_fixed_K():
    X = _data(300, 16, 7, shift=0.15)
    c_inf = certificate(X, M=10 ** 12, K=2)
    p = plan(X, target=c_inf.b_exact * 0.9, K=2)
    assert p.exact_M is None and p.align_M is None
    assert p.exact_limit == pytest.approx(c_inf.b_exact, rel=1e-6)
    assert p.align_limit == pytest.approx(c_inf.b_align, rel=1e-6)
    assert "M→∞" in p.notes and "increase K" in p.notes
    assert p.equal_exact is not None  # M = K always gets there


def test_plan_vacuous_and_bad_target():
    X = _data(20, 4, 8)
    p = plan(_data(20, 4, 3), -_data(20, 4, 4), target=0.1)
    assert p.vacuous and p.equal_exact is None and "vacuous" in p.notes
    for bad in (0.0, 1.0, -0.1, "x"):
        with pytest.raises(WidthscopeError, match="target must be a probability"):
            plan(X, target=bad)



def test_plan_tiny_target_beyond_search_range_is_none_with_note():
    # used to raise "sample-size search did not converge"; the other bound is still answered
    X = _data(300, 16, 7, shift=0.15)
    target = 1e-300
    p = plan(X, target=target)
    assert p.equal_align is None and "B_align needs M = K above" in p.notes
    if p.equal_exact is not None:   # float64 oracle: the returned M passes and M - 1 fails
        M = p.equal_exact
        assert certificate(X, M=M, K=M).b_exact <= target < certificate(X, M=M - 1, K=M - 1).b_exact
    else:
        assert "B_exact needs M = K above" in p.notes
    ok = plan(X, target=0.05)
    assert ok.equal_align is not None and "above" not in ok.notes


# ----------------------------------------------------------------------------- misalignment
def _brute_misalignment(Xa, Xb, I, J, M, K, tie=1e-9):
    """Count of draws with μ_Mᵀg_K ≤ 0, number of near-ties |μ_Mᵀg_K| ≤ tie, mean of μ_Mᵀg_K.

    The library sums the block of the cross-Gram in another order, so a draw within rounding of
    0 may fall either side; ``tie`` (far above float64 rounding of these O(1) values) bounds that.
    """
    count = ties = 0
    vals = []
    for r in range(I.shape[0]):
        mu = Xa[I[r, :M]].mean(0)
        gk = Xb[J[r, :K]].mean(0)
        v = float(mu @ gk)
        count += int(v <= 0)
        ties += int(abs(v) <= tie)
        vals.append(v)
    return count, ties, math.fsum(vals) / len(vals)


def _assert_matches_brute(res, brute):
    count, ties, mean = brute
    assert abs(res.count - count) <= ties, (res.count, count, ties)
    assert res.probability == res.count / res.draws
    # float64 block sums of ≤ 32·24 O(1) terms in another order: ~1e-15 relative, 1e-12 is far above it
    assert math.isclose(res.mean_alignment, mean, rel_tol=1e-12, abs_tol=1e-14)


@pytest.mark.parametrize("path_cost", [0, 10 ** 9])  # force the block-gather / the row-sum path
def test_misalignment_matches_brute_force_loop(monkeypatch, path_cost):
    import widthscope.stats.resample as rs

    monkeypatch.setattr(rs, "_GATHER_COST", path_cost)
    Xa, Xb = _data(90, 12, 9, shift=0.08), _data(70, 12, 10, shift=0.08)
    draws, seed = 400, 3
    gen = torch.Generator().manual_seed(seed)
    I = _draw_indices(90, 32, draws, gen)
    J = _draw_indices(70, 24, draws, gen)
    for row in I[:20]:
        assert len(set(row.tolist())) == 32  # without replacement
    pairs = [(32, 24), (8, 8), (16, 24), (1, 1)]
    got = misalignment(Xa, Xb, pairs=pairs, draws=draws, seed=seed)
    for res, (M, K) in zip(got, pairs):
        brute = _brute_misalignment(Xa, Xb, I, J, M, K)
        assert (res.M, res.K, res.draws) == (M, K, draws)
        _assert_matches_brute(res, brute)
        assert 0 < brute[0] < draws  # the setting is not trivial
    # many pairs take the 2-D prefix-sum path; same draws, same counts
    many = [(32, 24)] + [(m, min(m, 24)) for m in range(1, 32, 2)]
    assert sum(m * k for m, k in many) > 2 * 32 * 24
    for res, (M, K) in zip(misalignment(Xa, Xb, pairs=many, draws=draws, seed=seed), many):
        _assert_matches_brute(res, _brute_misalignment(Xa, Xb, I, J, M, K))
    single = misalignment(Xa, Xb, M=32, K=24, draws=draws, seed=seed)
    # Exact on purpose: the pair's block sums are the same tensor ops on the same draws in both
    # calls, and math.fsum of them has no reduction order (see _add_exact_sums).
    assert single == got[0]
    C = Xa @ Xb.T  # the very matmul misalignment() does on these float64 inputs
    assert misalignment_from_gram(C, M=32, K=24, draws=draws, seed=seed) == single


@pytest.mark.parametrize("path_cost", [0, 10 ** 9])
@pytest.mark.parametrize("draws", [399, 1000, 2500])
def test_misalignment_pair_does_not_depend_on_other_pairs(monkeypatch, path_cost, draws):
    """Issue 18: a (draws, pairs) column sum rounds in a shape/CPU-dependent order; the fsum does not.

    Fails on the tensor ``sum(0)`` accumulation for about half of these settings on an AMD EPYC.
    """
    import widthscope.stats.resample as rs

    monkeypatch.setattr(rs, "_GATHER_COST", path_cost)
    for seed in range(3):
        Xa, Xb = _data(90, 12, 20 + seed, shift=0.08), _data(70, 12, 30 + seed, shift=0.08)
        got = misalignment(Xa, Xb, pairs=[(8, 8), (32, 24), (16, 24), (1, 1)], draws=draws, seed=seed)
        for i, (M, K) in enumerate([(8, 8), (32, 24)]):
            # exact: same block-sum ops on the same draws (M_max, K_max are equal), order-free fsum;
            # (32, 24) twice must fill both columns (the row-sum path once left one uninitialised)
            again = misalignment(Xa, Xb, pairs=[(M, K), (32, 24)], draws=draws, seed=seed)
            assert again[0] == got[i] and again[1] == got[1]
        assert misalignment(Xa, Xb, M=32, K=24, draws=draws, seed=seed) == got[1]


def test_misalignment_chunks_and_seed(monkeypatch):
    import widthscope.stats.resample as rs

    Xa, Xb = _data(60, 6, 11, shift=0.1), _data(60, 6, 12, shift=0.1)
    a = misalignment(Xa, Xb, M=10, K=10, draws=300, seed=5)
    assert misalignment(Xa, Xb, M=10, K=10, draws=300, seed=5) == a
    b = misalignment(Xa, Xb, M=10, K=10, draws=300, seed=6)
    assert b.mean_alignment != a.mean_alignment
    monkeypatch.setattr(rs, "_CHUNK_ELEMS", 700)  # many small chunks of draws, same answer
    for cost in (0, 10 ** 9):
        monkeypatch.setattr(rs, "_GATHER_COST", cost)
        c = misalignment(Xa, Xb, M=10, K=10, draws=300, seed=5)
        assert c.count == a.count and c.mean_alignment == pytest.approx(a.mean_alignment, rel=1e-12)


def test_misalignment_probability_tracks_certificate():
    """Large pools ≈ population: empirical rate lies below B_exact (Cantelli)."""
    Xa, Xb = _data(2000, 8, 13, shift=0.12), _data(2000, 8, 14, shift=0.12)
    r = misalignment(Xa, Xb, M=8, K=8, draws=2000, seed=0)
    c = certificate(Xa, Xb, M=8, K=8)
    assert 0 < r.probability and r.low <= c.b_exact <= c.b_align


def test_misalignment_bad_inputs():
    Xa, Xb = _data(20, 4, 0), _data(15, 4, 1)
    with pytest.raises(WidthscopeError, match="train pool of 20"):
        misalignment(Xa, Xb, M=21, K=4)
    with pytest.raises(WidthscopeError, match="held-out pool of 15"):
        misalignment(Xa, Xb, pairs=[(4, 4), (4, 16)])
    with pytest.raises(WidthscopeError, match="d=4 but test has d=5"):
        misalignment(Xa, _data(15, 5, 1), M=2, K=2)
    with pytest.raises(WidthscopeError, match="needs M and K"):
        misalignment(Xa, Xb, M=2)
    with pytest.raises(WidthscopeError, match="draws must be a positive integer"):
        misalignment(Xa, Xb, M=2, K=2, draws=0)


# ----------------------------------------------------------------------------- Wilson
def test_wilson_interval_against_scipy_and_closed_form():
    from scipy.stats import binomtest, norm

    z = float(norm.ppf(0.975))
    for k, n in [(0, 10), (3, 10), (50, 1000), (999, 1000), (7, 7)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        lo, hi = wilson_interval(k, n, z=z)
        assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)
    lo, hi = wilson_interval(0, 100)
    assert lo == 0.0 and hi == pytest.approx(1.96 ** 2 / (100 + 1.96 ** 2), rel=1e-12)
    with pytest.raises(WidthscopeError, match="0 ≤ k ≤ n"):
        wilson_interval(5, 4)
    with pytest.raises(WidthscopeError, match="n ≥ 1"):
        wilson_interval(0, 0)


# ----------------------------------------------------------------------------- docs run
@pytest.mark.parametrize("mod", ["widthscope.stats", "widthscope.stats.estimators",
                                 "widthscope.stats.bounds", "widthscope.stats.resample"])
def test_docstring_examples_run(mod):
    res = doctest.testmod(importlib.import_module(mod), extraglobs={"torch": torch}, verbose=False)
    assert res.attempted > 0 and res.failed == 0


def test_top_level_lazy_exports():
    import widthscope

    assert widthscope.certificate is certificate and widthscope.plan is plan
    assert widthscope.misalignment is misalignment and widthscope.moments is moments


def test_vacuous_per_term_keeps_the_defined_dimension():
    """A failed covariance term does not hide the directional one (and vice versa); the bounds
    stay vacuous because Var(A) needs every term."""
    base = Moments(100, 3, 2.0, 0.5, -0.1, "unbiased", "x")  # tr(Σ²) estimate ≤ 0
    c = certificate(base, M=4, K=4)
    assert c.vacuous and c.b_exact == 1.0 and c.b_align == 1.0
    assert c.d_par == pytest.approx(4.0 / 0.5) and c.d_2 == 0.0 and c.d_align == c.d_par
    assert "tr(Σ²)" in c.reason and "μᵀΣμ" not in c.reason
    c = certificate(Moments(100, 3, 2.0, -0.5, 0.25, "unbiased", "x"), M=4, K=4)
    assert c.vacuous and c.d_par == 0.0 and c.d_2 == pytest.approx(16.0) and c.d_align == c.d_2
    assert "μᵀΣμ" in c.reason and "tr(Σ²)" not in c.reason
    c = certificate(Moments(100, 3, -2.0, 0.5, 0.25, "unbiased", "x"), M=4, K=4)
    assert c.vacuous and c.d_par == c.d_2 == c.d_align == 0.0 and "‖μ‖²" in c.reason
