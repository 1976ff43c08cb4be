"""The structured NTK equals the explicit-Jacobian oracle in float64, and auto picks it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from widthscope.errors import WidthscopeError
from widthscope.linear import nngp, ntk, structured_ntk
from widthscope.linear.cost import SAFETY
from widthscope.linear.structured import plan, uncovered
from widthscope.models import build

TOL = {"rtol": 1e-10, "atol": 1e-12}


def _flat_out(out):
    out = out if isinstance(out, torch.Tensor) else out.logits
    return out.reshape(-1)


def _oracle(model, x1, x2):
    """J(x1) J(x2)ᵀ from explicit per-example Jacobians (torch.func.jacrev), all outputs."""
    from torch.func import functional_call, jacrev

    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}

    def jac(x):  # {name: (n, out, P_name)}, one example at a time
        rows = [jacrev(lambda p, xi=xi: _flat_out(functional_call(model, p, (xi[None],))))(params) for xi in x]
        return {k: torch.stack([r[k].reshape(r[k].shape[0], -1) for r in rows]) for k in params}  # 0-d params too

    J1, J2 = jac(x1), jac(x2)
    return sum(torch.einsum("iap,jbp->ijab", J1[k], J2[k]) for k in params)
class SeqNet(nn.Module):
    """Dense layers applied at every position of a sequence, mean-pooled: the position sum."""

    def __init__(self, d=3, h=6, o=2):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, h), nn.Linear(h, h, bias=False), nn.Linear(h, o)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x))))).mean(1)


@pytest.mark.parametrize("kind", ["mlp", "widthscope-ntk", "widthscope-mup", "sequence", "frozen"])
def test_structured_equals_explicit_jacobians(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).double()
        x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    elif kind.startswith("widthscope"):
        model = build("mlp", 16, in_dim=4, out_dim=3, depth=2, parametrization=kind.split("-")[1],
                      activation="tanh").double()
        x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    elif kind == "sequence":
        model = SeqNet().double()
        x1, x2 = torch.randn(4, 5, 3, dtype=torch.float64), torch.randn(3, 5, 3, dtype=torch.float64)
    else:
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()
        model[0].bias.requires_grad_(False)  # a frozen parameter is a constant of the kernel
        x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    want = _oracle(model, x1, x2)  # frozen parameters are constants: the oracle skips them too
    got = structured_ntk(model, x1, x2)
    assert got.shape == want.shape and torch.allclose(got, want, **TOL)
    info = {}
    K = ntk(model, x1, x2, info=info, method="structured")
    assert info["method"] == "structured" and torch.allclose(K, want, **TOL)
    assert torch.allclose(ntk(model, x1, x2), want, **TOL)  # auto: whichever the cost model picks
    assert torch.allclose(ntk(model, x1, trace=True), torch.diagonal(_oracle(model, x1, x1), dim1=2, dim2=3).mean(-1),
                          **TOL)
    if kind == "frozen":
        assert info["covered"] == 8 * 4 + 16 + 2 and info["generic"] == []


class ConvNet(nn.Module):
    """Conv2d (stride, padding, dilation, reflect padding, groups), eval BatchNorm, GroupNorm, pooling,
    an in-place ReLU right after a conv (δ must be taken before it), Conv1d and a Linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.r1 = nn.ReLU(inplace=True)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 4, 3, padding="same", dilation=2, groups=2, padding_mode="reflect", bias=False)
        self.gn = nn.GroupNorm(2, 4)
        self.c3 = nn.Conv1d(4, 3, 2, stride=1, padding=1)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        h = self.r1(self.c1(x))
        h = torch.tanh(self.gn(self.c2(self.bn(h))))
        h = nn.functional.avg_pool2d(h, 2).flatten(2)  # (n, 4, L)
        return self.head(torch.tanh(self.c3(h)).mean(-1))


class EmbedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 5, padding_idx=0)
        self.ln = nn.LayerNorm(5)
        self.rms = nn.RMSNorm(5)
        self.lin = nn.Linear(5, 3)

    def forward(self, ids):
        return self.lin(torch.tanh(self.rms(self.ln(self.emb(ids))))).mean(1)


class GemmaStyleRMSNorm(nn.Module):
    """HF-style RMSNorm with a (1 + w) scale: elementwise, detected and checked by jvp."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * (1.0 + self.weight)


class MixingNorm(nn.Module):
    """Named like a norm, 1-D weight of the last-dim size, but NOT elementwise: must go generic."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * self.weight.roll(1) + self.weight.sum()


def _seeded(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


@pytest.mark.parametrize("kind", ["conv", "embed", "norms"])
def test_structured_covers_conv_embedding_and_norms(kind):
    torch.manual_seed(0)
    if kind == "conv":
        model = _seeded(ConvNet().double())
        with torch.no_grad():
            model.bn.running_mean.normal_()
            model.bn.running_var.uniform_(0.5, 2.0)
        model.eval()
        x1, x2 = torch.randn(3, 2, 9, 9, dtype=torch.float64), torch.randn(2, 2, 9, 9, dtype=torch.float64)
    elif kind == "embed":
        model = _seeded(EmbedNet().double())
        x1 = torch.tensor([[1, 2, 0, 2], [3, 3, 4, 0], [5, 6, 1, 1]])
        x2 = torch.tensor([[2, 0, 0, 6], [4, 1, 5, 2]])
    else:
        model = _seeded(nn.Sequential(nn.Linear(4, 6), GemmaStyleRMSNorm(6), nn.Tanh(), MixingNorm(6),
                                      nn.Linear(6, 2)).double())
        x1, x2 = torch.randn(4, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    info = {}
    got = ntk(model, x1, x2, info=info, method="structured")
    want = _oracle(model, x1, x2)
    assert info["method"] == "structured" and got.shape == want.shape
    assert torch.allclose(got, want, **TOL), (got - want).abs().max()
    if kind == "norms":  # the mixing "norm" is caught by the jvp check and handled by Jacobians
        assert info["generic"] == ["3.weight"] and info["uncovered"] == 6
    else:
        assert info["generic"] == [] and info["uncovered"] == 0
    assert info["covered"] + info["uncovered"] == sum(p.numel() for p in model.parameters())


class Shared(nn.Module):
    """A layer run twice (generic path), a weight tied between two modules and nn.MultiheadAttention
    (whose out_proj Linear is never called as a module; both structured)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.twice = nn.Linear(6, 6)
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
        self.tied_a, self.tied_b = nn.Linear(6, 6, bias=False), nn.Linear(6, 6)
        self.tied_b.weight = self.tied_a.weight
        self.big = nn.Linear(6, 64)
        self.head = nn.Linear(64, 2)

    def forward(self, x):  # x: (n, T, 4)
        h = torch.tanh(self.twice(torch.tanh(self.twice(self.inp(x)))))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = torch.tanh(self.tied_b(torch.tanh(self.tied_a(h))))
        return self.head(torch.tanh(self.big(h))).mean(1)


def test_hybrid_sums_structured_and_generic_parts():
    model = _seeded(Shared().double()).eval()
    x1, x2 = torch.randn(3, 5, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)
    info = {}
    got = ntk(model, x1, x2, info=info, method="structured")
    assert info["method"] == "structured"
    assert sorted(info["generic"]) == ["twice.bias", "twice.weight"]
    assert info["covered"] > info["uncovered"] > 0
    assert torch.allclose(got, _oracle(model, x1, x2), **TOL)
    assert torch.allclose(structured_ntk(model, x1), _oracle(model, x1, x1), **TOL)


def test_auto_falls_back_when_the_bulk_is_not_covered():
    class Bil(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Bilinear(4, 4, 6)  # no rule: 96 + 6 parameters
            self.head = nn.Linear(6, 2)

        def forward(self, x):
            return self.head(torch.tanh(self.b(x, x)))

    model = _seeded(Bil().double())
    assert uncovered(model) == ["b.weight", "b.bias"]
    x = torch.randn(4, 4, dtype=torch.float64)
    assert plan(model, x).generic == ["b.weight", "b.bias"]
    info = {}
    K = ntk(model, x, info=info)
    # an explicit-Jacobian route, the cheaper estimate of the two (per_example since issue 32)
    jac = {m: info["costs"][m]["seconds"] for m in ("per_example", "jacobian")}
    assert info["method"] == min(jac, key=jac.__getitem__) and torch.allclose(K, _oracle(model, x, x), **TOL)
    assert info["covered"] == 0 and info["uncovered"] == 116 and info["generic"] == [n for n, _ in model.named_parameters()]
    # forced, it is still exact (hybrid)
    info = {}
    assert torch.allclose(ntk(model, x, method="structured", info=info), _oracle(model, x, x), **TOL)
    assert info["generic"] == ["b.weight", "b.bias"] and info["covered"] == 14


def _tiny_hf(arch, tie_llama=False):
    """A tiny float64 Hugging Face model: ``"gpt2"`` (tied embeddings), ``"bert"`` (masked LM) or ``"llama"``."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=19, n_embd=8, n_layer=2, n_head=2, n_positions=8,
                                      bos_token_id=1, eos_token_id=1, attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(cfg)
    elif arch == "bert":
        cfg = transformers.BertConfig(vocab_size=19, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=16, max_position_embeddings=8, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, attn_implementation="eager")
        model = transformers.BertForMaskedLM(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=19, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8,
                                       pad_token_id=0, attn_implementation="eager", tie_word_embeddings=tie_llama)
        model = transformers.LlamaForCausalLM(cfg)
    return _seeded(model.double()).eval()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_structured_equals_oracle_on_tiny_transformers(arch):
    model = _tiny_hf(arch)
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.randint(1, 19, (2, 3), generator=g), torch.randint(1, 19, (2, 3), generator=g)
    info = {}
    got = ntk(model, x1, x2, info=info, method="structured")
    want = _oracle(model, x1, x2)
    # Llama's RMSNorm computes in float32 whatever the model dtype: agreement to float32 rounding
    tol = TOL if arch == "gpt2" else {"rtol": 1e-5, "atol": 1e-6 * float(want.abs().max())}
    assert info["method"] == "structured" and got.shape == (2, 2, 3 * 19, 3 * 19)
    assert torch.allclose(got, want, **tol), (got - want).abs().max()
    assert info["generic"] == []  # GPT-2: tied wte/lm_head and the batch-broadcast position embedding too
    if arch == "gpt2":
        # reverse mode only: fused (sdpa) attention needs no eager switch on this path
        sdpa = type(model)(type(model.config).from_dict({**model.config.to_dict(), "attn_implementation": "sdpa"}))
        sdpa = sdpa.double().eval()
        sdpa.load_state_dict(model.state_dict())
        assert sdpa.config._attn_implementation == "sdpa"
        assert torch.allclose(ntk(sdpa, x1, x2, method="structured"), want, **tol)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 3)).double()


@pytest.mark.parametrize("method", ["structured", "per_example", "jacobian", "products"])
def test_kernel_options_trace_diagonal_blocks(method):
    model = _mlp()
    x1, x2 = torch.randn(7, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    full = _oracle(model, x1, x2)
    sym = _oracle(model, x1, x1)
    kw = {"method": method}
    assert torch.allclose(ntk(model, x1, x2, **kw), full, **TOL)
    assert torch.allclose(ntk(model, x1, x2, trace=True, **kw), torch.diagonal(full, dim1=2, dim2=3).mean(-1), **TOL)
    dg = torch.diagonal(sym, dim1=0, dim2=1).permute(2, 0, 1)  # (n, o, o)
    got = ntk(model, x1, diagonal=True, **kw)
    assert got.shape == (7, 3, 3) and torch.allclose(got, dg, **TOL)
    assert torch.allclose(ntk(model, x1, diagonal=True, trace=True, **kw),
                          torch.diagonal(dg, dim1=1, dim2=2).mean(-1), **TOL)
    for b in (1, 3, 7, 50):  # blocked == unblocked, rectangular and symmetric, ragged last block
        assert torch.allclose(ntk(model, x1, x2, batch_size=b, **kw), full, **TOL)
        assert torch.allclose(ntk(model, x1, batch_size=b, **kw), sym, **TOL)
        assert torch.allclose(ntk(model, x1, batch_size=b, trace=True, **kw),
                              torch.diagonal(sym, dim1=2, dim2=3).mean(-1), **TOL)
        assert torch.allclose(ntk(model, x1, batch_size=b, diagonal=True, **kw), dg, **TOL)


def test_blocks_on_a_hybrid_sequence_model():
    model = _seeded(Shared().double()).eval()
    x1, x2 = torch.randn(5, 3, 4, dtype=torch.float64), torch.randn(4, 3, 4, dtype=torch.float64)
    want = _oracle(model, x1, x2)
    assert torch.allclose(ntk(model, x1, x2, batch_size=2), want, **TOL)
    info: dict = {}
    ntk(model, x1, x2, batch_size=2, method="structured", info=info)  # its estimate: nothing left to keep blocks
    tight = info["costs"]["structured"]["bytes"] / SAFETY  # the share ntk plans within, all of it taken
    assert torch.allclose(ntk(model, x1, x2, batch_size=2, memory_budget=tight, method="structured"), want, **TOL)
    sym = _oracle(model, x1, x1)
    dg = torch.diagonal(sym, dim1=0, dim2=1).permute(2, 0, 1)
    assert torch.allclose(ntk(model, x1, diagonal=True), dg, **TOL)
    assert torch.allclose(ntk(model, x1, diagonal=True, trace=True), torch.diagonal(dg, dim1=1, dim2=2).mean(-1), **TOL)
    assert torch.allclose(ntk(model, x1, x2, trace=True, batch_size=3), torch.diagonal(want, dim1=2, dim2=3).mean(-1),
                          **TOL)
    assert torch.allclose(ntk(model, x1, batch_size=2, dtype=torch.float64), sym, **TOL)


def test_float64_accumulation_of_a_float32_model():
    model = build("mlp", 64, in_dim=5, out_dim=3, depth=2, parametrization="ntk", activation="tanh")
    x = torch.randn(6, 5)
    want = _oracle(model.double(), x.double(), x.double())
    model.float()
    K32 = ntk(model, x)
    K64 = ntk(model, x, dtype=torch.float64)
    assert K32.dtype == torch.float32 and K64.dtype == torch.float64
    assert torch.allclose(K64, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert torch.allclose(K64.float(), K32, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert ntk(model, x, trace=True, dtype=torch.float64).dtype == torch.float64
    assert ntk(model, x, method="jacobian", dtype=torch.float64).dtype == torch.float64


def test_nngp_is_the_readout_feature_gram():
    torch.manual_seed(0)
    model = build("mlp", 32, in_dim=4, out_dim=3, depth=2, parametrization="ntk", activation="tanh").double()
    x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    feats = {}
    h = model.head.register_forward_hook(lambda m, a, o: feats.setdefault(len(feats), a[0]))
    model(x1), model(x2)
    h.remove()
    m = model.head.multiplier
    want = m ** 2 * feats[0] @ feats[1].T
    assert torch.allclose(nngp(model, x1, x2), want, **TOL)
    assert torch.allclose(nngp(model, x1), m ** 2 * feats[0] @ feats[0].T, **TOL)
    # it is the readout weights' part of the NTK: freeze everything else and compare
    for n, p in model.named_parameters():
        p.requires_grad_(n == "head.weight")
    K = _oracle(model, x1, x2)
    assert torch.allclose(K, want[:, :, None, None] * torch.eye(3, dtype=torch.float64), **TOL)
    seq = SeqNet().double()
    xs = torch.randn(2, 5, 3, dtype=torch.float64)
    a = torch.tanh(seq.b(torch.tanh(seq.a(xs))))
    got = nngp(seq, xs)
    assert got.shape == (2, 2, 5, 5) and torch.allclose(got, torch.einsum("itd,jsd->ijts", a, a), **TOL)
    assert torch.allclose(nngp(seq, xs, readout="b"), torch.einsum("itd,jsd->ijts", torch.tanh(seq.a(xs)),
                                                                   torch.tanh(seq.a(xs))), **TOL)
    with pytest.raises(WidthscopeError, match="no dense layer .* named 'nope'"):
        nngp(seq, xs, readout="nope")


def test_bad_kernel_options_raise_widthscope_errors():
    model = _mlp()
    x = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(WidthscopeError, match="diagonal=True .* pass x2=None"):
        ntk(model, x, x, diagonal=True)
    for b in (0, -1, 2.5, True):
        with pytest.raises(WidthscopeError, match="batch_size must be a positive integer"):
            ntk(model, x, batch_size=b)
    with pytest.raises(WidthscopeError, match="dtype must be a floating torch.dtype"):
        ntk(model, x, dtype=torch.int64)
    bn = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)).double().train()
    with pytest.raises(WidthscopeError, match=r"BatchNorm1d '1' uses batch statistics.*model.eval\(\)"):
        ntk(bn, x)
    with pytest.raises(WidthscopeError, match="no dense layer .* ran"):
        nngp(nn.Sequential(nn.Conv1d(1, 1, 1)).double(), torch.randn(2, 1, 3, dtype=torch.float64))
def test_kernel_predictions_equal_the_function_space_recursion():
    from widthscope.linear import function_space_gd
    from widthscope.linear.trainer import kernel_predict

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 2)).double()
    X, Xt = torch.randn(12, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    Y = torch.randn(12, 2, dtype=torch.float64)
    lr, steps = 0.5, 40
    rec = function_space_gd(net, X, Y, steps=steps, lr=lr, test=Xt)
    with torch.no_grad():
        f0, g0 = net(X), net(Xt)
    K, Kt = ntk(net, X), ntk(net, Xt, X)
    got = kernel_predict(K, Y, lr=lr, steps=steps, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(got["train"], rec["train"][-1], atol=1e-10)
    assert torch.allclose(got["test"], rec["test"][-1], atol=1e-10)
    # many steps: the recursion and the closed form still agree; the limit is the interpolant
    far = function_space_gd(net, X, Y, steps=3000, lr=lr, test=Xt)
    at = kernel_predict(K, Y, lr=lr, steps=3000, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(at["test"], far["test"][-1], atol=1e-8)
    lim = kernel_predict(K, Y, lr=lr, steps=float("inf"), K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(lim["train"], Y, atol=1e-6)  # 12·2 = 24 outputs, full-rank kernel: interpolates
    Kf = K.permute(0, 2, 1, 3).reshape(24, 24)
    Ktf = Kt.permute(0, 2, 1, 3).reshape(10, 24)
    exact = g0.reshape(-1) - Ktf @ torch.linalg.solve(Kf, (f0 - Y).reshape(-1))
    assert torch.allclose(lim["test"].reshape(-1), exact, rtol=1e-6, atol=1e-6)
    # the recursion moves toward the limit as the steps grow
    assert (at["test"] - lim["test"]).norm() < (got["test"] - lim["test"]).norm()
    flow = kernel_predict(K, Y, lr=lr, t=1e9, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(flow["test"], lim["test"], atol=1e-6)
    ridge = kernel_predict(K, Y, lr=lr, steps=float("inf"), ridge=1e-9, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(ridge["test"], lim["test"], atol=1e-4)
    # (t = ∞: GD at this lr diverges on the ridge loss, η(λ_max + 10)/N > 2, and steps=inf is refused)
    big = kernel_predict(K, Y, lr=lr, t=float("inf"), ridge=10.0, K_test=Kt, f0_train=f0, f0_test=g0)
    want = g0.reshape(-1) - Kt.permute(0, 2, 1, 3).reshape(10, 24) @ torch.linalg.solve(
        Kf + 10.0 * torch.eye(24, dtype=torch.float64), (f0 - Y).reshape(-1))
    assert torch.allclose(big["test"].reshape(-1), want)
    with pytest.raises(WidthscopeError, match="exactly one"):
        kernel_predict(K, Y, lr=lr)


@pytest.mark.parametrize("method", ["gram", "explicit", "pairs", "auto"])
@pytest.mark.parametrize("mode", ["full", "trace", "diag", "diagtrace"])
def test_position_sums_equal_the_brute_force_contraction(method, mode):
    from widthscope.linear.gram import mirror_upper, positions

    g = torch.Generator().manual_seed(0)
    O, n1, n2, T1, T2, Dd, Da = 3, 4, 5, 6, 2, 3, 4
    a1, d1 = torch.randn(n1, T1, Da, generator=g).double(), torch.randn(O, n1, T1, Dd, generator=g).double()
    a2, d2 = torch.randn(n2, T2, Da, generator=g).double(), torch.randn(O, n2, T2, Dd, generator=g).double()
    if mode.startswith("diag"):
        a2, d2, n2, T2 = a1, d1, n1, T1
    # brute force: per-example weight gradients P_{o,i} = Σ_t δ_{o,i,t} a_{i,t}ᵀ and their inner products
    P1, P2 = torch.einsum("oitd,ita->oida", d1, a1), torch.einsum("oitd,ita->oida", d2, a2)
    full = 0.7 * torch.einsum("oida,pjda->oipj", P1, P2)
    want = torch.einsum({"full": "oipj->oipj", "trace": "oioj->ij", "diag": "oipi->iop", "diagtrace": "oioi->i"}[mode],
                        full)
    acc = torch.zeros_like(want)
    positions(acc, a1, d1, a2, d2, 0.7, mode, method=method, max_floats=50)  # tiny chunks: several
    assert torch.allclose(acc, want, **TOL)
    if mode == "full":  # same batch, symmetric blocks only + mirror
        sym = torch.zeros(O, n1, O, n1, dtype=torch.float64)
        positions(sym, a1, d1, a1, d1, 0.7, mode, same=True, method=method)
        mirror_upper(sym)
        assert torch.allclose(sym, 0.7 * torch.einsum("oida,pjda->oipj", P1, P1), **TOL)
