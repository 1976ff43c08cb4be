"""``memory_budget`` bounds the peak memory of every NTK method (and the chunked paths stay exact).

Peak = Linux ``VmHWM`` during the call (reset by ``/proc/self/clear_refs``) minus ``VmRSS`` before it,
in a fresh process, after a warm-up call on two rows (one-time library set-up is not the call's
memory). The model and inputs exist before, so this is the memory ``ntk`` itself adds, the returned
kernel included. Budgets are set so that the kernel alone is a large part of them and an unbounded
method would exceed them (the old Jacobian chunking peaked at 1.7× its budget).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from widthscope.linear import ntk
from widthscope.linear.cost import SAFETY

ROOT = Path(__file__).resolve().parents[1]
SLACK = 2 * 2 ** 20  # bytes: page granularity and allocator bookkeeping of the measurement itself

SCRIPT = r"""
import json, sys, torch
from pathlib import Path
torch.set_num_threads(1)
from widthscope.linear import ntk
from widthscope.linear.cost import SAFETY
from widthscope.models import build
method, width, n, budget, arch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
class Head(torch.nn.Module):  # a causal LM's first logit, mean-pooled over positions: one output
    def __init__(self, lm):
        super().__init__()
        self.lm = lm
    def forward(self, ids):
        return self.lm(ids).logits.mean(1)[:, :1]
def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
torch.manual_seed(0)
if arch == "llama":  # 16 tokens: the activations saved for the backward outweigh the parameters
    model, x = Head(build("llama", width, depth=2, vocab_size=512)).eval(), torch.randint(0, 512, (n, 16))
else:
    model, x = build("mlp", width, in_dim=64, out_dim=10, depth=2).eval(), torch.randn(n, 64)
ntk(model, x[:2], method=method, memory_budget=budget)
rss0 = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")
info = {}
K = ntk(model, x, method=method, memory_budget=budget, info=info)
peak = status("VmHWM") - rss0
c = info["costs"][info["method"]]
print(json.dumps({"peak": peak, "kernel": K.numel() * K.element_size(), "method": info["method"],
                  "chunk": c.get("chunk"), "out_chunk": c.get("out_chunk"), "batch_size": c.get("batch_size")}))
"""


def _can_measure() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return "VmHWM" in Path("/proc/self/status").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _can_measure(), reason="needs Linux /proc/self/status VmHWM and clear_refs")
@pytest.mark.parametrize("method,width,n,budget,arch", [
    ("jacobian", 256, 64, 2e7, "mlp"),     # Jacobian chunks of examples (one example: 3.2 MB)
    ("jacobian", 512, 8, 2e7, "mlp"),      # one example's Jacobian (12.6 MB) × copies does not fit: output chunks
    ("per_example", 256, 64, 3e7, "mlp"),  # planned with 3 Jacobian copies, it peaked at 27-34 MB
    ("structured", 256, 256, 4e7, "mlp"),  # the 25 MB kernel plus signals: blocks of examples
    ("products", 256, 64, 1e7, "mlp"),
    # 32 sequences at once: ~0.6 MB of saved activations each; planned without them, 38 MB (1.26x)
    ("products", 256, 32, 3e7, "llama"),
    ("auto", 256, 256, 4e7, "mlp"),
])
def test_peak_memory_within_budget(method, width, n, budget, arch):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    args = [method, str(width), str(n), str(budget), arch]
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT, *args],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["peak"] <= budget + SLACK, r
    if method == "jacobian" and width == 512:
        assert r["chunk"] == 1 and r["out_chunk"] < 10, r
    if method == "structured":
        assert r["batch_size"] is not None and r["batch_size"] < n, r


def _oracle(model, x):
    from torch.func import functional_call, jacrev

    params = {k: v.detach() for k, v in model.named_parameters()}
    J = [jacrev(lambda p, xi=xi: functional_call(model, p, (xi[None],)).reshape(-1))(params) for xi in x]
    J = torch.stack([torch.cat([j[k].flatten(1) for k in params], 1) for j in J])  # (n, out, P)
    return torch.einsum("iap,jbp->ijab", J, J)


@pytest.mark.parametrize("method", ["jacobian", "structured", "products"])
def test_small_budget_chunks_stay_exact(method):
    """A budget that forces chunks of one example (and of outputs, for Jacobians) or blocks: same kernel."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)).double()
    x = torch.randn(6, 5, dtype=torch.float64)
    want = _oracle(model, x)
    info: dict = {}
    ntk(model, x, method=method, info=info)
    roomy = info["costs"][method]
    P, K = sum(p.numel() for p in model.parameters()), want.numel() * 8
    if method == "jacobian":  # one example's 4 outputs × JAC_COPIES do not fit, 2 outputs do
        budget = (K + 3 * 4 * P * 8) / SAFETY
    elif method == "structured":
        budget = 0.5 * roomy["bytes"] / SAFETY
    else:  # the products route's chunks of x1 (its memory choice is tested above)
        from widthscope.linear._core import ntk_products

        params = {k: v.detach() for k, v in model.named_parameters()}
        assert torch.allclose(ntk_products(model, params, {}, x, x, chunk=4), want, rtol=1e-10, atol=1e-12)
        budget = roomy["bytes"] / SAFETY
    info = {}
    got = ntk(model, x, method=method, memory_budget=budget, info=info)
    c = info["costs"][method]
    assert c["bytes"] <= SAFETY * budget
    if method == "jacobian":
        assert c["chunk"] == 1 and c["out_chunk"] < 4
    if method == "structured":
        assert c["batch_size"] is not None and c["batch_size"] < 6
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    x2 = torch.randn(3, 5, dtype=torch.float64)
    both = _oracle(model, torch.cat([x, x2]))[:6, 6:]
    assert torch.allclose(ntk(model, x, x2, method=method, memory_budget=budget), both, rtol=1e-10, atol=1e-12)


def test_a_method_that_cannot_fit_is_refused_before_work():
    model = nn.Linear(3, 2)
    with pytest.raises(Exception, match="more than the 85% of memory_budget"):
        ntk(model, torch.randn(4, 3), method="jacobian", memory_budget=10)
