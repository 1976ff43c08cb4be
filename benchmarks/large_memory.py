"""Peak memory and throughput of ``certify`` on a ~1B-parameter model built from a config.

Not part of ``run_all.py`` (minutes per run on a CPU). It builds a LLaMA-style model from a
config (TinyLlama-1.1B sizes by default; random weights: memory and speed do not depend on
them), probes every block output on ``n`` train and ``n`` held-out sequences of ``--seq-len``
random token ids, one sequence per batch, and records

- the weights' size and the process RSS after building the model (``VmRSS``),
- the peak RSS *during* certify (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``
  after the model is built) and the part above the weights,
- the pooled samples certify keeps, ``2 · n · points · d · 8`` bytes (``O(n·d)`` per point),
  and the transient per-batch activation gradient ``B · T · d · 4`` bytes per point,
- sequences per second of the probe; on CUDA also ``torch.cuda.max_memory_allocated``.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/large_memory.py --seq-len 1024 --n 4 --out mem.json
    python benchmarks/large_memory.py --device cuda --dtype bfloat16 --seq-len 2048 --n 16
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _common import proc_status, reset_peak  # noqa: E402  (VmRSS / VmHWM of this process)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--n", type=int, default=4, help="sequences per pool (train and held-out)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from widthscope.certification import certify_dict
    from widthscope.models import count_parameters

    dtype = getattr(torch, a.dtype)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.width, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=max(2048, a.seq_len), tie_word_embeddings=False)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(a.device):
        model = LlamaForCausalLM._from_config(cfg, attn_implementation=a.attn, dtype=dtype).eval()
    build_s = time.perf_counter() - t0
    params = count_parameters(model)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    rss_model = proc_status("VmRSS")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (2 * a.n, a.seq_len), generator=g)
    tr = [ids[i:i + a.batch_size] for i in range(0, a.n, a.batch_size)]
    te = [ids[a.n + i:a.n + i + a.batch_size] for i in range(0, a.n, a.batch_size)]
    reset = reset_peak()
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    res = certify_dict(model, tr, te, M=[4], K=[4], draws=100, interventions=None, progress=False)
    probe_s = res["timing"]["probe_s"]
    total_s = time.perf_counter() - t0
    points = len(res["points"])
    row = {
        "config": {k: getattr(a, k) for k in ("layers", "width", "ffn", "heads", "kv_heads", "vocab", "seq_len",
                                               "n", "batch_size", "device", "dtype", "attn")},
        "parameters": params, "weights_GB": weights / 1e9, "build_s": build_s,
        "rss_after_build_GB": rss_model / 1e9,
        "peak_rss_during_certify_GB": proc_status("VmHWM") / 1e9 if reset else None,
        "peak_above_weights_GB": (proc_status("VmHWM") - weights) / 1e9 if reset else None,
        "samples_kept_MB": 2 * a.n * points * a.width * 8 / 1e6,
        "activation_grad_per_batch_MB": a.batch_size * a.seq_len * a.width * 4 / 1e6,
        "points": points, "probe_s": probe_s, "certify_s": total_s,
        "sequences_per_s": 2 * a.n / probe_s, "torch_threads": torch.get_num_threads(),
        "d_align_last_point": res["ranking"][0]["d_align"],
    }
    if a.device.startswith("cuda"):
        row["cuda_peak_allocated_GB"] = torch.cuda.max_memory_allocated() / 1e9
        row["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(row, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(row, indent=2) + "\n")
    return row


RESULTS = Path(__file__).resolve().parent / "results"


def section() -> str:
    """Markdown for ``docs/benchmarks.md`` from every ``results/memory-*.json`` (run_all adds it)."""
    rows = [json.loads(f.read_text()) for f in sorted(RESULTS.glob("memory-*.json"))]
    if not rows:
        return ""
    lines = ["## large models (certify at ~1B parameters; separate runs)", "",
             "`python benchmarks/large_memory.py` (not part of run_all: minutes per run). LLaMA-style model "
             "built from a config, every block output probed, one sequence per batch, interventions off. "
             "Peak RSS is Linux `VmHWM` during certify, reset after the model was built.", "",
             "| device | dtype | layers × width | params | seq_len | sequences | weights GB | peak RSS GB | "
             "peak above weights GB | samples kept MB | seq/s | threads |", "|" + "---|" * 12]
    for r in rows:
        c = r["config"]
        lines.append(f"| {c['device']} | {c['dtype']} | {c['layers']} × {c['width']} | {r['parameters'] / 1e9:.2f}B | "
                     f"{c['seq_len']} | {2 * c['n']} | {r['weights_GB']:.2f} | "
                     f"{r['peak_rss_during_certify_GB']:.2f} | {r['peak_above_weights_GB']:.2f} | "
                     f"{r['samples_kept_MB']:.2f} | {r['sequences_per_s']:.3f} | {r['torch_threads']} |")
    lines += ["", "The pooled samples certify keeps are `2·n·points·d·8` bytes (float64): `O(n·d)` per point, "
              "independent of the sequence length; the per-batch activation gradient `B·T·d` exists only "
              "while its batch is pooled. What lies above the weights is the forward/backward of one "
              "sequence (activations, the `T × vocab` logits and their gradient).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
