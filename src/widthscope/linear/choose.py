r"""``ntk(method="auto")``'s choice: every method's estimate (:mod:`.cost`: memory, chunking and the counts
of one probe pass), priced in seconds by fitted terms, and the cheapest that fits.

:func:`terms` turns a method's counts into named terms (unit coefficients); :data:`FIT` holds the seconds
per unit of each (θ ≥ 0), fitted by ``benchmarks/ntk_auto_fit.py`` to the times of every method at a set of
shapes (least squares on the log error up to one factor per shape, since only ratios between methods
decide; see docs/performance.md). The terms:

- ``fixed``: one call's set-up (hooks, the plan's records, the Jacobian's pytree handling);
- ``pass``: FLOPs of the forward and reverse passes;
- ``mem``: the same passes' saved activation bytes (elementwise work FLOPs do not count), as
  :func:`.cost.measure` counts them for one example;
- ``write``: Jacobian numbers written (``P`` per reverse pass);
- ``contract``: the ``J Jᵀ`` contraction's FLOPs; ``gram``: the structured Grams' FLOPs;
- ``call`` and ``op``: functorch calls and aten operators dispatched (Python and dispatch overhead);
- ``out``: the structured path's per-output work per block; ``block``: per layer and block pair.

``products`` keeps :mod:`.cost`'s own estimate, as does an estimate without counts (a method over the
budget; estimates a caller substituted). Every term is a count, nothing is timed: the same architecture and
input shapes give the same estimates and the same choice in every run."""

from __future__ import annotations

import math
from typing import Any

from ..errors import WidthscopeError
from . import cost
from ._core import flat_out, forward_ad_ok
from .probes import cached

__all__ = ["plan_costs", "terms", "price", "FIT", "AUTO_METHODS"]

AUTO_METHODS = ("structured", "per_example", "jacobian", "products")  # what "auto" chooses among

# seconds per unit of each term (module docstring), from benchmarks/ntk_auto_fit.py --fit (docs/performance.md)
FIT: dict[str, dict[str, float]] = {
    "per_example": {
        "fixed": 0.00211,
        "pass": 2.84e-18,
        "write": 6.42e-09,
        "contract": 8.89e-12,
        "call": 0.00538,
        "op": 5.89e-05,
        "mem": 1.61e-10,
    },
    "jacobian": {
        "fixed": 8.87e-10,
        "pass": 1.77e-11,
        "write": 7.97e-09,
        "contract": 1.05e-11,
        "call": 0.00266,
        "op": 4.95e-11,
        "mem": 6.69e-10,
    },
    "structured": {
        "fixed": 8.78e-11,
        "pass": 1.01e-11,
        "gram": 1.04e-11,
        "out": 3.11e-12,
        "op": 2.8e-05,
        "block": 0.0014,
        "mem": 2.09e-09,
    },
}


def _explicit_counts(kind: str, P: float, O: int, n1: int, n2: int, same: bool, c: int, oc: int) -> dict:
    """The chunk arithmetic of :func:`.cost._per_example` / :func:`.cost._jacobian` (``kind``)."""
    rows = n1 if same else n1 + n2
    oks = math.ceil(O / oc)
    row_chunks, col_chunks = math.ceil(n1 / c) * oks, math.ceil(n2 / c) * oks
    pairs = row_chunks * (row_chunks + 1) / 2 if same else row_chunks * col_chunks
    share = pairs / (row_chunks * col_chunks)
    contract = 2.0 * n1 * n2 * O * O * P * share
    if kind == "per_example":
        recompute = 0 if (same or col_chunks == 1) else row_chunks * n2
        examples, passes = (rows + recompute) * oks, (rows + recompute) * O
        calls = row_chunks + (0 if same else (col_chunks if col_chunks == 1 else row_chunks * col_chunks))
        return {"examples": examples, "passes": passes, "contract": contract, "calls": calls, "pairs": pairs}
    recompute = 0 if (same or col_chunks == 1) else row_chunks * n2 * O
    calls = row_chunks + (0 if same else col_chunks)
    return {"passes": rows * O + recompute, "contract": contract, "calls": calls, "pairs": pairs}


def terms(
    method: str,
    entry: dict,
    pr: cost.Probe,
    plan: Any,
    P: int,
    O: int,
    n1: int,
    n2: int,
    same: bool,
    mode: str,
) -> dict[str, float] | None:
    """The unit terms of ``method``'s estimate ``entry`` (its chunking), ``None`` for ``products``."""
    F, S, ops = pr.flops, pr.saved, max(pr.ops, 1.0)
    if method == "per_example":
        k = _explicit_counts(method, P, O, n1, n2, same, entry["chunk"], entry["out_chunk"])
        return {
            "fixed": 1.0,
            "pass": (k["examples"] + 2 * k["passes"]) * F,
            "mem": (k["examples"] + 2 * k["passes"]) * S,
            "write": k["passes"] * P,
            "contract": k["contract"],
            "call": k["calls"],
            "op": k["calls"] * ops,
        }
    if method == "jacobian":
        c = entry["chunk"]
        k = _explicit_counts(method, P, O, n1, n2, same, c, entry["out_chunk"])
        return {
            "fixed": 1.0,
            "pass": k["passes"] * 2 * F * min(c, max(n1, n2)),
            "mem": k["passes"] * 2 * S * min(c, max(n1, n2)),
            "write": k["passes"] * P,
            "contract": k["contract"],
            "call": k["calls"] + k["pairs"],
            "op": k["calls"] * ops,
        }
    if method == "structured":
        shapes = cost.layer_shapes(plan)
        n = n1 if same else max(n1, n2)
        b = entry.get("batch_size") or n
        blocks = math.ceil(n / b)
        recapture = 1 if blocks == 1 else blocks / 2 + 1
        gram = sum(cost.positions_flops(r, n, O, t, da, dd, mode, same) for r, t, da, dd in shapes)
        rows = n1 if same else n1 + n2
        return {
            "fixed": 1.0,
            "pass": rows * (1 + 2 * O) * F * recapture,
            "mem": rows * (1 + 2 * O) * S * recapture,
            "gram": gram * (n1 * n2) / (n * n),
            "out": O * blocks * recapture,
            "op": blocks * recapture * math.ceil(O / 64) * ops,
            "block": blocks * blocks * max(1, len(shapes)),
        }
    return None


def _seconds(method: str, t: dict[str, float]) -> float:
    coef = FIT[method]
    return sum(coef.get(k, 0.0) * v for k, v in t.items())


def price(
    costs: dict[str, dict],
    pr: cost.Probe,
    plan: Any,
    P: int,
    O: int,
    n1: int,
    n2: int,
    same: bool,
    mode: str,
) -> dict[str, dict]:
    """Replace each fitting estimate's ``seconds`` by the fitted terms' (module docstring); the terms are kept
    in ``terms`` (the structured path's uncovered remainder in ``generic_terms``: the per-example route's)."""
    for m, c in costs.items():
        if not c.get("fits") or "flops" not in c or m not in FIT:
            continue
        t = terms(m, c, pr, plan, P, O, n1, n2, same, mode)
        if t is None:
            continue
        c["terms"] = t
        s = _seconds(m, t)
        if m == "structured" and plan is not None and plan.n_generic and c.get("generic_chunk"):
            g = {"chunk": c["generic_chunk"], "out_chunk": c["generic_out_chunk"]}
            gt = terms("per_example", g, pr, plan, plan.n_generic, O, n1, n2, same, mode)
            assert gt is not None  # per_example always has terms
            gt["fixed"] = 0.0  # one call's set-up is the structured path's
            c["generic_terms"] = gt
            s += _seconds("per_example", gt)
        c["seconds"] = s
    return costs


def _measure(model, params, buffers, x) -> cost.Probe:
    """:func:`.cost.measure` of the forward pass as the kernels differentiate it: on parameters that require
    grad (the detached ones would save nothing for a backward pass, and let ``nn.TransformerEncoder`` take
    its fused inference kernel, whose FLOPs and operators the counters do not see)."""
    tracked = {k: v.detach().requires_grad_() for k, v in params.items()}
    return cost.measure(lambda x: flat_out(model, tracked, buffers, x), x, tracked)


def plan_costs(
    model,
    params,
    buffers,
    x1,
    x2,
    same,
    P,
    method,
    n_params,
    n_out,
    itemsize,
    budget,
    trace,
    diagonal,
    batch_size,
    coupled,
) -> dict[str, Any]:
    """Estimate every method's time and memory; pick the cheapest that fits for ``"auto"``, else check that
    the forced method fits ``budget``. One clear error when nothing fits."""
    px = x1 if coupled else x1[:1]
    pr = cached(model, px, ("measure", px.shape[0]), lambda: _measure(model, params, buffers, px))
    n1 = x1.shape[0]
    n2 = n1 if same else x2.shape[0]
    if batch_size is not None:  # blocks of batch_size examples, one pair at a time
        n1, n2 = min(n1, batch_size), min(n2, batch_size)
    mode = ("diagtrace" if trace else "diag") if diagonal else ("trace" if trace else "full")
    if diagonal and method != "structured":
        n2 = 1  # per-chunk diagonal blocks
    cands: tuple[str, ...] = AUTO_METHODS if method == "auto" else (method,)
    if coupled is not None:  # one batch at once: the Jacobian of the whole batch
        cands = tuple(m for m in cands if m not in ("structured", "per_example"))
    kw = dict(n_params=n_params, n_out=n_out, n1=n1, n2=n2, same=same)
    costs = cost.estimates(pr=pr, plan=P, item=itemsize, budget=budget, mode=mode, methods=cands, **kw)
    if P is not None and "structured" in costs and P.n_covered == 0:
        costs.pop("structured")  # nothing covered: it is the Jacobian route with extra steps
    if coupled is not None and "jacobian" in costs:  # forced whole-batch chunk
        costs["jacobian"].update(chunk=x1.shape[0], out_chunk=n_out)
    price(costs, pr, P, n_params, n_out, n1, n2, same, mode)
    if method != "auto":
        c = costs.get(method)
        if c is not None and not c["fits"]:
            raise WidthscopeError(
                f"ntk: method={method!r} needs about {c['bytes'] / 1e6:.4g} MB at its smallest chunks, more than "
                f"the {cost.SAFETY:.0%} of memory_budget={budget / 1e6:.4g} MB it plans within (the rest is "
                "the allocator's slack); raise memory_budget or let "
                "method='auto' pick one that fits"
            )
        return {"method": method, "reason": f"{method}: asked for", "costs": costs}
    best, reason = cost.choose(costs, budget)
    # a jvp is tried only when products would win (a fused TransformerEncoder kernel has no forward-mode AD)
    if best == "products" and not cached(model, x1, ("jvp", 1), lambda: forward_ad_ok(model, params, buffers, x1[:1])):
        costs.pop("products")
        best, reason = cost.choose(costs, budget)
        reason += "; products: no forward-mode AD through this model"
    if best is None:
        raise WidthscopeError(
            f"ntk: {reason}; raise memory_budget, or pass trace=True, diagonal=True or batch_size to need less"
        )
    return {"method": best, "reason": reason, "costs": costs}
