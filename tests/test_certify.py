"""widthscope.certification: the pipeline against brute-force float64 oracles, and the CLI."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from widthscope.certification import certify_dict
from widthscope.cli import main
from widthscope.errors import WidthscopeError

D64 = torch.float64


def mlp() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3)).to(D64)


def data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g, dtype=D64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


def loop_grads(model, x, y, point):
    """Per-example gradients at ``point`` by a batch-size-1 loop (independent of the probe)."""
    mod = dict(model.named_modules())[point]
    rows = []
    for i in range(len(x)):
        caught = {}
        h = mod.register_forward_hook(lambda m, inp, out: caught.setdefault("z", out))
        loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        h.remove()
        rows.append(torch.autograd.grad(loss, caught["z"])[0][0])
    return torch.stack(rows)


def test_certify_matches_brute_force_statistics():
    model = mlp()
    xa, ya = data(40, 1)
    xb, yb = data(30, 2)
    tr = [(xa[i:i + 16], ya[i:i + 16]) for i in range(0, 40, 16)]
    te = [(xb[i:i + 16], yb[i:i + 16]) for i in range(0, 30, 16)]
    res = certify_dict(model, tr, te, M=[8, 16], K=[4, 24], draws=200, progress=False)
    json.dumps(res)  # JSON-able as is
    assert [p["point"] for p in res["points"]] == ["0", "1", "2", "3"]
    for p in res["points"]:
        a = loop_grads(model, xa, ya, p["point"])
        b = loop_grads(model, xb, yb, p["point"])
        assert (p["n_train"], p["n_test"], p["d"]) == (40, 30, 12)
        # ‖μ‖² unbiased: sum over i≠j of a_i·a_j / (n(n-1)), by explicit double loop.
        n = len(a)
        s = sum(float(a[i] @ a[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
        assert p["moments_train"]["mu_sq"] == pytest.approx(s, rel=1e-8)
        # aᵀb unbiased = (mean a)·(mean b); it is E[A] of the two-population certificate.
        ab = float(a.mean(0) @ b.mean(0))
        assert p["cross_moments"]["ab"] == pytest.approx(ab, rel=1e-8)
        assert [(c["M"], c["K"]) for c in p["certificates"]] == [(8, 4), (16, 24)]
        for c in p["certificates"]:
            two, one = c["two"], c["one"]
            assert two["populations"] == "two" and one["populations"] == "one"
            assert two["expectation"] == pytest.approx(ab, rel=1e-8)
            assert one["expectation"] == pytest.approx(s, rel=1e-8)
            if not two["vacuous"]:
                # Var(A) = bᵀΣ_a b/M + aᵀΣ_b a/K + tr(Σ_aΣ_b)/(MK), Cantelli bound
                cm = p["cross_moments"]
                var = cm["b_sigma_a_b"] / c["M"] + cm["a_sigma_b_a"] / c["K"] + \
                    cm["tr_sigma_a_sigma_b"] / (c["M"] * c["K"])
                assert two["variance"] == pytest.approx(var, rel=1e-8)
                assert two["b_exact"] == pytest.approx(var / (var + ab * ab), rel=1e-8)
            mis = c["misalignment"]
            assert mis["draws"] == 200 and 0 <= mis["low"] <= mis["probability"] <= mis["high"] <= 1
    # Certified points first, largest d_align first; a vacuous one has no d_align (None) and comes after.
    vac = [r["vacuous"] for r in res["ranking"]]
    assert vac == sorted(vac) and [r["rank"] for r in res["ranking"]] == [1, 2, 3, 4]
    assert all((r["d_align"] is None) == r["vacuous"] for r in res["ranking"])
    d = [r["d_align"] for r in res["ranking"] if not r["vacuous"]]
    assert d == sorted(d, reverse=True)
    assert res["settings"]["M"] == [8, 16] and res["settings"]["K"] == [4, 24]


def test_misalignment_matches_explicit_resampling_on_a_separated_problem():
    # A model whose activation gradients all point the same way: misalignment must be 0 and
    # the certificate non-vacuous; with the output reversed for held-out targets it must be ~1.
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 1)).to(D64)
    x = torch.randn(64, 3, dtype=D64)
    up, down = torch.full((64, 1), 5.0, dtype=D64), torch.full((64, 1), -5.0, dtype=D64)
    tr = [(x[:32], up[:32]), (x[32:], up[32:])]
    same = certify_dict(lin, tr, [(x, up)], points=["1"], M=[8], draws=100, progress=False)
    c = same["points"][0]["certificates"][0]
    assert c["misalignment"]["probability"] == 0.0 and c["two"]["expectation"] > 0
    flip = certify_dict(lin, tr, [(x, down)], points=["1"], M=[8], draws=100, progress=False)
    c = flip["points"][0]["certificates"][0]
    assert c["misalignment"]["probability"] == 1.0 and c["two"]["vacuous"]


def test_certify_bad_inputs():
    model = mlp()
    xa, ya = data(20, 1)
    tr = [(xa[:10], ya[:10]), (xa[10:], ya[10:])]
    with pytest.raises(WidthscopeError, match="M=32 is larger than the train pool of 20"):
        certify_dict(model, tr, tr, M=[32], progress=False)
    with pytest.raises(WidthscopeError, match="at least 4"):
        certify_dict(model, [(xa[:3], ya[:3])], tr, M=[2], progress=False)
    with pytest.raises(WidthscopeError, match="K has 2 values but M has 1"):
        certify_dict(model, tr, tr, M=[4], K=[4, 8], progress=False)
    with pytest.raises(WidthscopeError, match="positive whole numbers"):
        certify_dict(model, tr, tr, M=[0], progress=False)
    with pytest.raises(WidthscopeError, match="unknown insertion point 'x'"):
        certify_dict(model, tr, tr, M=[4], points=["x"], progress=False)
    with pytest.raises(WidthscopeError, match="estimator"):
        certify_dict(model, tr, tr, M=[4], estimator="biased", progress=False)


# ----------------------------------------------------------------------------- CLI
SMALL = ["--n-train", "32", "--n-test", "32", "--M", "8,16", "--draws", "50", "--batch-size", "16"]


def test_cli_builtin_end_to_end(tmp_path, capsys):
    out = tmp_path / "res" / "certify.json"
    rc = main(["certify", "--train-steps", "20", *SMALL, "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out.read_text())
    assert [p["point"] for p in res["points"]] == ["blocks.0", "blocks.1", "blocks.2"]
    assert res["settings"]["data"] == "digits" and res["settings"]["model"] == "builtin"
    for name in ("blocks.0", "blocks.1", "blocks.2", "d_align", "B_exact", "misalign", "ranking", str(out)):
        assert name in text
    assert not list(out.parent.glob(".*.tmp"))  # atomic write left no temporary


def test_cli_list_points(capsys):
    assert main(["certify", "--list-points"]) == 0
    assert capsys.readouterr().out.split() == ["blocks.0", "blocks.1", "blocks.2"]


@pytest.mark.parametrize("argv, message", [
    (["--points", "blocks.9", "--train-steps", "1", *SMALL], "unknown insertion point 'blocks.9'"),
    (["--n-train", "3"], "--n-train 3"),
    (["--n-train", "32", "--n-test", "32", "--M", "64"], "M=64 is larger than the train pool of 32 examples"),
    (["--K", "8,9,10", "--M", "8"], "K has 3 values but M has 1"),
    (["--M", "8,x"], "--M '8,x'"),
    (["--n-train", "5000", "--train-steps", "1"], "--n-train 5000 but the training part of digits gave only 1438"),
])
def test_cli_bad_inputs_exit_2_without_traceback(argv, message, capsys, tmp_path):
    rc = main(["certify", *argv, "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "c.json").exists()


def test_cli_rejects_what_is_not_a_checkpoint(tmp_path, capsys):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    assert main(["certify", "--model", str(junk)]) == 2
    assert "not a checkpoint" in capsys.readouterr().err
    assert main(["certify", "--model", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "d").mkdir()
    assert main(["certify", "--model", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_cli_checkpoint_with_recorded_dataset_and_text_lm(tmp_path, capsys):
    from widthscope import checkpoint
    from widthscope.models import build

    torch.manual_seed(0)
    m = build("mlp", 16, in_dim=64, out_dim=10, depth=2)
    checkpoint.save(m, tmp_path / "mlp", extra={"dataset": "digits",
                                                "train": {"steps": 9, "train_loss": 0.5, "test_loss": 0.75}})
    out = tmp_path / "mlp.json"
    assert main(["certify", "--model", str(tmp_path / "mlp"), *SMALL, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["data"] == "digits" and len(res["points"]) == 2
    # the checkpoint's training record travels with the result (the report's provenance table reads it)
    assert res["settings"]["training"] == {"steps": 9, "train_loss": 0.5, "test_loss": 0.75}

    lm = build("llama", 16, depth=2, vocab_size=256, max_seq_len=32)
    checkpoint.save(lm, tmp_path / "lm")  # no dataset recorded: --data is required
    capsys.readouterr()
    assert main(["certify", "--model", str(tmp_path / "lm"), *SMALL]) == 2
    assert "pass --data" in capsys.readouterr().err
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "lm.json"
    rc = main(["certify", "--model", str(tmp_path / "lm"), "--data", str(corpus), "--seq-len", "16",
               *SMALL, "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [p["point"] for p in res["points"]] == ["model.layers.0", "model.layers.1"]
    assert res["points"][0]["d"] == 16 and res["points"][0]["n_train"] == 32


# ----------------------------------------------------------------------------- torchrun
def _dist_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = mlp()
        xa, ya = data(40, 1)
        xb, yb = data(30, 2)
        tr = [(xa[i:i + 8], ya[i:i + 8]) for i in range(0, 40, 8)]
        te = [(xb[i:i + 8], yb[i:i + 8]) for i in range(0, 30, 8)]
        res = certify_dict(model, tr, te, M=[8], draws=50, progress=False)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(res, f)
    finally:
        dist.destroy_process_group()


def test_certify_sharded_over_two_gloo_ranks_equals_single_process(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "dist.json"
    mp.spawn(_dist_worker, args=(2, f"file://{tmp_path / 'store'}", str(out)), nprocs=2, join=True)
    got = json.loads(out.read_text())
    xa, ya = data(40, 1)
    xb, yb = data(30, 2)
    ref = certify_dict(mlp(), [(xa[i:i + 8], ya[i:i + 8]) for i in range(0, 40, 8)],
                  [(xb[i:i + 8], yb[i:i + 8]) for i in range(0, 30, 8)], M=[8], draws=50, progress=False)
    assert got["settings"]["world_size"] == 2
    for g, r in zip(got["points"], ref["points"]):
        assert (g["n_train"], g["n_test"]) == (r["n_train"], r["n_test"]) == (40, 30)
        for key in ("moments_train", "moments_test", "cross_moments"):
            for f, v in r[key].items():
                if isinstance(v, float):
                    assert g[key][f] == pytest.approx(v, rel=1e-9, abs=1e-300), (key, f)
        want = r["certificates"][0]["two"]["d_align"]
        got_d = g["certificates"][0]["two"]["d_align"]
        assert (got_d is None and want is None) or got_d == pytest.approx(want, rel=1e-9)
