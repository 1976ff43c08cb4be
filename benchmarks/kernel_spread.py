"""How far another CPU code path moves a committed growth cell: the tolerance the reproduction test uses.

A committed row was computed on one machine's kernels (``env_cpu_capability`` in the row). Another
machine of the same kind may report AVX512 where this one reports AVX2, and then torch and MKL run
other kernels: sums in another order, so after a few hundred training steps the gains differ in the
third significant digit. This script reruns the recorded teacher-last seed-0 growth cell under
several kernel selections (environment variables read when torch loads, so one subprocess each),
and records every column's largest absolute and relative spread over them.

    python benchmarks/kernel_spread.py          # rerun, write benchmarks/results/kernel-spread.json

``tests/test_growbench.py`` compares a fresh run with the committed rows within a tolerance derived
from these rows (a stated multiple of the measured spread), never at printed precision.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "kernel-spread.json"
COLUMNS = ("loss_before", "gain_long", "gain_long_A", "gain_continue_long", "gain_all_long", "gain_gradmax_long")
# Kernel selections reachable on one machine: torch's dispatch (ATen) and MKL's instruction set.
PATHS = {
    "native": {},
    "avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "default": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"},
}
_CELL = """
import json
from widthscope.growth.bench import run_cell
from widthscope.growth.suite import cells
import torch
c = next(c for c in cells("full") if c["model"] == "teacher-last" and c["seed"] == 0)
rows = run_cell(c)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                  "rows": [{k: r[k] for k in ("point",) + COLUMNS} for r in rows]}))
"""


def run_path(name: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **PATHS[name]}
    code = f"COLUMNS = {COLUMNS!r}\n" + _CELL
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    return {"path": name, **json.loads(out.strip().splitlines()[-1])}


def spread(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per column: the largest |a - b| and |a - b| / max(|a|, |b|) over pairs of runs and points."""
    res = {}
    for col in COLUMNS:
        ab, rel = 0.0, 0.0
        for i, a in enumerate(runs):
            for b in runs[i + 1:]:
                for ra, rb in zip(a["rows"], b["rows"]):
                    d = abs(ra[col] - rb[col])
                    ab = max(ab, d)
                    rel = max(rel, d / max(abs(ra[col]), abs(rb[col]), 1e-300))
        res[col] = {"abs": ab, "rel": rel}
    return res


def main() -> None:
    runs = [run_path(name) for name in PATHS]
    for r in runs:
        print(r["path"], r["capability"], [round(x["gain_gradmax_long"], 4) for x in r["rows"]], file=sys.stderr)
    OUT.write_text(json.dumps({"runs": runs, "spread": spread(runs)}, indent=1, sort_keys=True) + "\n")
    print(json.dumps(spread(runs), indent=1))


if __name__ == "__main__":
    main()
