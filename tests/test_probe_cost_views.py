"""The certify plan's pass counter (:func:`widthscope.probe.cost.count_pass`) counts one example's saved
bytes, not those of the data set its example is sliced from (issue 32: a saved view keeps, and was counted
by, its whole storage)."""

from __future__ import annotations

from collections import namedtuple

import torch
import torch.nn.functional as F
from torch import nn

from saved_bytes import saved_bytes
from widthscope.probe.cost import _standalone, count_pass


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")  # saves its target: the batch's labels


def _reference(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Brute force on standalone copies: the probe's pass (parameters frozen, a zero leaf added to the first
    layer's output), the bytes of each distinct tensor autograd saves, parameters excluded."""
    x, y = x.clone(), y.clone()
    with torch.no_grad():
        h = net[0](x)
    with saved_bytes(net) as seen:
        h = h + torch.zeros_like(h, requires_grad=True)
        _loss(net[2](net[1](h)), y)
    return sum(seen.values())


def test_count_pass_saved_bytes_do_not_grow_with_the_data_set_the_example_is_sliced_from():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    want = _reference(net, torch.randn(1, 5, dtype=torch.float64), torch.zeros(1, dtype=torch.long))
    assert want >= 8 * 7 + 8  # tanh's output and the one label at least
    for n in (8, 4096):
        X, Y = torch.randn(n, 5, dtype=torch.float64), torch.randint(0, 3, (n,))
        c = count_pass(net, (X[:1], Y[:1]), ["0"], _loss)
        assert c["saved_bytes"] == want, n
    assert all(p.requires_grad for p in net.parameters())  # the probe's set-up is undone


def test_standalone_copies_every_tensor_and_keeps_the_batch_type():
    Pair = namedtuple("Pair", "x y")
    big = torch.arange(100.0)
    batch = {"a": big[:2], "b": (big[2:4], [big[4:5]]), "p": Pair(big[5:6], 3)}
    out = _standalone(batch)
    assert type(out) is dict and type(out["b"]) is tuple and type(out["b"][1]) is list and type(out["p"]) is Pair
    flat = [out["a"], out["b"][0], out["b"][1][0], out["p"].x]
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in flat)
    assert all(t.untyped_storage().data_ptr() != big.untyped_storage().data_ptr() for t in flat)
    assert torch.equal(out["b"][0], big[2:4]) and out["p"].y == 3 and batch["a"] is not out["a"]
