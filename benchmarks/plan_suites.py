"""``--plan`` of the suite commands against the whole process: each command's plan beside the real
run measured by ``/usr/bin/time -v`` (wall clock, maximum resident set size), one torch thread, one
after the other. One row per command in ``benchmarks/results/plan_suites.jsonl`` (the same columns as
``plan_whole_process.jsonl``).

    python benchmarks/plan_suites.py [--out benchmarks/results/plan_suites.jsonl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from plan_whole_process import ROOT, _cli, _env, _plan_row, _size

COMMANDS = {
    "grow-target --quick": ["grow-target", "--quick", "--seeds", "0"],
    "grow-bench --quick": ["grow-bench", "--quick"],
    "linearize configs/linearize-demo.toml": ["linearize", str(ROOT / "configs" / "linearize-demo.toml")],
}


def _last(out: str, what: str) -> str:
    return _plan_row("\n".join(reversed(out.splitlines())), what)


def measure(name: str, argv: list[str], work: Path) -> dict[str, object]:
    t0 = time.perf_counter()
    plan = subprocess.run(_cli([*argv, "--plan"]), env=_env(), capture_output=True, text=True, check=True)
    plan_s = time.perf_counter() - t0
    predicted_s = float(_last(plan.stdout, "predicted wall time (whole process)").split()[0])
    rss = _size(_last(plan.stdout, "predicted peak memory (whole process, RSS)"))
    out = work / name.split()[0]
    run = subprocess.run(
        ["/usr/bin/time", "-v", *_cli([*argv, "--out", str(out)])], env=_env(), capture_output=True, text=True
    )
    if run.returncode:
        raise RuntimeError(run.stderr[-3000:])
    parts = [float(p) for p in _plan_row(run.stderr, "Elapsed (wall clock) time (h:mm:ss or m:ss):").split(":")]
    measured_s = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    measured_rss = int(_plan_row(run.stderr, "Maximum resident set size (kbytes):")) * 1024
    return {
        "command": name,
        "predicted_s": round(predicted_s, 2),
        "measured_s": round(measured_s, 2),
        "time_ratio": round(measured_s / predicted_s, 2),
        "predicted_rss_mib": round(rss / 2**20, 1),
        "measured_rss_mib": round(measured_rss / 2**20, 1),
        "rss_ratio": round(measured_rss / rss, 2),
        "plan_s": round(plan_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_suites.jsonl"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in COMMANDS.items():
            row = measure(name, argv, Path(tmp))
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
