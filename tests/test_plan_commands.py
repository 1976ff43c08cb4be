"""``--plan`` of the suite commands (``linearize``, ``grow-bench``, ``grow-target``), all built
by :mod:`widthscope.planning` from the same pieces: parameters and weights counted (on the meta device
where the run's models allow), bytes per example counted, one step or cell timed per distinct
shape, the fixed costs of the process once. The commands print the plan, exit 0, train and write
nothing, and a bad option is refused (exit 2) before any work."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch

from widthscope import planning as wplan

sys.path.insert(0, str(Path(__file__).parent))
from cli_run import one_line, run_cli  # noqa: E402


def _predicted(text: str) -> float:
    line = next(ln for ln in text.splitlines() if "predicted wall time (whole process)" in ln)
    return float(re.search(r"\)\s+([0-9.]+(?:e[+-]?[0-9]+)?) s", line).group(1))  # "3.2 s" or "385 s (6.4 min)"


def test_plan_bench_counts_each_model_of_the_suite_once():
    from widthscope.growth.suite import build_model, cells

    plan = wplan.plan_bench(quick=True, seeds=(0, 1), time_run=False)
    counts = dict(plan.counts)
    assert counts["cells"] == len(cells("quick", (0, 1)))
    assert [k for k in counts if k in ("llama-16", "mlp-32", "teacher-student", "teacher-last")] == [
        "llama-16", "mlp-32", "teacher-student", "teacher-last"
    ]  # fmt: skip
    cell = next(c for c in cells("quick", (0,)) if c["model"] == "llama-16")
    torch.manual_seed(0)
    n = sum(p.numel() for p in build_model(cell, cell["depth"]).parameters())
    assert counts["llama-16"].startswith(f"{n:,} parameters") and "x 2 cell(s)" in counts["llama-16"]
    assert plan.predicted_s is None and plan.peak_bytes and plan.bytes_per_example and plan.max_batch
    assert "not predicted" in plan.table() and plan.to_dict()["predicted_s"] is None


def test_plan_target_counts_on_meta_and_times_each_model():
    from widthscope.growth.target import TARGET_SUITES, target_model

    counted = wplan.plan_target(quick=True, seeds=(0,), operators=("widen",), schedules=("fixed@0.25",), time_run=False)
    cell = TARGET_SUITES["quick"]
    torch.manual_seed(0)
    target = target_model(cell, cell["width"], cell["depth"])
    assert counted.parameters == sum(p.numel() for p in target.parameters())
    assert counted.weight_bytes == sum(p.numel() * p.element_size() for p in target.parameters())
    # scratch (steps) + continue-width (to cap x B) + widen from a quarter of B (at most to cap x B)
    steps = int(dict(counted.counts)[f"llama {cell['width']} x {cell['depth']}"].split("; ")[1].split()[0])
    assert steps > cell["steps"] * (1 + cell["cap"] - 0.25)
    timed = wplan.plan_target(quick=True, seeds=(0,), operators=("widen",), schedules=("fixed@0.25",), steps=4)
    assert timed.timed and timed.predicted_s == pytest.approx(sum(t for _, t in timed.parts if t is not None))
    assert timed.parts[0][0].startswith(wplan.FIXED) and timed.parts[0][1] > 0
    assert wplan.work_s(timed) == pytest.approx(timed.predicted_s - timed.parts[0][1])


def test_plan_target_suite_file_counts_without_the_device(tmp_path):
    """A suite file for a device this machine lacks: counted (meta), not timed, the parameters as plan_cost's."""
    from widthscope.growth.target import plan_cost, read_suite_file

    if torch.cuda.is_available():
        pytest.skip("the suite's device is here: the plan would time it")
    f = tmp_path / "s.toml"
    f.write_text(
        'device = "cuda"\nseeds = [0, 1]\n[defaults]\nhead_dim = 16\n'
        "[[suite]]\nwidth = 64\nsmall_width = 32\nsteps = 10\n"
    )
    plan = wplan.plan_target(suite_file=str(f))
    assert plan.predicted_s is None and any("counted, not timed" in n for n in plan.notes)
    (row,) = plan_cost(read_suite_file(f), {})
    assert plan.parameters == row["parameters"]


def test_cli_grow_bench_plan_trains_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import widthscope.cli.grow_bench as cli

    def refuse(*a, **k):
        raise AssertionError("--plan ran the benchmark")

    monkeypatch.setattr(cli, "run_bench", refuse)
    out = tmp_path / "res" / "gb"
    rc, _, cap = run_cli(["grow-bench", "--quick", "--seeds", "0", "--out", str(out), "--plan-no-time"], capsys)
    assert rc == 0, cap.err
    assert "cost plan: grow-bench" in cap.out and "llama-16" in cap.out and "largest batch that fits" in cap.out
    assert "not predicted" in cap.out and not (tmp_path / "res").exists()


def test_cli_grow_target_plan_trains_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import widthscope.cli.grow_target as cli

    def refuse(*a, **k):
        raise AssertionError("--plan ran the benchmark")

    monkeypatch.setattr(cli, "run_target", refuse)
    out = tmp_path / "res" / "gt"
    argv = ["grow-target", "--quick", "--seeds", "0", "--operators", "widen", "--schedules", "fixed@0.25"]
    rc, _, cap = run_cli(argv + ["--steps", "4", "--out", str(out), "--plan"], capsys)
    assert rc == 0, cap.err
    assert "cost plan: grow-target" in cap.out and "llama 32 x 2" in cap.out and _predicted(cap.out) > 0
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["grow-bench", "--plan", "--quick", "--M", "2"], "--M 2: must be >= 4"),
        (["grow-bench", "--plan-no-time", "--seeds", "0,-1"], "--seeds '0,-1'"),
        (["grow-target", "--plan", "--operators", "nope"], "--operators 'nope': choose from"),
        (["grow-target", "--plan", "--quick", "--suite-file", "x.toml"], "--quick and --suite-file"),
    ],
)
def test_cli_plan_refuses_a_bad_option_before_any_work(argv, msg, capsys, monkeypatch):
    import widthscope.cli.grow_bench as gb
    import widthscope.cli.grow_target as gt

    def refuse(*a, **k):
        raise AssertionError("planned despite a bad option")

    monkeypatch.setattr(gb, "plan_bench", refuse)
    monkeypatch.setattr(gt, "plan_target", refuse)
    one_line(argv, capsys, msg)


LINEARIZE = (
    'name = "tiny"\nwidths = [8, 10, 12, 14, 16]\nseeds = [0, 1]\n[data]\nname = "digits"\nn_train = 32\nn_test = 32\n'
    "[train]\nsteps = 5\nalphas = [0.0]\nlog_steps = [0, 5]\n[correlations]\nmeasure = []\n"
)


def test_plan_linearize_times_one_cell_per_width(tmp_path, monkeypatch):
    from widthscope.linearization import run as lrun
    from widthscope.linearization.config import load_toml

    toml = tmp_path / "lin.toml"
    toml.write_text(LINEARIZE)
    ran = []
    real = lrun.run_cell
    monkeypatch.setattr(lrun, "run_cell", lambda cfg, cell: ran.append(cell["width"]) or real(cfg, cell))
    plan = wplan.plan_linearize(load_toml(str(toml)))
    assert ran == [8, 10, 12, 14, 16]  # 10 cells, 5 widths: one timed each
    assert [n for n, _ in plan.parts[1:]] == [f"width {w}: one cell x 2" for w in ran]
    assert plan.predicted_s == pytest.approx(sum(t for _, t in plan.parts if t is not None))
    assert plan.weight_bytes == 2 * 4 * plan.parameters  # float32; the network and its linearization
    counted = wplan.plan_linearize(load_toml(str(toml)), time_run=False)
    assert counted.predicted_s is None and counted.peak_bytes and math.isfinite(counted.bytes_per_example or 0)


def test_cli_linearize_plan_writes_nothing(tmp_path, capsys, monkeypatch):
    toml = tmp_path / "lin.toml"
    toml.write_text(LINEARIZE)
    monkeypatch.chdir(tmp_path)
    rc, _, cap = run_cli(["linearize", str(toml), "--out", str(tmp_path / "runs"), "--plan"], capsys)
    assert rc == 0, cap.err
    assert "cost plan: linearize" in cap.out and "width 16: one cell x 2" in cap.out and _predicted(cap.out) > 0
    assert not (tmp_path / "runs").exists()
