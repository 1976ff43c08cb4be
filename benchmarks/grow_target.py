"""The compute-to-target growth benchmark (a study, not part of ``run_all.py``).

Trains a LLaMA-style target (byte-level text from Python's own files) from
scratch, two small models (half the depth, half the width) continued alone, and every growth
operator × schedule grown from them; reports the FLOPs each needs to reach the from-scratch final
held-out loss, with 95% intervals over 5 seeds. Resumable. The same as ``widthscope grow-target``.

    OMP_NUM_THREADS=1 python benchmarks/grow_target.py [--quick] [--out DIR]
    python benchmarks/grow_target.py --paper-plan configs/grow-target-paper.toml   # predicted GPU cost
    python benchmarks/grow_target.py --recompare DIR   # the judgement again from DIR's rows

Committed rows: benchmarks/results/grow-target/ (docs/growth.md renders them through
benchmarks/docnumbers_growth_target.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from widthscope._io import atomic_write_json, atomic_write_text, read_jsonl
from widthscope.cli import grow_target
from widthscope.errors import WidthscopeError
from widthscope.growth.target_compare import answer, compare
from widthscope.growth.target import plan_cost, read_suite_file, spent_fractions

RESULTS = Path(__file__).resolve().parent / "results" / "grow-target"


def plan(path: str, rows_dir: Path = RESULTS) -> Path:
    """The predicted cost of the suites of ``path`` from the committed CPU rows: ``paper-plan.json``."""
    info = read_suite_file(path)
    rows = read_jsonl(rows_dir / "results.jsonl")
    out = {
        "config": path,
        "sustained_flops": info["sustained_flops"],
        "fractions": spent_fractions(rows),
        "rows": plan_cost(info, spent_fractions(rows)),
    }
    return atomic_write_json(rows_dir / "paper-plan.json", out)


def recompare(rows_dir: str | Path) -> Path:
    """``comparison.jsonl`` and the summary's ``answer`` again from ``results.jsonl`` (the rows stay)."""
    d = Path(rows_dir)
    table = compare(read_jsonl(d / "results.jsonl"))
    atomic_write_text(d / "comparison.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in table))
    summary = json.loads((d / "summary.json").read_text())
    summary["answer"] = answer(table)
    return atomic_write_json(d / "summary.json", summary)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="grow_target.py", description=__doc__.splitlines()[0])
    grow_target.add_arguments(p)
    p.add_argument("--paper-plan", metavar="TOML", help="only predict the cost of a suite file (writes paper-plan.json)")
    p.add_argument("--recompare", metavar="DIR", help="only judge a finished run's rows again")
    args = p.parse_args(argv)
    if args.threads is None:
        args.threads = 1
    try:
        if args.recompare:
            print(f"wrote {recompare(args.recompare)}")
            return 0
        if args.paper_plan:
            print(f"wrote {plan(args.paper_plan)}")
            return 0
        return grow_target.run(args)
    except WidthscopeError as exc:
        print(f"grow_target.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
