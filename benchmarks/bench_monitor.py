"""Cost of the alignment monitor: a small LLaMA-style training with and without it, in one run.

The same training (same seed, AdamW, causal-LM loss on random token ids) runs ``steps``
optimizer steps twice per repeat, alternating plain / monitored so load changes hit both alike;
the monitored run probes every ``every`` steps all block outputs on fixed pools of
``n_pool`` train and ``n_pool`` held-out sequences (``M = K = 16``, 1000 misalignment draws).
Reported: the median training step and the median probe, ``probe_in_steps = probe_s / step_s``
(the cost of one probe in training steps; the overhead of probing every ``N`` steps is
``probe_in_steps / N``) and the load-sensitive wall-time ratio. The final weights of both runs
are compared (they must be bit-identical).

Usage::

    python benchmarks/bench_monitor.py          # width 64 and 128, 60 steps (about a minute on 2 cores)
    python benchmarks/bench_monitor.py --quick  # seconds
    python benchmarks/bench_monitor.py --out benchmarks/results/monitor-cpu.json   # the committed rows
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _common import markdown_table  # noqa: E402


def _train(width: int, steps: int, every: int | None, n_pool: int, seq_len: int, batch: int
           ) -> tuple[float, list[float], list[float], dict[str, torch.Tensor]]:
    """One training; returns (wall s, per-step training times, per-probe times, final weights)."""
    from widthscope.models import build
    from widthscope.monitor import AlignmentMonitor
    from widthscope.probe import causal_lm_loss

    torch.manual_seed(0)
    model = build("llama", width, depth=4, vocab_size=256, max_seq_len=seq_len)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (steps * batch, seq_len), generator=g)
    pools = torch.randint(0, 256, (2 * n_pool, seq_len), generator=g)
    mon = None
    if every is not None:
        mon = AlignmentMonitor(model, pools[:n_pool], pools[n_pool:], M=16, every=every, draws=1000,
                               batch_size=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    step_s, probe_s = [], []
    t_start = time.perf_counter()
    for step in range(1, steps + 1):
        ids = data[(step - 1) * batch: step * batch]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        causal_lm_loss(model(ids).logits, ids).mean().backward()
        opt.step()
        t1 = time.perf_counter()
        step_s.append(t1 - t0)
        if mon is not None and mon.step(model, step):
            probe_s.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t_start
    return wall, step_s, probe_s, {k: v.clone() for k, v in model.state_dict().items()}


def run(quick: bool = False) -> list[dict[str, Any]]:
    widths = [64] if quick else [64, 128]
    steps, every, repeats = (10, 5, 1) if quick else (60, 10, 3)
    n_pool, seq_len, batch = (32, 32, 8) if quick else (64, 64, 16)
    rows = []
    for width in widths:
        walls: dict[str, list[float]] = {"plain": [], "monitored": []}
        steps_plain, steps_mon, probes = [], [], []
        identical = True
        for _ in range(repeats):  # alternate so machine load affects both alike
            wp, sp, _, fp = _train(width, steps, None, n_pool, seq_len, batch)
            wm, sm, pm, fm = _train(width, steps, every, n_pool, seq_len, batch)
            walls["plain"].append(wp)
            walls["monitored"].append(wm)
            steps_plain += sp
            steps_mon += sm
            probes += pm
            identical &= all(torch.equal(fp[k], fm[k]) for k in fp)
        step_s, probe_s = statistics.median(steps_plain), statistics.median(probes)
        rows.append({"width": width, "steps": steps, "every": every, "repeats": repeats, "n_pool": n_pool,
                     "step_s": step_s, "step_s_monitored": statistics.median(steps_mon), "probe_s": probe_s,
                     "probe_in_steps": probe_s / step_s, "overhead": probe_s / step_s / every,
                     "wall_ratio": statistics.median(walls["monitored"]) / statistics.median(walls["plain"]),
                     "identical_weights": identical})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, note=(
        "Same training (LLaMA-style, depth 4, seq 64, batch 16, AdamW) with and without the monitor, "
        "alternated in one run. `step_s`: median training step (plain run; `step_s_monitored` the same "
        "in the monitored run); `probe_s`: median probe of all 4 block outputs on 64 + 64 sequences "
        "(M = K = 16, 1000 draws); `probe_in_steps` = probe_s / step_s, so probing every N steps costs "
        "`overhead` = probe_in_steps / N of the training time (medians, robust to load spikes); "
        "`wall_ratio`: monitored / plain median wall time (load-sensitive). `identical_weights`: final "
        "weights bit-identical with and without the monitor."))


if __name__ == "__main__":
    import json
    import os

    rows = run(quick="--quick" in sys.argv)
    print(markdown(rows))
    if "--out" in sys.argv:  # the committed rows docs/benchmarks.md quotes
        path = Path(sys.argv[sys.argv.index("--out") + 1])
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg())}
        path.write_text(json.dumps({"machine": meta, "rows": rows}, indent=1) + "\n")
