"""What the growth ranking adds to a run's memory, against the plan's measurement of it, warmed on itself
or at another size (docs/big-models.md, "Training plans").

``grow --plan`` measures the ranking (:func:`widthscope.growth.plan._ranking_peak`) in a fresh process
(:func:`widthscope.probe.resident.resident_peak`): the work run once to warm up, trimmed, then run
again and measured. Warmed on itself, what a size fills on its first use (the allocator's pools,
kernels' buffers) is filled before the measurement; the run ranks at its size once, and pays it.
On the built-in MLP with ``plan_accuracy_train.py``'s settings (``grow --compare``, batch 64), at the
run's pools, for the first and the last point:

- ``on_itself``: warmed on the same work (the plan's protocol before);
- ``elsewhere``: warmed at half the ranking's smallest measured size (the plan's protocol now);
- ``plan_on_itself``, ``plan_elsewhere``: the plan's extrapolated ranking term each way;
- ``in_run``: ``run_grow``'s own ranking call, its peak resident set above the resident set before
  it, in ``RUNS`` processes started as ``plan_accuracy_train.py`` starts its memory runs
  (``MALLOC_MMAP_THRESHOLD_=65536``, the same command's tiny run first, then trimmed).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/ranking_warm.py --out benchmarks/results/ranking-warm-cpu.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import proc_status, reset_peak  # noqa: E402
from plan_accuracy_train import GROW, _trim, _warm_up  # noqa: E402

SETTING = GROW[0]  # the built-in MLP
RUNS = 3


def _in_run(result: Path) -> None:
    """One process as the benchmark's memory run: the ranking call's peak above the resident set before it."""
    import torch

    import widthscope.growth.pipeline as pipeline

    torch.set_num_threads(1)
    _warm_up(result.parent, "grow", SETTING)
    _trim()
    rank, got = pipeline.rank_points, []

    def measured(*args: Any, **kwargs: Any) -> Any:
        before = proc_status("VmRSS")
        reset_peak()
        out = rank(*args, **kwargs)
        got.append(proc_status("VmHWM") - before)
        return out

    pipeline.rank_points = measured
    kw = {k: SETTING[k] for k in ("steps", "compare", "batch_size")}
    pipeline.run_grow(None, show=False, say=lambda m: None, **kw)
    result.write_text(json.dumps(got))


def _planned() -> dict[str, Any]:
    import torch

    from widthscope.growth import plan
    from widthscope.growth.inputs import builtin_inputs
    from widthscope.growth.options import GrowOptions
    from widthscope.growth.pipeline import _split_pools
    from widthscope.probe.intervene import index_batch
    from widthscope.probe.points import resolve_points
    from widthscope.probe.resident import resident_peak

    torch.set_num_threads(1)
    opts = GrowOptions(steps=SETTING["steps"], compare=SETTING["compare"], batch_size=SETTING["batch_size"])
    model, _, (train, test) = builtin_inputs(opts.seed, None, None)
    pools = _split_pools(model, train, test, opts, None)
    names = resolve_points(model, opts.points)
    widths = plan._widths(model, names, index_batch(pools.probe_train, slice(0, 1)), None)
    _, _, (a0, b0), small = plan.ranking_sizes(pools, opts)
    points = {}
    for p in dict.fromkeys([names[0], names[-1]]):
        work = functools.partial(
            plan._rank, model, *plan._sub_pools(pools, pools.n_train, pools.n_rank), [p], opts, None
        )
        warm = functools.partial(plan._rank, model, *plan._sub_pools(pools, a0, b0), [p], small, None)
        points[p] = {"on_itself": resident_peak(work).peak, "elsewhere": resident_peak(work, warm=warm).peak}
    return {
        "pools": [pools.n_train, pools.n_rank],
        "warm_size": [a0, b0],
        "points": points,
        "plan_on_itself": plan._ranking_peak(
            model, names, widths, pools, opts, None, lambda f, w: resident_peak(f).peak
        ),
        "plan_elsewhere": plan._ranking_peak(model, names, widths, pools, opts, None, plan._peak_measured),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--in-run", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.in_run:
        _in_run(Path(a.in_run))
        return {}
    runs = []
    with tempfile.TemporaryDirectory(prefix="ranking-warm-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
        for i in range(RUNS):
            out = Path(tmp) / f"run-{i}.json"
            subprocess.run([sys.executable, __file__, "--in-run", str(out)], check=True, env=env)
            runs.append(max(json.loads(out.read_text())))
    result = {"setting": SETTING, **_planned(), "in_run_runs": runs, "in_run": statistics.median(runs)}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
