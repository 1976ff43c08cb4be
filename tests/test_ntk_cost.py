"""The NTK cost model: its probe counts what it says, and auto reports which method and why."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from saved_bytes import saved_bytes
from widthscope.errors import WidthscopeError
from widthscope.linear import ntk
from widthscope.linear.cost import choose, measure


def test_probe_counts_matmul_flops_and_saved_activations():
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    params = dict(net.named_parameters())
    pr = measure(lambda x: torch.func.functional_call(net, params, (x,)), torch.randn(4, 5), params)
    assert pr.flops == pytest.approx(2 * (5 * 7 + 7 * 3))  # per example
    # saved for backward: the two matmuls' inputs (5 and tanh's output, 7, which tanh saves too: one storage),
    # never a parameter; a little room for what a torch version saves besides
    assert 4 * (5 + 7) <= pr.saved <= 4 * (5 + 7 + 7 + 3) + 64


def test_auto_says_which_and_why(capsys):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    x = torch.randn(32, 6)
    info: dict = {}
    K = ntk(net, x, info=info, verbose=True)
    assert set(info["costs"]) == {"structured", "per_example", "jacobian", "products"}
    fits = {m: c for m, c in info["costs"].items() if c["fits"]}
    assert info["method"] == min(fits, key=lambda m: fits[m]["seconds"])
    assert info["reason"].startswith(info["method"] + ": cheapest estimate")
    assert f"ntk: method={info['method']!r}" in capsys.readouterr().err
    # the contraction 2·n²·out²·P of the Jacobian route dwarfs the Grams here
    assert info["costs"]["jacobian"]["flops"] > 10 * info["costs"]["structured"]["flops"]
    assert torch.allclose(K, ntk(net, x, method="jacobian"), rtol=1e-4, atol=1e-5)


def test_choose_takes_the_fastest_that_fits_and_says_when_none_does():
    costs = {"a": {"fits": True, "seconds": 2.0, "bytes": 1e6}, "b": {"fits": False, "seconds": 1.0, "bytes": 9e9},
             "c": {"fits": True, "seconds": 3.0, "bytes": 1e3}}
    best, why = choose(costs, 2e9)
    assert best == "a" and "b ~1 s / 9000 MB (over budget)" in why
    assert choose({"b": costs["b"]}, 2e9)[0] is None
    with pytest.raises(WidthscopeError, match="no method fits memory_budget"):
        ntk(nn.Linear(3, 2), torch.randn(4, 3), memory_budget=100)


def _saved_reference(net: nn.Module, x: torch.Tensor) -> int:
    """Brute force: the bytes of every distinct tensor autograd saves in ``net(x)`` on a standalone copy of
    ``x`` (parameters excluded), each storage once."""
    x = x.clone()
    with saved_bytes(net) as seen:
        net(x)
    return sum(seen.values())


def test_probe_saved_bytes_are_one_examples_whatever_batch_it_is_sliced_from():
    """Issue 32: the one-example probe ``x[:1]`` is a view into the batch; its saved bytes counted the batch's
    whole storage, so they (and the ``mem`` term) grew with the batch."""
    from widthscope.linear import probes

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2)).double()
    params = dict(net.named_parameters())
    want = _saved_reference(net, torch.randn(1, 16, dtype=torch.float64))
    assert want == 8 * (16 + 32 + 32)  # the three matmuls' inputs (tanh saves the same output it returns)
    for n in (8, 512):
        x = torch.randn(n, 16, dtype=torch.float64)
        pr = measure(lambda z: torch.func.functional_call(net, params, (z,)), x[:1], params)
        assert pr.saved == want, n
        probes.clear()  # and as ntk probes it: the cached probe of ntk(net, x)
        ntk(net, x[:16], method="structured")  # a view into the batch of n
        got = probes.peek(net, x, ("measure", 1))
        assert got is not probes.MISSING and got.saved == want, n


def test_ntk_leaves_nothing_of_the_model_alive():
    """The cost probe's saved-tensor hook packed each tensor as itself; its graph, dropped without a
    backward pass, then kept those tensors alive for good (a cycle through autograd's C++): every
    ``ntk`` call leaked the parameters' detached copies (a linearize sweep: 4 weight matrices per cell)."""
    import gc

    from widthscope.linear import ntk
    from widthscope.models import build

    def alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and tuple(o.shape) == (97, 97))

    before = alive()
    for method in ("auto", "jacobian", "structured", "products", "per_example"):
        torch.manual_seed(0)
        model = build("mlp", 97, in_dim=8, out_dim=3, depth=2).double()
        ntk(model, torch.randn(5, 8, dtype=torch.float64), method=method)
        del model
        assert alive() == before, method
