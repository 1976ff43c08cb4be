r"""Cost model of the NTK methods and ``ntk(method="auto")``'s choice.

:func:`measure` counts one example's forward FLOPs, saved bytes and aten operators; :func:`estimates` gives each
method's chunking, peak bytes and seconds; :func:`price` reprices them as :func:`terms` times :data:`FIT`.
Formulas: docs/performance.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from .gram import form_flops

__all__ = ["Probe", "measure", "estimates", "terms", "price", "choose", "FIT", "AUTO_METHODS", "SAFETY"]

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

# the calibrated constants as seconds per unit of each term (:func:`terms`); the structured path adds O·CALL_S
RATES: dict[str, dict[str, float]] = {
    "per_example": {"pass": PE_PASS_S, "write": PE_WRITE_S, "contract": GEMM_S, "call": CALL_S, "op": 3 * OP_S},
    "jacobian": {"pass": PASS_S, "write": PASS_S, "contract": GEMM_S * CONTRACT_SLOWER, "call": CALL_S, "op": 3 * OP_S},
    "structured": {"pass": PASS_S, "gram": GEMM_S, "block": CALL_S / 4, "op": 3 * OP_S},
}

AUTO_METHODS = ("structured", "per_example", "jacobian", "products")  # what "auto" chooses among

# seconds per unit of each term (:func:`terms`), from benchmarks/ntk_auto_fit.py --fit (docs/performance.md)
_EXPLICIT_TERMS = ("fixed", "pass", "write", "contract", "call", "op", "mem")
FIT: dict[str, dict[str, float]] = {
    "per_example": dict(zip(_EXPLICIT_TERMS, (0.00211, 2.84e-18, 6.42e-09, 8.89e-12, 0.00538, 5.89e-05, 1.61e-10))),
    "jacobian": dict(zip(_EXPLICIT_TERMS, (8.87e-10, 1.77e-11, 7.97e-09, 1.05e-11, 0.00266, 4.95e-11, 6.69e-10))),
    "structured": dict(
        zip(
            ("fixed", "pass", "gram", "out", "op", "block", "mem"),
            (8.78e-11, 1.01e-11, 1.04e-11, 3.11e-12, 2.8e-05, 0.0014, 2.09e-09),
        )
    ),
}


@dataclass
class Probe:
    """One example's forward pass: FLOPs, saved-for-backward bytes and aten operators dispatched."""

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
    """FLOPs, saved activation bytes (per storage, on a copy of ``x``) and operators of ``fn(x)`` per row of ``x``."""
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
        # not ``t`` itself: a tensor packed as itself stays alive in a cycle the garbage collector cannot see
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
    return 2.0 * min(form_flops(O, n, n, T, Da, Dd, mode, same).values())


def _counts(kind: str, P: float, O: int, n1: int, n2: int, same: bool, c: int, oc: int) -> dict[str, float]:
    """Work of the ``"per_example"``/``"jacobian"`` route in chunks of ``c`` examples × ``oc`` outputs: forward
    ``examples``, reverse ``passes``, ``contract`` FLOPs, functorch ``calls`` and chunk ``pairs``."""
    rows = n1 if same else n1 + n2
    oks = math.ceil(O / oc)
    row_chunks, col_chunks = math.ceil(n1 / c) * oks, math.ceil(n2 / c) * oks
    pairs = row_chunks * (row_chunks + 1) / 2 if same else row_chunks * col_chunks
    contract = 2.0 * n1 * n2 * O * O * P * pairs / (row_chunks * col_chunks)
    recompute = 0 if (same or col_chunks == 1) else row_chunks * n2
    if kind == "per_example":
        calls = row_chunks + (0 if same else (col_chunks if col_chunks == 1 else row_chunks * col_chunks))
        examples, passes = (rows + recompute) * oks, (rows + recompute) * O
    else:
        calls, examples, passes = row_chunks + (0 if same else col_chunks), 0, rows * O + recompute * O
    return {"examples": examples, "passes": passes, "contract": contract, "calls": calls, "pairs": pairs}


def _explicit(
    kind: str, P: float, O: int, n1: int, n2: int, same: bool, pr: Probe, item: int, budget: float, fixed: float
) -> dict[str, Any]:
    """Chunking, bytes and seconds of the ``"per_example"``/``"jacobian"`` route for ``P`` parameters within
    ``budget`` bytes (``fixed``: already spent): ``*_COPIES`` Jacobian chunks and the vmapped activations."""
    per_example, room = kind == "per_example", budget - fixed

    def need(c: int, oc: int) -> float:
        if per_example:
            return PE_COPIES * c * oc * P * item + c * pr.saved * (1 + oc)
        return JAC_COPIES * c * oc * P * item + c * pr.saved * (1 + c * oc)

    c = 1
    while c < max(n1, n2) and need(2 * c, O) <= room:
        c *= 2
    oc = O
    while oc > 1 and need(1, oc) > room:
        oc = (oc + 1) // 2
    if need(c, oc) > room:
        return {"fits": False, "bytes": fixed + need(1, 1), "seconds": math.inf, "chunk": 1, "out_chunk": 1}
    k = _counts(kind, P, O, n1, n2, same, c, oc)
    t = _dot(RATES[kind], terms(kind, {"chunk": c, "out_chunk": oc}, pr, None, P, O, n1, n2, same, "full") or {})
    if per_example:
        flops = (k["examples"] + 2 * k["passes"]) * pr.flops + k["contract"]
    else:
        flops = k["passes"] * 2 * pr.flops + 2.0 * n1 * n2 * O * O * P
    return {"fits": True, "bytes": fixed + need(c, oc), "seconds": t, "chunk": c, "out_chunk": oc, "flops": flops}


def _structured(
    plan, O: int, n1: int, n2: int, same: bool, pr: Probe, item: int, room: float, result: float, mode: str
):
    n = n1 if same else max(n1, n2)
    inp = sum(da * t for _, t, da, _ in plan.shapes)

    def need(b: int) -> float:
        # two blocks' records, each also held once more while captured; the batched backward's gradients;
        # the block accumulator with the Gram product, its weighted copy and the transposed write
        blocks = 2 * 2 * b * (O * plan.signal_numel + inp) * item
        grads = b * min(O, 64) * pr.saved + b * pr.saved
        acc = (b * b * O * O if mode == "full" else b * b) * item
        # one chunk of explicit per-example gradients and its scaled copy (gram.positions, max_floats)
        chunk = 2 * min(2**24, O * b * max((dd * da for _, t, da, dd in plan.shapes if t > 1), default=0)) * item
        return blocks + grads + 5 * acc + chunk

    b = n
    while b > 1 and need(b) > room - result:
        b = (b + 1) // 2
    gen = None
    if plan.n_generic:
        gen = _explicit("per_example", plan.n_generic, O, n1, n2, same, pr, item, room, result + need(b))
    k = terms("structured", {"batch_size": None if b >= n else b}, pr, plan, 0, O, n1, n2, same, mode) or {}
    out = {
        "fits": need(b) <= room - result and (gen is None or gen["fits"]),
        "bytes": gen["bytes"] if gen else result + need(b),
        "seconds": _dot(RATES["structured"], k) + O * CALL_S + (gen["seconds"] if gen else 0.0),
        "batch_size": None if b >= n else b,
        "flops": k["pass"] + k["gram"] + (gen["flops"] if gen and gen["fits"] else 0.0),
    }
    if gen is not None:
        out.update(generic_chunk=gen["chunk"], generic_out_chunk=gen["out_chunk"])
    return out


def _products(P: int, O: int, n1: int, n2: int, pr: Probe, item: int, room: float, result: float) -> dict:
    def need(c: int) -> float:
        return 3 * P * item + 3 * c * pr.saved + pr.saved

    c = n1
    while c > 1 and need(c) > room - result:
        c = (c + 1) // 2
    cols = n2 * O
    chunks = math.ceil(n1 / c)
    t = (  # forward-mode passes: JVP_SLOWER× the reverse passes' cost per FLOP
        cols * (2 * pr.flops + 3 * n1 * pr.flops) * PASS_S * JVP_SLOWER
        + cols * (1 + chunks) * CALL_S
        + cols * (3 + 3 * chunks) * pr.ops * OP_S
    )
    fits = need(c) <= room - result
    return {"fits": fits, "bytes": result + need(c), "seconds": t, "chunk": c, "flops": cols * (2 + 3 * n1) * pr.flops}


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
    """Seconds, peak bytes and chunking of each method in ``methods`` (``fits``: within ``budget``)."""
    O, room = n_out, SAFETY * budget
    res_n = {"full": n1 * n2 * O * O, "trace": n1 * n2 * O, "diag": n1 * O * O, "diagtrace": n1 * O}[mode]
    result = float(res_n * item)  # the returned kernel
    # the Jacobian and product routes form the full (n1, n2, o, o) blocks first, then reduce (trace)
    full = result + (0.0 if mode in ("full", "diag") else float(n1 * n2 * O * O * item))
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        if m in ("jacobian", "per_example"):
            out[m] = _explicit(m, n_params, O, n1, n2, same, pr, item, room, full)
        elif m == "structured" and plan is not None:
            out[m] = _structured(plan, O, n1, n2, same, pr, item, room, result, mode)
        elif m == "products":
            out[m] = _products(n_params, O, n1, n2, pr, item, room, full)
    return out


def terms(
    method: str, entry: dict, pr: Probe, plan: Any, P: float, O: int, n1: int, n2: int, same: bool, mode: str
) -> dict[str, float] | None:
    """The unit terms (counts) of ``method``'s estimate ``entry`` (its chunking); ``None`` for ``products``."""
    F, S, ops = pr.flops, pr.saved, max(pr.ops, 1.0)
    if method in ("per_example", "jacobian"):
        c = entry["chunk"]
        k = _counts(method, P, O, n1, n2, same, c, entry["out_chunk"])
        run = k["examples"] + 2 * k["passes"] if method == "per_example" else k["passes"] * 2 * min(c, max(n1, n2))
        calls = k["calls"] + (0 if method == "per_example" else k["pairs"])
        return {
            "fixed": 1.0,
            "pass": run * F,
            "mem": run * S,
            "write": k["passes"] * P,
            "contract": k["contract"],
            "call": calls,
            "op": k["calls"] * ops,
        }
    if method == "structured":
        n = n1 if same else max(n1, n2)
        blocks = math.ceil(n / (entry.get("batch_size") or n))
        recapture = 1 if blocks == 1 else blocks / 2 + 1
        gram = sum(positions_flops(r, n, O, t, da, dd, mode, same) for r, t, da, dd in plan.shapes)
        rows = n1 if same else n1 + n2
        return {
            "fixed": 1.0,
            "pass": rows * (1 + 2 * O) * F * recapture,
            "mem": rows * (1 + 2 * O) * S * recapture,
            "gram": gram * (n1 * n2) / (n * n),
            "out": O * blocks * recapture,
            "op": blocks * recapture * math.ceil(O / 64) * ops,
            "block": blocks * blocks * max(1, len(plan.shapes)),
        }
    return None


def _dot(rates: dict[str, float], t: dict[str, float]) -> float:
    """Seconds of the terms ``t`` at ``rates`` (seconds per unit; a term without a rate costs nothing)."""
    return sum(rates.get(k, 0.0) * v for k, v in t.items())


def price(costs: dict[str, dict], pr: Probe, plan: Any, P: int, O: int, n1: int, n2: int, same: bool, mode: str):
    """Replace each fitting estimate's ``seconds`` by its fitted terms' (``terms``; ``generic_terms``: the
    structured path's per-example remainder)."""
    for m, c in costs.items():
        if not c.get("fits") or "flops" not in c or m not in FIT:
            continue
        t = terms(m, c, pr, plan, P, O, n1, n2, same, mode)
        assert t is not None  # every method in FIT has terms
        c["terms"], s = t, _dot(FIT[m], t)
        if m == "structured" and plan is not None and plan.n_generic and c.get("generic_chunk"):
            g = {"chunk": c["generic_chunk"], "out_chunk": c["generic_out_chunk"]}
            gt = terms("per_example", g, pr, plan, plan.n_generic, O, n1, n2, same, mode)
            assert gt is not None
            gt["fixed"] = 0.0  # one call's set-up is the structured path's
            c["generic_terms"] = gt
            s += _dot(FIT["per_example"], gt)
        c["seconds"] = s
    return costs


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
