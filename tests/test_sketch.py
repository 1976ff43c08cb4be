"""Random projection (widthscope.stats.sketch): exact formulas against brute force, and the stated
expectations / error over R checked by Monte Carlo with known truth (float64)."""
from __future__ import annotations

import itertools

import pytest
import torch

from widthscope import stats
from widthscope.errors import WidthscopeError
from widthscope.stats.sketch import (Projector, finalize_projected, out_of_core_moments, projected_moments,
                                    spill_rows)


def population(d: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(d, generator=g, dtype=torch.float64) * 0.5
    L = torch.randn(d, d, generator=g, dtype=torch.float64) / d ** 0.5
    Sigma = L @ L.T + 0.2 * torch.eye(d, dtype=torch.float64)
    return mu, Sigma, L


def truth(mu, Sigma):
    return {"mu_sq": float(mu @ mu), "msm": float(mu @ Sigma @ mu), "trs2": float((Sigma @ Sigma).trace()),
            "trs": float(Sigma.trace())}


def mc_check(samples: torch.Tensor, expected: float, z: float = 4.5) -> None:
    """Mean of the Monte Carlo samples within z standard errors of the stated expectation."""
    m, se = samples.mean().item(), samples.std().item() / samples.numel() ** 0.5
    assert abs(m - expected) <= z * se + 1e-12 * abs(expected), f"mean {m:.6g} vs stated {expected:.6g} (se {se:.3g})"


def test_projector_streams_by_blocks_and_is_seeded():
    X = torch.randn(23, 17, dtype=torch.float64)
    P = Projector(17, 5, seed=4)
    assert torch.equal(P(X), X @ P.R)
    # other block heights may take another matmul kernel: float64 rounding (~1e-15 here), not equality
    assert torch.allclose(torch.cat([P(X[:7]), P(X[7:15]), P(X[15:])]), P(X), rtol=1e-12, atol=1e-12)
    assert torch.equal(Projector(17, 5, seed=4).R, P.R) and not torch.equal(Projector(17, 5, seed=5).R, P.R)
    S = Projector(17, 6, seed=1, kind="sparse").R
    vals = set((S * (6 / 3) ** 0.5).round().unique().tolist())
    assert vals <= {-1.0, 0.0, 1.0}


@pytest.mark.parametrize("kind", ["gaussian", "sparse"])
def test_projector_second_moment_is_identity(kind):
    # E[R Rᵀ] = I: average over seeds, entrywise within 5 standard errors.
    d, k, N = 6, 4, 3000
    P = torch.stack([Projector(d, k, seed=s, kind=kind).R @ Projector(d, k, seed=s, kind=kind).R.T
                     for s in range(N)])
    mean, se = P.mean(0), P.std(0) / N ** 0.5
    assert ((mean - torch.eye(d, dtype=torch.float64)).abs() <= 5 * se + 1e-12).all()


@pytest.mark.parametrize("kind", ["gaussian", "sparse"])
def test_population_expectations_over_R(kind):
    """The module docstring's expectations over R, by Monte Carlo (no sampling noise)."""
    d, k, N = 10, 3, 20000
    mu, Sigma, _ = population(d)
    t = truth(mu, Sigma)
    # Draw N projections at once with the same distribution as Projector (checked above).
    g = torch.Generator().manual_seed(99)
    if kind == "gaussian":
        R = torch.randn(N, d, k, generator=g, dtype=torch.float64) / k ** 0.5
    else:
        u = torch.rand(N, d, k, generator=g, dtype=torch.float64)
        R = torch.where(u < 1 / 6, -1.0, torch.where(u < 1 / 3, 1.0, 0.0)).double() * (3 / k) ** 0.5
    a = torch.einsum("d,ndk->nk", mu, R)                       # Rᵀμ
    SR = torch.einsum("nda,de,nek->nak", R, Sigma, R)          # RᵀΣR
    m = (a * a).sum(1)
    v = torch.einsum("na,nab,nb->n", a, SR, a)
    q = (SR * SR).sum((1, 2))
    tr = SR.diagonal(dim1=1, dim2=2).sum(1)
    mc_check(m, t["mu_sq"])
    mc_check(v, t["msm"] * (1 + 1 / k) + t["trs"] * t["mu_sq"] / k)
    mc_check(q, t["trs2"] * (1 + 1 / k) + t["trs"] ** 2 / k)
    mc_check(tr, t["trs"])
    mc_check(tr * m, t["trs"] * t["mu_sq"] + 2 * t["msm"] / k)
    mc_check(tr * tr, t["trs"] ** 2 + 2 * t["trs2"] / k)
    # the stated spread: Var ‖Rᵀμ‖² = 2‖μ‖⁴/k (chi-square); sample variance within 5%
    assert abs(m.var().item() / (2 * t["mu_sq"] ** 2 / k) - 1) < 0.05
    # the corrected combinations are unbiased over R
    c = (k + 2) * (k - 1) / k ** 2
    mc_check((v - tr * m / k) / c, t["msm"])
    mc_check((q - tr * tr / k) / c, t["trs2"])
    # and the raw tr(Σ²) really is biased (the correction matters)
    assert abs(q.mean().item() - t["trs2"]) > 10 * q.std().item() / N ** 0.5


def brute_force_extra(Y: torch.Tensor) -> tuple[float, float]:
    """Distinct-index sums by explicit loops: unbiased tr(Σ)‖μ‖² and tr(Σ)²."""
    n = Y.shape[0]
    G = Y @ Y.T
    D = G.diagonal()
    e1 = sum(D[i] * G[j, kk] for i, j, kk in itertools.permutations(range(n), 3))
    e2 = sum(D[i] * D[j] for i, j in itertools.permutations(range(n), 2))
    c4 = sum(G[i, j] * G[kk, l] for i, j, kk, l in itertools.permutations(range(n), 4))
    p2, p3, p4 = n * (n - 1), n * (n - 1) * (n - 2), n * (n - 1) * (n - 2) * (n - 3)
    return float(e1 / p3 - c4 / p4), float(e2 / p2 - 2 * e1 / p3 + c4 / p4)


def test_projected_moments_against_brute_force():
    X = torch.randn(7, 9, dtype=torch.float64) + 0.3
    k = 4
    pm = projected_moments(X, k=k, seed=2)
    Y = X @ Projector(9, k, seed=2).R
    raw = stats.moments(Y, method="dual")
    for f in ("mu_sq", "mu_sigma_mu", "tr_sigma_sq"):
        assert getattr(pm.raw, f) == pytest.approx(getattr(raw, f), rel=1e-10, abs=1e-12)
    tm, t2 = brute_force_extra(Y)
    assert pm.tm == pytest.approx(tm, rel=1e-10, abs=1e-12)
    assert pm.t2 == pytest.approx(t2, rel=1e-10, abs=1e-12)
    c = (k + 2) * (k - 1) / k ** 2
    assert pm.mu_sq == pytest.approx(raw.mu_sq, rel=1e-12)
    assert pm.mu_sigma_mu == pytest.approx((raw.mu_sigma_mu - tm / k) / c, rel=1e-9, abs=1e-12)
    assert pm.tr_sigma_sq == pytest.approx((raw.tr_sigma_sq - t2 / k) / c, rel=1e-9, abs=1e-12)
    # streamed blocks and merged shards give the same numbers
    blocks = projected_moments((X[i:i + 3] for i in range(0, 7, 3)), k=k, seed=2)
    assert blocks.tr_sigma_sq == pytest.approx(pm.tr_sigma_sq, rel=1e-10)
    P = Projector(9, k, seed=2)
    merged = stats.PrimalMoments(k).update(P(X[:3])) + stats.PrimalMoments(k).update(P(X[3:]))
    assert finalize_projected(merged, P).mu_sigma_mu == pytest.approx(pm.mu_sigma_mu, rel=1e-10)
    # usable by the certificate
    cert = stats.certificate(pm.as_moments(), M=4, K=4, populations="one")
    assert cert.M == 4


def test_sample_estimates_unbiased_jointly_over_R_and_samples():
    """New samples and a new R each repetition: corrected means hit the population truth."""
    d, k, n, reps = 8, 3, 12, 3000
    mu, Sigma, L = population(d, seed=3)
    Lc = torch.linalg.cholesky(Sigma)
    t = truth(mu, Sigma)
    g = torch.Generator().manual_seed(5)
    out = {"mu_sq": [], "msm": [], "trs2": [], "raw_trs2": []}
    for r in range(reps):
        X = mu + torch.randn(n, d, generator=g, dtype=torch.float64) @ Lc.T
        pm = projected_moments(X, k=k, seed=1000 + r)
        out["mu_sq"].append(pm.mu_sq)
        out["msm"].append(pm.mu_sigma_mu)
        out["trs2"].append(pm.tr_sigma_sq)
        out["raw_trs2"].append(pm.raw.tr_sigma_sq)
    o = {key: torch.tensor(v) for key, v in out.items()}
    mc_check(o["mu_sq"], t["mu_sq"])
    mc_check(o["msm"], t["msm"])
    mc_check(o["trs2"], t["trs2"])
    assert abs(o["raw_trs2"].mean().item() - t["trs2"]) > 10 * o["raw_trs2"].std().item() / reps ** 0.5


def test_bad_input_messages():
    with pytest.raises(WidthscopeError, match="k >= 2"):
        Projector(5, 1)
    with pytest.raises(WidthscopeError, match="unknown kind 'srht'.*gaussian"):
        Projector(5, 3, kind="srht")
    with pytest.raises(WidthscopeError, match=r"\(b, 5\)"):
        Projector(5, 3)(torch.zeros(2, 4))
    with pytest.raises(WidthscopeError, match="at least 4 samples"):
        projected_moments(torch.randn(3, 5), k=2)
    with pytest.raises(WidthscopeError, match="no row blocks"):
        projected_moments(iter([]), k=2)


def test_out_of_core_dual_form_equals_in_memory(tmp_path):
    X = torch.randn(53, 7, dtype=torch.float64) * 0.8 + 0.2
    f = tmp_path / "rows.npy"
    mm = spill_rows((X[i:i + 10] for i in range(0, 53, 10)), f)
    assert mm.shape == (53, 7) and [p.name for p in tmp_path.iterdir()] == ["rows.npy"]
    assert torch.equal(torch.from_numpy(mm.copy()), X)
    ref = stats.moments(X, method="dual")
    for block in (4, 16, 53, 100):
        m = out_of_core_moments(mm, block=block)
        for key in ("mu_sq", "mu_sigma_mu", "tr_sigma_sq", "tr_sigma"):
            assert getattr(m, key) == pytest.approx(getattr(ref, key), rel=1e-10, abs=1e-12), (block, key)
    with pytest.raises(WidthscopeError, match="block must be a positive integer"):
        out_of_core_moments(mm, block=0)
    with pytest.raises(WidthscopeError, match="no row blocks"):
        spill_rows([], tmp_path / "empty.npy")
    assert not (tmp_path / "empty.npy").exists()


def test_two_population_expectations_over_R_and_correction():
    """Cross terms under projection: the stated expectations over R, and the corrected
    estimates unbiased jointly over R and the (independent) train / held-out samples."""
    from widthscope.stats import cross_moments, moments
    from widthscope.stats.sketch import correct_projected_cross

    d, k = 8, 3
    a, Sa, _ = population(d, seed=1)
    b, Sb, _ = population(d, seed=2)
    truth_bab, truth_aba, truth_tr = float(b @ Sa @ b), float(a @ Sb @ a), float((Sa @ Sb).trace())
    # population level, N projections at once
    g = torch.Generator().manual_seed(7)
    N = 20000
    R = torch.randn(N, d, k, generator=g, dtype=torch.float64) / k ** 0.5
    P = R @ R.transpose(1, 2)
    v = torch.einsum("d,nde,ef,nfg,g->n", b, P, Sa, P, b)
    q = torch.einsum("nde,ef,nfg,gd->n", P, Sa, P, Sb)
    ta = torch.einsum("ndk,de,nek->n", R, Sa, R)
    tb = torch.einsum("ndk,de,nek->n", R, Sb, R)
    mb = torch.einsum("d,ndk->nk", b, R).square().sum(1)
    mc_check(v, truth_bab * (1 + 1 / k) + float(Sa.trace()) * float(b @ b) / k)
    mc_check(ta * mb, float(Sa.trace()) * float(b @ b) + 2 * truth_bab / k)
    mc_check(q, truth_tr * (1 + 1 / k) + float(Sa.trace()) * float(Sb.trace()) / k)
    mc_check(ta * tb, float(Sa.trace()) * float(Sb.trace()) + 2 * truth_tr / k)
    assert abs(q.mean().item() - truth_tr) > 10 * q.std().item() / N ** 0.5  # raw is biased

    # sample level: new samples and a new R per repetition (non-Gaussian: centred exponentials)
    La, Lb = torch.linalg.cholesky(Sa), torch.linalg.cholesky(Sb)
    out = {"bab": [], "aba": [], "tr": [], "raw_tr": []}
    for r in range(2000):
        za = torch.empty(10, d, dtype=torch.float64).exponential_(generator=g) - 1
        zb = torch.empty(9, d, dtype=torch.float64).exponential_(generator=g) - 1
        Xa, Xb = a + za @ La.T, b + zb @ Lb.T
        Pr = Projector(d, k, seed=5000 + r)
        Ya, Yb = Pr(Xa), Pr(Xb)
        raw = cross_moments(Ya, Yb)
        c = correct_projected_cross(raw, moments(Ya), moments(Yb), k)
        out["raw_tr"].append(raw.tr_sigma_a_sigma_b)
        out["bab"].append(c.b_sigma_a_b)
        out["aba"].append(c.a_sigma_b_a)
        out["tr"].append(c.tr_sigma_a_sigma_b)
    mc_check(torch.tensor(out["bab"]), truth_bab)
    mc_check(torch.tensor(out["aba"]), truth_aba)
    mc_check(torch.tensor(out["tr"]), truth_tr)
    raw_tr = torch.tensor(out["raw_tr"])  # without the correction the same check fails by far
    assert abs(raw_tr.mean().item() - truth_tr) > 10 * raw_tr.std().item() / len(raw_tr) ** 0.5
