"""Per-example activation gradients three ways, and where the probe's time goes (MLP).

For an MLP (``widthscope.models.build("mlp", width, depth=4)``) and one insertion point (the
output of the middle block), the per-example gradients ``q_i = ∂ℓ_i/∂z_i`` of ``n`` examples:

* ``probe``: :func:`widthscope.probe.collect` (one batched forward + backward per batch);
* ``loop``: one forward + backward per example with ``retain_grad`` on ``z``;
* ``func``: ``torch.func`` — the bottom of the network batched, then
  ``vmap(grad(loss ∘ top))`` over the examples (the functional per-sample-gradient idiom);
* ``floor``: the model's own work for the same gradients — a batched forward that keeps the
  point's output ``z`` (one hook, no copy) and ``autograd.grad(loss.sum(), z)`` with the
  parameters frozen, as the probe does, but without pooling, float64 copies or bookkeeping;
* ``step``: a plain training-step forward + backward (parameter gradients), for scale.

``overhead`` = ``(probe − floor)/probe``: the share of the probe's time that is ours (hooks,
pooling, float64 copies, Python) rather than the model's own forward/backward. Every time is the median
of ``repeats`` runs in the same process; every ratio compares times from the same run.

    python benchmarks/bench_persample.py [--quick]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import markdown_table, median_time  # noqa: E402


def _setup(width: int, n: int, in_dim: int = 64, classes: int = 10):
    from widthscope import models

    torch.manual_seed(0)
    model = models.build("mlp", width, in_dim=in_dim, out_dim=classes, depth=4).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, in_dim, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    points = model.widthscope_points
    point = points[len(points) // 2]
    return model, x, y, point


def _loop(model, x, y, point) -> torch.Tensor:
    mod = model.get_submodule(point)
    out = []
    for i in range(x.shape[0]):
        caught = []
        h = mod.register_forward_hook(lambda m, inp, o: caught.append(o))
        logits = model(x[i:i + 1])
        h.remove()
        caught[0].retain_grad()
        torch.nn.functional.cross_entropy(logits, y[i:i + 1]).backward()
        out.append(caught[0].grad[0].clone())
        model.zero_grad(set_to_none=True)
    return torch.stack(out)


def _func(model, x, y, point) -> torch.Tensor:
    """Bottom batched (activations captured by a hook), then vmap(grad) over the examples.

    The per-example function runs the model on a dummy input with the point's output replaced
    by ``z_i`` (a forward hook), so the bottom layers are re-run too: the usual cost of the
    functional idiom on a module one cannot split.
    """
    from torch.func import grad, vmap

    mod = model.get_submodule(point)
    caught = []
    h = mod.register_forward_hook(lambda m, inp, o: caught.append(o.detach()))
    with torch.no_grad():
        model(x)
    h.remove()
    z = caught[0]

    def loss_at(zi, yi):
        # replace the point's output by zi: a forward hook returning a value overrides it
        hh = mod.register_forward_hook(lambda m, inp, o: zi[None].expand_as(o))
        try:
            logits = model(torch.zeros_like(x[:1]))
        finally:
            hh.remove()
        return torch.nn.functional.cross_entropy(logits, yi[None])

    return vmap(grad(loss_at))(z, y)


def _floor(model, x, y, bs: int, point: str) -> None:
    mod = model.get_submodule(point)
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for i in range(0, x.shape[0], bs):
            caught = []
            h = mod.register_forward_hook(lambda m, inp, o: caught.append(o))
            xi = x[i:i + bs].requires_grad_(True)  # a graph must reach z even with frozen params
            logits = model(xi)
            h.remove()
            loss = torch.nn.functional.cross_entropy(logits, y[i:i + bs], reduction="sum")
            torch.autograd.grad(loss, caught[0])
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)


def _step(model, x, y, bs: int) -> None:
    for i in range(0, x.shape[0], bs):
        torch.nn.functional.cross_entropy(model(x[i:i + bs]), y[i:i + bs], reduction="sum").backward()
    model.zero_grad(set_to_none=True)


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows ``{width, n, probe_s, loop_s, func_s, floor_s, step_s, loop_over_probe, func_over_probe, overhead, max_rel_err}``."""
    from widthscope.probe import collect

    grid = [128] if quick else [128, 512, 2048]
    n, bs, repeats = (128, 64, 3) if quick else (512, 128, 5)
    rows = []
    for width in grid:
        model, x, y, point = _setup(width, n)
        batches = [(x[i:i + bs], y[i:i + bs]) for i in range(0, n, bs)]
        probe = lambda: collect(model, batches, points=[point], progress=False)[point]  # noqa: E731
        q = probe()
        ref = _loop(model, x, y, point).double()
        fq = _func(model, x, y, point).double()
        q, fq, ref = q.detach(), fq.detach(), ref.detach()
        scale = ref.abs().max()
        err = max(float((q - ref).abs().max() / scale), float((fq - ref).abs().max() / scale))
        t_probe = median_time(probe, repeats)
        t_loop = median_time(lambda: _loop(model, x, y, point), max(1, repeats // 2))
        t_func = median_time(lambda: _func(model, x, y, point), repeats)
        t_floor = median_time(lambda: _floor(model, x, y, bs, point), repeats)
        t_step = median_time(lambda: _step(model, x, y, bs), repeats)
        rows.append({"width": width, "n": n, "probe_s": t_probe, "loop_s": t_loop, "func_s": t_func,
                     "floor_s": t_floor, "step_s": t_step, "loop_over_probe": t_loop / t_probe,
                     "func_over_probe": t_func / t_probe,
                     "overhead": (t_probe - t_floor) / t_probe, "max_rel_err": err})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows)


if __name__ == "__main__":
    print(markdown(run("--quick" in sys.argv)))
