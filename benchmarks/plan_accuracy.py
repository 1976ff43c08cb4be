"""How close ``certify --plan`` comes: predicted against measured time and memory of the certify run.

For each setting (a LLaMA-like Hugging Face causal LM of width 64–256 built from a config with
seeded random weights and saved with ``save_pretrained``; byte tokens of a seeded pseudo-English
corpus; probe batch sizes 8 and 32), two fresh processes (one torch thread each), each warmed up
on a tiny model first so imports and first-call allocations are not counted:

- ``plan``: :func:`widthscope.certification.plan.plan_run` (loads the weights and times one batch);
- ``run``: :func:`widthscope.certification.run.run_certify` on the same job (the default statistics:
  M = K in 16, 32, 64, 128, 1000 draws, bias interventions at 4 steps), its wall time and its peak
  RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) above the RSS before it started;
- ``run-mmap``: the same with ``MALLOC_MMAP_THRESHOLD_=65536`` (glibc then returns each freed large
  block to the system, so the peak RSS is what the run holds at once, not what the allocator
  keeps; slower, so not timed);
- ``run-mmap-none``: the same without interventions (the probe and the statistics only).

The plan's memory is ``peak_bytes`` (weights + pooled samples + the kept held-out prefix + the
larger of a probed batch and a stacked intervention pass; without interventions: weights +
samples + the probed batch), its time ``predicted_s``. Ratios are predicted / measured.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/plan_accuracy.py --out benchmarks/results/plan-accuracy-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from _common import machine, proc_status, reset_peak  # noqa: E402  (VmRSS / VmHWM of this process)

WIDTHS = (64, 128, 256)
BATCHES = (8, 32)
LAYERS, SEQ_LEN, N, VOCAB = 4, 64, 128, 512
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more can who some into them could "
    "time only new these two may first then do any like my now over such our man me even most made after also"
).split()


def _corpus(path: Path, n_docs: int = 600, seed: int = 0) -> None:
    import random

    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160))) + "." for _ in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n")


def _save_model(directory: Path, width: int) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=width,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=4 * width,
        max_position_embeddings=256,
    )
    tf.LlamaForCausalLM(cfg).save_pretrained(directory)


def _job(model: str, corpus: str, batch: int) -> tuple[Any, Any, Any]:
    from widthscope.data.spec import InputSpec
    from widthscope.options import CertifyOptions, CertifyRunOptions

    spec = InputSpec(model=model, data=corpus, tokenizer="bytes", seq_len=SEQ_LEN, n_train=N, n_test=N)
    return spec, CertifyOptions(), CertifyRunOptions(batch_size=batch)


def _warm_up(tiny: str, corpus: str, work: Path) -> None:
    from widthscope.certification.plan import plan_run
    from widthscope.certification.run import CertifyJob, run_certify

    spec, opts, run = _job(tiny, corpus, 8)
    plan_run(spec, opts.replace(M=(8,), draws=20), run)
    run_certify(CertifyJob(spec, opts.replace(M=(8,), draws=20), run, out=str(work / "warm.json")), say=lambda m: None)


def worker(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    work = Path(a.work)
    _warm_up(str(work / "tiny"), str(work / "corpus.txt"), work)
    spec, opts, run = _job(str(work / f"w{a.width}"), str(work / "corpus.txt"), a.batch)
    if a.worker == "run-mmap-none":
        opts = opts.replace(interventions="none")
    if a.worker == "plan":
        from widthscope.certification.plan import plan_run

        t0 = time.perf_counter()
        plan = plan_run(spec, opts, run)
        out = {"plan": plan.to_dict(), "plan_s": time.perf_counter() - t0}
    else:
        from widthscope.certification.run import CertifyJob, run_certify

        baseline = proc_status("VmRSS")
        reset = reset_peak()
        t0 = time.perf_counter()
        res = run_certify(CertifyJob(spec, opts, run, out=str(work / "run.json")), say=lambda m: None)
        out = {
            "run_s": time.perf_counter() - t0,
            "peak_above_baseline_bytes": proc_status("VmHWM") - baseline if reset else None,
            "timing": res["timing"],
        }
    Path(a.result).write_text(json.dumps(out))


WORKERS = ("plan", "run", "run-mmap", "run-mmap-none")


def no_interventions(plan: dict[str, Any]) -> int:
    """The plan's memory of the run with ``--interventions none``: no kept prefix, no stacked pass."""
    return int(plan["weight_bytes"] + plan["sample_bytes"] + plan["batch_bytes"])


def _cell(work: Path, width: int, batch: int) -> dict[str, Any]:
    got = {}
    for what in WORKERS:
        result = work / f"{what}-{width}-{batch}.json"
        cmd = [sys.executable, __file__, "--worker", what, "--work", str(work), "--width", str(width)]
        cmd += ["--batch", str(batch), "--result", str(result)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        if what.startswith("run-mmap"):
            env["MALLOC_MMAP_THRESHOLD_"] = "65536"
        subprocess.run(cmd, check=True, env=env)
        got[what] = json.loads(result.read_text())
    plan, run = got["plan"]["plan"], got["run"]
    memory = plan["peak_bytes"]
    held, held_none = got["run-mmap"]["peak_above_baseline_bytes"], got["run-mmap-none"]["peak_above_baseline_bytes"]
    memory_none = no_interventions(plan)
    return {
        "width": width,
        "batch_size": batch,
        "parameters": plan["parameters"],
        "weight_bytes": plan["weight_bytes"],
        "flops_per_example": plan["flops_per_example"],
        "predicted_s": plan["predicted_s"],
        "measured_s": run["run_s"],
        "time_ratio": plan["predicted_s"] / run["run_s"],
        "predicted_bytes": memory,
        "measured_peak_bytes": held,
        "memory_ratio": memory / held if held else None,
        "measured_peak_default_malloc_bytes": run["peak_above_baseline_bytes"],
        "memory_ratio_default_malloc": memory / run["peak_above_baseline_bytes"]
        if run["peak_above_baseline_bytes"]
        else None,
        "predicted_bytes_no_interventions": memory_none,
        "measured_peak_no_interventions_bytes": held_none,
        "memory_ratio_no_interventions": memory_none / held_none if held_none else None,
        "plan_s": got["plan"]["plan_s"],
        "plan": plan,
        "run_timing": run["timing"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--worker", choices=WORKERS, default=None)
    p.add_argument("--work", default=None)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--result", default=None)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return {}

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as tmp:
        work = Path(tmp)
        _corpus(work / "corpus.txt")
        _save_model(work / "tiny", 16)
        for w in WIDTHS:
            _save_model(work / f"w{w}", w)
        rows = [_cell(work, w, b) for w in WIDTHS for b in BATCHES]
    result = {
        "setting": {
            "model": f"LlamaForCausalLM, {LAYERS} blocks, FFN 4x width, 4 heads, vocabulary {VOCAB}, float32",
            "seq_len": SEQ_LEN,
            "n_train": N,
            "n_test": N,
            "statistics": "default: M = K in 16,32,64,128, 1000 draws, bias interventions at 4 steps",
        },
        "rows": rows,
        "total_s": time.perf_counter() - t0,
        "machine": machine(),
    }
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    for r in rows:
        print(
            f"width {r['width']:4d} batch {r['batch_size']:3d}: time {r['predicted_s']:.2f}/{r['measured_s']:.2f} s "
            f"= {r['time_ratio']:.2f}x, memory {r['predicted_bytes'] / 1e6:.1f}/"
            f"{(r['measured_peak_bytes'] or 0) / 1e6:.1f} MB = {r['memory_ratio'] or float('nan'):.2f}x, "
            f"no interventions {r['memory_ratio_no_interventions'] or float('nan'):.2f}x, "
            f"default malloc {r['memory_ratio_default_malloc'] or float('nan'):.2f}x"
        )
    return result


if __name__ == "__main__":
    main()
