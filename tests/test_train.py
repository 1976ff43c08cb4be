"""Training loop and the shared loss definitions, against float64 per-example loops."""
import math

import pytest
import torch

from widthscope.data import Split, load
from widthscope.errors import WidthscopeError
from widthscope.models import build
from widthscope.train import evaluate, lr_at, per_example_loss, train


def test_per_example_ce_and_mse_match_loops():
    logits = torch.randn(6, 4, dtype=torch.float64)
    y = torch.tensor([0, 3, 1, 1, 2, 0])
    got = per_example_loss(logits, y, "classification")
    want = torch.stack([-(logits[i, y[i]] - torch.logsumexp(logits[i], 0)) for i in range(6)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    mse = per_example_loss(logits, y, "classification", loss="mse")
    want = torch.stack([sum((logits[i, k] - (1.0 if k == y[i] else 0.0)) ** 2 for k in range(4)) for i in range(6)])
    torch.testing.assert_close(mse, want, rtol=1e-12, atol=1e-12)


def test_per_example_lm_loss_is_mean_over_predicted_tokens():
    B, T, V = 3, 5, 7
    logits = torch.randn(B, T, V, dtype=torch.float64)
    x = torch.randint(0, V, (B, T))
    got = per_example_loss(logits, x, "lm")
    for b in range(B):
        terms = [-(logits[b, t, x[b, t + 1]] - torch.logsumexp(logits[b, t], 0)) for t in range(T - 1)]
        assert got[b].item() == pytest.approx(sum(terms).item() / (T - 1), rel=1e-12)
    assert got.dtype == torch.float64

    class Out:  # HF-style output object
        pass

    o = Out()
    o.logits = logits
    torch.testing.assert_close(per_example_loss(o, x, "lm"), got)
    with pytest.raises(WidthscopeError, match="classification, lm"):
        per_example_loss(logits, x, "regression")


def test_lr_schedule():
    kw = dict(steps=100, lr=1.0, warmup_steps=10)
    assert lr_at(0, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(9, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(10, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(55, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(99, schedule="cosine", **kw) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert lr_at(70, schedule="constant", **kw) == 1.0


def test_evaluate_matches_manual_loop():
    split = load("digits", n_train=64, n_test=50)
    m = build("mlp", 16, in_dim=64, out_dim=10).double()
    X, y = split.test[0].double(), split.test[1]
    ev = evaluate(m, (X, y), "classification", batch_size=7)
    with torch.no_grad():
        losses = [per_example_loss(m(X[i:i + 1]), y[i:i + 1], "classification").item() for i in range(50)]
        logits = torch.cat([m(X[i:i + 1]) for i in range(50)])
        acc = sum(int(logits[i].argmax() == y[i]) for i in range(50)) / 50
    assert ev["loss"] == pytest.approx(sum(losses) / 50, rel=1e-12)
    # batches of 7 vs 1 round the logits differently; the argmax cannot flip unless the top two
    # logits are within rounding, so check that margin and then the count is exact
    top2 = logits.topk(2, dim=1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-9
    assert ev["accuracy"] == acc


def _digits():
    return load("digits", n_train=256, n_test=128, seed=0)


def test_train_learns_and_is_deterministic():
    split = _digits()

    def run(seed):
        torch.manual_seed(0)
        m = build("mlp", 32, in_dim=64, out_dim=10)
        before = evaluate(m, split.test, "classification")["loss"]
        r = train(m, split, steps=60, lr=1e-2, batch_size=32, seed=seed, eval_every=20, progress=False)
        return m, r, before

    m1, r1, before = run(0)
    m2, r2, _ = run(0)
    m3, r3, _ = run(1)
    assert r1["test_loss"] < 0.5 * before and r1["test_accuracy"] > 0.7
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert r1["test_loss"] == r2["test_loss"] and r1["test_loss"] != r3["test_loss"]
    assert any("test_loss" in row for row in r1["history"][:-1])
    assert r1["steps"] == 60 and r1["seconds"] > 0 and r1["history"][-1]["step"] == 60
    assert r1["train_loss"] == pytest.approx(evaluate(m1, split.train, "classification")["loss"])


def test_train_sgd_mse_constant_and_double():
    split = _digits()
    split = Split((split.train[0].double(), split.train[1]), (split.test[0].double(), split.test[1]),
                  split.task, split.num_classes, split.input_shape, split.name, split.meta)
    torch.manual_seed(0)
    m = build("mlp", 32, in_dim=64, out_dim=10, parametrization="ntk").double()
    before = evaluate(m, split.train, "classification", loss="mse")["loss"]
    r = train(m, split, steps=40, lr=0.05, optimizer="sgd", loss="mse", schedule="constant", warmup=0,
              clip=None, progress=False)
    assert r["loss"] == "mse" and r["train_loss"] < before
    assert all(row["lr"] == 0.05 for row in r["history"])


def test_train_language_model_on_bytes(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"abcabcabd " * 200)
    split = load("text", root=str(tmp_path), seq_len=16)
    torch.manual_seed(0)
    m = build("llama", 32, depth=1, max_seq_len=16)
    r = train(m, split, steps=40, lr=1e-2, batch_size=16, train_eval_examples=20, progress=False)
    assert "test_accuracy" not in r and r["test_loss"] < 0.5 * math.log(256)
    assert r["train_eval_examples"] == 20 and r["train_loss"] < 0.5 * math.log(256)


def test_non_finite_loss_names_the_step():
    split = _digits()
    torch.manual_seed(0)
    m = build("mlp", 32, in_dim=64, out_dim=10)
    with pytest.raises(WidthscopeError, match=r"diverged: loss is (nan|inf) at step \d+"):
        train(m, split, steps=200, lr=1e6, optimizer="sgd", loss="mse", clip=None, warmup=0, progress=False)


def test_train_bad_arguments():
    split = _digits()
    m = build("mlp", 8, in_dim=64, out_dim=10)
    for kw, msg in [(dict(optimizer="lion"), "adamw, sgd"), (dict(loss="hinge"), "auto, ce, mse"),
                    (dict(schedule="step"), "cosine, constant"), (dict(steps=0), "steps")]:
        args = dict(steps=1, lr=0.1, progress=False)
        args.update(kw)
        with pytest.raises(WidthscopeError, match=msg):
            train(m, split, **args)


def test_train_rejects_bad_split_warmup_lr_and_unavailable_device():
    # these used to be an AttributeError, a silently accepted negative warm-up, and torch's
    # "Torch not compiled with CUDA enabled" assertion from model.to
    from widthscope.train import resolve_device

    split = _digits()
    m = build("mlp", 8, in_dim=64, out_dim=10)
    before = [p.detach().clone() for p in m.parameters()]
    bad = [(dict(split=split.train), "widthscope.data.Split"), (dict(warmup=-1), "warmup must be >= 0"),
           (dict(warmup=math.nan), "warmup"), (dict(lr=math.inf), "lr must be > 0"),
           (dict(lr="0.1"), "lr must be > 0"), (dict(batch_size=0), "batch_size"),
           (dict(device="nonsense"), "not a torch device")]
    if not torch.cuda.is_available():
        bad.append((dict(device="cuda"), "CUDA is not available"))
    for kw, msg in bad:
        args = dict(split=split, steps=1, lr=0.1, progress=False)
        args.update(kw)
        with pytest.raises(WidthscopeError, match=msg):
            train(m, args.pop("split"), **args)
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))   # nothing trained
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(None).type == "cpu"
