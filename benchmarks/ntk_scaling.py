"""Empirical NTK at scale: the structured kernel against torch.func references, time and peak memory.

Not part of ``run_all.py`` (the references take minutes); run_all lists the recorded results.
widthscope ``mlp`` (NTK parametrisation, ReLU, 2 hidden layers of width N, 64 inputs, 10
outputs, float32, one thread), the full kernel ``Θ(x, x)`` of shape ``(n, n, 10, 10)`` for
widths 256–4096 and n = 64–1024. Each measurement runs in a fresh process; its peak memory is
Linux ``VmHWM`` during the call (reset after the model and inputs are built), minus ``VmRSS``
before the call. Methods:

* ``structured``: :func:`widthscope.linear.ntk` ``method="structured"`` (layer Grams, no Jacobian);
* ``jacrev``: ``torch.func.jacrev`` of the batch output, chunked, contracted block by block
  (widthscope's ``method="jacobian"``);
* ``vmap_jacrev``: per-example ``torch.func.vmap(jacrev(f))`` in chunks, the Jacobian rows
  flattened into one ``(n·o, P)`` matrix product per chunk pair;
* ``ntk_vp``: NTK-vector products, one ``vjp`` and one ``jvp`` per kernel column
  (widthscope's ``method="products"``);
* ``floor``: what a structured implementation cannot avoid, on the same shapes: one batched
  backward pass over all outputs (``is_grads_batched``, ``backward_s``) plus the per-layer Gram
  products ``(n·o × N_out)(N_out × n·o)`` and ``(n × N_in)(N_in × n)`` as plain matmuls on the real
  signals (``gram_s``). The Gram FLOPs are ``Σ_l 2 (n·o)² N_out,l + 2 n² N_in,l`` (``gram_gflop``).

References run only where the time predicted from a smaller measured size (``n²`` for the
contractions, ``n`` for ``ntk_vp`` column count × batch) stays under ``--cap`` seconds; the others
are recorded as skipped with the prediction. Results go to ``benchmarks/results/ntk-scaling-cpu.json``
(one key per method and size, resumable).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/ntk_scaling.py [--cap 400] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import proc_status  # noqa: E402  (VmRSS / VmHWM of this process)
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "ntk-scaling-cpu.json"  # --out changes it
METHODS = ("structured", "floor", "vmap_jacrev", "jacrev", "ntk_vp")
WIDTHS, NS = (256, 1024, 4096), (64, 256, 1024)


def _vmap_jacrev(model, x, chunk: int):
    import torch
    from torch.func import functional_call, jacrev, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, xi):
        return functional_call(model, p, (xi[None],)).reshape(-1)

    def rows(xs):  # (c·o, P) Jacobian rows of a chunk
        J = vmap(jacrev(f), (None, 0))(params, xs)
        return torch.cat([J[k].flatten(2) for k in params], dim=2).flatten(0, 1)

    n, o = x.shape[0], model(x[:1]).shape[1]
    K = torch.empty(n * o, n * o, dtype=next(model.parameters()).dtype)
    blocks = [(i, rows(x[i:i + chunk])) for i in range(0, n, chunk)] if n <= chunk else None
    for i in range(0, n, chunk):
        Ji = blocks[0][1] if blocks else rows(x[i:i + chunk])
        for j in range(0, n, chunk):
            Jj = Ji if i == j else rows(x[j:j + chunk])
            K[i * o:(i + chunk) * o, j * o:(j + chunk) * o] = Ji @ Jj.T
    return K.reshape(n, o, n, o).permute(0, 2, 1, 3)


def _floor(model, x):
    """The per-layer Gram products alone, as plain matmuls on the real layer inputs and signals.

    Returns the Gram products as a callable the worker times, and the seconds of the one batched
    backward over all outputs that produced the signals (the other unavoidable part)."""
    import torch

    layers = [m for m in model.modules() if type(m).__name__ in ("Linear", "ScaledLinear")]
    ins: list = []
    outs: list = []

    def keep(_m, i, o) -> None:
        ins.append(i[0])
        outs.append(o)

    hs = [m.register_forward_hook(keep) for m in layers]
    with torch.enable_grad():
        y = model(x)
    for h in hs:
        h.remove()
    n, o = y.shape
    eye = torch.eye(o)[:, None, :].expand(o, n, o)  # output k: e_k at every example
    t0 = time.perf_counter()
    deltas = torch.autograd.grad(y, outs, eye, is_grads_batched=True)
    backward_s = time.perf_counter() - t0
    pairs = [(a.detach(), d.permute(1, 0, 2).reshape(n * o, -1).contiguous()) for a, d in zip(ins, deltas)]

    def grams() -> None:
        for a, D in pairs:
            _ = D @ D.T
            _ = a @ a.T
    return grams, backward_s


def _gram_gflop(model, n: int, o: int = 10) -> float:
    f = 0.0
    for m in model.modules():
        if type(m).__name__ in ("Linear", "ScaledLinear"):
            f += 2 * (n * o) ** 2 * m.weight.shape[0] + 2 * n ** 2 * m.weight.shape[1]
    return f / 1e9


def worker(method: str, width: int, n: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from widthscope.linear import ntk
    from widthscope.models import build

    torch.manual_seed(0)
    model = build("mlp", width, in_dim=64, out_dim=10, depth=2, parametrization="ntk").eval()
    x = torch.randn(n, 64)
    budget = 4e9  # bytes of Jacobian rows per chunk for the reference methods
    P = sum(p.numel() for p in model.parameters())
    chunk = max(1, int(budget // (2 * 10 * P * 4)))
    fn = {"structured": lambda x: ntk(model, x, method="structured"),
          "floor": lambda x: _floor(model, x),  # returns the timed Gram products
          "vmap_jacrev": lambda x: _vmap_jacrev(model, x, chunk),
          "jacrev": lambda x: ntk(model, x, method="jacobian", chunk_size=chunk),
          "ntk_vp": lambda x: ntk(model, x, method="products")}[method]
    fn(x[:2])  # one-time costs (dispatch, vmap set-up) are not what is compared
    backward_s = None
    if method == "floor":
        grams, backward_s = _floor(model, x)
        fn = lambda _x: grams()  # noqa: E731
    rss0 = proc_status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    t0 = time.perf_counter()
    K = fn(x)
    s = time.perf_counter() - t0
    if backward_s is not None:  # floor = Gram products + the batched backward, timed apart
        s, row_extra = s + backward_s, {"gram_s": s, "backward_s": backward_s}
    else:
        row_extra = {}
    row = {"method": method, "width": width, "n": n, "params": P, "seconds": s, **row_extra,
           "peak_MB": (proc_status("VmHWM") - rss0) / 2 ** 20, "gram_gflop": _gram_gflop(model, n)}
    if K is not None and method != "structured" and n <= 256:
        R = ntk(model, x, method="structured")
        row["max_rel_err_vs_structured"] = float((K - R).abs().max() / R.abs().max())
    return row


JACOBIAN_SKIP = ("Jacobian rows need {gb:.0f} GB (n·o·P floats); in 4 GB chunks of 2 examples every chunk "
                 "pair is recomputed, and a first run had not finished after 14 min")


def _params(width: int) -> int:
    return 64 * width + width + width * width + width + width * 10 + 10


def _load() -> dict[str, Any]:
    return json.loads(OUT.read_text()) if OUT.exists() else {}


def _save(res: dict[str, Any]) -> None:
    from widthscope._io import atomic_write_json

    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_json(OUT, res)


def _predict(res: dict[str, Any], method: str, width: int, n: int) -> float | None:
    """Seconds predicted from the largest measured smaller n at this width (n² or n·n columns)."""
    done = [r for r in res.values() if r.get("method") == method and r["width"] == width
            and "seconds" in r and r["n"] < n]
    if done:
        r = max(done, key=lambda r: r["n"])
        return r["seconds"] * (n / r["n"]) ** 2
    narrower = [r for r in res.values() if r.get("method") == method and r["n"] == n and "seconds" in r
                and r["width"] < width]
    if narrower:  # same n at a narrower width: time ∝ parameters
        r = max(narrower, key=lambda r: r["width"])
        return r["seconds"] * _params(width) / _params(r["width"])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=float, default=400.0, help="skip a reference predicted to take longer (s)")
    ap.add_argument("--quick", action="store_true", help="width 256, n = 64 only")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/ntk-scaling-cpu.json)")
    ap.add_argument("--worker", nargs=3, metavar=("METHOD", "WIDTH", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        m, w, n = args.worker
        print(json.dumps(worker(m, int(w), int(n))))
        return 0
    global OUT
    if args.out:
        OUT = Path(args.out)
    res = _load()
    sizes = [(256, 64)] if args.quick else [(w, n) for w in WIDTHS for n in NS]
    for w, n in sizes:
        for method in METHODS:
            key = f"{method}/{w}/{n}"
            if key in res:
                continue
            if method in ("vmap_jacrev", "jacrev") and w >= 4096:
                res[key] = {"method": method, "width": w, "n": n, "skipped": JACOBIAN_SKIP.format(
                    gb=n * 10 * _params(w) * 4 / 1e9)}
                _save(res)
                continue
            pred = None if method in ("structured", "floor") else _predict(res, method, w, n)
            if method not in ("structured", "floor") and pred is None and (n > 64 or w > WIDTHS[0]):
                res[key] = {"method": method, "width": w, "n": n, "skipped": "no smaller measured size"}
                _save(res)
                continue
            if pred is not None and pred > args.cap:
                res[key] = {"method": method, "width": w, "n": n, "skipped": f"predicted {pred:.0f} s > cap",
                            "predicted_s": pred}
                _save(res)
                print(f"{key}: skipped (predicted {pred:.0f} s)", file=sys.stderr)
                continue
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, __file__, "--worker", method, str(w), str(n)],
                               capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if p.returncode != 0:
                res[key] = {"method": method, "width": w, "n": n,
                            "skipped": "failed: " + (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
            else:
                res[key] = json.loads(p.stdout.strip().splitlines()[-1])
            _save(res)
            print(f"{key}: {res[key].get('seconds', res[key].get('skipped'))} "
                  f"({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr, flush=True)
    print(section())
    return 0


def section() -> str:
    """Markdown for ``docs/benchmarks.md`` from the recorded results (run_all adds it)."""
    res = _load()
    if not res:
        return ""
    lines = ["## NTK at scale (structured vs torch.func references; separate run)", "",
             "`OMP_NUM_THREADS=1 python benchmarks/ntk_scaling.py` (not part of run_all: the references take "
             "minutes). widthscope `mlp`, 2 hidden layers of width N, 64 inputs, 10 outputs, float32, one thread, "
             "full kernel `(n, n, 10, 10)`; each cell a fresh process, peak = `VmHWM` above `VmRSS` before the "
             "call. `floor` = one batched backward over the outputs + the per-layer Gram matmuls, timed alone; `vs best ref` = fastest "
             "measured torch.func reference / structured; `vs floor` = structured / floor.", "",
             "| width | n | params | structured s | peak MB | floor s | Gram GFLOP | vmap_jacrev s | jacrev s | "
             "ntk_vp s | ref peak MB | vs best ref | vs floor |", "|" + "---|" * 13]
    for w in WIDTHS:
        for n in NS:
            g = {m: res.get(f"{m}/{w}/{n}", {}) for m in METHODS}
            st = g["structured"]
            if "seconds" not in st:
                continue

            def cell(r):
                if "seconds" in r:
                    return f"{r['seconds']:.3g}"
                if "predicted_s" in r:
                    return f"(~{r['predicted_s']:.0f}, skipped)"
                return "(memory, skipped)" if "skipped" in r else "—"

            refs = [g[m] for m in ("vmap_jacrev", "jacrev", "ntk_vp") if "seconds" in g[m]]
            best = min(refs, key=lambda r: r["seconds"]) if refs else None
            fl = g["floor"].get("seconds")
            floor_s = "" if fl is None else f"{fl:.3g}"
            ref_peak = "" if best is None else f"{best['peak_MB']:.0f}"
            vs_ref = "" if best is None else f"{best['seconds'] / st['seconds']:.0f}× ({best['method']})"
            vs_floor = "" if fl is None else f"{st['seconds'] / fl:.2f}"
            lines.append(f"| {w} | {n} | {st['params'] / 1e6:.2f}M | {st['seconds']:.3g} | {st['peak_MB']:.0f} | "
                         f"{floor_s} | {st['gram_gflop']:.3g} | {cell(g['vmap_jacrev'])} | "
                         f"{cell(g['jacrev'])} | {cell(g['ntk_vp'])} | {ref_peak} | {vs_ref} | {vs_floor} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
