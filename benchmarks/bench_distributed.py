"""1 vs 2 ranks under ``torchrun`` (gloo, CPU) for collection + statistics of a small model.

Each configuration launches ``python -m torch.distributed.run --standalone --nproc_per_node=W
benchmarks/bench_distributed.py --worker OUT``. The worker builds the same MLP on every rank,
probes its contiguous shard of the examples (:func:`widthscope.distributed.shard`), merges
the moments (:func:`widthscope.distributed.gather_or_reduce`) and the cross-Gram, computes the
certificate and 1000 misalignment draws on rank 0, all under
:func:`widthscope.distributed.run_rank_guarded`. It reports the median over ``repeats`` of the
*work* time (after the process group exists) and, separately, the whole launch's wall time
(Python + torch start-up, rendezvous): on a small model the start-up dominates, which is the
honest overhead of going distributed. ``speedup`` = work(1 rank)/work(2 ranks).

    python benchmarks/bench_distributed.py [--quick]
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import markdown_table, median_time  # noqa: E402


def worker(out: str, width: int, n: int, repeats: int) -> None:
    from widthscope import distributed as wd
    from widthscope import models, stats
    from widthscope._io import atomic_write_json
    from widthscope.probe import collect

    wd.init_from_env()
    torch.manual_seed(0)
    model = models.build("mlp", width, in_dim=64, out_dim=10, depth=4).eval()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2 * n, 64, generator=g), torch.randint(0, 10, (2 * n,), generator=g)
    bs = 32
    train = [(x[i:i + bs], y[i:i + bs]) for i in range(0, n, bs)]
    test = [(x[i:i + bs], y[i:i + bs]) for i in range(n, 2 * n, bs)]
    point = model.widthscope_points[-1]

    def job() -> float:
        wd.barrier()
        t0 = time.perf_counter()
        qa = collect(model, wd.shard(train), points=[point], progress=False)[point]
        qb = collect(model, wd.shard(test), points=[point], progress=False)[point]
        m = wd.gather_or_reduce(qa)
        mis = wd.distributed_misalignment(qa, qb, M=16, K=16, draws=1000, seed=0)
        stats.certificate(m, M=16, K=16, populations="one")
        wd.barrier()
        return time.perf_counter() - t0 if mis is not None else float("nan")

    times = [wd.run_rank_guarded(job) for _ in range(repeats + 1)][1:]  # first run: warm-up
    if wd.is_main():
        atomic_write_json(out, {"work_s": statistics.median(times), "world_size": wd.world_size()})


def _launch(W: int, width: int, n: int, repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", WIDTHSCOPE_PROGRESS="0",
                   PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={W}",
               __file__, "--worker", str(out), str(width), str(n), str(repeats)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"torchrun with {W} ranks failed:\n{r.stderr[-3000:]}")
        res = json.loads(out.read_text())
    return {"work_s": res["work_s"], "launch_s": wall}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows ``{width, n_examples, work_1_s, work_2_s, speedup, launch_1_s, launch_2_s}``."""
    grid = [(256, 512)] if quick else [(256, 512), (1024, 2048)]
    repeats = 3 if quick else 5
    rows = []
    for width, n in grid:
        one, two = _launch(1, width, n, repeats), _launch(2, width, n, repeats)
        rows.append({"width": width, "n_examples": 2 * n, "work_1_s": one["work_s"], "work_2_s": two["work_s"],
                     "speedup": one["work_s"] / two["work_s"], "launch_1_s": one["launch_s"],
                     "launch_2_s": two["launch_s"], "cpus": os.cpu_count()})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, ["width", "n_examples", "work_1_s", "work_2_s", "speedup", "launch_1_s",
                                 "launch_2_s", "cpus"],
                          "`work` = probe + merge + statistics after the process group exists (median); "
                          "`launch` = whole torchrun wall time including Python/torch start-up and all "
                          "repeats. On a machine shared with other jobs the 2-rank speed-up is bounded by "
                          "the free cores.")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        print(markdown(run("--quick" in sys.argv)))
