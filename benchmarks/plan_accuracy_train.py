"""How close ``grow --plan`` and ``linearize --plan`` come: predicted against measured time and memory.

For each setting, fresh processes (one torch thread each; imports, the data library and the first
optimizer warmed up on a tiny run of the same command first, so start-up is not counted on either
side, and no other command's work is in the heap: a user's process runs one command; then
``malloc_trim`` gives back what the warm-up freed, so a small run cannot hide in it), as
``plan_accuracy.py`` measures ``certify --plan``:

- ``plan``: :func:`widthscope.growth.plan.plan_grow` or :func:`widthscope.linearization.plan.plan_linearize`
  (timing on);
- ``run``: :func:`widthscope.growth.pipeline.run_grow` or :func:`widthscope.linearization.run.run_sweep` on
  the same settings: its wall time (the measured time);
- ``run-mmap``: the same with ``MALLOC_MMAP_THRESHOLD_=65536`` (glibc returns each freed large block,
  so the peak RSS is what the run holds at once, not what the allocator keeps; slower, so not
  timed): its peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) above the RSS before it
  started (the measured memory: the baseline is the process after imports and warm-up, which is
  the interpreter's and the libraries', not the run's). ``run`` and ``run-mmap`` run ``RUNS`` times, each in
  its own process: the measured time and memory are their medians, the runs recorded (a run of a few MB
  varies by more than 1.2x between identical processes: its small blocks land in whatever holes
  the warm-up left). The default allocator's peak is recorded beside it.
- ``whole-run``: the whole run measured in a fresh process forked from a clean heap, warmed on
  itself (:func:`widthscope.probe.resident.resident_peak`: the run once, then trimmed, then
  measured): no prediction; what a second identical run adds, without the first use of each size
  that the plan's phases count (they are warmed at other sizes).

The grow grid: the built-in MLP (trained 300 steps, then the growth) and LLaMA-like Hugging Face
causal LMs of width 64 and 128 (the models and corpus of ``plan_accuracy.py``). The linearize grid:
the demo sweep's MLPs at a few widths. The plan's memory is ``peak_bytes`` (the largest training step
or phase + what is held beside it; a phase is the larger of its counted bytes and its resident peak
measured in a fresh process, :func:`widthscope.probe.resident.resident_peak`), its time ``predicted_s``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/plan_accuracy_train.py --out benchmarks/results/plan-accuracy-train-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import machine, proc_status, reset_peak  # noqa: E402
from plan_accuracy import _corpus, _save_model  # noqa: E402

GROW = (
    {"name": "grow builtin, compare", "model": "builtin", "steps": 200, "compare": True, "batch_size": 64},
    {"name": "grow llama-64", "model": "w64", "steps": 30, "compare": False, "batch_size": 16},
    {"name": "grow llama-128", "model": "w128", "steps": 30, "compare": False, "batch_size": 32},
)
LINEARIZE = (
    {"name": "linearize widths 32-512", "widths": [32, 64, 128, 256, 512], "seeds": [0], "steps": 60},
    {"name": "linearize widths 16-256, 2 seeds", "widths": [16, 32, 64, 128, 256], "seeds": [0, 1], "steps": 100},
)


def _linearize_config(s: dict[str, Any]) -> dict[str, Any]:
    from widthscope.linearization.config import DEMO_CONFIG

    cfg = json.loads(json.dumps(DEMO_CONFIG))
    cfg.update(widths=s["widths"], seeds=s["seeds"], name="plan-bench")
    cfg["train"] = {**cfg["train"], "steps": s["steps"], "log_steps": [0, 10, s["steps"]]}
    cfg["fit"] = {"steps": [10, s["steps"]]}
    return cfg


def _grow_args(s: dict[str, Any], work: Path) -> tuple[Any, dict[str, Any]]:
    from widthscope.data.spec import InputSpec

    keywords = {"steps": s["steps"], "compare": s["compare"], "batch_size": s["batch_size"]}
    if s["model"] == "builtin":
        return None, keywords
    spec = InputSpec(
        model=str(work / s["model"]),
        data=str(work / "corpus.txt"),
        tokenizer="bytes",
        seq_len=64,
        n_train=256,
        n_test=128,
    )
    return spec, keywords


def _warm_up(work: Path, kind: str, s: dict[str, Any]) -> None:
    """The command's own first calls, on a tiny setting of the same kind (a user's process runs one
    command: another command's warm-up would leave a heap no user's run starts from)."""
    import torch

    from widthscope.data import load

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    load("digits", seed=0)  # its library (scikit-learn) imported before the baseline, as torch and transformers are
    if kind == "grow":
        from widthscope.growth.pipeline import run_grow

        if s["model"] == "builtin":
            run_grow(None, n_train=64, n_test=64, M=8, K=8, steps=2, compare=s["compare"], batch_size=8, show=False)
        else:
            spec, kw = _grow_args({"model": "tiny", "steps": 2, "compare": False, "batch_size": 8}, work)
            run_grow(spec, M=8, K=8, show=False, say=lambda m: None, **kw)
        return
    from widthscope.linearization.run import run_sweep

    cfg = _linearize_config({"widths": [4, 5, 6, 7, 8], "seeds": [0], "steps": 10})
    with tempfile.TemporaryDirectory(dir=work) as warm:  # a fresh folder: a finished sweep would be skipped
        run_sweep(cfg, Path(warm) / "warm-linearize", quiet=True)


def _trim() -> None:
    """Give the allocator's free memory back after the warm-up (glibc ``malloc_trim``): memory the
    warm-up freed stays resident otherwise, and a small run reuses it without its RSS growing (the
    built-in model's whole run fitted in it)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def worker(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    work = Path(a.work)
    kind, s = ("grow", GROW[a.index]) if a.grid == "grow" else ("linearize", LINEARIZE[a.index])
    _warm_up(work, kind, s)
    _trim()
    if a.worker == "whole-run":
        import functools

        from _common import sweep_in_fresh_folder
        from widthscope.probe.resident import resident_peak

        if kind == "grow":
            from widthscope.growth.pipeline import run_grow

            spec, kw = _grow_args(s, work)
            whole = functools.partial(run_grow, spec, show=False, **kw)
        else:
            whole = functools.partial(sweep_in_fresh_folder, _linearize_config(s), str(work))
        got = resident_peak(whole)
        out = {"peak_bytes": got.peak, "where": got.where, "why": got.why}
    elif a.worker == "plan":
        t0 = time.perf_counter()
        if kind == "grow":
            from widthscope.growth.plan import plan_grow

            spec, kw = _grow_args(s, work)
            plan = plan_grow(spec, **kw)
        else:
            from widthscope.linearization.plan import plan_linearize

            plan = plan_linearize(_linearize_config(s))
        out = {"plan": plan.to_dict(), "plan_s": time.perf_counter() - t0}
    else:
        # a folder of its own per run: a finished sweep in the folder of an earlier run would be skipped
        fresh = Path(tempfile.mkdtemp(dir=work, prefix=f"linearize-{a.index}-{a.worker}-"))
        baseline = proc_status("VmRSS")
        reset = reset_peak()
        t0 = time.perf_counter()
        if kind == "grow":
            from widthscope.growth.pipeline import run_grow

            spec, kw = _grow_args(s, work)
            run_grow(spec, show=False, say=lambda m: None, **kw)
        else:
            from widthscope.linearization.run import run_sweep

            run_sweep(_linearize_config(s), fresh / "sweep", quiet=True)
        out = {
            "run_s": time.perf_counter() - t0,
            "peak_above_baseline_bytes": proc_status("VmHWM") - baseline if reset else None,
        }
    Path(a.result).write_text(json.dumps(out))


WORKERS = ("plan", "run", "run-mmap", "whole-run")
RUNS = 3  # run and run-mmap processes per setting: the measured time and memory are their medians


def _cell(work: Path, grid: str, index: int) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for what in (w for w in WORKERS for _ in range(RUNS if w in ("run", "run-mmap") else 1)):
        result = work / f"{grid}-{index}-{what}.json"
        cmd = [sys.executable, __file__, "--worker", what, "--work", str(work), "--grid", grid]
        cmd += ["--index", str(index), "--result", str(result)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        if what == "run-mmap":
            env["MALLOC_MMAP_THRESHOLD_"] = "65536"
        subprocess.run(cmd, check=True, env=env)
        got.setdefault(what, []).append(json.loads(result.read_text()))
    plan, whole = got["plan"][0]["plan"], got["whole-run"][0]
    times = [g["run_s"] for g in got["run"]]
    peaks = [g["peak_above_baseline_bytes"] for g in got["run-mmap"]]
    held = statistics.median(peaks) if None not in peaks else None
    s = (GROW if grid == "grow" else LINEARIZE)[index]
    return {
        "grid": grid,
        "name": s["name"],
        "setting": s,
        "parameters": plan["parameters"],
        "train_flops": plan["train_flops"],
        "predicted_s": plan["predicted_s"],
        "measured_s": statistics.median(times),
        "time_ratio": plan["predicted_s"] / statistics.median(times),
        "measured_runs_s": times,
        "predicted_bytes": plan["peak_bytes"],
        "measured_peak_bytes": held,
        "memory_ratio": plan["peak_bytes"] / held if held else None,
        "measured_peak_runs_bytes": peaks,
        "memory_ratio_range": [plan["peak_bytes"] / max(peaks), plan["peak_bytes"] / min(peaks)] if held else None,
        "whole_run_fresh_process_bytes": whole["peak_bytes"],
        "whole_run_where": whole["where"] or whole["why"],
        "measured_peak_default_malloc_bytes": [g["peak_above_baseline_bytes"] for g in got["run"]],
        "run_mmap_s": got["run-mmap"][0]["run_s"],
        "plan_s": got["plan"][0]["plan_s"],
        "plan": plan,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--worker", choices=WORKERS, default=None)
    p.add_argument("--work", default=None)
    p.add_argument("--grid", choices=("grow", "linearize"), default="grow")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--result", default=None)
    p.add_argument(
        "--only", default="", help="comma-separated parts of setting names: run those only (a check; no --out)"
    )
    a = p.parse_args(argv)
    if a.only and a.out:
        p.error("--only runs part of the grid: it writes no --out")
    if a.worker:
        worker(a)
        return {}

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-train-") as tmp:
        work = Path(tmp)
        _corpus(work / "corpus.txt")
        for name, w in (("tiny", 16), ("w64", 64), ("w128", 128)):
            _save_model(work / name, w)
        wanted = [w for w in a.only.split(",") if w]
        grid = [("grow", i, s) for i, s in enumerate(GROW)] + [("linearize", i, s) for i, s in enumerate(LINEARIZE)]
        rows = [_cell(work, g, i) for g, i, s in grid if not wanted or any(w in s["name"] for w in wanted)]
    result = {
        "setting": {
            "grow": "LlamaForCausalLM, 4 blocks, FFN 4x width, 4 heads, vocabulary 512, float32, 256 + 128 sequences "
            "of 64 byte tokens, M = K = 32, line-search criterion; the built-in MLP on digits",
            "linearize": "the demo sweep (configs/linearize-demo.toml: depth-2 ReLU MLPs, NTK parametrization, "
            "digits 128 + 128, float64, alphas 0 and -1, correlations C02 and C11) at other widths, seeds, steps",
        },
        "rows": rows,
        "total_s": time.perf_counter() - t0,
        "machine": machine(),
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        runs = [round((p or 0) / 1e6, 1) for p in r["measured_peak_runs_bytes"]]
        whole = (r["whole_run_fresh_process_bytes"] or 0) / 1e6
        print(
            f"{r['name']}: time {r['predicted_s']:.1f}/{r['measured_s']:.1f} s = {r['time_ratio']:.2f}x, memory "
            f"{r['predicted_bytes'] / 1e6:.1f}/{(r['measured_peak_bytes'] or 0) / 1e6:.1f} MB = "
            f"{r['memory_ratio'] or float('nan'):.2f}x (runs {runs} MB; whole run in a fresh process {whole:.1f} MB; "
            f"plan {r['plan_s']:.1f} s)"
        )
    return result


if __name__ == "__main__":
    main()
