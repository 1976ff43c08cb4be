"""certify's interventions (issue 4) and random-projection (issue 6) options."""
import pytest
import torch

from widthscope import stats
from widthscope.certification import certify_dict
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
    res = certify_dict(model, tr, te, M=[8, 16], draws=50, etas=[1e-4, 1e-3], progress=False)
    for r in res["points"]:
        iv = r["interventions"]
        assert [x["eta"] for x in iv] == [1e-4, 1e-3]
        assert {"eta", "predicted", "actual", "retention", "sign_agrees"} <= set(iv[0])
        assert iv[0]["M"] == 16 and iv[0]["K"] == 16
        # float64 tanh model: first order is essentially exact at a tiny step
        assert iv[0]["retention"] == pytest.approx(1.0, abs=0.02)
    assert all("interventions" not in r for r in
               certify_dict(model, tr, te, M=[8], draws=10, interventions=None, progress=False)["points"])


def test_certify_projection_matches_projecting_the_whole_sample():
    model, tr, te = _setup()
    k = 8
    res = certify_dict(model, tr, te, M=[8], draws=20, interventions=None, project=k, seed=3, progress=False)
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
        certify_dict(model, tr, te, M=[8], project=1, progress=False)


def test_cli_rejects_bad_etas(capsys):
    assert main(["certify", "--etas", "0.1,-1", "--n-train", "32", "--n-test", "32", "--M", "8",
                 "--train-steps", "2"]) == 2
    assert "step sizes must be positive" in capsys.readouterr().err


def test_checkpoint_probed_with_its_recorded_data_options(tmp_path):
    """A sweep checkpoint records seq_len/max_bytes and the split seed; certify reuses them."""
    import json

    from widthscope import checkpoint

    torch.manual_seed(0)
    model = build("llama", 32, depth=1, max_seq_len=32)
    checkpoint.save(model, tmp_path / "ck", extra={"dataset": "text", "data_seed": 3,
                                                   "data_options": {"seq_len": 16, "max_bytes": 20000}})
    out = tmp_path / "c.json"
    assert main(["certify", "--model", str(tmp_path / "ck"), "--n-train", "8", "--n-test", "8", "--M", "4",
                 "--draws", "10", "--interventions", "none", "--out", str(out)]) == 0
    s = json.loads(out.read_text())["settings"]
    assert s["n_train_examples"] + s["n_test_examples"] == 20000 // 16
    # an explicit --seq-len beyond the model's context is refused before probing
    assert main(["certify", "--model", str(tmp_path / "ck"), "--seq-len", "64", "--n-train", "8",
                 "--n-test", "8", "--M", "4", "--out", str(out)]) == 2


def test_unknown_device_and_data_fail_fast(capsys):
    assert main(["certify", "--device", "cuda:7", "--M", "8"]) == 2
    assert "cuda" in capsys.readouterr().err
    assert main(["certify", "--data", "no-such-data", "--M", "8"]) == 2
    err = capsys.readouterr().err
    assert "not a dataset name" in err and "builtin:" not in err  # nothing was trained first


def test_cli_n_etas_sets_the_default_grid(tmp_path):
    """Default: 4 intervention steps, the decades 1e-4..0.1, at every point; --n-etas 3 gives
    3 (1e-4, 1e-2.5, 0.1); with --max-rel-step 1, 3 give 1e-4, 1e-2, 1; the settings record the grid."""
    import json

    common = ["certify", "--n-train", "32", "--n-test", "32", "--M", "8", "--draws", "10", "--train-steps", "2"]
    assert main([*common, "--out", str(tmp_path / "a.json")]) == 0
    assert main([*common, "--n-etas", "3", "--out", str(tmp_path / "b.json")]) == 0
    assert main([*common, "--n-etas", "3", "--max-rel-step", "1", "--out", str(tmp_path / "c.json")]) == 0
    settings = json.loads((tmp_path / "c.json").read_text())["settings"]
    assert (settings["n_etas"], settings["max_rel_step"], settings["etas"]) == (3, 1.0, None)
    for f, want in (("a.json", [1e-4, 1e-3, 1e-2, 1e-1]), ("b.json", [1e-4, 10 ** -2.5, 0.1]),
                    ("c.json", [1e-4, 1e-2, 1.0])):
        pts = json.loads((tmp_path / f).read_text())["points"]
        for p in pts:
            assert [r["rel_step"] for r in p["interventions"]] == pytest.approx(want, rel=1e-9), (f, p["point"])
