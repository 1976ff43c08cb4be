"""``--plan`` of the suite commands against the whole process: each command's plan beside the real
run measured by ``/usr/bin/time -v`` (wall clock, maximum resident set size), one torch thread, one
after the other. One row per command in ``benchmarks/results/plan_suites.jsonl`` (the same columns as
``plan_whole_process.jsonl``).

    python benchmarks/plan_suites.py [--out benchmarks/results/plan_suites.jsonl]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from plan_whole_process import ROOT, plan_and_run

COMMANDS = {
    "grow-target --quick": ["grow-target", "--quick", "--seeds", "0"],
    "grow-bench --quick": ["grow-bench", "--quick"],
    "linearize configs/linearize-demo.toml": ["linearize", str(ROOT / "configs" / "linearize-demo.toml")],
    "sweep configs/demo-mlp.toml": ["sweep", str(ROOT / "configs" / "demo-mlp.toml")],
    "demo --quick": ["demo", "--quick"],
}


def measure(name: str, argv: list[str], work: Path) -> dict[str, object]:
    out = work / name.split()[0]
    return {"command": name, **plan_and_run([*argv, "--plan"], [*argv, "--out", str(out)], last=True)}


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
