"""``widthscope demo``: alignment width sweeps of LLaMA decoders on byte text and ReLU MLPs on
Fashion-MNIST (else digits), the linearization sweep, then the HTML report (resumable; ``quick``:
seconds). :data:`DEMO_LLAMA` and :data:`DEMO_MLP` are ``configs/demo-*.toml``, embedded."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import report as wreport  # report, load_results looked up at call time (tests replace them)
from ._env import torch_threads
from ._io import atomic_write_json
from .errors import WidthscopeError
from .options import Options, option
from .validate import check_dir_writable

if TYPE_CHECKING:
    from .planning import Plan


@dataclasses.dataclass(frozen=True)
class DemoOptions(Options):
    """The settings of ``widthscope demo`` (:func:`run_demo`; the results folder is not a setting)."""

    quick: bool = option(False, help="seconds-long smoke version")
    no_linear: bool = option(False, help="skip the linearization part")
    no_progress: bool = option(False, help="no progress bars inside cells")
    threads: int | None = option(
        1,
        kind="int",
        lo=1,
        hi=4096,
        unit="threads",
        metavar="N",
        help="torch CPU threads (default 1: these small models gain little from more, and "
        "busy cores make extra threads 10-20x slower)",
    )  # None (Python only): leave torch's default


DEMO_LLAMA: dict[str, Any] = {
    "sweep": {
        "name": "demo-llama",
        "out_dir": "widthscope-results/demo/llama",
        "seeds": [0, 1],
        "M": [8, 16, 32, 64],
        "draws": 1000,
        "estimator": "unbiased",
        "pool": "sum",
    },
    "family": [
        {
            "name": "llama",
            "widths": [32, 64, 128, 256],
            "dataset": "text",
            "data_options": {"seq_len": 64, "max_bytes": 1000000},
            "n_train": 2048,
            "n_test": 128,
            "model_options": {"depth": 4, "max_seq_len": 256},
            "train": {
                "steps": 150,
                "lr": 3e-3,
                "batch_size": 16,
                "warmup": 0.1,
                "clip": 1.0,
                "optimizer": "adamw",
                "train_eval_examples": 256,
            },
            "certify": {"n_probe_train": 128, "n_probe_test": 128, "batch_size": 32},
            # held-out text of the corpus, and English prose at a longer probe length
            "probes": [{"name": "in-domain"}, {"name": "shifted", "data": "prose", "seq_len": [256]}],
            # Alignment over training: the shifted pools at the training length, 6 log-spaced steps.
            "monitor": {
                "probe": "shifted",
                "seq_len": 64,
                "points": ["model.layers.1", "model.layers.3"],
                "n_train": 48,
                "n_test": 48,
                "M": 32,
                "delta": 0.1,
            },
        }
    ],
}
DEMO_MLP: dict[str, Any] = {
    "sweep": {
        "name": "demo-mlp",
        "out_dir": "widthscope-results/demo/mlp",
        "seeds": [0, 1],
        "M": [8, 16, 32, 64],
        "draws": 1000,
    },
    "family": [
        {
            "name": "mlp",
            "widths": [16, 32, 64, 128, 256],
            "dataset": "fashion-mnist",
            "data_options": {"flatten": True},
            "n_train": 4096,
            "n_test": 256,
            "model_options": {"depth": 3, "activation": "relu"},
            "train": {"steps": 300, "lr": 1e-3, "batch_size": 64, "warmup": 0.05, "train_eval_examples": 1024},
            "certify": {"n_probe_train": 256, "n_probe_test": 256, "batch_size": 64},
        }
    ],
}


def _image_dataset() -> str:
    """'fashion-mnist' when its files load, else 'digits' (always available via scikit-learn)."""
    from . import data  # noqa: PLC0415  start-up time: torch

    try:
        data.load("fashion-mnist", n_train=8, n_test=8, flatten=True)
        return "fashion-mnist"
    except (WidthscopeError, ImportError, OSError):
        return "digits"


def demo_configs(
    quick: bool = False, image_dataset: str | None = None, threads: int | None = None
) -> list[dict[str, Any]]:
    """The alignment sweep configs the demo runs (deep copies; ``quick`` shrinks them to seconds; ``threads``:
    torch threads, ``None``: as configured)."""
    llama, mlp = copy.deepcopy(DEMO_LLAMA), copy.deepcopy(DEMO_MLP)
    for cfg in (llama, mlp) if threads else ():
        cfg["sweep"]["threads"] = threads
    ds = image_dataset or _image_dataset()
    if ds != "fashion-mnist":
        fam = mlp["family"][0]
        fam.update(dataset=ds, data_options={}, n_train=1024, n_test=256)
    if quick:
        for cfg in (llama, mlp):
            cfg["sweep"].update(seeds=[0], M=[4, 8], draws=200)
            cfg["sweep"]["name"] += "-quick"
            fam = cfg["family"][0]
            fam["certify"].update(n_probe_train=16, n_probe_test=16, batch_size=16)
            fam["train"].update(steps=8, batch_size=8)
            fam["n_test"] = 16
        llama["family"][0].update(
            widths=[16, 32], n_train=64, model_options={"depth": 2}, data_options={"seq_len": 16, "max_bytes": 100000}
        )
        llama["family"][0]["monitor"].update(
            n_train=16, n_test=16, M=8, seq_len=16, points=["model.layers.0", "model.layers.1"]
        )
        mlp["family"][0].update(widths=[8, 16], n_train=64, model_options={"depth": 2, "activation": "relu"})
    return [llama, mlp]


def _linear_config(quick: bool) -> dict[str, Any]:
    from .linearization.config import DEMO_CONFIG  # noqa: PLC0415  start-up time: torch

    cfg = copy.deepcopy(DEMO_CONFIG)
    if quick:  # the smallest grid the linearization sweep accepts (>= 5 geometric widths)
        cfg.update(name=f"{cfg.get('name', 'linearize')}-quick", widths=[4, 8, 16, 32, 64], seeds=[0])
        cfg["data"] = {**cfg.get("data", {}), "n_train": 32, "n_test": 32}
        cfg["train"] = {**cfg.get("train", {}), "steps": 4, "log_steps": [0, 4]}
        cfg["correlations"] = {**cfg.get("correlations", {}), "measure": ["C02"], "n_tuples": 2}
        cfg["fit"] = {"steps": [4]}
    return cfg


def _failed(failed: list[str], part: str, exc: Exception) -> None:
    """Record and show a part's failure (a traceback for anything but a WidthscopeError)."""
    failed.append(f"{part}: {type(exc).__name__}: {exc}")
    print(f"  failed: {exc}", file=sys.stderr)
    if not isinstance(exc, WidthscopeError):
        traceback.print_exc()


def _out(out_dir: str | Path | None, quick: bool) -> Path:
    return Path(out_dir or ("widthscope-results/demo-quick" if quick else "widthscope-results/demo"))


def report_figures(configs: list[dict[str, Any]], linear: bool) -> int:
    """The PNGs the demo's report draws: per alignment sweep 3 per probe condition (d_align, misalignment
    against (M, K) and against width) and 1 for a monitor; 2 for the interventions; 5 for the linearization."""
    per_sweep = [3 * len(f.get("probes") or [{}]) + ("monitor" in f) for c in configs for f in c["family"]]
    return sum(per_sweep) + 2 * bool(configs) + 5 * linear


def plan_demo(
    out_dir: str | Path | None = None,
    *,
    quick: bool = False,
    linear: bool = True,
    threads: int | None = 1,
    time_run: bool = True,
    file=None,
) -> Plan:
    """``widthscope demo --plan``: each part's plan and their sum (nothing is written)."""
    from .planning import (  # noqa: PLC0415  start-up time: torch
        FIXED,
        peak_so_far,
        plan_linearize,
        since_start,
        whole_process,
        work_s,
    )
    from .planning import Plan as Sum  # noqa: PLC0415  start-up time: torch
    from .report.html import figure_seconds  # noqa: PLC0415  start-up time: matplotlib
    from .sweeps.alignment import load_config  # noqa: PLC0415  start-up time: torch
    from .sweeps.run import print_config_plan  # noqa: PLC0415  start-up time: torch

    DemoOptions(quick=quick, no_linear=not linear, threads=threads)  # checked as the run checks them
    file = file or sys.stdout
    say = functools.partial(print, file=file, flush=True)
    out = check_dir_writable(_out(out_dir, quick))  # the run would be refused: the plan says so first
    configs = demo_configs(quick, _image_dataset(), threads)
    n = len(configs) + 2
    parts: list[tuple[str, float | None]] = []
    with torch_threads(threads or None):  # timed as the run runs
        for i, raw in enumerate(configs, 1):
            fam = raw["family"][0]
            say(f"[{i}/{n}] alignment sweep: {fam['name']} on {fam['dataset']}")
            with contextlib.redirect_stdout(file):
                costs = print_config_plan(load_config(raw, out_dir=out / fam["name"]), timed=time_run)
            left = [c for c in costs if c.left]
            untimed = not time_run or any(c.cell_s is None for c in left)
            parts.append((f"{fam['name']} sweep", None if untimed else sum((c.cell_s or 0.0) * c.left for c in left)))
            say()
        say(f"[{n - 1}/{n}] linearization sweep")
        if linear:
            lplan = plan_linearize(_linear_config(quick), time_run=time_run)
            say(lplan.table())
            parts.append(("linearization sweep", work_s(lplan)))
        else:
            say("  skipped (--no-linear)")
        if time_run:  # the report: its figures, each timed as drawn, saved and embedded
            with tempfile.TemporaryDirectory() as tmp:
                first, each = figure_seconds(tmp)
            parts.append(("report", first + (report_figures(configs, linear) - 1) * each))
    fixed = (f"{FIXED} and imports (measured)", since_start() if time_run else None)
    # the parts run one after the other in one process: the peak is this process's, which ran a cell of each
    plan = Sum("demo", "the demo's parts", 0, 0, None, 1, None, parts=(fixed, *parts), peak_bytes=peak_so_far())
    say(
        f"[{n}/{n}] report: {report_figures(configs, linear)} figures"
        + (f", {parts[-1][1]:.3g} s\n" if time_run else "\n")
    )
    say(whole_process(plan.predicted_s, plan.peak_bytes, "cost plan: the whole demo (its parts + the process's start)"))
    return plan


def run_demo(
    out_dir: str | Path | None = None,
    *,
    quick: bool = False,
    linear: bool = True,
    show_progress: bool = True,
    threads: int | None = 1,
    file=None,
) -> Path:
    """Run every demo part into ``out_dir`` and write the report; a failed part raises at the end."""
    from .report.alignment import summary  # noqa: PLC0415  start-up time: numpy
    from .sweeps.alignment import load_config, run_sweep  # noqa: PLC0415  start-up time: torch
    from .sweeps.results import print_summary  # noqa: PLC0415  start-up time: torch

    opts = DemoOptions(  # checked before any work, recorded in DIR/demo.json
        quick=quick, no_linear=not linear, no_progress=not show_progress, threads=threads
    )
    file = file or sys.stdout
    out = _out(out_dir, quick)
    parts: list[Path] = []
    failed: list[str] = []
    t_start = time.perf_counter()
    image_ds = _image_dataset()  # once: the configs and the report's note both follow it
    configs = demo_configs(quick, image_ds, threads)
    n_parts = len(configs) + 1
    say = functools.partial(print, file=file, flush=True)
    for i, raw in enumerate(configs, 1):
        fam = raw["family"][0]
        sub = out / fam["name"]
        say(
            f"[{i}/{n_parts + 1}] alignment sweep: {fam['name']} on {fam['dataset']}, widths "
            f"{fam['widths']}, seeds {raw['sweep']['seeds']} -> {sub}"
        )
        t0 = time.perf_counter()
        try:
            res = run_sweep(load_config(raw, out_dir=sub), sub, show_progress=show_progress)
        except Exception as exc:  # keep going: the other parts and the report are still useful
            _failed(failed, f"{fam['name']} sweep", exc)
            continue
        parts.append(sub)
        print_summary(res.rows, sub, file=file)
        say(f"  ({time.perf_counter() - t0:.0f} s)\n")

    say(f"[{n_parts}/{n_parts + 1}] linearization sweep")
    if not linear:
        say("  skipped (--no-linear)")
    else:
        from .linearization import run as lsweep  # noqa: PLC0415  start-up time: torch

        sub, t0 = out / "linearize", time.perf_counter()
        try:
            with torch_threads(threads or None):
                lsweep.run_sweep(_linear_config(quick), sub)
            parts.append(sub)
            say(f"  ({time.perf_counter() - t0:.0f} s)\n")
        except Exception as exc:
            _failed(failed, "linearization sweep", exc)

    say(f"[{n_parts + 1}/{n_parts + 1}] report")
    if not parts:
        raise WidthscopeError("every demo part failed: " + "; ".join(failed))
    notes = [f"part failed: {f}" for f in failed]
    if image_ds != "fashion-mnist":
        notes.insert(
            0,
            f"MLP part: {image_ds}, because Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist "
            "puts it in /usr/share/datasets/fashion-mnist)",
        )
    page = wreport.report(parts, out / "report", title="widthscope demo" + (" (quick)" if quick else ""), notes=notes)
    record = {"options": {"demo": opts.to_dict()}, "report": str(page), "parts": [str(p) for p in parts]}
    atomic_write_json(out / "demo.json", {**record, "failed": failed})
    from .report.claims import claims  # noqa: PLC0415  start-up time: scipy

    rows = wreport.load_results(parts)  # the page's claims (all rows): the console verdict quotes the page
    for line in summary([r for r in rows if r.get("kind") == "alignment"], found=claims(rows)):
        print("  " + line, file=file)
    say(f"\nreport: {page}\n(open it in a browser; total {time.perf_counter() - t_start:.0f} s)")
    if failed:
        raise WidthscopeError("demo finished with failures (report written to " + str(page) + "): " + "; ".join(failed))
    return page
