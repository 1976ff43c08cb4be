"""Sign agreement of the bias probe over random (M, K) draws, on the llama-interventions checkpoints.

Input: a finished ``widthscope sweep configs/llama-interventions.toml --out SWEEP_DIR`` (its
``results.jsonl`` names the cells, ``artifacts/<cell_id>`` holds each trained model). For every
cell and block output, :func:`widthscope.probe.interventions.sign_agreement` with ``M = K = 32`` at
its default step (RMS = 1e-3 of the activation's, for the pool mean), on the sweep's own split
(``data.load("text", n_train=2048, n_test=256, seed=0, seq_len=64)``, checked against the rows'
``data_description``): train pool = 256 training chunks drawn at random (seed 123) from the 2048,
held-out pool = all 256, ``draws`` = 200 (100 at width 256, where only seed 0 runs: the cost),
the draw seed = the cell's seed. One torch thread.

Rows (JSONL, one per (cell, point), appended and fsynced as each finishes; a rerun skips the
finished ones): ``width``, ``seed``, ``cell_id``, ``point``, ``seconds`` and the fields of
``sign_agreement`` (``agree_rate`` with its Wilson interval, ``misaligned_rate``,
``improved_rate``, ``b_exact``, ``b_align``, ``d_align``, ``draws``, ``M``, ``K``, ``eta``).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/sign_agreement.py SWEEP_DIR --out benchmarks/results/llama-interventions/sign.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

M = K = 32
POOL_SEED = 123
N_POOL = 256


def _cells(sweep: Path) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for line in (sweep / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind", "alignment") == "alignment" and r["cell_id"] not in seen:
            seen[r["cell_id"]] = {k: r[k] for k in ("cell_id", "width", "seed", "data_description")}
    return sorted(seen.values(), key=lambda c: (c["width"], c["seed"]))


def _done(out: Path) -> set[tuple[str, str]]:
    if not out.exists():
        return set()
    done = set()
    for line in out.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a torn last line: that point runs again
            continue
        done.add((r["cell_id"], r["point"]))
    return done


def run(sweep: Path, out: Path, *, widest_seeds: tuple[int, ...] = (0,)) -> int:
    from widthscope.checkpoint import load as load_checkpoint
    from widthscope.data import describe, load
    from widthscope.probe import insertion_points
    from widthscope.probe.interventions import sign_agreement

    cells = _cells(sweep)
    config = json.loads((sweep / "sweep.json").read_text())["config"]
    widest = max(w for fam in config["families"] for w in fam["widths"])  # of the sweep, finished or not
    split = load("text", n_train=2048, n_test=256, seed=0, seq_len=64)
    if not all(c["data_description"].endswith(describe(split)) for c in cells):
        raise SystemExit(f"the split differs from the sweep's: {describe(split)!r}")
    g = torch.Generator().manual_seed(POOL_SEED)
    idx = torch.randperm(split.train[0].shape[0], generator=g)[:N_POOL]
    train, test = split.train[0][idx], split.test[0]
    done = _done(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    for c in cells:
        if c["width"] == widest and c["seed"] not in widest_seeds:
            continue
        model = load_checkpoint(sweep / "artifacts" / c["cell_id"]).eval()
        draws = 100 if c["width"] == widest else 200
        for p in insertion_points(model):
            if (c["cell_id"], p) in done:
                continue
            t0 = time.perf_counter()
            res = sign_agreement(model, p, [train], [test], M=M, K=K, draws=draws, seed=c["seed"], progress=False)
            row = {"width": c["width"], "seed": c["seed"], "cell_id": c["cell_id"],
                   "seconds": time.perf_counter() - t0, "pool_seed": POOL_SEED, "n_pool_train": N_POOL, **res}
            with open(out, "a") as f:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
                f.flush()
                os.fsync(f.fileno())
            n += 1
            print(f"width {c['width']} seed {c['seed']} {p}: agree {res['agree_rate']:.3f} "
                  f"({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="the finished llama-interventions sweep directory")
    ap.add_argument("--out", type=Path, required=True, help="JSONL of rows (appended; finished points skipped)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    run(args.sweep, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
