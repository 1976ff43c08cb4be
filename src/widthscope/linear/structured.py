r"""Structured empirical NTK: the kernel from Grams, never a Jacobian (plus a generic remainder).

A layer ``z = m · a Wᵀ + b`` at positions ``t`` contributes ``m² Σ_{t,s} (δ_{o,t}·δ'_{o',s})(a_t·a'_s)
+ (Σ_t δ_{o,t})·(Σ_s δ'_{o',s})``; one batched backward gives every ``δ_o``. Parameters no rule covers
(:func:`plan`'s ``generic``) go through the Jacobian route. Maths: docs/linearization.md.

Example::

    >>> import torch
    >>> from widthscope.linear import ntk, structured_ntk
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2)).double()
    >>> x = torch.randn(5, 3, dtype=torch.float64)
    >>> bool(torch.allclose(structured_ntk(net, x), ntk(net, x, method="jacobian")))
    True
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from ..errors import WidthscopeError
from ._core import out_tensor, params_and_buffers
from .checks import batchnorm_coupling
from .cost import SAFETY
from .gram import hadamard, mirror_upper, positions, tied_gradients
from .rules import LinearTaps, bag_gram, bag_input, elementwise_layout, mha_records, mha_taps, records, rule, tied_use

__all__ = ["uncovered", "plan", "Plan", "structured_kernel"]


@dataclass
class Plan:
    """``entries`` (name, module, rule, covered attrs, layout) on the structured path, ``generic`` parameter
    names on the Jacobian path, ``tied`` (per shared weight, its entries' indices) and the cost model's sizes."""

    entries: list[tuple[str, nn.Module, str, set, str | None]] = field(default_factory=list)
    generic: list[str] = field(default_factory=list)
    n_covered: int = 0
    n_generic: int = 0
    signal_numel: int = 0  # Σ over entries of one example's output numel: δ memory = out·n·this numbers
    shapes: list[tuple[str, int, int, int]] = field(default_factory=list)  # (rule, T, D_a, D_δ) for the cost model
    tied: list[list[int]] = field(default_factory=list)  # per tied weight, the entries (indices) that use it


def first_input(args: tuple, kwargs: dict) -> Any:
    if args:
        return args[0]
    return next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)


def _entry_input(r: str, m: nn.Module, args: tuple, kwargs: dict) -> Any:
    """What :func:`~widthscope.linear.rules.records` reads of a call: the first input tensor (detached), or an
    EmbeddingBag's padded ``(ids, coefficients)``."""
    if r == "embedding_bag":
        assert isinstance(m, nn.EmbeddingBag)  # rule(): exactly this type
        return bag_input(m, args, kwargs)
    x = first_input(args, kwargs)
    if not isinstance(x, torch.Tensor):
        return x
    # elementwise records recompute the module from x: a copy, safe from later in-place writes
    return x.detach().clone() if r == "elementwise" else x.detach()


def _rows(inp: Any) -> int | None:
    """Leading (batch) size of a captured input, ``None`` when it has none."""
    t = inp[0] if isinstance(inp, tuple) else inp
    return t.shape[0] if isinstance(t, torch.Tensor) and t.dim() >= 1 else None


def _use_counts(root: torch.Tensor) -> dict[int, int]:
    """Per parameter (by id), how many graph nodes consume it: 1 for a weight used once."""
    counts: dict[int, int] = {}
    seen, stack = set(), [root.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            var = getattr(nxt, "variable", None)
            if var is not None:
                counts[id(var)] = counts.get(id(var), 0) + 1
            elif nxt not in seen:
                stack.append(nxt)
    return counts


def _forward_hooked(model: nn.Module, x: torch.Tensor, hooks: list, taps: dict | None = None) -> torch.Tensor:
    """``model(x)``'s output tensor with grad enabled and forward hooks ``(module, fn)`` in place for this call;
    ``taps``: module → list that collects its ``F.linear`` calls (:class:`~widthscope.linear.rules.LinearTaps`)."""
    handles = [m.register_forward_hook(fn, with_kwargs=True) for m, fn in hooks]
    wrapped = []
    for m, calls in (taps or {}).items():
        wrapped.append((m, m.__dict__.get("forward")))
        m.forward = _tapped(m.forward, calls)
    try:
        with torch.enable_grad():
            return out_tensor(model(x))
    finally:
        for h in handles:
            h.remove()
        for m, prev in wrapped:
            del m.forward
            if prev is not None:
                m.forward = prev


def _tapped(forward, calls: list):
    def run(*args, **kwargs):
        with LinearTaps(calls):
            return forward(*args, **kwargs)

    return run


def plan(model: nn.Module, x: torch.Tensor) -> Plan:
    """Split the trainable parameters into the structured and the generic path, from one probe pass on ``x[:2]``."""
    coupled = batchnorm_coupling(model)
    if coupled is not None:
        raise WidthscopeError(
            f"ntk: {coupled}. The structured kernel assumes each output depends on its own "
            "example only, which does not hold"
        )
    cands = [
        (n, m, r)
        for n, m in model.named_modules()
        if (r := rule(m)) is not None and any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    owners = {k: len(v) for k, v in _owner_rules(model).items()}
    probe = x[:2]
    seen: dict[str, list] = {}

    def hook(name, r):
        def f(_m, args, kwargs, out):
            z = out.detach().clone() if isinstance(out, torch.Tensor) else out  # before later in-place ops
            seen.setdefault(name, []).append((_entry_input(r, _m, args, kwargs), z))

        return f

    mha: dict[nn.Module, list] = {m: [] for _, m, r in cands if r == "mha"}
    out = _forward_hooked(model, probe, [(m, hook(n, r)) for n, m, r in cands], mha)
    uses = _use_counts(out) if out.grad_fn is not None else {}
    bcast = _broadcast_embeddings(model, probe, out, cands, seen)
    P = Plan()
    covered_ids: set[int] = set()
    tied_uses: dict[int, tuple[nn.Parameter, list[int]]] = {}
    B = probe.shape[0]
    for name, m, r in cands:
        calls = seen.get(name, [])
        if len(calls) != 1:
            continue
        if r == "mha":
            _plan_mha(P, name, m, mha_taps(m, mha[m], B), uses, owners, covered_ids)
            continue
        inp, z = calls[0]
        layout = None
        if name in bcast:  # one lookup for the whole batch (GPT-2's position ids): per example from here
            inp, z, layout = inp.expand(B, *inp.shape[1:]), z.expand(B, *z.shape[1:]), "broadcast"
        if not (_rows(inp) == B and isinstance(z, torch.Tensor) and z.dim() >= 1 and z.shape[0] == B):
            continue
        if r == "elementwise":
            layout = elementwise_layout(m, inp, z)
            if layout is None:
                continue
        if r in ("conv", "conv_transpose") and inp.dim() != m.weight.dim():
            continue  # unbatched conv input
        attrs, tied = set(), []
        for k, p in m.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            # a dense layer or embedding always uses its parameters: the one use is this module's even when
            # a container registers the parameter too (BERT's cls.predictions.bias is its decoder's bias)
            if uses.get(id(p), 0) == 1 and (owners.get(id(p), 0) == 1 or r in ("dense", "embedding")):
                attrs.add(k)
                covered_ids.add(id(p))
            elif k == "weight" and r in ("dense", "embedding") and uses.get(id(p), 0) == owners.get(id(p), 0) > 1:
                tied.append(p)  # one use per owning module: covered if every owner is an entry (below)
        if attrs or tied:
            for p in tied:
                tied_uses.setdefault(id(p), (p, []))[1].append(len(P.entries))
            P.entries.append((name, m, r, attrs, layout))
            P.signal_numel += z[0].numel()
            if attrs:
                P.shapes.append(_entry_shape(r, m, inp, z))
                if r == "conv_transpose":  # its records hold the signal's windows (T·D_δ per example), not δ
                    P.signal_numel += math.prod(P.shapes[-1][1::2])
    for p, idx in tied_uses.values():
        if len(idx) == owners[id(p)]:  # every use is a covered module's, run once on per-example inputs
            P.tied.append(idx)
            covered_ids.add(id(p))
            P.shapes.append(("tied", 1, 0, p.numel()))
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    P.generic = [n for n, p in trainable if id(p) not in covered_ids]
    P.n_covered = sum(p.numel() for _, p in trainable if id(p) in covered_ids)
    P.n_generic = sum(p.numel() for _, p in trainable if id(p) not in covered_ids)
    return P


def _broadcast_embeddings(
    model: nn.Module, probe: torch.Tensor, out: torch.Tensor, cands: list, seen: dict
) -> set[str]:
    """Names of the embeddings looked up once for the whole batch (GPT-2's positions) whose output, expanded to
    one copy per example, gives the same model output: per example from there."""
    B = probe.shape[0]
    names = {
        n: m
        for n, m, r in cands
        if r == "embedding"
        and len(seen.get(n, [])) == 1
        and B > 1
        and all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == 1 for t in seen[n][0])
    }
    if not names:
        return set()

    def expand(_m, args, kwargs, z):
        return z.expand(B, *z.shape[1:]).clone()

    try:
        again = _forward_hooked(model, probe, [(m, expand) for m in names.values()])
    except (RuntimeError, ValueError, IndexError):
        return set()
    tol = 1e-12 if out.dtype == torch.float64 else 1e-5
    again, out = again.detach(), out.detach()
    same = again.shape == out.shape and bool(torch.allclose(again, out, rtol=tol, atol=tol * float(out.abs().max())))
    return set(names) if same else set()


def _plan_mha(P: Plan, name: str, m: nn.Module, taps: list | None, uses: dict, owners: dict, covered: set) -> None:
    """An ``nn.MultiheadAttention`` entry: the parameters its ``F.linear`` calls (``taps``) use exactly once."""
    if not taps:
        return
    params = dict(m.named_parameters())
    tapped = {k for kw, kb, _, _ in taps for k in (kw, kb) if k is not None}
    attrs = {
        k
        for k in tapped
        if params[k].requires_grad and uses.get(id(params[k]), 0) == 1 and owners.get(id(params[k]), 0) == 1
    }
    if not attrs:
        return
    covered.update(id(params[k]) for k in attrs)
    P.entries.append((name, m, "mha", attrs, None))
    for _, _, a, z in taps:
        P.signal_numel += z.numel() // a.shape[0]
        P.shapes.append(("dense", a.shape[1], a.shape[2], z.shape[-1]))


def _entry_shape(r: str, m: Any, inp: torch.Tensor, z: torch.Tensor) -> tuple[str, int, int, int]:
    """(rule, positions T, input width D_a, signal width D_δ) of one example, for :mod:`.cost`."""
    if r == "conv":
        k = math.prod(m.kernel_size) * m.in_channels // m.groups
        return r, z[0].numel() // m.out_channels, k, m.out_channels
    if r == "embedding":
        return r, inp[0].numel(), min(m.num_embeddings, 2 * inp[0].numel()), m.embedding_dim
    if r == "conv_transpose":  # positions: input locations; D_δ: the signal window C_out/groups · K, all groups
        return r, inp[0, 0].numel(), m.in_channels // m.groups, m.out_channels * math.prod(m.kernel_size)
    if r == "embedding_bag":  # one position; D_a: the bag histograms over the ids both batches share
        return r, 1, min(m.num_embeddings, 2 * inp[0].shape[1]), m.embedding_dim
    if r == "prelu":
        return r, 1, 0, m.num_parameters
    if r == "elementwise":
        return r, 1, 0, sum(p.numel() for p in m.parameters(recurse=False))
    da = inp.shape[-1] if inp.dim() > 1 else 1
    return r, max(1, inp[0].numel() // max(1, da)), da, z.shape[-1] if z.dim() > 1 else 1


def _owner_rules(model: nn.Module) -> dict[int, list[str | None]]:
    """Per parameter (by id), the :func:`~widthscope.linear.rules.rule` of each module that registers it."""
    out: dict[int, list[str | None]] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        r = rule(m)
        for p in m.parameters(recurse=False):
            out.setdefault(id(p), []).append(r)
    return out


def uncovered(model: nn.Module, x: torch.Tensor | None = None) -> list[str]:
    """Trainable parameters the structured kernel leaves to the generic path: :func:`plan`'s with inputs ``x``;
    without, those of modules no rule covers, or shared by modules none of which is dense or an embedding."""
    if x is not None:
        return plan(model, x).generic
    owners = _owner_rules(model)

    def covered(rs: list) -> bool:
        return rs != [None] if len(rs) == 1 else any(r in ("dense", "embedding") for r in rs)

    return [n for n, p in model.named_parameters() if p.requires_grad and not covered(owners[id(p)])]


def capture_records(model: nn.Module, P: Plan, X: torch.Tensor, o_chunk: int = 64) -> list[tuple]:
    """One forward and one (batched) backward pass: every entry's records for the batch ``X``."""
    store: dict[str, Any] = {}

    def hook(name, r, layout):
        def f(_m, args, kwargs, out):
            if name in store:
                raise WidthscopeError(
                    f"structured NTK: module {name!r} ran twice on these inputs but once on "
                    "the probe (input-dependent control flow); use method='jacobian'"
                )
            if r == "mha":  # an attention module: its F.linear calls are the taps
                store[name] = None
                return None
            x = _entry_input(r, _m, args, kwargs)
            if layout == "broadcast":
                x, out = x.expand(N, *x.shape[1:]), out.expand(N, *out.shape[1:]).clone()
            store[name] = (x, out)
            return out.clone()  # later in-place ops must not touch the z that δ is taken at

        return f

    N = X.shape[0]
    mha: dict[nn.Module, list] = {m: [] for _, m, r, *_ in P.entries if r == "mha"}
    out = _forward_hooked(model, X, [(m, hook(n, r, lay)) for n, m, r, _, lay in P.entries], mha)
    N = out.shape[0]
    zs, owner = [], []  # every tensor δ is taken at, and its entry's index
    for i, (nm, m, r, *_) in enumerate(P.entries):
        if r == "mha" and nm in store:
            assert isinstance(m, nn.MultiheadAttention)  # rule(): exactly this type
            store[nm] = mha_taps(m, mha[m], N)
        got = store.get(nm)
        if got is None or (r != "mha" and (got[1].shape[0] != N or _rows(got[0]) != N)):
            raise WidthscopeError(
                f"structured NTK: module {nm!r} did not run once on per-example inputs for "
                f"this batch of {N}; use method='jacobian'"
            )
        for z in [t[3] for t in got] if r == "mha" else [got[1]]:
            zs.append(z)
            owner.append(i)
    ds = _signals(out, zs, o_chunk)
    recs: list[tuple] = []
    uses: dict[int, tuple] = {}
    tied = {i for idx in P.tied for i in idx}
    for i, (nm, m, r, attrs, layout) in enumerate(P.entries):
        d = [dk for dk, k in zip(ds, owner) if k == i]
        recs.extend(
            mha_records(store[nm], d, attrs) if r == "mha" else records(r, m, store[nm][0], d[0], attrs, layout)
        )
        if i in tied:
            uses[i] = tied_use(r, m, store[nm][0], d[0])
    recs.extend(("tied", [uses[i] for i in idx], P.entries[idx[0]][1].weight.shape) for idx in P.tied)
    return recs


def _signals(out: torch.Tensor, zs: list[torch.Tensor], o_chunk: int) -> list[torch.Tensor]:
    """``δ = ∂out_o/∂z`` ``(o, *z.shape)`` for every ``z`` in ``zs``, by batched backward passes over chunks of
    ``o_chunk`` outputs (zeros where ``z`` does not reach the output)."""
    N, O = out.shape
    live = [i for i, z in enumerate(zs) if z.requires_grad]
    deltas: list[list[torch.Tensor]] = [[] for _ in zs]
    for o0 in range(0, O, o_chunk):
        oc = min(o_chunk, O - o0)
        E = torch.zeros(oc, N, O, dtype=out.dtype, device=out.device)
        E[torch.arange(oc), :, o0 + torch.arange(oc)] = 1.0
        last = o0 + oc >= O
        grads: Sequence[torch.Tensor | None]  # None where z does not reach the output (allow_unused)
        try:
            with warnings.catch_warnings():  # ops without a batching rule fall back to a loop: fine
                warnings.filterwarnings("ignore", message="There is a performance drop")
                grads = torch.autograd.grad(
                    out,
                    [zs[i] for i in live],
                    grad_outputs=E,
                    is_grads_batched=True,
                    retain_graph=not last,
                    allow_unused=True,
                )
        except RuntimeError:  # an op without a batching rule: one backward per output component
            cols = [
                torch.autograd.grad(out, [zs[i] for i in live], grad_outputs=E[k], retain_graph=True, allow_unused=True)
                for k in range(oc)
            ]
            grads = [None if cols[0][li] is None else torch.stack([c[li] for c in cols]) for li in range(len(live))]
        for li, g in zip(live, grads):
            deltas[li].append(
                torch.zeros((oc,) + tuple(zs[li].shape), dtype=out.dtype, device=out.device)
                if g is None
                else g.detach()
            )
    return [
        (D[0] if len(D) == 1 else torch.cat(D))
        if D
        else torch.zeros((O,) + tuple(z.shape), dtype=z.dtype, device=z.device)
        for D, z in zip(deltas, zs)
    ]


def _combine(acc: torch.Tensor, r1: list[tuple], r2: list[tuple], mode: str, same: bool) -> None:
    diag = mode.startswith("diag")
    for a, b in zip(r1, r2):
        if a[0] == "tied":  # Σ of every use's per-example gradient, then the product (in row chunks)
            O, n = a[1][0][2].shape[:2]
            step = max(1, 2**24 // max(1, O * max(n, b[1][0][2].shape[1]) * math.prod(a[2][1:])))
            gs = tied_gradients(a[1], a[2], step)
            for g1, g2 in ((g, g) for g in gs) if same else zip(gs, tied_gradients(b[1], b[2], step)):
                hadamard(acc, g1, g2, None, mode, same=same)
        elif a[0] == "vector":
            hadamard(acc, a[1], b[1], None, mode, same=same)
        elif a[0] == "bag":
            hadamard(acc, a[3], b[3], bag_gram(a, b, diag), mode, same=same)
        elif a[0] == "embed":
            ids1, d1, ids2, d2 = a[1], a[2], b[1], b[2]
            uniq, inv = torch.unique(torch.cat([ids1.reshape(-1), ids2.reshape(-1)]), return_inverse=True)
            oh = nn.functional.one_hot(inv, len(uniq)).to(d1.dtype)
            A1 = oh[: ids1.numel()].view(ids1.shape[0], ids1.shape[1], -1)
            A2 = A1 if same else oh[ids1.numel() :].view(ids2.shape[0], ids2.shape[1], -1)
            positions(acc, A1, d1, A2, d2, 1.0, mode, same=same)
        else:
            _, a1, d1, s, w_on, b_on = a
            a2, d2 = b[1], b[2]
            if d1.shape[2] == 1 and d2.shape[2] == 1:  # one position: weight and bias share δδ'ᵀ
                if w_on:
                    W = s * ((a1[:, 0] * a2[:, 0]).sum(-1) if diag else a1[:, 0] @ a2[:, 0].T)
                    W = W + 1.0 if b_on else W
                else:
                    W = None
                hadamard(acc, d1[:, :, 0], d2[:, :, 0], W, mode, same=same)
                continue
            if w_on:
                positions(acc, a1, d1, a2, d2, s, mode, same=same)
            if b_on:
                s1 = d1.sum(2)
                hadamard(acc, s1, s1 if same else d2.sum(2), None, mode, same=same)


def _blocks(n: int, b: int | None) -> list[slice]:
    b = n if b is None else b
    return [slice(i, min(i + b, n)) for i in range(0, n, b)]


def structured_kernel(
    model: nn.Module, x1, x2, P: Plan, trace: bool, diagonal: bool, batch_size, dtype, memory_budget: float, est
) -> torch.Tensor:
    """The Gram part of :func:`widthscope.linear.structured_ntk` for the plan ``P``; ``est``: the cost model's
    estimate (block size, and bytes: blocks are kept for reuse in the rest of the budget)."""
    acc_dtype = dtype or next(iter(params_and_buffers(model)[0].values())).dtype
    same = x2 is None
    x2 = x1 if x2 is None else x2
    batch_size = batch_size or est.get("batch_size")
    mode = ("diagtrace" if trace else "diag") if diagonal else ("trace" if trace else "full")
    n1, n2 = x1.shape[0], x2.shape[0]
    b1, b2 = _blocks(n1, batch_size), _blocks(n2, batch_size)
    with torch.no_grad():
        O = out_tensor(model(x1[:1])).shape[1]
    shape = {"full": (n1, n2, O, O), "trace": (n1, n2), "diag": (n1, O, O), "diagtrace": (n1,)}[mode]
    K = torch.zeros(shape, dtype=acc_dtype, device=x1.device)
    cache: dict[tuple[int, int], tuple[list[tuple], int]] = {}
    room = [max(0.0, SAFETY * float(memory_budget) - est.get("bytes", 0.0))]  # the cost model's rest, for reuse

    def get(which: int, idx: int, s: slice) -> list[tuple]:
        """Records of a block; kept for reuse (x2's blocks, or x1's when x2 is None) while they fit."""
        if (which, idx) in cache:
            return cache[(which, idx)][0]
        recs = capture_records(model, P, (x1 if which == 1 else x2)[s]) if P.entries else []
        size = sum(t.numel() * t.element_size() for rec in recs for t in rec if isinstance(t, torch.Tensor))
        reused = (which == 2 and len(b1) > 1) or (which == 1 and same and len(b1) > 1)
        if reused and size <= room[0]:
            room[0] -= size
            cache[(which, idx)] = (recs, size)
        return recs

    for bi, s1 in enumerate(b1):
        r1 = get(1, bi, s1)
        m1 = s1.stop - s1.start
        if diagonal:
            acc = torch.zeros((m1, O, O) if mode == "diag" else (m1,), dtype=acc_dtype, device=x1.device)
            _combine(acc, r1, r1, mode, True)
            K[s1] = acc
            continue
        for bj, s2 in enumerate(b2):
            if same and bj < bi:
                continue
            r2 = r1 if same and bj == bi else get(1 if same else 2, bj, s2)
            m2 = s2.stop - s2.start
            acc = torch.zeros((O, m1, O, m2) if mode == "full" else (m1, m2), dtype=acc_dtype, device=x1.device)
            _combine(acc, r1, r2, mode, same and bj == bi)
            if mode == "full" and same and bj == bi:
                mirror_upper(acc)
            blk = acc.permute(1, 3, 0, 2) if mode == "full" else acc
            K[s1, s2] = blk
            if same and bj != bi:
                K[s2, s1] = blk.permute(1, 0, 3, 2) if mode == "full" else blk.T
        room[0] += cache.pop((1, bi), ([], 0))[1]  # x1's block bi is not needed again
    if trace:
        K /= O
    return K.detach()
