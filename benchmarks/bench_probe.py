"""Probe throughput on small Llama models: one batched backward vs a per-example loop.

For each (width, sequence length) on a 4-layer Llama (vocab 256, eager attention), the
activation gradients at every block output are computed for ``n`` sequences three ways:

* ``probe``: :func:`widthscope.probe.collect` (one forward + backward per batch, gradients
  w.r.t. the block outputs only, parameters frozen);
* ``loop``: one forward + ``loss.backward()`` per sequence with ``retain_grad`` on the block
  outputs (what published scripts do; parameter gradients are computed too);
* ``floor``: a plain batched forward + backward of the same batches (parameter gradients, no
  hooks): what any training step costs.

and ``stats`` is the time of everything :func:`widthscope.certification.certify_dict` does after the probe
(moments, cross-moments, certificates, 1000 misalignment draws) for ``M = K = 16`` with the
train and held-out pools both ``n/2``. Each time is the median of ``repeats`` runs.

Usage::

    python benchmarks/bench_probe.py          # full table (a few minutes on 2 CPU cores)
    python benchmarks/bench_probe.py --quick  # seconds
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import markdown_table, median_time  # noqa: E402


def _llama(width: int, seq_len: int, depth: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, width // 32)
    cfg = LlamaConfig(vocab_size=256, hidden_size=width, intermediate_size=int(width * 8 / 3) // 8 * 8,
                      num_hidden_layers=depth, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max(seq_len, 64), attn_implementation="eager")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()




def _loop(model, ids: torch.Tensor, points: list[str]) -> list[torch.Tensor]:
    from widthscope.probe import causal_lm_loss

    mods = [model.get_submodule(p) for p in points]
    rows = []
    for i in range(ids.shape[0]):
        caught: list[torch.Tensor] = []
        hs = [m.register_forward_hook(lambda m, inp, out: caught.append(out)) for m in mods]
        x = ids[i:i + 1]
        loss = causal_lm_loss(model(x).logits, x)[0]
        for h in hs:
            h.remove()
        for z in caught:
            z.retain_grad()
        loss.backward()
        rows.append(torch.stack([z.grad[0].sum(0) for z in caught]))
        model.zero_grad(set_to_none=True)
    return rows


def _floor(model, batches: list[torch.Tensor]) -> None:
    from widthscope.probe import causal_lm_loss

    for b in batches:
        causal_lm_loss(model(b).logits, b).sum().backward()
    model.zero_grad(set_to_none=True)


def _stats(a: torch.Tensor, b: torch.Tensor) -> None:
    from widthscope import stats

    ma = stats.moments(a)
    cm = stats.cross_moments(a, b)
    stats.certificate(ma, M=16, K=16, populations="one")
    stats.certificate(cm, M=16, K=16, populations="two")
    stats.misalignment_from_gram(a @ b.T, M=16, K=16, draws=1000, seed=0)


def run(quick: bool = False, on_row=None) -> list[dict[str, Any]]:
    """Rows ``{width, seq_len, n, probe_ex_s, loop_ex_s, floor_ex_s, speedup_vs_loop, stats_s, probe_s, max_rel_err}``."""
    from widthscope.probe import collect, insertion_points

    grid = [(64, 32)] if quick else [(64, 32), (64, 128), (128, 32), (128, 128), (256, 32), (256, 128)]
    n, bs, repeats = (32, 16, 3) if quick else (48, 16, 3)
    rows = []
    for width, T in grid:
        model = _llama(width, T)
        points = insertion_points(model)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 256, (n, T), generator=g)
        batches = [ids[i:i + bs] for i in range(0, n, bs)]
        q = collect(model, batches, progress=False)
        ref = torch.stack(_loop(model, ids, points))  # (n, points, d)
        err = max(float((q[p] - ref[:, j].double()).abs().max() / ref[:, j].abs().max())
                  for j, p in enumerate(points))
        t_probe = median_time(lambda: collect(model, batches, progress=False), repeats)
        t_loop = median_time(lambda: _loop(model, ids, points), repeats)
        t_floor = median_time(lambda: _floor(model, batches), repeats)
        a, b = q[points[-1]][: n // 2], q[points[-1]][n // 2:]
        t_stats = median_time(lambda: _stats(a, b), repeats)
        rows.append({"width": width, "seq_len": T, "n": n, "points": len(points),
                     "probe_ex_s": n / t_probe, "loop_ex_s": n / t_loop, "floor_ex_s": n / t_floor,
                     "speedup_vs_loop": t_loop / t_probe, "probe_s": t_probe, "stats_s": t_stats,
                     "max_rel_err": err})
        if on_row is not None:
            on_row(rows[-1])
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, ["width", "seq_len", "n", "probe_ex_s", "loop_ex_s", "floor_ex_s",
                                 "speedup_vs_loop", "probe_s", "stats_s", "max_rel_err"])


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    # Rows are printed as they finish (the full grid takes minutes on a small CPU).
    print(markdown([]))
    run(quick="--quick" in sys.argv, on_row=lambda r: print(markdown([r]).splitlines()[-1], flush=True))
