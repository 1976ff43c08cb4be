"""The calibration and power of grow-target's verdicts (widthscope.growth.target_compare.compare), by
simulation: per-seed speed-ups log-normal around a true value against from scratch, and a paired
ratio log-normal around a true value against the small model continued alone; one growth label,
5 seeds. Each row: how often the verdict says "holds" in each family.

    python benchmarks/grow_target_power.py [--reps 500]   # writes results/grow_target_power.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from widthscope.growth.target_compare import compare

OUT = Path(__file__).resolve().parent / "results" / "grow_target_power.jsonl"
GRID = [(g, r, sd) for sd in (0.1, 0.2) for g in (1.3, 1.5, 1.8, 2.2) for r in (1.0, 1.2, 1.5)]


def simulated_rows(rng: np.random.Generator, growth: float, ratio: float, sd: float, seeds: int = 5) -> list[dict]:
    g = growth * np.exp(rng.normal(0.0, sd, seeds))
    c = g / (ratio * np.exp(rng.normal(0.0, sd, seeds)))
    base = {"kind": "grow_target", "reached": True, "final_loss": 1.0, "target_loss": 1.0}
    rows = [{**base, "run": "scratch", "seed": s, "speedup": 1.0} for s in range(seeds)]
    rows += [{**base, "run": "continue-depth", "small": "depth", "seed": s, "speedup": float(c[s])} for s in range(seeds)]
    rows += [
        {**base, "run": "op/x", "small": "depth", "operator": "op", "seed": s, "speedup": float(g[s])}
        for s in range(seeds)
    ]
    return rows


def rates(growth: float, ratio: float, sd: float, reps: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    holds = holds_continue = 0
    for _ in range(reps):
        t = {r["run"]: r for r in compare(simulated_rows(rng, growth, ratio, sd))}["op/x"]
        holds += t["verdict"] == "holds"
        holds_continue += t["verdict_continue"] == "holds"
    return {
        "speedup": growth,
        "vs_continue": ratio,
        "seed_sd_log": sd,
        "seeds": 5,
        "reps": reps,
        "holds": holds / reps,
        "holds_continue": holds_continue / reps,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=500)
    args = p.parse_args(argv)
    rows = [rates(g, r, sd, args.reps, seed=i) for i, (g, r, sd) in enumerate(GRID)]
    OUT.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"wrote {OUT} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
