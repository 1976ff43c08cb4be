"""Cost of certify's default bias interventions relative to the probe, with and without reuse.

4-layer LLaMA-style model (widthscope ``llama`` family, byte vocabulary), ``n`` train and ``n``
held-out sequences, ``M = K`` up to 128, the default 9 step sizes at every block output:

* ``probe_s``: :func:`widthscope.probe.collect` of both pools (what certify measures anyway);
* ``reuse_s``: the interventions as certify runs them now — ``μ_M``, ``g_K``, the held-out loss
  and the activation scale taken from the probe, all 9 steps of a batch in one stacked pass;
* ``recompute_s``: the same interventions measuring those again (two extra probes and two
  forward passes per point), as before the reuse.

``ratio`` columns divide by ``probe_s`` in the same run (lower is better).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table  # noqa: E402


def run(quick: bool = False) -> list[dict[str, Any]]:
    from widthscope.models import build
    from widthscope.probe import collect, insertion_points
    from widthscope.probe.intervene import intervene, to_batches

    sizes = [(64, 64, 64)] if quick else [(128, 64, 256), (256, 128, 256)]
    rows = []
    for width, seq_len, n in sizes:
        torch.manual_seed(0)
        model = build("llama", width, depth=4, max_seq_len=seq_len).eval()
        ids = torch.randint(0, 256, (2 * n, seq_len))
        tr, te = to_batches(ids[:n], 32), to_batches(ids[n:], 32)
        points = insertion_points(model)
        M = K = min(128, n)
        t0 = time.perf_counter()
        qa = collect(model, tr, points=points, progress=False)
        qb = collect(model, te, points=points, progress=False)
        probe_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for p in points:
            intervene(model, p, tr, te, M=M, K=K, progress=False,
                      reuse={"train": qa[p], "test": qb[p], "test_losses": qb.losses, "act_sq": qa.act_sq[p],
                             "width": qa.widths[p]})
        reuse_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for p in points:
            intervene(model, p, tr, te, M=M, K=K, progress=False)
        recompute_s = time.perf_counter() - t0
        rows.append({"width": width, "seq_len": seq_len, "n": n, "points": len(points), "M=K": M,
                     "probe_s": probe_s, "reuse_s": reuse_s, "recompute_s": recompute_s,
                     "reuse/probe": reuse_s / probe_s, "recompute/probe": recompute_s / probe_s})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, note="9 steps × K held-out forward passes per point remain: at 4 points, "
                                     "K = 128 and 2n = 512 probed sequences that is about 4608 forward "
                                     "passes against the probe's 512 forward + backward passes.")


if __name__ == "__main__":
    print(markdown(run(quick="--quick" in sys.argv)))
