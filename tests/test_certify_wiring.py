"""certify's interventions (issue 4) and random-projection (issue 6) options."""
import pytest
import torch

from widthscope import stats
from widthscope.certify import certify
from widthscope.cli import main
from widthscope.models import build
from widthscope.probe import collect
from widthscope.stats.sketch import Projector, finalize_projected


def _setup(n=48, bs=16):
    torch.manual_seed(0)
    model = build("mlp", 24, in_dim=6, out_dim=3, depth=2, activation="tanh").double().eval()
    x, y = torch.randn(2 * n, 6, dtype=torch.float64), torch.randint(0, 3, (2 * n,))
    tr = [(x[i:i + bs], y[i:i + bs]) for i in range(0, n, bs)]
    te = [(x[i:i + bs], y[i:i + bs]) for i in range(n, 2 * n, bs)]
    return model, tr, te


def test_certify_reports_interventions_per_point():
    model, tr, te = _setup()
    res = certify(model, tr, te, M=[8, 16], draws=50, etas=[1e-4, 1e-3], progress=False)
    for r in res["points"]:
        iv = r["interventions"]
        assert [x["eta"] for x in iv] == [1e-4, 1e-3]
        assert {"eta", "predicted", "actual", "retention", "sign_agrees"} <= set(iv[0])
        assert iv[0]["M"] == 16 and iv[0]["K"] == 16
        # float64 tanh model: first order is essentially exact at a tiny step
        assert iv[0]["retention"] == pytest.approx(1.0, abs=0.02)
    assert all("interventions" not in r for r in
               certify(model, tr, te, M=[8], draws=10, interventions=None, progress=False)["points"])


def test_certify_projection_matches_projecting_the_whole_sample():
    model, tr, te = _setup()
    k = 8
    res = certify(model, tr, te, M=[8], draws=20, interventions=None, project=k, seed=3, progress=False)
    full = collect(model, tr, progress=False)
    for r in res["points"]:
        a = full[r["point"]]
        P = Projector(a.shape[1], k, seed=3)
        want = finalize_projected(stats.PrimalMoments(k).update(P(a)), P)
        got = r["moments_train"]
        assert r["d"] == a.shape[1]
        assert got["mu_sq"] == pytest.approx(want.mu_sq, rel=1e-10)
        assert got["tr_sigma_sq"] == pytest.approx(want.tr_sigma_sq, rel=1e-10)
    assert any("projected" in n for n in res["notes"])
    with pytest.raises(Exception, match="project"):
        certify(model, tr, te, M=[8], project=1, progress=False)


def test_cli_rejects_bad_etas(capsys):
    assert main(["certify", "--etas", "0.1,-1", "--n-train", "32", "--n-test", "32", "--M", "8",
                 "--train-steps", "2"]) == 2
    assert "step sizes must be positive" in capsys.readouterr().err
