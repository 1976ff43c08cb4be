"""Attention and sequence models on the structured NTK path: float64 oracles against torch.func Jacobians.

Covered here: ``nn.MultiheadAttention`` (packed and separate in-projections, both batch layouts, masks,
``need_weights``), tied weights (input embedding = LM head) and batch-broadcast embeddings (GPT-2's
positions), tiny Hugging Face LLaMA / GPT-2 / BERT models, and the position-sum forms of
:func:`widthscope.linear.gram.positions` and :func:`~widthscope.linear.gram.tied_gradients`.
"""
from __future__ import annotations

import pytest
import torch
from test_structured_ntk import _oracle, _seeded, _tiny_hf
from torch import nn

from widthscope.linear import ntk
from widthscope.linear.structured import plan, uncovered

TOL = {"rtol": 1e-10, "atol": 1e-12}


def _modes(model, x1, x2, tol=TOL):
    """Full (x1, x2), symmetric, trace and diagonal kernels of the structured path against the oracle."""
    want, sym = _oracle(model, x1, x2), _oracle(model, x1, x1)
    dg = torch.diagonal(sym, dim1=0, dim2=1).permute(2, 0, 1)
    info: dict = {}
    got = ntk(model, x1, x2, method="structured", info=info)
    assert info["method"] == "structured" and info["generic"] == [], info["generic"]
    assert torch.allclose(got, want, **tol), float((got - want).abs().max())
    assert torch.allclose(ntk(model, x1, method="structured"), sym, **tol)
    assert torch.allclose(ntk(model, x1, x2, method="structured", trace=True),
                          torch.diagonal(want, dim1=2, dim2=3).mean(-1), **tol)
    assert torch.allclose(ntk(model, x1, method="structured", diagonal=True), dg, **tol)
    assert torch.allclose(ntk(model, x1, method="structured", diagonal=True, trace=True),
                          torch.diagonal(dg, dim1=1, dim2=2).mean(-1), **tol)
    assert torch.allclose(ntk(model, x1, method="structured", batch_size=2), sym, **tol)
    assert uncovered(model, x1) == []


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` (MultiheadAttention inside, batch first), mean-pooled."""

    def __init__(self, d=8, causal=False):
        super().__init__()
        self.inp = nn.Linear(3, d)
        layer = nn.TransformerEncoderLayer(d, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)
        self.causal = causal

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype) if self.causal else None
        return self.head(self.enc(self.inp(x), mask=mask, is_causal=self.causal).mean(1))


class Attn(nn.Module):
    """One ``nn.MultiheadAttention`` in the configuration ``kind`` between two linear layers."""

    def __init__(self, kind: str, d=6):
        super().__init__()
        self.kind = kind
        kw = {"kdim": 4, "vdim": 5} if kind == "separate" else {}
        self.inp = nn.Linear(3, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=kind != "seq_first", **kw)
        if kind == "separate":
            self.kv, self.v = nn.Linear(3, 4), nn.Linear(3, 5)
        self.head = nn.Linear(d, 2)

    def forward(self, x):  # x: (n, T, 3)
        h = torch.tanh(self.inp(x))
        if self.kind == "seq_first":
            o = self.attn(h.transpose(0, 1), h.transpose(0, 1), h.transpose(0, 1), need_weights=False)[0]
            o = o.transpose(0, 1)
        elif self.kind == "separate":  # kdim/vdim != embed_dim: q/k/v_proj_weight and a sliced in_proj_bias
            o = self.attn(h, torch.tanh(self.kv(x)), torch.tanh(self.v(x)), need_weights=False)[0]
        elif self.kind == "cross":  # key is value, not query: the packed weight split in two slices
            c = torch.sin(h)
            o = self.attn(h, c, c, need_weights=False)[0]
        elif self.kind == "weights":  # need_weights=True takes the explicit-softmax branch; weights used too
            o, w = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
            o = o + w.sum(1)[..., :1]
        else:  # key padding mask (last position masked) and an additive float attention mask
            T = x.shape[1]
            pad = torch.zeros(x.shape[0], T, dtype=torch.bool)
            pad[:, -1] = True
            am = torch.triu(torch.full((T, T), -1.5, dtype=x.dtype), 1)
            o = self.attn(h, h, h, key_padding_mask=pad, attn_mask=am, need_weights=False)[0]
        return self.head(o.mean(1))


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_encoder_is_covered_and_exact(causal):
    model = _seeded(Encoder(causal=causal).double()).eval()
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.randn(3, 4, 3, generator=g).double(), torch.randn(2, 4, 3, generator=g).double()
    _modes(model, x1, x2)
    P = plan(model, x1)
    assert sum(e[2] == "mha" for e in P.entries) == 2 and P.n_generic == 0


@pytest.mark.parametrize("kind", ["self", "seq_first", "separate", "cross", "weights", "masks"])
def test_multihead_attention_configurations(kind):
    model = _seeded(Attn(kind).double()).eval()
    g = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(3, 4, 3, generator=g).double(), torch.randn(2, 4, 3, generator=g).double()
    _modes(model, x1, x2)


def test_attention_bias_kv_goes_generic_and_the_rest_stays_exact():
    """``add_bias_kv`` parameters are concatenated, not projected: Jacobians for them (a hybrid)."""
    model = Attn("self")
    model.attn = nn.MultiheadAttention(6, 2, batch_first=True, add_bias_kv=True, add_zero_attn=True)
    model = _seeded(model.double()).eval()
    x1, x2 = torch.randn(3, 4, 3).double(), torch.randn(2, 4, 3).double()
    info: dict = {}
    got = ntk(model, x1, x2, method="structured", info=info)
    assert sorted(info["generic"]) == ["attn.bias_k", "attn.bias_v"]
    assert torch.allclose(got, _oracle(model, x1, x2), **TOL)


class TiedLM(nn.Module):
    """Input embedding tied to the output head (``head.weight is emb.weight``), padding id 0."""

    def __init__(self, V=11, d=6):
        super().__init__()
        self.emb = nn.Embedding(V, d, padding_idx=0)
        self.mid = nn.Linear(d, d)
        self.head = nn.Linear(d, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids)))).mean(1)


def test_tied_embedding_and_head_sum_their_gradients():
    model = _seeded(TiedLM().double()).eval()
    g = torch.Generator().manual_seed(3)
    x1, x2 = torch.randint(0, 11, (3, 5), generator=g), torch.randint(0, 11, (2, 5), generator=g)
    _modes(model, x1, x2)
    assert plan(model, x1).tied == [[0, 2]]  # emb and head entries share the weight
    # the two uses' cross terms matter: summing separate kernels of each use is not the NTK
    untied = _seeded(TiedLM().double()).eval()
    untied.head.weight = nn.Parameter(untied.emb.weight.detach().clone())
    sep = ntk(untied, x1, x2, method="structured")
    assert (sep - _oracle(model, x1, x2)).abs().max() > 1e-3 * sep.abs().max()


class TiedOnePosition(nn.Module):
    """A tied embedding and bias-free head at one position: the head's own entry covers nothing."""

    def __init__(self, V=10, d=4):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.head = nn.Linear(d, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids).squeeze(1)))


def test_tied_head_at_one_position_adds_no_bias_term():
    model = _seeded(TiedOnePosition().double()).eval()
    g = torch.Generator().manual_seed(5)
    _modes(model, torch.randint(0, 10, (4, 1), generator=g), torch.randint(0, 10, (3, 1), generator=g))


def test_tied_gradients_in_row_chunks_equal_the_brute_force_sum():
    from widthscope.linear.gram import tied_gradients

    g = torch.Generator().manual_seed(4)
    O, n, T, V, D = 2, 3, 4, 7, 5
    ids = torch.randint(0, V, (n, T), generator=g)
    de, dh = torch.randn(O, n, T, D, generator=g).double(), torch.randn(O, n, T, V, generator=g).double()
    h = torch.randn(n, T, D, generator=g).double()
    # brute force: ∂/∂W of Σ_t δe_t·W[id_t] (embedding) + Σ_t δh_t·(2 W h_t) (a head with multiplier 2)
    want = torch.zeros(O, n, V, D, dtype=torch.float64)
    for o in range(O):
        for i in range(n):
            for t in range(T):
                want[o, i, ids[i, t]] += de[o, i, t]
                want[o, i] += 2.0 * torch.outer(dh[o, i, t], h[i, t])
    uses = [("embed", ids, de, 1.0), ("linear", h, dh, 2.0)]
    for step in (1, 3, V):
        got = torch.cat([c.view(O, n, -1, D) for c in tied_gradients(uses, (V, D), step)], dim=2)
        assert torch.allclose(got, want, **TOL)


def _hf(arch):
    model = _tiny_hf(arch, tie_llama=True)
    if arch == "gpt2":
        assert model.lm_head.weight is model.transformer.wte.weight  # tied
    return model


class Pooled(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids).logits.mean(1)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_tiny_hugging_face_transformers_are_covered_and_exact(arch):
    model = Pooled(_hf(arch)).eval()
    g = torch.Generator().manual_seed(5)
    x1, x2 = torch.randint(1, 19, (3, 4), generator=g), torch.randint(1, 19, (2, 4), generator=g)
    want = _oracle(model, x1, x2)
    # Llama's RMSNorm computes in float32 whatever the model dtype: agreement to float32 rounding
    tol = TOL if arch != "llama" else {"rtol": 1e-5, "atol": 1e-6 * float(want.abs().max())}
    _modes(model, x1, x2, tol)
    P = plan(model, x1)
    assert P.tied, "the tied input embedding / LM head is on the structured path"
