"""How close ``widthscope demo --plan`` comes to the demo it precedes: predicted against measured time per part.

Two fresh processes (one torch thread each), as a user runs the two commands: ``plan``
(:func:`widthscope.demo.plan_demo`, timing on) and ``run`` (:func:`widthscope.demo.run_demo`, each
part's wall time taken around the call that runs it: the alignment sweeps'
``widthscope.sweeps.alignment.run_sweep``, the linearization part). The report at the end is not
planned; its time is recorded apart. Both write into their own temporary folder.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/plan_accuracy_demo.py --out benchmarks/results/plan-accuracy-demo-cpu.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import machine  # noqa: E402


def _plan(out: Path) -> dict[str, Any]:
    from widthscope.demo import plan_demo

    t0 = time.perf_counter()
    plan = plan_demo(out / "demo", time_run=True, file=io.StringIO())
    return {**plan.to_dict(), "plan_s": time.perf_counter() - t0}


def _run(out: Path) -> dict[str, Any]:
    import widthscope.demo as demo
    import widthscope.sweeps.alignment as alignment

    parts: list[list[Any]] = []
    sweep, linear = alignment.run_sweep, demo._linear_part

    def timed_sweep(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return sweep(cfg, *args, **kwargs)
        finally:
            parts.append([f"{cfg.families[0].name} sweep", time.perf_counter() - t0])

    def timed_linear(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return linear(*args, **kwargs)
        finally:
            parts.append(["linearization sweep", time.perf_counter() - t0])

    alignment.run_sweep, demo._linear_part = timed_sweep, timed_linear
    t0 = time.perf_counter()
    demo.run_demo(out / "demo", show_progress=False, file=io.StringIO())
    return {"parts": parts, "run_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--worker", choices=("plan", "run"), default=None)
    p.add_argument("--work", default=None)
    a = p.parse_args(argv)
    if a.worker:
        import torch

        torch.set_num_threads(1)
        got = _plan(Path(a.work)) if a.worker == "plan" else _run(Path(a.work))
        (Path(a.work) / f"{a.worker}.json").write_text(json.dumps(got))
        return got
    got: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-demo-") as tmp:
        for what in ("plan", "run"):
            work = Path(tmp) / what
            work.mkdir()
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run([sys.executable, __file__, "--worker", what, "--work", str(work)], check=True, env=env)
            got[what] = json.loads((work / f"{what}.json").read_text())
    measured = dict(got["run"]["parts"])
    rows = [
        {
            "part": d["part"],
            "predicted_s": d["predicted_s"],
            "measured_s": measured[d["part"]],
            "time_ratio": d["predicted_s"] / measured[d["part"]],
        }
        for d in got["plan"]["parts"]
    ]
    result = {
        "setting": "widthscope demo (the README's main job): its default settings, 1 torch thread",
        "rows": rows,
        "predicted_s": got["plan"]["predicted_s"],
        "measured_parts_s": sum(r["measured_s"] for r in rows),
        "run_s": got["run"]["run_s"],
        "plan_s": got["plan"]["plan_s"],
        "machine": machine(),
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(f"{r['part']}: {r['predicted_s']:.1f} / {r['measured_s']:.1f} s = {r['time_ratio']:.2f}x")
    print(f"run {result['run_s']:.0f} s (parts {result['measured_parts_s']:.0f} s), plan {result['plan_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
