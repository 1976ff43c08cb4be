"""``ntk(method="auto")``'s choice (:mod:`widthscope.linear.cost`): the fitted terms price the estimates,
the committed coefficients are the fit's, the fitting code recovers known coefficients, and the checks'
forward passes run once per model and parameter values (auto's fixed overhead) without changing a result."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from widthscope.errors import WidthscopeError
from widthscope.linear import checks, cost, ntk, probes

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-12}


def _oracle(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """J(x) J(x)ᵀ from one torch.autograd.grad per example and output (float64, no torch.func)."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for xi in x:
        y = model(xi[None]).reshape(-1)
        g = [
            torch.cat([t.reshape(-1) for t in torch.autograd.grad(y[a], params, retain_graph=True)])
            for a in range(y.numel())
        ]
        rows.append(torch.stack(g))
    J = torch.stack(rows)  # (n, out, P)
    return torch.einsum("iap,jbp->ijab", J, J)


def _fit_mod():
    spec = importlib.util.spec_from_file_location("ntk_auto_fit", ROOT / "benchmarks" / "ntk_auto_fit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def test_the_estimates_are_the_fitted_terms():
    net, x = _net(), torch.randn(6, 4, dtype=F64)
    info: dict = {}
    ntk(net, x, info=info)
    priced = 0
    for m, c in info["costs"].items():
        if m == "products":  # cost.py's own estimate
            assert "terms" not in c
            continue
        want = sum(cost.FIT[m][k] * v for k, v in c["terms"].items())
        want += sum(cost.FIT["per_example"][k] * v for k, v in c.get("generic_terms", {}).items())
        assert c["seconds"] == pytest.approx(want, rel=1e-12) and c["seconds"] > 0
        priced += 1
    assert priced == 3
    fits = {m: c for m, c in info["costs"].items() if c["fits"]}
    assert info["method"] == min(fits, key=lambda m: fits[m]["seconds"])
    # terms by hand for the per-example route: one chunk of all 6 rows, x2 = x1, 3 outputs
    t, P, F = info["costs"]["per_example"]["terms"], sum(p.numel() for p in net.parameters()), 2 * (64 + 256 + 48)
    assert t["write"] == 6 * 3 * P and t["contract"] == pytest.approx(2 * 36 * 9 * P * 1.0)
    assert t["pass"] == pytest.approx((6 + 2 * 18) * F) and t["call"] == 1


def test_the_committed_fit_is_the_fit_run():
    rec = json.loads((ROOT / "benchmarks" / "results" / "ntk-auto-fit-cpu.json").read_text())
    assert rec["fit"] == cost.FIT
    for r in rec["rows"].values():  # every measured method carries the terms it was fitted on, and only those
        assert set(r["seconds"]) <= set(r["terms"]) and all(v > 0 for v in r["seconds"].values())
        assert all(set(t) == set(cost.FIT[m]) for m, t in r["terms"].items())
    assert "fwd" in rec["dropped_terms"]  # the timed term (issue 32) is in no row and no coefficient
    # the recorded fit is what the fitting code makes of the recorded rows: the same estimates at every recorded
    # shape (a term that contributes nothing may land elsewhere within the optimizer's tolerance)
    mod = _fit_mod()
    fitted = mod.fit(rec["rows"])
    for r in rec["rows"].values():
        for m in r["seconds"]:
            assert mod._estimate(fitted, r, m) == pytest.approx(mod._estimate(rec["fit"], r, m), rel=0.02)


def test_the_fit_recovers_coefficients_and_ignores_a_factor_per_shape():
    mod = _fit_mod()
    gen = torch.Generator().manual_seed(1)
    true = {
        m: {k: float(torch.rand(1, generator=gen)) * 10 ** -(i % 3) for i, k in enumerate(c)}
        for m, c in cost.FIT.items()
    }
    rows = {}
    for s in range(40):
        terms = {
            m: {k: float(torch.rand(1, generator=gen)) * 10 ** (i % 3) for i, k in enumerate(c)}
            for m, c in true.items()
        }
        load = 1 + 3 * float(torch.rand(1, generator=gen))  # the shape's load: every method alike
        r = {"terms": terms, "generic_terms": None, "seconds": {}}
        r["seconds"] = {m: load * sum(true[m][k] * v for k, v in terms[m].items()) for m in true}
        rows[f"s{s}"] = r
    fitted = mod.fit(rows)
    assert max(mod.regret(rows, fitted).values()) <= 1.01  # picks within 1 % of the fastest
    for r in rows.values():  # ratios between methods at one shape are what the fit gets right
        est = {m: sum(fitted[m][k] * v for k, v in r["terms"][m].items()) for m in true}
        for m in true:
            assert est[m] / est["per_example"] == pytest.approx(r["seconds"][m] / r["seconds"]["per_example"], rel=0.05)


def test_the_checks_run_once_per_model_and_again_after_an_update(monkeypatch):
    probes.clear()
    calls = []
    real = checks.probe_checks
    monkeypatch.setattr(checks, "probe_checks", lambda *a, **k: calls.append(1) or real(*a, **k))
    measured = []
    real_measure = cost.measure
    monkeypatch.setattr(cost, "measure", lambda *a, **k: measured.append(1) or real_measure(*a, **k))
    net, x = _net(), torch.randn(5, 4, dtype=F64)
    K = ntk(net, x)
    for m in ("auto", "per_example", "structured", "jacobian"):
        assert torch.allclose(ntk(net, x, method=m), K, **TOL)
    assert len(calls) == 1
    for step in range(20):  # a training loop: each in-place update checks again, the probes stay cached
        with torch.no_grad():
            net[0].weight.add_(0.01)
        K = ntk(net, x)
        assert len(calls) == 2 + step
    assert len(measured) == 1 and len(probes._CACHE[net]) < probes.MAX_ENTRIES
    assert torch.allclose(K, _oracle(net, x), **TOL)


def test_a_random_model_is_refused_on_every_call():
    class FunctionalDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 16), nn.Linear(16, 2)

        def forward(self, x):
            return self.b(nn.functional.dropout(torch.tanh(self.a(x)), 0.5, training=True))

    net, x = FunctionalDropout().double(), torch.randn(4, 3, dtype=F64)
    for _ in range(2):  # a refusal is not cached as a pass
        with pytest.raises(WidthscopeError, match="two calls of the forward pass on the same inputs differ"):
            ntk(net, x)


class _Attn(nn.Module):
    """A one-block transformer with a scalar head: the shape where per_example and structured lie close."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.inp = nn.Linear(3, d)
        self.att = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        h = self.inp(x)
        h = self.norm(h + self.att(h, h, h, need_weights=False)[0])
        return self.head(h.mean(1))


@pytest.mark.parametrize("make", [_net, lambda: _Attn().double().eval()])
def test_auto_equals_the_oracle_whatever_it_picks(make):
    model = make()
    x = torch.randn(4, 5, 3, dtype=F64) if isinstance(model, _Attn) else torch.randn(4, 4, dtype=F64)
    want = _oracle(model, x)
    info: dict = {}
    assert torch.allclose(ntk(model, x, info=info), want, **TOL)
    for m in ("structured", "per_example", "jacobian"):
        assert torch.allclose(ntk(model, x, method=m), want, **TOL), m
    assert math.isfinite(info["costs"][info["method"]]["seconds"])


def _same_costs(a: dict, b: dict) -> None:
    """Every method's estimate equal to the last digit (seconds, bytes, chunking, terms)."""
    assert a.keys() == b.keys()
    for m in a:
        assert a[m] == b[m], m


def test_the_choice_is_the_same_whatever_the_clock(monkeypatch):
    """Issue 32: the choice is made from counts only. Two fresh models built the same way, on the same inputs,
    get the same method, the same estimates and the same kernel to the last digit, with a clock that returns
    garbage (a timed term would make every estimate, and so the choice, differ)."""
    gen = random.Random(32)
    for name in ("perf_counter", "monotonic", "process_time"):
        monkeypatch.setattr(time, name, lambda: gen.uniform(-1e6, 1e6))
    x = torch.randn(6, 5, 3, dtype=F64)
    runs = []
    for _ in range(2):
        probes.clear()
        torch.manual_seed(0)
        model = _Attn().double().eval()  # per_example and structured lie close here
        info: dict = {}
        K = ntk(model, x, info=info)
        runs.append((info, K))
    (a, Ka), (b, Kb) = runs
    assert a["method"] == b["method"] and a["reason"] == b["reason"]
    _same_costs(a["costs"], b["costs"])
    assert all(math.isfinite(c["seconds"]) and c["seconds"] > 0 for c in a["costs"].values() if c["fits"])
    assert torch.equal(Ka, Kb)  # the same method on the same machine: the same floating-point operations
    monkeypatch.undo()  # and the real clock agrees: the estimates never read it
    probes.clear()
    torch.manual_seed(0)
    info = {}
    ntk(_Attn().double().eval(), x, info=info)
    assert info["method"] == a["method"]
    _same_costs(info["costs"], a["costs"])
