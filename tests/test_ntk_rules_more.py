"""Structured rules for Conv3d, ConvTranspose1d/2d/3d, EmbeddingBag and PReLU equal the jacrev oracle in
float64 (full, trace, diagonal kernels), across their options; what has no rule stays exact by Jacobians."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from test_structured_ntk import TOL, _oracle, _seeded
from widthscope.linear import ntk
from widthscope.linear.rules import rule
from widthscope.linear.structured import plan, uncovered

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")  # the oracle's vmapped backward


def _check_all_modes(model, x1, x2, generic=()):
    """Full (x1, x2) and (x1, x1), trace, diagonal and diagonal trace of the structured path against the
    oracle; ``generic``: the parameter names expected on the Jacobian path."""
    assert sorted(uncovered(model, x1)) == sorted(generic)
    want, want11 = _oracle(model, x1, x2), _oracle(model, x1, x1)
    info = {}
    got = ntk(model, x1, x2, method="structured", info=info)
    assert info["method"] == "structured" and sorted(info["generic"]) == sorted(generic)
    assert got.shape == want.shape and torch.allclose(got, want, **TOL), (got - want).abs().max()
    assert torch.allclose(ntk(model, x1, method="structured"), want11, **TOL)
    assert torch.allclose(ntk(model, x1, method="structured", batch_size=2), want11, **TOL)  # blocks
    tr = torch.diagonal(want, dim1=2, dim2=3).mean(-1)
    assert torch.allclose(ntk(model, x1, x2, trace=True, method="structured"), tr, **TOL)
    dg = torch.diagonal(want11, dim1=0, dim2=1).permute(2, 0, 1)  # (n, o, o): Θ(x_i, x_i)
    assert torch.allclose(ntk(model, x1, diagonal=True, method="structured"), dg, **TOL)
    assert torch.allclose(ntk(model, x1, diagonal=True, trace=True, method="structured"),
                          torch.diagonal(dg, dim1=1, dim2=2).mean(-1), **TOL)


class Head(nn.Module):
    """``head(tanh(layer(pre(x))))`` pooled over locations: ``pre`` makes the layer's input depend on
    parameters, ``tanh`` makes its signal vary over locations."""

    def __init__(self, layer, channels, pre=None, call=None):
        super().__init__()
        self.pre, self.layer, self.head, self.call = pre, layer, nn.Linear(channels, 2), call

    def forward(self, x):
        h = x if self.pre is None else torch.tanh(self.pre(x))
        h = self.layer(h) if self.call is None else self.call(self.layer, h)
        return self.head(torch.tanh(h).flatten(2).mean(-1))


CONV3D = [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=(2, 3, 2), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), bias=False),
    dict(kernel_size=3, padding="same", dilation=(2, 1, 1), groups=2, padding_mode="reflect"),
    dict(kernel_size=2, stride=2, padding=1, groups=2, padding_mode="circular"),
    dict(kernel_size=3, padding=(0, 1, 1), padding_mode="replicate", stride=(1, 1, 2)),
]


@pytest.mark.parametrize("kw", CONV3D, ids=range(len(CONV3D)))
def test_conv3d_equals_oracle(kw):
    conv = nn.Conv3d(2, 4, **kw)
    assert rule(conv) == "conv"
    model = _seeded(Head(conv, 4).double())
    g = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(n, 2, 5, 6, 5, generator=g, dtype=torch.float64) for n in (3, 2))
    assert uncovered(model) == []
    _check_all_modes(model, x1, x2)


def _output_size(layer, h):
    """``layer(h, output_size=...)``: one more than the smallest output along every dim of stride > 1."""
    lo = [(L - 1) * s - 2 * p + d * (k - 1) + 1 for L, s, p, d, k in
          zip(h.shape[2:], layer.stride, layer.padding, layer.dilation, layer.kernel_size)]
    return layer(h, output_size=[v + (s > 1) for v, s in zip(lo, layer.stride)])


TRANSPOSED = [  # (dims, options, call with output_size)
    (1, dict(kernel_size=3), False),
    (1, dict(kernel_size=3, stride=2, padding=1, output_padding=1), False),
    (1, dict(kernel_size=2, stride=3, dilation=2, output_padding=2, groups=2, bias=False), False),
    (1, dict(kernel_size=4, stride=2, padding=3), True),
    (2, dict(kernel_size=3, stride=(2, 1), padding=(1, 0), dilation=(1, 2), output_padding=(1, 0)), False),
    (2, dict(kernel_size=(2, 3), stride=2, padding=1, groups=2), True),
    (2, dict(kernel_size=2, stride=1, dilation=3, padding=2, bias=False), False),
    (2, dict(kernel_size=2, stride=(2, 1), dilation=(3, 4), output_padding=(2, 3), padding=(3, 0)), False),  # op ≥ s
    (3, dict(kernel_size=2, stride=2, output_padding=(1, 0, 1)), False),
    (3, dict(kernel_size=(3, 2, 2), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2), True),
]


@pytest.mark.parametrize("dims,kw,sized", TRANSPOSED, ids=range(len(TRANSPOSED)))
def test_conv_transpose_equals_oracle(dims, kw, sized):
    conv_t = getattr(nn, f"ConvTranspose{dims}d")(4, 6, **kw)
    pre = getattr(nn, f"Conv{dims}d")(2, 4, 1)
    assert rule(conv_t) == "conv_transpose"
    model = _seeded(Head(conv_t, 6, pre, _output_size if sized else None).double())
    g = torch.Generator().manual_seed(2)
    size = {1: (5,), 2: (4, 3), 3: (3, 4, 3)}[dims]
    x1, x2 = (torch.randn((n, 2) + size, generator=g, dtype=torch.float64) for n in (3, 2))
    assert uncovered(model) == []
    _check_all_modes(model, x1, x2)


class BagNet(nn.Module):
    """An EmbeddingBag over the ids of each example (``-1``: no id; the offsets forms make bags of
    unequal length, an empty one included), optional per-sample weights from a trainable gate."""

    def __init__(self, mode, form, weighted, padding_idx):
        super().__init__()
        self.form = form
        self.bag = nn.EmbeddingBag(9, 5, mode=mode, padding_idx=padding_idx, include_last_offset=form == "last")
        self.gate = nn.Embedding(9, 1) if weighted else None
        self.head = nn.Linear(5, 3)

    def forward(self, ids):
        w = None if self.gate is None else torch.sigmoid(self.gate(ids.clamp(min=0))[..., 0])
        if self.form == "2d":
            z = self.bag(ids, per_sample_weights=w)
        else:
            keep = ids >= 0
            ends = keep.sum(1).cumsum(0)
            offsets = torch.cat([ends.new_zeros(1), ends if self.form == "last" else ends[:-1]])
            z = self.bag(ids[keep], offsets, per_sample_weights=None if w is None else w[keep])
        return self.head(torch.tanh(z))


BAGS = [("sum", "2d", False, None), ("mean", "2d", False, 0), ("sum", "2d", True, 0), ("sum", "offsets", True, None),
        ("mean", "offsets", False, 2), ("sum", "last", False, 3), ("mean", "last", False, None)]


@pytest.mark.parametrize("mode,form,weighted,padding_idx", BAGS)
def test_embedding_bag_equals_oracle(mode, form, weighted, padding_idx):
    model = _seeded(BagNet(mode, form, weighted, padding_idx).double())
    assert rule(model.bag) == "embedding_bag"
    if form == "2d":  # repeated ids within a bag, ids shared between the batches, padding ids
        x1 = torch.tensor([[1, 2, 0, 2, 5], [3, 3, 4, 0, 0], [5, 6, 1, 1, 8], [0, 0, 0, 0, 0]])
        x2 = torch.tensor([[2, 0, 0, 6, 7], [4, 1, 5, 2, 2]])
    else:  # an empty bag (row 2 of x1), bags of 1 to 5 ids
        x1 = torch.tensor([[1, 2, 2, -1, -1], [3, 3, 4, 0, 8], [-1, -1, -1, -1, -1], [5, -1, -1, -1, -1]])
        x2 = torch.tensor([[2, 0, 6, 7, -1], [3, 1, 5, 2, 2]])
    assert uncovered(model) == []
    _check_all_modes(model, x1, x2)


@pytest.mark.parametrize("channels,conv", [(1, False), (6, False), (1, True), (3, True)])
def test_prelu_equals_oracle(channels, conv):
    if conv:  # channel dim 1 of an (n, C, L) input
        act = nn.PReLU(channels)
        model = Head(nn.Sequential(nn.Conv1d(2, 3, 2), act), 3)
        x1, x2 = torch.randn(4, 2, 6, dtype=torch.float64), torch.randn(3, 2, 6, dtype=torch.float64)
    else:
        act = nn.PReLU(channels)
        model = nn.Sequential(nn.Linear(4, 6), act, nn.Linear(6, 2))
        x1, x2 = torch.randn(4, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    model = _seeded(model.double())
    assert rule(act) == "prelu" and uncovered(model) == []
    _check_all_modes(model, x1, x2)


class NoRule(nn.Module):
    """Max-mode EmbeddingBag and an LSTM: no structured rule; the hybrid adds them by Jacobians."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(7, 4, mode="max")
        self.lstm = nn.LSTM(4, 3, batch_first=True)
        self.head = nn.Linear(3, 2)

    def forward(self, ids):
        h = self.bag(ids)[:, None].expand(-1, 3, -1)
        return self.head(self.lstm(h)[0].mean(1))


def test_modules_without_a_closed_form_stay_exact_on_the_generic_path():
    model = _seeded(NoRule().double())
    assert rule(model.bag) is None and rule(model.lstm) is None
    generic = ["bag.weight"] + [n for n, _ in model.named_parameters() if n.startswith("lstm.")]
    assert sorted(uncovered(model)) == sorted(generic)
    x1, x2 = torch.tensor([[1, 2, 2], [3, 0, 6], [5, 5, 1]]), torch.tensor([[2, 4, 4], [6, 1, 0]])
    assert plan(model, x1).n_covered == 3 * 2 + 2
    _check_all_modes(model, x1, x2, generic)


class LayerScale(nn.Module):
    """timm-style ``x · γ`` (optionally in place: then its captured input is its output → generic)."""

    def __init__(self, d, inplace=False):
        super().__init__()
        self.gamma, self.inplace = nn.Parameter(torch.full((d,), 0.3)), inplace

    def forward(self, x):
        return x.mul_(self.gamma) if self.inplace else x * self.gamma


class Temperature(nn.Module):
    """A learned scalar scale and shift: ``x·t + s`` with two 0-d parameters."""

    def __init__(self):
        super().__init__()
        self.t, self.s = nn.Parameter(torch.tensor(1.5)), nn.Parameter(torch.tensor(0.2))

    def forward(self, x):
        return torch.tanh(x) * self.t + self.s


class ChannelAffine(nn.Module):
    """Per-channel ``α ⊙ softplus(x) + β`` on (n, C, L): the channel layout, names not weight/bias."""

    def __init__(self, c):
        super().__init__()
        self.alpha, self.beta = nn.Parameter(torch.randn(c)), nn.Parameter(torch.randn(c))

    def forward(self, x):
        return self.alpha[:, None] * nn.functional.softplus(x) + self.beta[:, None]


class Mix(nn.Module):
    """A (d, d) parameter applied as a matrix (same-shape params, but not elementwise) → generic."""

    def __init__(self, d):
        super().__init__()
        self.m = nn.Parameter(torch.randn(d, d) * 0.3)

    def forward(self, x):
        return x @ self.m


class Masked(nn.Module):
    """Elementwise in its parameter but reads a second argument: recomputing from x alone differs → generic."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x, gate=None):
        return x * self.w * (1.0 if gate is None else gate)


class Owned(nn.Module):
    """Custom modules owning their parameters, and a container-owned position parameter used in forward."""

    def __init__(self, d=4):
        super().__init__()
        self.inp, self.ls, self.temp = nn.Linear(3, d), LayerScale(d), Temperature()
        self.ls_inplace, self.mix, self.masked = LayerScale(d, inplace=True), Mix(d), Masked(d)
        self.conv, self.chan = nn.Conv1d(d, 3, 1), ChannelAffine(3)
        self.pos = nn.Parameter(torch.randn(5, d) * 0.1)  # container-owned: no hook reaches its use
        self.head = nn.Linear(3, 2)

    def forward(self, x):  # (n, 5, 3)
        h = self.ls(torch.tanh(self.inp(x) + self.pos))
        h = self.masked(self.mix(self.ls_inplace(self.temp(h))), gate=torch.sigmoid(h))
        h = self.chan(self.conv(h.transpose(1, 2)))
        return self.head(torch.tanh(h).mean(-1))


def test_module_owned_elementwise_parameters_are_covered_and_the_rest_exact():
    model = _seeded(Owned().double())
    assert rule(model.ls) == rule(model.temp) == rule(model.chan) == "elementwise"
    x1, x2 = torch.randn(3, 5, 3, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    generic = ["pos", "ls_inplace.gamma", "mix.m", "masked.w"]
    assert sorted(uncovered(model)) == sorted(["pos"])  # the static check cannot run the jvp checks
    _check_all_modes(model, x1, x2, generic)


def test_a_norm_that_needs_a_second_argument_goes_generic_instead_of_crashing():
    """widthscope's inserted ResidualBlock calls its _ChannelNorm as norm(z, dim): the recompute from z
    alone raised TypeError inside plan (before: the structured kernel crashed); ResidualBias is covered."""
    from widthscope.probe.insert import ResidualBias, ResidualBlock

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.rb, self.bias, self.h = nn.Linear(3, 4), ResidualBlock(4, 4, norm="rms"), ResidualBias(4), nn.Linear(4, 2)

        def forward(self, x):
            return self.h(self.bias(self.rb(torch.tanh(self.a(x)))))

    model = _seeded(M().double())
    x1, x2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    assert rule(model.bias) == "elementwise"
    _check_all_modes(model, x1, x2, ["rb.w_in", "rb.w_out", "rb.norm.weight"])


def test_plan_shapes_of_the_new_rules_feed_the_cost_model():
    """(rule, positions T, D_a, D_δ) per covered entry, as gram.positions will see them (D_δ over all groups)."""
    model = nn.Sequential(nn.Conv3d(2, 4, 3, stride=2, groups=2), nn.Flatten(2), nn.PReLU(4),
                          nn.Unflatten(2, (2, 4)), nn.ConvTranspose2d(4, 6, (2, 3), stride=2, groups=2))
    x = torch.randn(2, 2, 5, 5, 5)
    P = plan(model, x)
    assert [e[2] for e in P.entries] == ["conv", "prelu", "conv_transpose"]
    # the transposed conv: input (2, 4) → output (4, 9); T = 8 input locations, D_δ = 6 · 2·3
    assert P.shapes == [("conv", 8, 27, 4), ("prelu", 1, 0, 4), ("conv_transpose", 8, 2, 36)]
    # signals: z per example, plus the transposed conv's windows T·D_δ that its records hold
    assert P.signal_numel == 4 * 8 + 4 * 8 + 6 * 36 + 8 * 36
    bag = BagNet("mean", "offsets", False, None)
    Pb = plan(bag, torch.tensor([[1, 2, 2, -1, -1], [3, 3, 4, 0, 8]]))
    assert ("embedding_bag", 1, 9, 5) in Pb.shapes


def test_an_input_overwritten_after_the_module_ran_does_not_change_its_records():
    """Temperature keeps tanh(u), not u, for its backward, so autograd lets u be scaled in place after it
    ran; the records recompute ∂z/∂t = tanh(u) from a copy of u taken at the call."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.t, self.h = nn.Linear(3, 4), Temperature(), nn.Linear(4, 2)

        def forward(self, x):
            u = self.a(x)
            y = self.t(u)
            u.mul_(2.0)
            return self.h(torch.tanh(y + u))

    model = _seeded(M().double())
    x1, x2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    _check_all_modes(model, x1, x2)
