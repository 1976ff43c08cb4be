r"""Cost model of the NTK methods: FLOPs, time and peak memory from one probe forward pass.

:func:`measure` counts one example's forward FLOPs (``FlopCounterMode``) and the bytes autograd saves;
:func:`estimates` turns them, with the parameter count, output size, example counts and the structured
:class:`~widthscope.linear.structured.Plan`, into each method's seconds and bytes (constants calibrated
by ``benchmarks/ntk_auto.py --calibrate``). The formulas: docs/performance.md "NTK ``method="auto"``".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from .gram import explicit_flops, gram_flops, pairs_flops

# from benchmarks/ntk_auto.py --calibrate (one thread, float32; see docs/performance.md)
GEMM_S = 6.8e-11
PASS_S = 1.1e-10
CALL_S = 2.0e-3
OP_S = 2.9e-5
PE_PASS_S = 2.5e-11
PE_WRITE_S = 1.4e-8
JVP_SLOWER = 2.5
CONTRACT_SLOWER = 1.6  # the per-tensor einsum contraction's rate relative to GEMM_S
SAFETY = 0.85  # plan for this share of memory_budget: allocator slack, temporaries the model does not count
# Jacobian chunks alive at the peak: row chunk, column chunk, the copies jacrev and vmap stack them through
PE_COPIES = 5
JAC_COPIES = 5


@dataclass
class Probe:
    """What one forward pass on one example says: FLOPs ``flops``, saved-for-backward bytes ``saved`` and
    ``ops`` (aten operators dispatched: the fixed cost of one pass that FLOPs do not see)."""

    flops: float
    saved: float
    ops: float = 0.0


class _OpCount(TorchDispatchMode):
    """Counts the aten operators a call dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def measure(fn, x: torch.Tensor, params: dict[str, torch.Tensor]) -> Probe:
    """FLOPs and saved activation bytes of ``fn(x)`` per row of ``x`` (grad enabled, as the kernels run it).

    The pass runs on a standalone copy of ``x``: the saved bytes are counted per storage (a saved view
    keeps its whole storage alive), and ``x`` may be a view into a larger batch (``x1[:1]``) whose
    storage must not be counted."""
    x = x.clone(memory_format=torch.contiguous_format)
    own = {p.untyped_storage().data_ptr() for p in params.values()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in own:
                seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):
            pass
        # not ``t`` itself: a graph dropped without a backward pass keeps a tensor packed as itself alive
        # (a cycle through autograd's C++ the garbage collector cannot see)
        return t.detach()

    counter, ops = FlopCounterMode(display=False), _OpCount()
    with torch.enable_grad(), counter, ops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    n = x.shape[0]
    return Probe(
        flops=float(max(counter.get_total_flops(), 1)) / n, saved=float(sum(seen.values())) / n, ops=float(ops.n)
    )


def positions_flops(rule: str, n: int, O: int, T: int, Da: int, Dd: int, mode: str, same: bool) -> float:
    """The Gram flops of one covered layer, as :func:`~widthscope.linear.gram.positions` would pick."""
    if T == 1:
        return (
            2.0 * (O * n) ** 2 * Dd / (O if mode != "full" else 1) * (0.56 if same and mode == "full" else 1)
            + 2.0 * n * n * Da
        )
    forms = [explicit_flops(O, n, n, T, Da, Dd, mode, same), pairs_flops(O, n, n, T, Da, Dd, mode, same)]
    if not mode.startswith("diag"):
        forms.append(gram_flops(O, n, n, T, Da, Dd, mode))
    return 2.0 * min(forms)


def _jacobian(
    P: float, O: int, n1: int, n2: int, same: bool, pr: Probe, item: int, budget: float, fixed: float
) -> dict[str, Any]:
    """Seconds and bytes of the Jacobian route for ``P`` parameters (``fixed``: bytes already spent)."""
    per = O * P * item  # one example's Jacobian
    room = budget - fixed

    def need(c: int, oc: int) -> float:
        return JAC_COPIES * c * oc * P * item + c * pr.saved * (1 + c * oc)

    c = 1
    while c < max(n1, n2) and need(2 * c, O) <= room:
        c *= 2
    oc = O
    while oc > 1 and need(1, oc) > room:
        oc = (oc + 1) // 2
    if need(c, oc) > room:
        return {"fits": False, "bytes": fixed + need(1, 1), "seconds": math.inf, "chunk": 1, "out_chunk": 1}
    rows = n1 if same else n1 + n2
    row_chunks, col_chunks = math.ceil(n1 / c) * math.ceil(O / oc), math.ceil(n2 / c) * math.ceil(O / oc)
    recompute = 0 if (same or col_chunks == 1) else row_chunks * n2 * O  # x2's Jacobian rows again
    passes = rows * O + recompute
    pairs = row_chunks * (row_chunks + 1) / 2 if same else row_chunks * col_chunks  # x2=None: upper pairs
    share = pairs / (row_chunks * col_chunks)
    calls = row_chunks + (0 if same else col_chunks)
    t = (
        passes * 2 * pr.flops * PASS_S * min(c, max(n1, n2))  # each vmapped pass runs over the whole chunk
        + passes * P * PASS_S  # the Jacobian writes
        + 2.0 * n1 * n2 * O * O * P * share * GEMM_S * CONTRACT_SLOWER
        + calls * 3 * pr.ops * OP_S
        + (calls + pairs) * CALL_S
    )
    return {
        "fits": True,
        "bytes": fixed + need(c, oc),
        "seconds": t,
        "chunk": c,
        "out_chunk": oc,
        "flops": passes * 2 * pr.flops + 2.0 * n1 * n2 * O * O * P,
        "per_example_jacobian": per,
    }


def _per_example(
    P: float, O: int, n1: int, n2: int, same: bool, pr: Probe, item: int, budget: float, fixed: float
) -> dict[str, Any]:
    """Seconds and bytes of the per-example route: ``vmap(jacrev)`` over chunks of ``c`` examples, each example
    run alone, so ``r·o`` one-example reverse passes (``2F`` and a ``P``-number gradient each) and one forward
    per example, against ``c·r·o`` for the batched :func:`_jacobian`; the contraction one matrix product per
    parameter tensor. Memory: ``PE_COPIES`` Jacobian chunks and the ``c·oc`` vmapped passes' activations."""
    room = budget - fixed

    def need(c: int, oc: int) -> float:
        return PE_COPIES * c * oc * P * item + c * pr.saved * (1 + oc)

    c = 1
    while c < max(n1, n2) and need(2 * c, O) <= room:
        c *= 2
    oc = O
    while oc > 1 and need(1, oc) > room:
        oc = (oc + 1) // 2
    if need(c, oc) > room:
        return {"fits": False, "bytes": fixed + need(1, 1), "seconds": math.inf, "chunk": 1, "out_chunk": 1}
    rows = n1 if same else n1 + n2
    oks = math.ceil(O / oc)
    row_chunks, col_chunks = math.ceil(n1 / c) * oks, math.ceil(n2 / c) * oks
    recompute = 0 if (same or col_chunks == 1) else row_chunks * n2  # x2's Jacobian rows again (examples)
    examples = rows * oks + recompute * oks  # forward passes (one per example per output chunk)
    passes = rows * O + recompute * O  # one-example reverse passes
    pairs = row_chunks * (row_chunks + 1) / 2 if same else row_chunks * col_chunks
    share = pairs / (row_chunks * col_chunks)
    calls = row_chunks + (0 if same else (col_chunks if col_chunks == 1 else row_chunks * col_chunks))
    t = (
        (examples + 2 * passes) * pr.flops * PE_PASS_S
        + passes * P * PE_WRITE_S
        + 2.0 * n1 * n2 * O * O * P * share * GEMM_S
        + calls * (CALL_S + 3 * pr.ops * OP_S)
    )
    return {
        "fits": True,
        "bytes": fixed + need(c, oc),
        "seconds": t,
        "chunk": c,
        "out_chunk": oc,
        "flops": (examples + 2 * passes) * pr.flops + 2.0 * n1 * n2 * O * O * P * share,
        "per_example_jacobian": O * P * item,
    }


def _structured(
    plan,
    shapes,
    P: int,
    O: int,
    n1: int,
    n2: int,
    same: bool,
    pr: Probe,
    item: int,
    budget: float,
    result: float,
    mode: str,
) -> dict[str, Any]:
    n = n1 if same else max(n1, n2)
    sig = plan.signal_numel
    inp = sum(da * t for _, t, da, _ in shapes)

    def need(b: int) -> float:
        # two blocks' records, each also held once more while captured; the batched backward's gradients;
        # the block accumulator with the Gram product, its weighted copy and the transposed write
        blocks = 2 * 2 * b * (O * sig + inp) * item
        grads = b * min(O, 64) * pr.saved + b * pr.saved
        acc = (b * b * O * O if mode == "full" else b * b) * item
        # one chunk of explicit per-example gradients and its scaled copy (gram.positions, max_floats)
        chunk = 2 * min(2**24, O * b * max((dd * da for _, t, da, dd in shapes if t > 1), default=0)) * item
        return blocks + grads + 5 * acc + chunk

    b = n
    while b > 1 and need(b) > budget - result:
        b = (b + 1) // 2
    gen = None
    if plan.n_generic:
        gen = _per_example(plan.n_generic, O, n1, n2, same, pr, item, budget, result + need(b))
    fits = need(b) <= budget - result and (gen is None or gen["fits"])
    rows = n1 if same else n1 + n2
    blocks = math.ceil(n / b)
    recapture = 1 if blocks == 1 else blocks / 2 + 1  # x2's blocks recomputed when they are not kept
    gram = sum(positions_flops(r, n, O, t, da, dd, mode, same) for r, t, da, dd in shapes)
    gram *= (n1 * n2) / (n * n)
    passes = rows * (1 + 2 * O) * pr.flops * recapture
    captures = blocks * recapture * math.ceil(O / 64)  # one forward and a batched backward per 64 outputs
    t = (
        passes * PASS_S
        + gram * GEMM_S
        + blocks * blocks * CALL_S * max(1, len(shapes)) / 4
        + O * CALL_S
        + captures * 3 * pr.ops * OP_S
    )
    out = {
        "fits": fits,
        "bytes": result + need(b) + (gen["bytes"] - result - need(b) if gen else 0),
        "seconds": t + (gen["seconds"] if gen else 0.0),
        "batch_size": None if b >= n else b,
        "flops": passes + gram + (gen["flops"] if gen and gen["fits"] else 0.0),
    }
    if gen is not None:
        out.update(generic_chunk=gen["chunk"], generic_out_chunk=gen["out_chunk"])
    return out


def _products(P: int, O: int, n1: int, n2: int, pr: Probe, item: int, budget: float, result: float) -> dict:
    def need(c: int) -> float:
        return 3 * P * item + 3 * c * pr.saved + pr.saved

    c = n1
    while c > 1 and need(c) > budget - result:
        c = (c + 1) // 2
    cols = n2 * O
    chunks = math.ceil(n1 / c)
    # forward-mode passes: JVP_SLOWER× the reverse passes' cost per FLOP
    t = (
        cols * (2 * pr.flops + 3 * n1 * pr.flops) * PASS_S * JVP_SLOWER
        + cols * (1 + chunks) * CALL_S
        + cols * (3 + 3 * chunks) * pr.ops * OP_S
    )
    return {
        "fits": need(c) <= budget - result,
        "bytes": result + need(c),
        "seconds": t,
        "chunk": c,
        "flops": cols * (2 + 3 * n1) * pr.flops,
    }


def layer_shapes(plan) -> list[tuple[str, int, int, int]]:
    """(rule, positions T, input width D_a, signal width D_δ) of each covered entry."""
    return list(getattr(plan, "shapes", []))


def estimates(
    *,
    pr: Probe,
    plan,
    n_params: int,
    n_out: int,
    n1: int,
    n2: int,
    same: bool,
    item: int,
    budget: float,
    mode: str,
    methods: tuple[str, ...],
) -> dict[str, dict[str, Any]]:
    """Estimated seconds, peak bytes and chunking of each method in ``methods`` (``fits``: within
    ``budget`` bytes, the returned kernel of ``mode`` included)."""
    O = n_out
    budget = SAFETY * budget
    res_n = {"full": n1 * n2 * O * O, "trace": n1 * n2 * O, "diag": n1 * O * O, "diagtrace": n1 * O}[mode]
    result = float(res_n * item)  # the returned kernel
    # the Jacobian and product routes form the full (n1, n2, o, o) blocks first, then reduce (trace)
    full = result + (0.0 if mode in ("full", "diag") else float(n1 * n2 * O * O * item))
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        if m == "jacobian":
            out[m] = _jacobian(n_params, O, n1, n2, same, pr, item, budget, full)
        elif m == "structured" and plan is not None:
            out[m] = _structured(plan, layer_shapes(plan), n_params, O, n1, n2, same, pr, item, budget, result, mode)
        elif m == "per_example":
            out[m] = _per_example(n_params, O, n1, n2, same, pr, item, budget, full)
        elif m == "products":
            out[m] = _products(n_params, O, n1, n2, pr, item, budget, full)
    return out


def choose(costs: dict[str, dict[str, Any]], budget: float) -> tuple[str | None, str]:
    """The fastest method that fits, and a one-line reason naming the alternatives."""
    fit = {m: c for m, c in costs.items() if c["fits"]}
    summary = ", ".join(
        f"{m} ~{c['seconds']:.3g} s / {c['bytes'] / 1e6:.4g} MB" + ("" if c["fits"] else " (over budget)")
        for m, c in costs.items()
    )
    if not fit:
        return None, f"no method fits memory_budget={budget:.4g} bytes ({summary})"
    best = min(fit, key=lambda m: fit[m]["seconds"])
    return best, f"{best}: cheapest estimate within memory_budget={budget:.4g} bytes ({summary})"
