"""NTK ``method="auto"`` against every method: an MLP, a conv net, LLaMA, GPT-2 and a TransformerEncoder.

Per model the full kernel ``Θ(x, x)`` is timed for each method ``ntk`` offers (``structured``,
``jacobian``, ``products``) and for ``auto``, back to back and interleaved (the machine is shared:
``--reps`` rounds, the median per method), float32, one thread. ``ratio`` = auto / fastest measured
method; ``auto_choice`` and ``reason`` are what auto said (``info``). A method whose own estimate is
over ``--skip-factor`` × the best estimate is not run (recorded as skipped with its estimate), nor one
that fails (e.g. forward-mode AD through ``TransformerEncoder``'s fused kernel). Results go to
``benchmarks/results/ntk-auto-cpu.json`` (resumable per row); :func:`ratios` reads the per-round times.
Each row also times :func:`vmap_jacrev`, the plain ``torch.func`` reference, in the same rounds, and
records the load average at its start and end.

``--calibrate`` prints the cost-model constants measured on this machine (see
:mod:`widthscope.linear.cost`): seconds per FLOP of a 512² matmul, of vmapped reverse passes, and
seconds per vjp call.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/ntk_auto.py [--reps 3] [--calibrate]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
OUT = ROOT / "benchmarks" / "results" / "ntk-auto-cpu.json"
METHODS = ("structured", "jacobian", "products")


class Pooled(nn.Module):
    """A causal LM's logits mean-pooled over positions: one ``vocab``-sized output per sequence."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids).logits.mean(1)


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` (2 layers, 4 heads, no dropout) on 8 input features, mean-pooled, 10 outputs."""

    def __init__(self, d: int):
        super().__init__()
        self.inp = nn.Linear(8, d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.inp(x)).mean(1))


def _conv() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def models() -> dict[str, Any]:
    """name → (builder, inputs builder, description)."""
    from widthscope.models import build

    return {
        "mlp-256": (lambda: build("mlp", 256, in_dim=64, out_dim=10, depth=2), lambda: torch.randn(64, 64),
                    "widthscope mlp, 2×256 hidden, 64 inputs, 10 outputs, n=64"),
        "conv": (_conv, lambda: torch.randn(32, 3, 16, 16), "2 conv layers (16, 32 ch) + linear, 16×16×3, n=32"),
        "encoder-64": (lambda: Encoder(64), lambda: torch.randn(16, 16, 8),
                       "nn.TransformerEncoder d=64, 2 layers, 16 seqs × 16 positions, 10 outputs"),
        "encoder-128": (lambda: Encoder(128), lambda: torch.randn(16, 16, 8), "as encoder-64 at d=128"),
        "llama-64": (lambda: Pooled(build("llama", 64, depth=2, vocab_size=64)),
                     lambda: torch.randint(0, 64, (16, 16)),
                     "widthscope llama width 64, 2 layers, vocab 64, 16 seqs × 16 tokens, mean-pooled logits"),
        "llama-128": (lambda: Pooled(build("llama", 128, depth=2, vocab_size=64)),
                      lambda: torch.randint(0, 64, (16, 16)), "as llama-64 at width 128"),
        "encoder-256": (lambda: Encoder(256), lambda: torch.randn(16, 16, 8), "as encoder-64 at d=256"),
        "llama-256": (lambda: Pooled(build("llama", 256, depth=2, vocab_size=64)),
                      lambda: torch.randint(0, 64, (16, 16)), "as llama-64 at width 256"),
        "gpt2-256": (_gpt2, lambda: torch.randint(0, 64, (16, 16)),
                     "transformers GPT-2 width 256, 2 layers, 4 heads, vocab 64, tied input embedding and LM head, "
                     "16 seqs × 16 tokens, mean-pooled logits"),
    }


def _gpt2() -> nn.Module:
    import transformers

    cfg = transformers.GPT2Config(vocab_size=64, n_embd=256, n_layer=2, n_head=4, n_positions=16, resid_pdrop=0.0,
                                  bos_token_id=1, eos_token_id=1,
                                  embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    return Pooled(transformers.GPT2LMHeadModel(cfg))


def vmap_jacrev(model: nn.Module, x: torch.Tensor, budget: float = 8e9) -> torch.Tensor:
    """The plain ``torch.func`` reference: per-example Jacobians ``vmap(jacrev(f))`` and one einsum per
    parameter, ``Θ = Σ_p J_p(x) J_p(x)ᵀ`` (no symmetry exploited). All Jacobians at once when their
    ``n·o·P`` numbers fit ``budget`` bytes; else chunks of examples, a chunk pair's Jacobians recomputed."""
    from torch.func import functional_call, jacrev, vmap

    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}

    def f(p, xi):
        return functional_call(model, p, (xi[None],)).reshape(-1)

    def jac(xs):
        return vmap(jacrev(f), (None, 0))(params, xs)

    n, o = x.shape[0], model(x[:1]).shape[1]
    per = o * sum(v.numel() for v in params.values()) * next(iter(params.values())).element_size()
    c = max(1, min(n, int(budget // (2 * per))))
    K = torch.zeros(n, n, o, o, dtype=next(iter(params.values())).dtype)
    for i in range(0, n, c):
        Ji = jac(x[i:i + c])
        for j in range(i, n, c):
            Jj = Ji if j == i else jac(x[j:j + c])
            blk = sum(torch.einsum("iap,jbp->ijab", Ji[k].flatten(2), Jj[k].flatten(2)) for k in params)
            K[i:i + c, j:j + c] = blk
            if j != i:
                K[j:j + c, i:i + c] = blk.permute(1, 0, 3, 2)
    return K


def row(name: str, reps: int, skip_factor: float) -> dict[str, Any]:
    from widthscope.linear import ntk

    build, inputs, desc = models()[name]
    torch.manual_seed(0)
    model = build().eval()
    x = inputs()
    ntk(model, x[:2])  # one-time costs (dispatch, vmap set-up) are not compared
    info: dict = {}
    K_auto = ntk(model, x, info=info)
    est = {m: c["seconds"] for m, c in info["costs"].items() if c["fits"]}
    best_est = min(est.values())
    run = {"auto": lambda: ntk(model, x), "vmap_jacrev": lambda: vmap_jacrev(model, x)}
    vmap_jacrev(model, x[:2])  # warm-up; its kernel on x is compared with auto's in the first round
    out: dict[str, Any] = {"model": name, "description": desc, "params": sum(p.numel() for p in model.parameters()),
                           "loadavg_start": os.getloadavg(), "auto_choice": info["method"], "reason": info["reason"],
                           "estimated_s": est, "skipped": {}}
    for m in METHODS:
        if m not in est:
            out["skipped"][m] = "not applicable or over budget"
        elif est[m] > skip_factor * best_est:
            out["skipped"][m] = f"estimate {est[m]:.3g} s > {skip_factor:g} × best estimate {best_est:.3g} s"
        else:
            try:
                K = ntk(model, x[:2], method=m)  # warm-up, and a failing method is found here
                K = ntk(model, x, method=m)
                out.setdefault("max_rel_diff_vs_auto", {})[m] = float((K - K_auto).abs().max() / K_auto.abs().max())
                run[m] = (lambda m=m: ntk(model, x, method=m))
            except (RuntimeError, NotImplementedError) as exc:  # recorded in the row, not hidden
                out["skipped"][m] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    times: dict[str, list[float]] = {k: [] for k in run}
    order = list(run)
    for r in range(reps):  # interleaved rounds, the order rotated: load changes and warm caches hit all alike
        for k in order[r % len(order):] + order[:r % len(order)]:
            fn = run[k]
            t0 = time.perf_counter()
            K = fn()
            times[k].append(time.perf_counter() - t0)
            if k == "vmap_jacrev" and r == 0:
                out["max_rel_diff_vmap_jacrev_vs_auto"] = float((K - K_auto).abs().max() / K_auto.abs().max())
    med = {k: statistics.median(v) for k, v in times.items()}
    best = min((k for k in med if k in METHODS), key=med.get)
    out.update(seconds=med, all_seconds=times, fastest=best, loadavg_end=os.getloadavg(),
               **ratios(out | {"all_seconds": times}))
    return out


def ratios(r: dict[str, Any]) -> dict[str, float]:
    """Per round (same load), the time of auto's choice and of auto itself over the fastest method of that
    round; the medians over rounds. ``choice_ratio`` judges the choice, ``auto_ratio`` adds auto's overhead
    and the round-to-round noise of timing the same method twice."""
    t = r["all_seconds"]
    methods = [m for m in t if m in METHODS]
    rounds = range(len(t["auto"]))
    best = [min(t[m][i] for m in methods) for i in rounds]
    choice = r["auto_choice"]
    out = {"choice_ratio": statistics.median(t[choice][i] / best[i] for i in rounds) if choice in t else math.nan,
           "auto_ratio": statistics.median(t["auto"][i] / best[i] for i in rounds)}
    if "vmap_jacrev" in t and "structured" in t:  # the plain torch.func reference over structured, per round
        out["vmap_jacrev_over_structured"] = statistics.median(t["vmap_jacrev"][i] / t["structured"][i] for i in rounds)
    return out


def calibrate() -> dict[str, float]:
    from torch.func import functional_call, vjp

    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    for _ in range(3):
        a @ b
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    gemm = (time.perf_counter() - t0) / (20 * 2 * 512 ** 3)
    m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    p = dict(m.named_parameters())
    x = torch.randn(256, 64)
    flops = 2 * 256 * (64 * 256 + 256 * 256 + 2560)
    out, pull = vjp(lambda q: functional_call(m, q, (x,)), p)
    e = torch.ones_like(out)
    pull(e)
    t0 = time.perf_counter()
    for _ in range(20):
        pull(e)
    pass_s = (time.perf_counter() - t0) / (20 * 2 * flops)
    xs = x[:1]
    out, pull = vjp(lambda q: functional_call(m, q, (xs,)), p)
    t0 = time.perf_counter()
    for _ in range(50):
        pull(torch.ones_like(out))
    call_s = (time.perf_counter() - t0) / 50
    return {"GEMM_S": gemm, "PASS_S": pass_s, "CALL_S": call_s, **_calibrate_per_example()}


def _best(fn, reps: int = 5) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def _calibrate_per_example() -> dict[str, float]:
    """``OP_S``: seconds per dispatched operator of a one-example forward pass of a deep narrow MLP (width 8:
    no FLOPs to speak of). ``PE_PASS_S``, ``PE_WRITE_S``: per FLOP and per Jacobian number of the per-example
    route's ``vmap(jacrev)``, solved from two models with the same ``P`` and different FLOPs per ``P`` (an MLP,
    and the same layers applied at 16 positions), their operator overheads taken off."""
    from torch.func import functional_call, jacrev, vmap

    from widthscope.linear.cost import measure

    deep = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(24)])
    p = dict(deep.named_parameters())
    x1 = torch.randn(1, 8)
    ops = measure(lambda z: functional_call(deep, p, (z,)), x1, p).ops
    op_s = _best(lambda: functional_call(deep, p, (x1,)), 20) / ops

    class Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.tanh(self.b(torch.tanh(self.a(x))))).reshape(x.shape[0], -1, 10).mean(1)

    rows = []
    for T in (1, 16):
        m = Seq()
        q = dict(m.named_parameters())
        x = torch.randn(32, T, 64)
        pr = measure(lambda z, m=m, q=q: functional_call(m, q, (z,)), x[:1], q)

        def f(q, xi, m=m):
            return functional_call(m, q, (xi[None],))[0]

        t = _best(lambda f=f, q=q, x=x: vmap(jacrev(f), in_dims=(None, 0))(q, x), 3)
        P = sum(v.numel() for v in q.values())
        n, O = x.shape[0], 10
        rows.append(((n + 2 * n * O) * pr.flops, n * O * P, t - 3 * pr.ops * op_s))
    (f1, w1, t1), (f2, w2, t2) = rows
    det = f1 * w2 - f2 * w1
    pe_pass = (t1 * w2 - t2 * w1) / det
    pe_write = (f1 * t2 - f2 * t1) / det
    return {"OP_S": op_s, "PE_PASS_S": pe_pass, "PE_WRITE_S": pe_write}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-factor", type=float, default=20.0)
    ap.add_argument("--rows", default=",".join(models()), help="comma-separated model names")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.calibrate:
        print(json.dumps(calibrate()))
        return 0
    from widthscope._io import atomic_write_json

    path = Path(args.out)
    res = json.loads(path.read_text()) if path.exists() else {}
    for name in args.rows.split(","):
        if name in res:
            continue
        res[name] = row(name, args.reps, args.skip_factor)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, res)
        r = res[name]
        print(f"{name}: auto={r['auto_choice']} {ratios(r)} {r['seconds']}", file=sys.stderr, flush=True)
    print(section(path))
    return 0


def section(path: Path = OUT) -> str:
    """Markdown for ``docs/benchmarks.md`` from the recorded rows."""
    if not path.exists():
        return ""
    res = json.loads(path.read_text())
    lines = ["## NTK `auto` against every method (separate run)", "",
             "`OMP_NUM_THREADS=1 python benchmarks/ntk_auto.py`: full kernel `Θ(x, x)`, float32, one thread, each "
             "method and `auto` timed back to back in interleaved rounds (median of the rounds; the machine is "
             "shared and loaded, so only the ratios within a row mean much). Ratios: a time over the fastest "
             "method's time in the same round, median over rounds; `choice` = the method auto picked, `auto` = the auto "
             "call itself (its probe and estimates, plus the noise of timing the same method twice on a loaded "
             "machine). Skipped: a method whose estimate is over 20× the best estimate, or that fails. "
             "`vmap_jacrev` is the plain `torch.func` reference timed in the same rounds (per-example "
             "`vmap(jacrev(f))` Jacobians and one einsum per parameter; not an `ntk` method, so not a candidate "
             "for fastest); `speed-up` = its time over structured's, per round, median. Load: the 1-minute "
             "load average at the row's start and end (2 cores, shared).", "",
             "| model | params | auto picks | structured s | jacobian s | products s | auto s | fastest | choice ratio "
             "| auto ratio | vmap_jacrev s | speed-up | load |", "|" + "---|" * 13]
    for name, r in res.items():
        cell = lambda m: f"{r['seconds'][m]:.3g}" if m in r["seconds"] else "skipped"  # noqa: E731
        q = ratios(r)
        sp = f"{q['vmap_jacrev_over_structured']:.2f}" if "vmap_jacrev_over_structured" in q else "–"
        load = (f"{r['loadavg_start'][0]:.1f}–{r['loadavg_end'][0]:.1f}" if "loadavg_start" in r else "–")
        lines.append(f"| {name} | {r['params']} | {r['auto_choice']} | {cell('structured')} | {cell('jacobian')} | "
                     f"{cell('products')} | {r['seconds']['auto']:.3g} | {r['fastest']} | {q['choice_ratio']:.2f} | "
                     f"{q['auto_ratio']:.2f} | {cell('vmap_jacrev')} | {sp} | {load} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
