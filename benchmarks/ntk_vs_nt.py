"""Empirical NTK: widthscope against neural-tangents (JAX), same weights, time, peak memory and agreement.

The competitor is neural-tangents' ``empirical_ntk_fn`` with ``implementation=3``
(``NtkImplementation.STRUCTURED_DERIVATIVES``: it reads the structure of the JAX program and contracts
per-primitive derivatives, the same idea as widthscope's ``method="structured"``) and, where the
Jacobians are small, ``implementation=1`` (``JACOBIAN_CONTRACTION``). Every model is written twice,
in PyTorch and in plain JAX (``f(params, x)``), and the JAX parameters are the PyTorch weights copied,
so the two libraries compute the same kernel ``Θ(x, x)`` of shape ``(n, n, out, out)``:

* ``mlp-W-n``: 64 → W → W → 10, ReLU, ``nn.Linear`` (standard parametrisation), n inputs; the JAX
  dense weights are stored ``(in, out)`` as stax stores them (``mlp-256-64-torch-layout``: stored
  ``(out, in)`` and transposed inside ``f``, a literal port of ``nn.Linear``, which implementation 3
  does not see through);
* ``conv``: ``ntk_auto``'s conv net (2 conv layers, 16 and 32 channels, + linear), 16×16×3, n = 32;
* ``transformer-d``: one pre-norm block (4-head self-attention with separate q/k/v/o linears, a
  2d-wide tanh-GELU MLP, LayerNorms), 8 input features, 16 sequences × 16 positions, mean-pooled, 10 outputs.

Per row, in one process, the methods are timed back to back in ``--reps`` interleaved rounds (the
order rotated each round; a call shorter than 0.5 s repeated to fill 0.5 s and averaged; medians;
float32; one thread: ``torch.set_num_threads(1)`` and XLA's
single-threaded Eigen). ``nt/ws`` = neural-tangents impl 3 over widthscope structured per round, median
over rounds. The JAX functions are ``jax.jit``-compiled for the full shape before timing (the
compile time is recorded apart, as widthscope's one-time costs are excluded by a 2-example call).
Peak memory: each method once more in a fresh subprocess, Linux ``VmHWM`` during the call minus
``VmRSS`` before it (reset by ``clear_refs`` after ``malloc_trim``, the compile or warm-up done
before), with the process CPU time over wall time as a thread check. Agreement: in another fresh
subprocess, in float64 (``jax_enable_x64``, a float64 copy of the model),
``max|Θ_ws − Θ_nt| / max|Θ_nt|``.

Without neural-tangents (it needs JAX: ``make bench-nt`` builds ``.venv-nt``) the neural-tangents
columns are recorded as skipped ("neural-tangents not installed: column skipped") and the widthscope
columns are still measured. Results: ``benchmarks/results/ntk-vs-nt-cpu.json``, one key per row,
resumable (a row recorded without neural-tangents is redone when it is installed).

Usage::

    OMP_NUM_THREADS=1 nice python benchmarks/ntk_vs_nt.py [--reps 3] [--rows mlp-256-64,conv] [--redo]

``--redo`` measures the named rows again and keeps the old ratios and loads in ``previous_runs``.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "ntk-vs-nt-cpu.json"
NOT_INSTALLED = "neural-tangents not installed: column skipped"
WS_METHODS = ("ws_structured", "ws_auto")
NT_METHODS = ("nt_structured", "nt_jacobian")
JAC_FLOP_CAP = 2e10  # impl 1 contracts (n·out × P) Jacobians: run it only below this many flops
JAC_BYTE_CAP = 1e9
INNER_S, INNER_CAP = 0.5, 50  # a timing repeats a short call to last >= 0.5 s (at most 50 calls): less timer noise

SPECS: dict[str, dict[str, Any]] = {
    **{f"mlp-{w}-{n}": {"kind": "mlp", "width": w, "n": n} for w in (256, 1024) for n in (64, 256)},
    "mlp-256-64-torch-layout": {"kind": "mlp", "width": 256, "n": 64, "layout": "torch"},
    "conv": {"kind": "conv", "n": 32},
    "transformer-64": {"kind": "transformer", "d": 64, "n": 16, "T": 16},
    "transformer-128": {"kind": "transformer", "d": 128, "n": 16, "T": 16},
}


def _env_one_thread() -> None:
    """One compute thread for torch and XLA (set before jax is imported)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # neural-tangents imports tensorflow (via tf2jax)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def have_nt() -> bool:
    return importlib.util.find_spec("neural_tangents") is not None and importlib.util.find_spec("jax") is not None


# --------------------------------------------------------------------------- the models, twice

def describe(spec: dict[str, Any]) -> str:
    if spec["kind"] == "mlp":
        return (f"64 → {spec['width']} → {spec['width']} → 10 ReLU MLP, n = {spec['n']}"
                + (", JAX weights (out, in) transposed inside f" if spec.get("layout") == "torch" else ""))
    if spec["kind"] == "conv":
        return f"2 conv (16, 32 ch) + linear, 16×16×3, n = {spec['n']}"
    return (f"1 attention block d = {spec['d']}, 4 heads, {spec['n']} seqs × {spec['T']} positions, "
            "mean-pooled, 10 outputs")


def _torch_transformer(d: int, heads: int = 4):
    import torch
    from torch import nn

    class Block(nn.Module):
        """Pre-norm attention block on 8 features, mean-pooled; mirrored by :func:`_jax_transformer`."""

        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(8, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
            self.head = nn.Linear(d, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            a = self.ln1(h)
            B, T, _ = a.shape
            split = lambda t: t.reshape(B, T, heads, d // heads).transpose(1, 2)  # noqa: E731
            q, k, v = split(self.q(a)), split(self.k(a)), split(self.v(a))
            w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1)
            h = h + self.o((w @ v).transpose(1, 2).reshape(B, T, d))
            h = h + self.fc2(nn.functional.gelu(self.fc1(self.ln2(h)), approximate="tanh"))
            return self.head(h.mean(1))

    return Block()


def make(spec: dict[str, Any], seed: int = 0):
    """The PyTorch model (eval mode, float32) and its inputs for ``spec``."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    if spec["kind"] == "mlp":
        w = spec["width"]
        model = nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
        x = torch.randn(spec["n"], 64)
    elif spec["kind"] == "conv":
        from ntk_auto import _conv

        model, x = _conv(), torch.randn(spec["n"], 3, 16, 16)
    elif spec["kind"] == "transformer":
        model, x = _torch_transformer(spec["d"]), torch.randn(spec["n"], spec["T"], 8)
    else:
        raise ValueError(f"unknown model kind {spec['kind']!r}")
    return model.eval(), x


def jax_fn(spec: dict[str, Any]) -> Callable:
    """``f(params, x)`` in plain JAX computing what :func:`make`'s model computes, ``params`` the
    dict of its PyTorch parameters by name (:func:`jax_params`; convolutions NCHW/OIHW as PyTorch's)."""
    import jax
    import jax.numpy as jnp

    torch_layout = spec.get("layout") == "torch"

    def lin(p, name, x):
        W = p[f"{name}.weight"]
        return x @ (W.T if torch_layout else W) + p[f"{name}.bias"]

    if spec["kind"] == "mlp":
        return lambda p, x: lin(p, "4", jax.nn.relu(lin(p, "2", jax.nn.relu(lin(p, "0", x)))))
    if spec["kind"] == "conv":
        def conv(p, name, x, stride):
            y = jax.lax.conv_general_dilated(x, p[f"{name}.weight"], (stride, stride), [(1, 1), (1, 1)],
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return y + p[f"{name}.bias"][None, :, None, None]

        def f(p, x):
            h = jax.nn.relu(conv(p, "2", jax.nn.relu(conv(p, "0", x, 1)), 2))
            return lin(p, "5", h.reshape(h.shape[0], -1))
        return f
    d, heads = spec["d"], 4

    def ln(p, name, x):  # nn.LayerNorm: biased variance, eps 1e-5
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]

    def f(p, x):
        h = lin(p, "inp", x)
        a = ln(p, "ln1", h)
        B, T, _ = a.shape
        split = lambda t: t.reshape(B, T, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(lin(p, "q", a)), split(lin(p, "k", a)), split(lin(p, "v", a))
        w = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), axis=-1)
        h = h + lin(p, "o", (w @ v).transpose(0, 2, 1, 3).reshape(B, T, d))
        h = h + lin(p, "fc2", jax.nn.gelu(lin(p, "fc1", ln(p, "ln2", h)), approximate=True))
        return lin(p, "head", h.mean(1))
    return f


def jax_params(model, spec: dict[str, Any]) -> dict[str, Any]:
    """The model's parameters as JAX arrays; dense weights as ``(in, out)`` (``y = x W``, stax's layout)
    unless ``spec["layout"] == "torch"``: implementation 3 loses the dense structure when the
    ``(out, in)`` weight is transposed inside ``f`` (the ``-torch-layout`` row shows what that costs)."""
    import jax.numpy as jnp

    keep = spec.get("layout") == "torch"
    return {k: jnp.asarray(v.detach().cpu().numpy().T.copy() if v.dim() == 2 and not keep else v.detach().cpu().numpy())
            for k, v in model.named_parameters()}


def nt_kernel_fn(spec: dict[str, Any], implementation: int) -> Callable:
    """``jit(empirical_ntk_fn)`` of the JAX mirror: ``fn(x1, x2, params)`` → ``(n1, n2, out, out)``."""
    import jax
    import neural_tangents as nt

    return jax.jit(nt.empirical_ntk_fn(jax_fn(spec), trace_axes=(), vmap_axes=0, implementation=implementation))


def _jacobian_skip(spec: dict[str, Any], params: int) -> str | None:
    n, out = spec["n"], 10
    flops, nbytes = 2 * (n * out) ** 2 * params, n * out * params * 4
    if flops > JAC_FLOP_CAP or nbytes > JAC_BYTE_CAP:
        return (f"Jacobian contraction needs {flops / 1e9:.0f} GFLOP and {nbytes / 1e9:.2f} GB of Jacobians "
                f"(caps {JAC_FLOP_CAP / 1e9:.0f} GFLOP, {JAC_BYTE_CAP / 1e9:.0f} GB)")
    return None


# --------------------------------------------------------------------------- one method's callable

def method_fn(method: str, spec: dict[str, Any], model, x) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A no-argument callable computing the full kernel with ``method`` (its one-time costs done:
    widthscope's 2-example call, JAX's compile for the full shape), and what the set-up recorded."""
    import numpy as np

    if method in WS_METHODS:
        from widthscope.linear import ntk

        m = "structured" if method == "ws_structured" else "auto"
        ntk(model, x[:2], method=m)  # one-time costs (dispatch, vmap set-up) are not compared
        info: dict[str, Any] = {}
        if m == "auto":  # what auto picks for the full x (it may differ from the 2-example call's)
            ntk(model, x, method=m, info=info)
        return (lambda: ntk(model, x, method=m)), {"choice": info.get("method", m)}
    import jax

    fn = nt_kernel_fn(spec, 3 if method == "nt_structured" else 1)
    p, xj = jax_params(model, spec), jax.numpy.asarray(np.asarray(x.numpy()))
    t0 = time.perf_counter()
    compiled = fn.lower(xj, None, p).compile()  # compiled without running: the run is what is measured
    return (lambda: compiled(xj, None, p).block_until_ready()), {"compile_s": time.perf_counter() - t0}


# --------------------------------------------------------------------------- subprocess workers

def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1


def worker_mem(method: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of one full-kernel call: ``VmHWM`` during it minus ``VmRSS`` before it."""
    import torch

    torch.set_num_threads(1)
    model, x = make(spec)
    fn, _ = method_fn(method, spec, model, x)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed set-up memory back to the OS, so it is not reused unseen
    except OSError:
        pass
    rss0 = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"peak_MB": (_status("VmHWM") - rss0) / 2 ** 20, "rss_before_MB": rss0 / 2 ** 20, "seconds": wall,
            "cpu_over_wall": cpu / wall, "hwm_reset": reset}


def worker_agree(spec: dict[str, Any]) -> dict[str, Any]:
    """float64: ``max|Θ_ws − Θ_nt| / max|Θ_nt|`` for widthscope structured and auto against impl 3 (and 1)."""
    import jax
    import numpy as np
    import torch

    jax.config.update("jax_enable_x64", True)
    torch.set_num_threads(1)
    from widthscope.linear import ntk

    model, x = make(spec)
    model, x = model.double(), x.double()
    p, xj = jax_params(model, spec), jax.numpy.asarray(x.numpy())
    ref = {"nt_structured": np.asarray(nt_kernel_fn(spec, 3)(xj, None, p))}
    if _jacobian_skip(spec, sum(q.numel() for q in model.parameters())) is None:
        ref["nt_jacobian"] = np.asarray(nt_kernel_fn(spec, 1)(xj, None, p))
    out: dict[str, Any] = {"dtype": str(ref["nt_structured"].dtype)}
    for m in ("structured", "auto"):
        K = ntk(model, x, method=m).numpy()
        for r, R in ref.items():
            out[f"ws_{m}_vs_{r}"] = float(np.abs(K - R).max() / np.abs(R).max())
    return out


def _subprocess(args: list[str], timeout: float = 900) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", *args], capture_output=True,
                           text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"failed": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- a row

def row(name: str, spec: dict[str, Any], reps: int = 3, memory: bool = True, agree: bool = True,
        nt_available: bool | None = None, inner_s: float = INNER_S) -> dict[str, Any]:
    """Time every method on ``spec`` back to back in interleaved rounds; peak memory and float64
    agreement in fresh subprocesses. The neural-tangents columns are skipped (and say so) when it is
    not installed (``nt_available=False`` forces that)."""
    import torch

    torch.set_num_threads(1)
    nt_ok = have_nt() if nt_available is None else nt_available
    model, x = make(spec)
    P = sum(q.numel() for q in model.parameters())
    out: dict[str, Any] = {"model": name, "description": describe(spec), "spec": spec, "params": P, "n": x.shape[0],
                           "load_average_before": list(os.getloadavg()), "reps": reps, "skipped": {},
                           "setup": {}, "peak": {}, "agreement": {}}
    methods = list(WS_METHODS)
    if not nt_ok:
        print(NOT_INSTALLED, file=sys.stderr, flush=True)
        out["skipped"].update({m: NOT_INSTALLED for m in NT_METHODS})
    else:
        methods.append("nt_structured")
        skip = _jacobian_skip(spec, P)
        if skip:
            out["skipped"]["nt_jacobian"] = skip
        else:
            methods.append("nt_jacobian")
    run: dict[str, Callable[[], Any]] = {}
    kernels: dict[str, Any] = {}
    inner: dict[str, int] = {}
    for m in methods:
        run[m], out["setup"][m] = method_fn(m, spec, model, x)
        t0 = time.perf_counter()
        kernels[m] = run[m]()
        inner[m] = max(1, min(INNER_CAP, math.ceil(inner_s / max(time.perf_counter() - t0, 1e-9))))
    out["inner"] = inner
    times: dict[str, list[float]] = {m: [] for m in run}
    for r in range(reps):  # interleaved rounds, order rotated: load changes hit every method alike
        for m in methods[r % len(methods):] + methods[:r % len(methods)]:
            t0 = time.perf_counter()
            for _ in range(inner[m]):
                run[m]()
            times[m].append((time.perf_counter() - t0) / inner[m])
    out["seconds"] = {m: statistics.median(v) for m, v in times.items()}
    out["all_seconds"] = times
    out.update(ratios(times))
    ref = kernels["ws_structured"].numpy()
    for m, K in kernels.items():  # float32 sanity: the timed kernels are the same kernel
        if m != "ws_structured":
            K = K.numpy() if isinstance(K, torch.Tensor) else __import__("numpy").asarray(K)
            out["agreement"][f"f32_{m}_vs_ws_structured"] = float(abs(K - ref).max() / abs(ref).max())
    if memory:
        out["peak"] = {m: _subprocess(["mem", m, json.dumps(spec)]) for m in methods}
    if agree and nt_ok:
        out["agreement"].update(_subprocess(["agree", json.dumps(spec)]))
    out["load_average_after"] = list(os.getloadavg())
    return out


def ratios(times: dict[str, list[float]]) -> dict[str, float]:
    """Per round (same load) neural-tangents impl 3 over widthscope structured and over auto; medians."""
    if "nt_structured" not in times:
        return {}
    nt = times["nt_structured"]
    return {f"nt_over_{m}": statistics.median(a / b for a, b in zip(nt, times[m])) for m in WS_METHODS}


def machine() -> dict[str, Any]:
    import torch

    info = {"cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": 1, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    if have_nt():
        import jax
        import jaxlib
        from importlib.metadata import version

        info.update(jax=jax.__version__, jaxlib=jaxlib.__version__, neural_tangents=version("neural-tangents"))
    return info


# --------------------------------------------------------------------------- the table

def _fmt_s(r: dict[str, Any], m: str) -> str:
    return f"{r['seconds'][m]:.3g}" if m in r.get("seconds", {}) else "skipped"


def _fmt_mb(r: dict[str, Any], m: str) -> str:
    p = r.get("peak", {}).get(m, {})
    return f"{p['peak_MB']:.0f}" if "peak_MB" in p else "–"


def table_lines(res: dict[str, Any]) -> list[str]:
    """The Markdown table of the recorded rows."""
    lines = ["| model | params | ws structured s | ws auto s (picks) | nt impl 3 s | nt impl 1 s | nt/ws | nt/ws auto "
             "| max rel diff f64 | peak MB ws / auto / nt3 / nt1 | nt compile s | load |", "|" + "---|" * 12]
    order = {k: i for i, k in enumerate(SPECS)}
    for name, r in sorted(res["rows"].items(), key=lambda kv: order.get(kv[0], len(order))):
        ag = r["agreement"].get("ws_structured_vs_nt_structured")
        pk = " / ".join(_fmt_mb(r, m) for m in (*WS_METHODS, *NT_METHODS))
        comp = r["setup"].get("nt_structured", {}).get("compile_s")
        lines.append(
            f"| {name} | {r['params']} | {_fmt_s(r, 'ws_structured')} | {_fmt_s(r, 'ws_auto')} "
            f"({r['setup']['ws_auto']['choice']}) | {_fmt_s(r, 'nt_structured')} | {_fmt_s(r, 'nt_jacobian')} | "
            + (f"{r['nt_over_ws_structured']:.3g} | {r['nt_over_ws_auto']:.3g} | " if "nt_over_ws_structured" in r
               else "skipped | skipped | ")
            + ("–" if ag is None else f"{ag:.1e}") + f" | {pk} | " + ("–" if comp is None else f"{comp:.2g}")
            + f" | {r['load_average_before'][0]:.1f} |")
    return lines


def _kind_rows(res: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Rows of one model kind with neural-tangents measured (the torch-layout MLP row apart)."""
    return [r for r in res["rows"].values() if r["spec"]["kind"] == kind and "nt_over_ws_structured" in r
            and r["spec"].get("layout") != "torch"]


def quantity(res: dict[str, Any], what: str) -> str:
    """The text of the ``ntk_nt/...`` numbers in docs/benchmarks.md (benchmarks/docnumbers.py):
    ``ratio/<kind>`` (nt impl 3 / ws structured, range over rows), ``ratio/<row>``, ``agree``
    (largest float64 difference over rows), ``s/<row>/<method>``, ``peak/<row>/<method>``, ``load``."""
    from docnumbers import sci, sig, span

    part = what.split("/")
    rows = res["rows"]
    if part[0] == "ratio" and part[1] in ("mlp", "conv", "transformer"):
        v = [r["nt_over_ws_structured"] for r in _kind_rows(res, part[1])]
        return span(min(v), max(v), lambda x: sig(x, 2))
    if part[0] == "ratio":
        return sig(rows[part[1]]["nt_over_ws_structured"], 2)
    if part[0] == "agree":
        return sci(max(r["agreement"]["ws_structured_vs_nt_structured"] for r in rows.values()
                       if "ws_structured_vs_nt_structured" in r["agreement"]))
    if part[0] == "s":
        return sig(rows[part[1]]["seconds"][part[2]], 2)
    if part[0] == "peak":
        return f"{rows[part[1]]['peak'][part[2]]['peak_MB']:.0f}"
    if part[0] == "prev":  # earlier measurements of a row (--redo): "ratio at load L"
        return ", ".join(f"{sig(p['nt_over_ws_structured'], 2)} at load {p['load_average_before'][0]:.1f}"
                         for p in rows[part[1]].get("previous_runs", []))
    if part[0] == "loadof":
        return f"{rows[part[1]]['load_average_before'][0]:.1f}"
    if part[0] == "nt_faster":  # rows where impl 3 beat widthscope structured
        return ", ".join(f"`{r['model']}`" for k in ("mlp", "conv", "transformer") for r in _kind_rows(res, k)
                         if r["nt_over_ws_structured"] < 1) or "none"
    if part[0] == "load":
        v = [x for r in rows.values() for x in (r["load_average_before"][0], r["load_average_after"][0])]
        return span(min(v), max(v), lambda x: f"{x:.1f}")
    raise KeyError(f"unknown ntk_nt quantity {what!r}")


def section(path: Path = OUT) -> str:
    """Markdown for ``docs/benchmarks.md`` from the recorded rows (run_all adds it; the marked spans are
    checked by benchmarks/docnumbers.py)."""
    if not path.exists():
        return ""
    res = json.loads(path.read_text())
    n = lambda key: f"<!--n:ntk_nt/{key}-->{quantity(res, key)}<!--/n-->"  # noqa: E731
    m = res.get("machine", {})
    lines = ["", "## NTK against neural-tangents (JAX; separate run)", "",
             "`make bench-nt` (`OMP_NUM_THREADS=1 nice python benchmarks/ntk_vs_nt.py` in its own `.venv-nt`: "
             f"the `nt` extra, jax {m.get('jax', '?')}, neural-tangents {m.get('neural_tangents', '?')}, tf2jax and "
             "numpy < 2, pinned in `constraints-nt.txt`; `make test` never installs JAX, and without it the "
             "neural-tangents columns are recorded as skipped; `make test-nt` runs the float64 agreement tests "
             "there, which skip elsewhere). Each model is written in PyTorch and in plain "
             "JAX with the same weights; full kernel `Θ(x, x)`, `(n, n, out, out)`, float32, one thread "
             "(torch and XLA), all methods timed back to back in one process in interleaved rounds (median of "
             "the rounds). `nt impl 3` = `empirical_ntk_fn(..., implementation=STRUCTURED_DERIVATIVES)` "
             "jit-compiled (its compile time apart), `nt impl 1` = Jacobian contraction (only where it needs "
             f"under {JAC_FLOP_CAP / 1e9:.0f} GFLOP and {JAC_BYTE_CAP / 1e9:.0f} GB); a call under "
             f"{INNER_S} s is repeated to fill {INNER_S} s; `nt/ws` = impl 3 time over widthscope `structured` per round, median "
             "(> 1: widthscope faster). Max rel diff: `max|Θ_ws − Θ_nt| / max|Θ_nt|` in float64. Peak MB: "
             "`VmHWM` above `VmRSS` in a fresh process per method. The machine was shared (load "
             f"{n('load')} on {m.get('cores', '?')} cores), so read the ratios, not the seconds.",
             f"<!--n:ntk_nt.table-->\n\n" + "\n".join(table_lines(res)) + "\n\n<!--/n-->"]
    if all(k in res["rows"] for k in SPECS) and all("nt_over_ws_structured" in r for r in res["rows"].values()):
        lines += [f"Reading: `nt/ws` is {n('ratio/mlp')} on the MLPs, {n('ratio/conv')} on the conv net and "
                  f"{n('ratio/transformer')} on the transformers; the two libraries' kernels agree to {n('agree')} "
                  f"(float64) on every row. Below 1 (neural-tangents faster): {n('nt_faster')}. Peak memory at "
                  f"width 1024, n = 256: {n('peak/mlp-1024-256/ws_structured')} MB (widthscope structured) against "
                  f"{n('peak/mlp-1024-256/nt_structured')} MB (impl 3). A literal port of `nn.Linear` to JAX "
                  "(weights `(out, in)`, transposed inside `f`) hides the dense structure from implementation 3: "
                  f"`nt/ws` {n('ratio/mlp-256-64-torch-layout')} against {n('ratio/mlp-256-64')} for the same MLP "
                  "with stax's `(in, out)` layout."]
        again = [k for k, r in res["rows"].items() if r.get("previous_runs")]
        for k in again:
            lines += ["", f"Measured again (`--redo`): `{k}` gave `nt/ws` {n(f'ratio/{k}')} at load "
                          f"{n(f'loadof/{k}')} (the table), {n(f'prev/{k}')} before: where a call takes well under "
                          "a second the ratio moves with the machine's load."]
        lines.append("")
    else:
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default=",".join(SPECS), help="comma-separated row names")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--redo", action="store_true", help="measure the rows again; the old ratios and loads are "
                    "kept in the new row's previous_runs")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    _env_one_thread()
    if args.worker:
        kind, *rest = args.worker
        res = worker_mem(rest[0], json.loads(rest[1])) if kind == "mem" else worker_agree(json.loads(rest[0]))
        print(json.dumps(res))
        return 0
    names = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in names if r not in SPECS]
    if unknown or args.reps < 1:
        print(f"ntk_vs_nt: unknown row(s) {unknown} (have {', '.join(SPECS)}) or --reps < 1", file=sys.stderr)
        return 2
    from widthscope._io import atomic_write_json

    path = Path(args.out)
    res = json.loads(path.read_text()) if path.exists() else {"rows": {}}
    nt_ok = have_nt()
    if not nt_ok:
        print(NOT_INSTALLED, file=sys.stderr)
    for name in names:
        old = res["rows"].get(name)
        if old is not None and not args.redo and not (nt_ok and old["skipped"].get("nt_structured") == NOT_INSTALLED):
            continue
        res["rows"][name] = row(name, SPECS[name], args.reps, nt_available=nt_ok)
        if old is not None and args.redo:
            keep = ("seconds", "nt_over_ws_structured", "nt_over_ws_auto", "load_average_before", "load_average_after")
            res["rows"][name]["previous_runs"] = [*old.pop("previous_runs", []), {k: old.get(k) for k in keep}]
        res["machine"] = machine()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, res)
        r = res["rows"][name]
        print(f"{name}: {r['seconds']} nt/ws={r.get('nt_over_ws_structured')} "
              f"agree={r['agreement'].get('ws_structured_vs_nt_structured')}", file=sys.stderr, flush=True)
    print("\n".join(table_lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
