"""widthscope.probe against brute-force float64 per-example loops (batch size 1)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from widthscope.errors import WidthscopeError
from widthscope.probe import all_points, batched, causal_lm_loss, collect, insertion_points

D64 = torch.float64


# ----------------------------------------------------------------------------- tiny models
def tiny_llama(vocab: int = 37, hidden: int = 16, layers: int = 2) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=24, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      attn_implementation="eager")
    torch.manual_seed(1)
    return LlamaForCausalLM(cfg).to(D64)


def tiny_neox(vocab: int = 41, hidden: int = 16, layers: int = 2) -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers,
                        num_attention_heads=2, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(2)
    return GPTNeoXForCausalLM(cfg).to(D64)


class Basic(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x  # in place on purpose: the probe must not care
        return F.relu(out)


class ConvNet(nn.Module):
    def __init__(self, c: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(Basic(c), Basic(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        h = self.blocks(self.stem(x))
        return self.head(h.mean((2, 3)))


def convnet() -> nn.Module:
    torch.manual_seed(3)
    m = ConvNet().to(D64)
    m.train()
    with torch.no_grad():  # non-trivial running statistics
        for _ in range(3):
            m(torch.randn(8, 1, 6, 6, dtype=D64) * 2 + 0.5)
    return m


def mlp(out: int = 3) -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, out)).to(D64)


# ----------------------------------------------------------------------------- oracle
def oracle(model, examples, loss_of, points, pool, fdims, bias=False):
    """Loop over examples one at a time; autograd.grad of that example's loss w.r.t. the output
    (or, with bias=True, w.r.t. a zero bias added to every position through a hook)."""
    modules = dict(model.named_modules())
    rows = {p: [] for p in points}
    model.eval()
    for ex in examples:
        caught, handles, biases = {}, [], {}
        for p in points:
            def hook(mod, inp, out, p=p):
                z = out[0] if isinstance(out, tuple) else out
                if bias:
                    shape = [1] * z.ndim
                    shape[fdims[p]] = z.shape[fdims[p]]
                    b = torch.zeros(shape, dtype=z.dtype, requires_grad=True)
                    biases[p] = b
                    z = z + b
                    return (z, *out[1:]) if isinstance(out, tuple) else z
                caught[p] = z
            handles.append(modules[p].register_forward_hook(hook))
        loss = loss_of(model, ex)
        for h in handles:
            h.remove()
        targets = [biases[p] if bias else caught[p] for p in points]
        grads = torch.autograd.grad(loss, targets)
        for p, g in zip(points, grads):
            g = g.reshape(-1) if bias else g[0]
            if not bias:
                fd = fdims[p] - 1
                g = g.movedim(fd, -1)
                d = g.shape[-1]
                g = g.reshape(-1, d)
                g = {"sum": g.sum(0), "mean": g.mean(0), "token": g}[pool]
            rows[p].append(g)
    return {p: torch.cat(v) if pool == "token" and not bias else torch.stack(v) for p, v in rows.items()}


def lm_loss_manual(logits, ids, mask=None):
    """Independent per-sequence mean token loss for ONE sequence (float64, explicit loop)."""
    logp = torch.log_softmax(logits[0], -1)
    terms = []
    for t in range(ids.shape[1] - 1):
        if mask is None or mask[0, t + 1]:
            terms.append(-logp[t, ids[0, t + 1]])
    return torch.stack(terms).mean()


def close(a, b, rtol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = b.abs().max().clamp_min(1e-30)
    err = (a - b).abs().max() / scale
    assert err < rtol, f"relative error {err:.3g}"


# ----------------------------------------------------------------------------- families
@pytest.mark.parametrize("family", ["llama", "neox"])
def test_causal_lm_matches_per_example_loop_with_padding(family):
    model = tiny_llama() if family == "llama" else tiny_neox()
    V = model.config.vocab_size
    pts = insertion_points(model)
    prefix = "model.layers" if family == "llama" else "gpt_neox.layers"
    assert pts == [f"{prefix}.0", f"{prefix}.1"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (5, 9), generator=g)
    lengths = [9, 7, 4, 9, 2]
    mask = torch.zeros_like(ids)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    batches = [{"input_ids": ids[:3], "attention_mask": mask[:3]},
               {"input_ids": ids[3:], "attention_mask": mask[3:]}]
    got = collect(model, batches, progress=False)
    # Oracle: each sequence alone, *unpadded*: padding must change nothing.
    examples = [ids[i:i + 1, :L] for i, L in enumerate(lengths)]

    def loss_of(m, ex):
        return lm_loss_manual(m(ex).logits, ex)

    ref = oracle(model, examples, loss_of, pts, "sum", {p: 2 for p in pts})
    for p in pts:
        assert got[p].dtype == D64 and got[p].shape == (5, 16)
        close(got[p], ref[p])
    # token pooling: one row per real (unpadded) token, in order.
    tok = collect(model, batches, pool="token", progress=False)
    ref_tok = oracle(model, examples, loss_of, pts, "token", {p: 2 for p in pts})
    for p in pts:
        assert tok[p].shape == (sum(lengths), 16)
        close(tok[p], ref_tok[p])


def test_llama_sum_pool_is_gradient_of_shared_bias_and_mean_flatten():
    model = tiny_llama()
    ids = torch.randint(0, 37, (4, 6))
    pts = ["model.layers.0", "model.layers.1.mlp"]
    got = collect(model, batched(ids, batch_size=3), points=pts, progress=False)
    examples = [ids[i:i + 1] for i in range(4)]

    def loss_of(m, ex):
        return lm_loss_manual(m(ex).logits, ex)

    ref_bias = oracle(model, examples, loss_of, pts, "sum", {p: 2 for p in pts}, bias=True)
    ref_sum = oracle(model, examples, loss_of, pts, "sum", {p: 2 for p in pts})
    for p in pts:
        close(got[p], ref_bias[p])
        close(ref_sum[p], ref_bias[p])
    mean = collect(model, [ids], points=pts, pool="mean", progress=False)
    flat = collect(model, [ids], points=pts, pool="flatten", progress=False)
    for p in pts:
        close(mean[p] * 6, got[p])
        assert flat[p].shape == (4, 6 * 16)
        close(flat[p].view(4, 6, 16).sum(1), got[p])


def test_convnet_batchnorm_eval_matches_loop_and_bias():
    model = convnet()
    assert model.training
    pts = insertion_points(model)
    assert pts == ["blocks.0", "blocks.1"]
    x = torch.randn(7, 1, 6, 6, dtype=D64)
    y = torch.randint(0, 3, (7,))
    with pytest.warns(UserWarning, match="BatchNorm"):
        got = collect(model, batched(x, y, batch_size=4), points=pts + ["stem.1"], progress=False)
    assert any("BatchNorm" in n and "eval" in n for n in got.notes)
    assert model.training and model.blocks[0].bn1.training  # modes restored
    examples = [(x[i:i + 1], y[i:i + 1]) for i in range(7)]

    def loss_of(m, ex):
        return F.cross_entropy(m(ex[0]), ex[1])

    state = {n: m.training for n, m in model.named_modules()}
    ref = oracle(model, examples, loss_of, pts + ["stem.1"], "sum", {p: 1 for p in pts + ["stem.1"]}, bias=True)
    for p in pts + ["stem.1"]:
        assert got[p].shape == (7, 4)
        close(got[p], ref[p])
    tok = collect(model, [(x, y)], points=["blocks.1"], pool="token", progress=False)
    ref_tok = oracle(model, examples, loss_of, ["blocks.1"], "token", {"blocks.1": 1})
    assert tok["blocks.1"].shape == (7 * 36, 4)
    close(tok["blocks.1"], ref_tok["blocks.1"])
    for n, m in model.named_modules():
        m.training = state[n]


def test_batchnorm_keep_mode_refuses_and_eval_model_is_silent():
    model = convnet()
    x, y = torch.randn(4, 1, 6, 6, dtype=D64), torch.randint(0, 3, (4,))
    with pytest.raises(WidthscopeError, match="BatchNorm in training mode.*depends on the whole batch"):
        collect(model, [(x, y)], train_mode="keep", progress=False)
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = collect(model, [(x, y)], train_mode="keep", progress=False)
    assert res.notes == [] and not model.training
    with pytest.raises(WidthscopeError, match="train_mode"):
        collect(model, [(x, y)], train_mode="train", progress=False)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_mlp_matches_loop(task):
    model = mlp()
    pts = insertion_points(model)
    assert pts == ["0", "1", "2", "3"]
    x = torch.randn(9, 5, dtype=D64)
    y = torch.randint(0, 3, (9,)) if task == "classification" else torch.randn(9, 3, dtype=D64)
    got = collect(model, batched(x, y, batch_size=4), progress=False)

    def loss_of(m, ex):
        out = m(ex[0])
        if task == "classification":
            return -torch.log_softmax(out, -1)[0, ex[1][0]]
        return ((out - ex[1]) ** 2).sum()

    ref = oracle(model, [(x[i:i + 1], y[i:i + 1]) for i in range(9)], loss_of, pts, "sum", {p: 1 for p in pts})
    for p in pts:
        close(got[p], ref[p])
    assert got.n_examples == 9


# ----------------------------------------------------------------------------- side effects
def test_params_get_no_grad_and_flags_restored():
    model = tiny_neox()
    frozen = model.gpt_neox.embed_in.weight
    frozen.requires_grad_(False)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    model.train()
    res = collect(model, [torch.randint(0, 41, (3, 5))], progress=False)
    assert all(p.grad is None for p in model.parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert model.training and all(m.training for m in model.modules())
    assert res["gpt_neox.layers.0"].shape == (3, 16)
    # A parameter gradient that already exists is left exactly as it was.
    p0 = next(model.parameters())
    p0.grad = torch.ones_like(p0)
    collect(model, [torch.randint(0, 41, (2, 5))], progress=False)
    assert torch.equal(p0.grad, torch.ones_like(p0))


def test_inplace_after_point_and_tuple_outputs():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 6)

        def forward(self, x):
            h = self.lin(x)
            return h, h.detach() * 0  # HF-style tuple: hidden states first

    class Net(nn.Module):
        def __init__(self, inplace):
            super().__init__()
            self.pair = Pair()
            self.act = nn.ReLU(inplace=inplace)
            self.out = nn.Linear(6, 2)

        def forward(self, x):
            h, _ = self.pair(x)
            return self.out(self.act(h))

    torch.manual_seed(0)
    a = Net(True).to(D64)
    b = Net(False).to(D64)
    b.load_state_dict(a.state_dict())
    x, y = torch.randn(6, 5, dtype=D64), torch.randint(0, 2, (6,))
    got = collect(a, [(x, y)], points=["pair"], progress=False)
    ref = oracle(b, [(x[i:i + 1], y[i:i + 1]) for i in range(6)],
                 lambda m, ex: F.cross_entropy(m(ex[0]), ex[1]), ["pair"], "sum", {"pair": 1})
    close(got["pair"], ref["pair"])


# ----------------------------------------------------------------------------- losses
def test_causal_lm_loss_is_mean_over_predicted_tokens():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, 11, generator=g, dtype=D64)
    ids = torch.randint(0, 11, (3, 6), generator=g)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    got = causal_lm_loss(logits, ids, mask)
    for i, L in enumerate([6, 3, 2]):
        ref = lm_loss_manual(logits[i:i + 1, :L], ids[i:i + 1, :L])
        assert abs(float(got[i] - ref)) < 1e-12
    with pytest.raises(WidthscopeError, match="no predicted token"):
        causal_lm_loss(logits, ids, torch.tensor([[1] * 6, [1, 0, 0, 0, 0, 0], [1] * 6]))


# ----------------------------------------------------------------------------- errors
def test_unknown_point_lists_valid_names_closest_first():
    model = tiny_llama()
    with pytest.raises(WidthscopeError) as e:
        collect(model, [torch.randint(0, 37, (2, 4))], points=["model.layer.1"], progress=False)
    msg = str(e.value)
    assert "model.layer.1" in msg and "Did you mean 'model.layers.1'" in msg
    # the block outputs come first; the many other modules are counted, not dumped
    assert "block outputs (the defaults): model.layers.0, model.layers.1" in msg
    assert "other module(s)" in msg and "lm_head" not in msg
    assert set(all_points(model)) >= set(insertion_points(model))


def test_nan_gradient_names_point_and_batch():
    model = mlp()
    x = torch.randn(6, 5, dtype=D64)
    y = torch.randint(0, 3, (6,))
    x[4, 2] = float("nan")  # lands in batch 1 with batch size 3
    with pytest.raises(WidthscopeError, match=r"point '3' in batch 1"):
        collect(model, batched(x, y, batch_size=3), points=["3"], progress=False)
    assert all(p.requires_grad for p in model.parameters())  # restored on error too


def test_empty_and_malformed_batches():
    model = mlp()
    with pytest.raises(WidthscopeError, match="no examples"):
        collect(model, [], progress=False)
    with pytest.raises(WidthscopeError, match="expected \\(x, y\\)"):
        collect(model, [torch.randn(3, 5, dtype=D64)], progress=False)
    with pytest.raises(WidthscopeError, match="unknown pool"):
        collect(model, [], pool="max", progress=False)


def test_declared_points_and_generic_rule():
    model = mlp()
    model.widthscope_points = ["1", "3"]
    assert insertion_points(model) == ["1", "3"]
    model.widthscope_points = ["1", "nope"]
    with pytest.raises(WidthscopeError, match="nope"):
        insertion_points(model)
    with pytest.raises(WidthscopeError, match="cannot guess"):
        insertion_points(nn.Linear(3, 3))


def test_dropout_runs_in_eval_mode_with_a_note():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.5), nn.Linear(8, 3)).to(D64).train()
    x, y = torch.randn(6, 5, dtype=D64), torch.randint(0, 3, (6,))
    r1 = collect(net, [(x, y)], points=["1"], progress=False)
    r2 = collect(net, [(x, y)], points=["1"], progress=False)
    assert torch.equal(r1["1"], r2["1"])  # deterministic: dropout was off
    assert any("dropout disabled" in n for n in r1.notes) and net[1].training


def test_empty_point_list_names_the_defaults_without_a_literal_none():
    from widthscope.probe.points import resolve_points

    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    for empty in ("", " , ", []):
        with pytest.raises(WidthscopeError, match=r"no insertion points given .*defaults: 0, 1$"):
            resolve_points(net, empty)
    assert resolve_points(net, " 1 , 0,1") == ["1", "0"]


def test_model_data_mismatch_names_batch_and_shapes():
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    cases = [([(x, y + 5)], "IndexError"),                        # class index out of range
             ([(x, y), (torch.randn(4, 7), y[:4])], "batch 1"),   # wrong input size in batch 1
             ([(x[:4], y[:5])], "(4, 4) float32, (5,) int64")]    # x/y batch mismatch
    for batches, needle in cases:
        with pytest.raises(WidthscopeError, match="forward pass or the loss failed") as e:
            collect(net, batches, points=["0"], progress=False)
        assert needle in str(e.value)
