"""Certify a model whose weights are ~3× the memory budget, through disk offload, against the plain run.

Builds a LLaMA-like Hugging Face causal LM from a config (seeded random weights: memory, time and
the equality of the numbers do not depend on them), saves it with ``save_pretrained``
(safetensors) and certifies every block output on seeded token-id pools, each run in a fresh
process (one torch thread):

- ``plain``: :func:`widthscope.models.hf.load_hf` as usual (all weights resident);
- ``offload``: ``load_hf(..., device_map="auto", max_memory="cpu=BUDGET,disk")`` with ``BUDGET``
  a third of the weights: accelerate keeps what fits on the CPU and offloads the rest to disk; the
  probe recomputes each block in the backward (:mod:`widthscope.probe.offload`);
- ``offload-no-recompute``: the same map without the recomputation (the blocks' forwards
  restored), to show what it saves;
- ``offload-adaptive-malloc``: ``offload`` with glibc's default adaptive mmap threshold, which
  ``offload`` fixes (loaded within :func:`widthscope.models.dispatch.releasing_memory`, as the
  command line does; the Python default leaves the threshold alone);
- ``plain-mmap``: ``plain`` with that fixed threshold (``MALLOC_MMAP_THRESHOLD_=65536``).

Then ``grow`` (:func:`widthscope.growth.grow`: rank every block output, grow a block at the best one
on a copy of the model, train it ``--grow-steps`` steps) on the same model and pools, each in a
fresh process: ``grow-plain``, ``grow-plain-mmap`` and ``grow-offload`` (the ``offload`` load);
recorded as ``grow.rows``, with the largest difference of every number of the grow result from
``grow-plain``'s.

Recorded per run: the process RSS after the imports (``VmRSS``, before any model) and, above it,
the RSS after the load and the peak RSS of the load and of certify (``VmHWM``, reset through
``/proc/self/clear_refs`` before each),
the load and certify wall times, and the device map; per offloaded run the largest absolute and
relative difference from the plain run over every number of the certify result (certificates,
misalignment, interventions, held-out losses; timing excluded) and over each headline group.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/offload_memory.py --out benchmarks/results/offload-memory-cpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from _common import proc_status, reset_peak  # noqa: E402  (VmRSS / VmHWM of this process)

MODES = ("plain", "offload", "offload-no-recompute", "offload-adaptive-malloc", "grow-plain", "grow-offload")
# glibc's malloc raises its mmap threshold as large blocks are freed, then serves the offloaded
# weights, loaded and dropped at every forward, from its heap, which it keeps; widthscope fixes the
# threshold for an offloaded model (widthscope.models.dispatch.fix_mmap_threshold). The plain run
# is measured with both allocator settings.
RUNS = (  # (run id, mode, extra environment)
    ("plain", "plain", {}),
    ("plain-mmap", "plain", {"MALLOC_MMAP_THRESHOLD_": "65536"}),
    ("offload", "offload", {}),
    ("offload-no-recompute", "offload-no-recompute", {}),
    ("offload-adaptive-malloc", "offload-adaptive-malloc", {}),
)
GROW_RUNS = (
    ("grow-plain", "grow-plain", {}),
    ("grow-plain-mmap", "grow-plain", {"MALLOC_MMAP_THRESHOLD_": "65536"}),
    ("grow-offload", "grow-offload", {}),
)
# headline groups of a certify result: (name, predicate on the path of a number)
GROUPS = {
    "certificates": lambda p: ".certificates[" in p and ".misalignment." not in p,
    "misalignment": lambda p: ".misalignment." in p,
    "interventions": lambda p: ".interventions[" in p and not p.endswith(".loss_before"),
    "held_out_loss": lambda p: p.endswith(".loss_before"),
    "moments": lambda p: ".moments_" in p or ".cross_moments." in p,
}


def _config(a: argparse.Namespace) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.width,
        intermediate_size=a.ffn,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.heads,
        max_position_embeddings=max(128, a.seq_len),
        tie_word_embeddings=False,
    )


def _pools(a: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (2 * a.n, a.seq_len), generator=g)
    tr = [ids[i : i + a.batch_size] for i in range(0, a.n, a.batch_size)]
    te = [ids[i : i + a.batch_size] for i in range(a.n, 2 * a.n, a.batch_size)]
    return tr, te


def worker(a: argparse.Namespace) -> None:
    """One run in this process; writes its row (and the certify result) to ``a.out``."""
    import torch

    torch.set_num_threads(1)
    from widthscope.certification import certify_dict
    from widthscope.growth import grow
    from widthscope.models.dispatch import mmap_threshold, releasing_memory
    from widthscope.models.hf import load_hf
    from widthscope.probe.offload import restore_blocks

    growing = a.worker.startswith("grow-")

    def load(directory: str, budget: int) -> Any:
        if a.worker in ("plain", "grow-plain"):
            return load_hf(directory)
        # glibc's threshold fixed as the command line does, except where its default is measured
        with releasing_memory(a.worker != "offload-adaptive-malloc"):
            m = load_hf(directory, device_map="auto", max_memory=f"cpu={budget},disk")
        if a.worker == "offload-no-recompute":
            restore_blocks(m)
        return m

    def run(model: Any, tr: Any, te: Any, small: bool = False) -> Any:
        if growing:
            n = 4 if small else a.grow_m
            return grow(model, (torch.cat(tr), torch.cat(te)), M=n, K=n, steps=1 if small else a.grow_steps,
                        batch_size=a.batch_size, progress=False)  # fmt: skip
        return certify_dict(model, tr, te, M=[8] if small else [a.n // 4, a.n], draws=10 if small else a.draws,
                       progress=False)  # fmt: skip

    # Warm-up on a tiny model of the same class, the same way: transformers' lazy imports and the
    # first-call allocations are paid here, so the peak below is the model's and the probe's.
    with tempfile.TemporaryDirectory(prefix="offload-warmup-") as tmp:
        small = argparse.Namespace(**{**vars(a), "layers": 2, "width": 32, "ffn": 64, "heads": 2, "vocab": 64})
        from transformers import LlamaForCausalLM

        LlamaForCausalLM(_config(small)).save_pretrained(tmp)
        tr, te = _pools(argparse.Namespace(**{**vars(small), "n": 8, "batch_size": 4}))
        warm = load(tmp, 60_000)  # embedding resident, the rest on disk
        run(warm, tr, te, small=True)
        del warm
    gc.collect()
    tr, te = _pools(a)
    baseline = proc_status("VmRSS")
    reset = reset_peak()
    t0 = time.perf_counter()
    model = load(a.dir, a.budget)
    load_s = time.perf_counter() - t0
    load_peak, after_load = proc_status("VmHWM"), proc_status("VmRSS")
    reset_peak()  # the certify peak alone, from the RSS after the load
    t0 = time.perf_counter()
    res = run(model, tr, te)
    certify_s = time.perf_counter() - t0
    certify_peak = proc_status("VmHWM")
    peak = max(load_peak, certify_peak)
    dmap = dict(getattr(model, "hf_device_map", None) or {})
    blocks = [model.get_submodule(n) for n in model.widthscope_points]
    on_disk = sum(1 for b in blocks if all(p.device.type == "meta" for p in b.parameters()))
    row = {
        "mode": a.worker,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "peak_above_baseline_bytes": peak - baseline if reset else None,
        "peak_reset": reset,
        "load_peak_above_baseline_bytes": load_peak - baseline if reset else None,
        "after_load_above_baseline_bytes": after_load - baseline,
        "certify_peak_above_baseline_bytes": certify_peak - baseline if reset else None,
        "load_s": load_s,
        "certify_s": certify_s,
        "device_map": {k: str(v) for k, v in dmap.items()},
        "malloc_mmap_threshold": mmap_threshold(),  # in effect at the end: the environment's or widthscope's
        "blocks": len(blocks),
        "blocks_offloaded": on_disk,
    }
    Path(a.out).write_text(json.dumps({"row": row, "result": res}, default=str))


def _numbers(x: Any, path: str = "") -> dict[str, float]:
    """Every float of a certify result by its path (timing left out)."""
    out: dict[str, float] = {}
    if isinstance(x, dict):
        for k, v in x.items():
            if k != "timing":
                out.update(_numbers(v, f"{path}.{k}"))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out.update(_numbers(v, f"{path}[{i}]"))
    elif isinstance(x, float):
        out[path] = x
    return out


def compare(plain: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Largest absolute / relative difference of ``other``'s numbers from ``plain``'s, overall and
    per headline group; the paths must be the same."""
    a, b = _numbers(plain), _numbers(other)
    if set(a) != set(b):
        raise SystemExit(f"the results differ in shape: {sorted(set(a) ^ set(b))[:5]}")

    def worst(keys: list[str]) -> dict[str, Any]:
        # not-a-number on both sides (a growth criterion undefined at a point) agrees; on one side
        # it is an infinite difference
        same_nan = [k for k in keys if math.isnan(a[k]) and math.isnan(b[k])]
        keys = [k for k in keys if k not in set(same_nan)]

        def diff(k: str) -> float:
            return math.inf if math.isnan(a[k]) or math.isnan(b[k]) else abs(a[k] - b[k])

        abs_d = max((diff(k) for k in keys), default=0.0)
        rel_d = max((diff(k) / abs(a[k]) for k in keys if a[k] != 0 and math.isfinite(a[k])), default=0.0)
        return {"numbers": len(keys) + len(same_nan), "max_abs": abs_d, "max_rel": rel_d}

    out = {"all": worst(list(a))}
    for name, pred in GROUPS.items():
        out[name] = worst([k for k in a if pred(k)])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--n", type=int, default=16, help="sequences per pool (train and held-out)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--grow-m", type=int, default=8, help="grow: M = K (the held-out half of the pool ranks)")
    p.add_argument("--grow-steps", type=int, default=10, help="grow: training steps of the new block")
    p.add_argument("--budget-fraction", type=float, default=1 / 3, help="max_memory cpu as a fraction of the weights")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return {}

    import torch
    import transformers
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(a)).eval()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    budget = int(weights * a.budget_fraction)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as tmp:
        model.save_pretrained(tmp)
        del model
        for run, mode, extra in (*RUNS, *GROW_RUNS):
            out = Path(tmp) / f"{run}.json"
            cmd = [sys.executable, __file__, "--worker", mode, "--dir", tmp, "--out", str(out)]
            cmd += ["--budget", str(budget), "--layers", str(a.layers), "--width", str(a.width)]
            cmd += ["--ffn", str(a.ffn), "--heads", str(a.heads), "--vocab", str(a.vocab)]
            cmd += ["--seq-len", str(a.seq_len), "--n", str(a.n), "--batch-size", str(a.batch_size)]
            cmd += ["--draws", str(a.draws), "--grow-m", str(a.grow_m), "--grow-steps", str(a.grow_steps)]
            env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", **extra)
            subprocess.run(cmd, check=True, env=env)
            runs[run] = json.loads(out.read_text())
            runs[run]["row"].update(run=run, env=extra)
    rows = [runs[r]["row"] for r, _, _ in RUNS]
    grow_rows = [runs[r]["row"] for r, _, _ in GROW_RUNS]
    for r in grow_rows:
        r["peak_over_weights"] = r["peak_above_baseline_bytes"] / weights if r["peak_above_baseline_bytes"] else None
        r["peak_over_budget"] = r["peak_above_baseline_bytes"] / budget if r["peak_above_baseline_bytes"] else None
        r["chosen"] = runs[r["run"]]["result"]["chosen"]
        if r["run"] != "grow-plain":
            r["vs_plain"] = compare(runs["grow-plain"]["result"], runs[r["run"]]["result"])
            r["slowdown"] = r["certify_s"] / runs["grow-plain"]["row"]["certify_s"]
    for r in rows:
        r["peak_over_weights"] = r["peak_above_baseline_bytes"] / weights if r["peak_above_baseline_bytes"] else None
        r["peak_over_budget"] = r["peak_above_baseline_bytes"] / budget if r["peak_above_baseline_bytes"] else None
        if r["run"] != "plain":
            r["vs_plain"] = compare(runs["plain"]["result"], runs[r["run"]]["result"])
            r["slowdown"] = r["certify_s"] / runs["plain"]["row"]["certify_s"]
    result = {
        "benchmark": "offload_memory",
        "model": {
            "architecture": "LlamaForCausalLM",
            "layers": a.layers,
            "width": a.width,
            "ffn": a.ffn,
            "heads": a.heads,
            "vocab": a.vocab,
            "weights_bytes": weights,
            "dtype": "float32",
        },
        "budget_bytes": budget,
        "weights_over_budget": weights / budget,
        "pools": {"n_train": a.n, "n_test": a.n, "seq_len": a.seq_len, "batch_size": a.batch_size, "draws": a.draws},
        "rows": rows,
        # grow's rows: "certify_s" / "certify_peak_*" are grow()'s time and peak
        "grow": {"M": a.grow_m, "K": a.grow_m, "steps": a.grow_steps, "rows": grow_rows},
        "machine": {
            "cpus": os.cpu_count(),
            "threads": 1,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": __import__("accelerate").__version__,
        },
    }
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
