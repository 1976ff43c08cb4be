"""The per-example Jacobian route (``method="per_example"``: ``vmap(jacrev)`` over examples) equals the
brute-force float64 oracle; auto's choice follows the cost model; the probe cache re-probes on change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from widthscope.errors import WidthscopeError
from widthscope.linear import cost, ntk, probes
from widthscope.linear._core import ntk_per_example, params_and_buffers

TOL = {"rtol": 1e-10, "atol": 1e-12}
F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]


def _oracle(model, x1, x2):
    """J(x1) J(x2)ᵀ, one example at a time with torch.autograd.grad, one output at a time (no torch.func)."""
    params = [p for p in model.parameters() if p.requires_grad]

    def rows(x):
        out = []
        for xi in x:
            y = model(xi[None]).reshape(-1)
            out.append(
                torch.stack(
                    [
                        torch.cat([g.reshape(-1) for g in torch.autograd.grad(y[a], params, retain_graph=True)])
                        for a in range(y.shape[0])
                    ]
                )
            )
        return torch.stack(out)  # (n, o, P)

    return torch.einsum("iap,jbp->ijab", rows(x1), rows(x2))


class Scaled(nn.Module):
    """A model with buffers: a fixed input scale and an eval-mode BatchNorm's running statistics."""

    def __init__(self, o: int):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 4))
        self.a, self.bn, self.b = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, o)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(6) * 0.1)
            self.bn.running_var.copy_(torch.rand(6) + 0.5)

    def forward(self, x):
        return self.b(torch.tanh(self.bn(self.a(x * self.scale))))


class Seq(nn.Module):
    """Shared layers at every position, mean-pooled."""

    def __init__(self, o: int):
        super().__init__()
        self.a, self.b = nn.Linear(3, 5), nn.Linear(5, o)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).mean(1)


@pytest.mark.parametrize("o", [1, 3])
@pytest.mark.parametrize("kind", ["mlp", "buffers", "sequence"])
def test_per_example_equals_the_oracle(kind, o):
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, o))
        x1, x2 = torch.randn(5, 4), torch.randn(3, 4)
    elif kind == "buffers":
        model = Scaled(o)
        x1, x2 = torch.randn(5, 4), torch.randn(3, 4)
    else:
        model = Seq(o)
        x1, x2 = torch.randn(5, 4, 3), torch.randn(3, 4, 3)
    model = model.double().eval()
    x1, x2 = x1.double(), x2.double()
    info: dict = {}
    got = ntk(model, x1, x2, method="per_example", info=info)
    assert info["method"] == "per_example" and got.shape == (5, 3, o, o)
    assert torch.allclose(got, _oracle(model, x1, x2), **TOL)
    assert torch.allclose(ntk(model, x1, method="per_example"), _oracle(model, x1, x1), **TOL)
    # chunks of examples and of outputs, rectangular and symmetric (the mirrored upper block pairs)
    p, b = params_and_buffers(model)
    for chunk, oc in ((1, None), (2, None), (2, 2), (4, 1)):
        assert torch.allclose(ntk_per_example(model, p, b, x1, x2, chunk, False, oc), _oracle(model, x1, x2), **TOL)
        assert torch.allclose(ntk_per_example(model, p, b, x1, x1, chunk, True, oc), _oracle(model, x1, x1), **TOL)


def test_per_example_on_a_function_of_params():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    x1, x2 = torch.randn(4, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    f = lambda p, x: torch.func.functional_call(net, p, (x,))  # noqa: E731
    got = ntk(f, x1, x2, params=dict(net.named_parameters()), method="per_example")
    assert torch.allclose(got, _oracle(net, x1, x2), **TOL)


def test_per_example_is_refused_on_batch_coupled_models():
    class Centred(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            h = self.lin(x)
            return h - h.mean(0)

    with pytest.raises(WidthscopeError, match="examples are coupled.*method='per_example'"):
        ntk(Centred().double(), torch.randn(4, 3, dtype=F64), method="per_example")


def _synthetic(best: str):
    def fake(**kw):
        return {
            m: {"fits": True, "seconds": 1.0 if m == best else 5.0, "bytes": 1e3, "chunk": 2, "out_chunk": 1}
            for m in kw["methods"]
        }

    return fake


@pytest.mark.parametrize("best", ["structured", "per_example", "jacobian", "products"])
def test_auto_takes_what_the_cost_model_says(monkeypatch, best):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    x = torch.randn(5, 3, dtype=F64)
    monkeypatch.setattr(cost, "estimates", _synthetic(best))
    info: dict = {}
    K = ntk(net, x, info=info)
    assert info["method"] == best and info["reason"].startswith(f"{best}: cheapest estimate")
    assert torch.allclose(K, _oracle(net, x, x), **TOL)


class NoJvp(torch.autograd.Function):
    """tanh with a backward (vmap-able) but no forward-mode rule: a jvp through it raises."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


class NoJvpNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.b(NoJvp.apply(self.a(x)))


def test_products_is_dropped_only_when_it_would_win_and_has_no_jvp(monkeypatch):
    probes.clear()
    net, x = NoJvpNet().double(), torch.randn(4, 3, dtype=F64)
    monkeypatch.setattr(cost, "estimates", _synthetic("products"))
    info: dict = {}
    ntk(net, x, info=info)
    assert info["method"] != "products" and "no forward-mode AD" in info["reason"]
    assert "products" not in info["costs"]
    monkeypatch.setattr(cost, "estimates", _synthetic("per_example"))
    ntk(net, x, info=info)
    assert info["method"] == "per_example" and "products" in info["costs"]  # never tried: not needed


def test_choose_on_synthetic_costs_follows_seconds_then_fit():
    costs = {
        "structured": {"fits": True, "seconds": 0.3, "bytes": 1e6},
        "per_example": {"fits": True, "seconds": 0.2, "bytes": 5e8},
        "jacobian": {"fits": False, "seconds": 0.1, "bytes": 9e9},
        "products": {"fits": True, "seconds": 3.0, "bytes": 1e5},
    }
    assert cost.choose(costs, 2e9)[0] == "per_example"
    costs["per_example"]["fits"] = False
    assert cost.choose(costs, 2e9)[0] == "structured"
    costs["structured"]["seconds"] = 4.0
    assert cost.choose(costs, 2e9)[0] == "products"


def test_per_example_estimate_fits_the_budget_and_beats_the_batched_jacobian():
    pr = cost.Probe(flops=2e5, saved=4e3, ops=20)
    kw = dict(
        pr=pr,
        plan=None,
        n_params=100_000,
        n_out=10,
        n1=64,
        n2=64,
        same=True,
        item=4,
        mode="full",
        methods=("per_example", "jacobian"),
    )
    big = cost.estimates(budget=2e9, **kw)
    assert big["per_example"]["seconds"] < big["jacobian"]["seconds"]  # n one-example passes, not n·chunk
    small = cost.estimates(budget=2e7, **kw)["per_example"]
    assert small["fits"] and small["bytes"] <= cost.SAFETY * 2e7 and small["chunk"] < big["per_example"]["chunk"]
    assert not cost.estimates(budget=1e5, **kw)["per_example"]["fits"]


def test_the_committed_constants_are_the_calibration_run():
    rec = json.loads((ROOT / "benchmarks" / "results" / "ntk-auto-calibrate-cpu.json").read_text())["measured"]
    for name, v in rec.items():
        assert getattr(cost, name) == pytest.approx(v, rel=0.05), name


def test_probe_cache_reprobes_when_the_model_changes(monkeypatch):
    probes.clear()
    calls = []
    real = cost.measure
    monkeypatch.setattr(cost, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.randn(5, 3)
    ntk(net, x)
    ntk(net, torch.randn(7, 3))  # same per-example shape: cached
    assert len(calls) == 1
    ntk(net, x, torch.randn(2, 3))  # x2 given: the plan's probe rows differ, the measure's do not
    assert len(calls) == 1
    net.double()
    K = ntk(net, x.double())
    assert len(calls) == 2
    net[0].bias.requires_grad_(False)  # a frozen parameter: different kernel, probed again
    K2 = ntk(net, x.double())
    assert len(calls) == 3 and not torch.allclose(K, K2)
    assert torch.allclose(K2, _oracle(net, x.double(), x.double()), **TOL)


def test_a_forward_without_a_batching_rule_falls_back_or_says_what_to_pass(monkeypatch):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.RReLU(), nn.Linear(5, 2)).double().eval()  # rrelu: no vmap rule
    x = torch.randn(4, 3, dtype=F64)
    with pytest.raises(WidthscopeError, match="method='per_example' runs the model under vmap.*method='jacobian'"):
        ntk(net, x, method="per_example")
    monkeypatch.setattr(cost, "estimates", _synthetic("per_example"))
    info: dict = {}
    K = ntk(net, x, info=info)
    assert info["method"] == "jacobian" and "per_example failed" in info["reason"]
    assert torch.allclose(K, _oracle(net, x, x), **TOL)


def test_the_probe_cache_does_not_keep_models_alive():
    import gc
    import weakref

    for make in (lambda: nn.Linear(3, 2), lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))):
        net = make()
        ntk(net, torch.randn(4, 3))
        assert probes.peek(net, torch.randn(4, 3), ("measure", 1)) is not probes.MISSING
        ref = weakref.ref(net)
        del net
        gc.collect()
        assert ref() is None
