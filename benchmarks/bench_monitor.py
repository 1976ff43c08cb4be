"""Cost of the alignment monitor on the demo's LLaMA training, measured side by side in one process.

The demo's training (``configs/demo-llama.toml``: LLaMA-style, depth 4, seq 64, batch 16, 150
AdamW steps; widths 32–256; random token ids here, the cost does not depend on the text) is run
by several identical models in lockstep: a plain one and one per monitor schedule, trained in
**interleaved blocks** of ``block`` steps (plain block, then each monitored block, then the next
plain block, ...), so a change of machine load hits all of them alike. Each monitor gets a clock
that runs only during its own model's blocks, so its ``budget`` sees its own training time.

Schedules (pools of ``n_pool`` + ``n_pool`` sequences, all 4 block outputs, ``M = K = 16``,
1000 draws): ``default`` (the log-spaced default under its 5% budget), ``log`` (the same steps,
no cap) and, when ``--every`` is given, ``every=N``.

Reported per (width, schedule): ``probes`` made; ``step_s`` (median plain step); ``probe_s``
(median probe); ``probe_in_steps = probe_s / step_s``; ``overhead`` = Σ monitor time / Σ plain
training time over the same blocks (what the monitor adds, in the demo's 150 steps); the
interval ``every_5pct = ⌈probe_in_steps / 0.05⌉`` that keeps an ``every=N`` schedule at ≤ 5%;
``block_ratio`` = median over blocks of monitored / plain block time (load-robust; probes fall
in few blocks, so it shows the training itself is not slowed); ``identical_weights`` (final
weights bit-identical to the plain model's).

Usage::

    OMP_NUM_THREADS=1 nice python benchmarks/bench_monitor.py --out benchmarks/results/monitor-cpu.json
    python benchmarks/bench_monitor.py --quick      # seconds
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _common import markdown_table  # noqa: E402

SHARE = 0.05  # the cost target of issue 23


class OwnClock:
    """A clock that advances only between :meth:`start` and :meth:`stop` (one model's blocks)."""

    def __init__(self) -> None:
        self.total, self.since = 0.0, None

    def start(self) -> None:
        self.since = time.perf_counter()

    def stop(self) -> None:
        self.total += time.perf_counter() - self.since
        self.since = None

    def __call__(self) -> float:
        return self.total + (0.0 if self.since is None else time.perf_counter() - self.since)


def _setup(width: int, steps: int, n_pool: int, seq_len: int, batch: int, schedules: dict[str, dict]):
    from widthscope.models import build
    from widthscope.monitor import AlignmentMonitor

    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (steps * batch, seq_len), generator=g)
    pools = torch.randint(0, 256, (2 * n_pool, seq_len), generator=g)
    runs = {}
    for name, kw in {"plain": None, **schedules}.items():
        torch.manual_seed(0)
        model = build("llama", width, depth=4, vocab_size=256, max_seq_len=seq_len)
        clock = OwnClock()
        clock.start()  # the dry probe at construction times one batch: the budget's first prediction
        mon = None if kw is None else AlignmentMonitor(model, pools[:n_pool], pools[n_pool:], M=16, draws=1000,
                                                       batch_size=32, clock=clock, **kw)
        clock.stop()
        runs[name] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-3), "mon": mon,
                      "clock": clock, "step_s": [], "probe_s": [], "blocks": [], "monitor_s": 0.0}
    return data, runs


def _block(run: dict, data: torch.Tensor, first: int, last: int, batch: int, step_fn: Callable) -> None:
    model, opt, mon, clock = run["model"], run["opt"], run["mon"], run["clock"]
    model.train()
    clock.start()
    t_block = time.perf_counter()
    for step in range(first, last + 1):
        if mon is not None and step == first == 1:  # step 0: before any update
            t0 = time.perf_counter()
            if mon.step(model, 0):
                run["probe_s"].append(time.perf_counter() - t0)
            run["monitor_s"] += time.perf_counter() - t0
        ids = data[(step - 1) * batch: step * batch]
        t0 = time.perf_counter()
        step_fn(model, opt, ids)
        t1 = time.perf_counter()
        run["step_s"].append(t1 - t0)
        if mon is not None:
            if mon.step(model, step):
                run["probe_s"].append(time.perf_counter() - t1)
            run["monitor_s"] += time.perf_counter() - t1
    run["blocks"].append(time.perf_counter() - t_block)
    clock.stop()


def _train_step(model, opt, ids) -> None:
    from widthscope.probe import causal_lm_loss

    opt.zero_grad(set_to_none=True)
    causal_lm_loss(model(ids).logits, ids).mean().backward()
    opt.step()


def run(quick: bool = False, every: int | None = None) -> list[dict[str, Any]]:
    widths = [32] if quick else [32, 64, 128, 256]
    steps, block = (12, 4) if quick else (150, 10)
    n_pool, seq_len, batch = (32, 32, 8) if quick else (64, 64, 16)
    schedules: dict[str, dict] = {"default": {}, "log": {"budget": math.inf}}
    if every is not None:
        schedules[f"every={every}"] = {"every": every}
    rows = []
    for width in widths:
        data, runs = _setup(width, steps, n_pool, seq_len, batch, schedules)
        for first in range(1, steps + 1, block):  # interleaved: plain, then each monitored, block by block
            for r in runs.values():
                _block(r, data, first, min(steps, first + block - 1), batch, _train_step)
        plain = runs["plain"]
        step_s = statistics.median(plain["step_s"])
        train_s = sum(plain["step_s"])
        ref = plain["model"].state_dict()
        for name in schedules:
            r = runs[name]
            probe_s = statistics.median(r["probe_s"]) if r["probe_s"] else None
            pis = None if probe_s is None else probe_s / step_s
            rows.append({
                "width": width, "schedule": name, "steps": steps, "block": block, "n_pool": n_pool,
                "probes": len(r["probe_s"]), "probed_steps": sorted({int(x["step"]) for x in r["mon"].rows}),
                "skipped": len(r["mon"].skipped), "step_s": step_s, "probe_s": probe_s, "probe_in_steps": pis,
                "overhead": r["monitor_s"] / train_s,
                "every_5pct": None if pis is None else math.ceil(pis / SHARE),
                "block_ratio": statistics.median(m / p for m, p in zip(r["blocks"], plain["blocks"])),
                "identical_weights": all(torch.equal(v, r["model"].state_dict()[k]) for k, v in ref.items())})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ("width", "schedule", "probes", "step_s", "probe_s", "probe_in_steps", "overhead", "every_5pct",
            "block_ratio", "identical_weights")
    return markdown_table([{c: r[c] for c in cols} for r in rows], note=(
        "The demo's LLaMA training (depth 4, seq 64, batch 16, 150 AdamW steps) with and without the "
        "monitor, interleaved in blocks of 10 steps in one process. `overhead`: monitor time / plain "
        "training time; `every_5pct`: the interval keeping an every=N schedule at <= 5%."))


if __name__ == "__main__":
    import json

    ev = int(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else None
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows = run(quick="--quick" in sys.argv, every=ev)
    print(markdown(rows))
    if "--out" in sys.argv:  # the committed rows docs/benchmarks.md quotes
        path = Path(sys.argv[sys.argv.index("--out") + 1])
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                "load_average_start": " ".join(f"{v:.2f}" for v in load0),
                "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
                "wall_s": time.perf_counter() - t0}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"machine": meta, "rows": rows}, indent=1) + "\n")
        tmp.replace(path)
