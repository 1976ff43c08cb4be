"""Cost plans of the growth benchmarks (``grow-bench --plan``, ``grow-target --plan``;
widthscope.growth.bench_plan, widthscope.growth.target_run_plan).

Oracles: a stage's FLOPs per step against ``FlopCounterMode`` on a real training step of the same
model, built the way the benchmark's cell builds it (``grow.block.step_flops``, the cell's count;
``grow.target.model_flops``, the compute-to-target benchmark's budget count); parameters against
``sum(p.numel())``; the exact step counts (equal-FLOPs continue runs, continue-small to ``cap · B``)
against the benchmark's own rules. The commands print the plan, exit 0, train and write nothing,
and a bad option is refused (exit 2) before any work.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from widthscope.growth.bench_plan import SuitePlan, merge_counts, plan_bench, tensor_bytes

sys.path.insert(0, str(Path(__file__).parent))
from cli_run import one_line, run_cli  # noqa: E402

TINY_TARGET = dict(quick=True, seeds=(0,), operators=("stack_copy", "zero_block", "widen"), schedules=("fixed@0.25",))


@pytest.fixture(scope="module")
def bench_plan() -> SuitePlan:
    return plan_bench(quick=True, seeds=(0, 1), time_run=False)


def test_plan_bench_flops_and_parameters_equal_a_real_step(bench_plan):
    """llama-16 of the quick suite: the cell's model, its grown copies and its equal-FLOPs steps."""
    from widthscope.growth.block import step_flops
    from widthscope.growth.cell import _grown
    from widthscope.growth.suite import build_model, cell_data, cells
    from widthscope.probe.interventions import index_batch

    cell = next(c for c in cells("quick", (0,)) if c["model"] == "llama-16")
    train, _, _, _ = cell_data(cell)
    torch.manual_seed(0)
    model = build_model(cell, cell["depth"])
    bs = cell["batch_size"]
    batch = index_batch(train, slice(0, bs))
    plan = next(p for p in bench_plan.plans if p.model == "llama-16")
    assert plan.parameters == sum(p.numel() for p in model.parameters())
    stages = {s.name.split(" (")[0]: s for s in plan.stages}
    f_orig = step_flops(model, batch)
    assert stages["continue"].flops_per_example * bs == f_orig
    assert stages["base training"].flops_per_example * bs == f_orig
    f_block, f_all = [], []
    for p in model.widthscope_points:
        g, prm = _grown(model, p, cell["width"], None, 0)
        for q in g.parameters():
            q.requires_grad_(any(q is r for r in prm))
        f_block.append(step_flops(g, batch))
        for q in g.parameters():
            q.requires_grad_(True)
        f_all.append(step_flops(g, batch))
    assert stages["new block"].flops_per_example * bs == pytest.approx(sum(f_block) / len(f_block), abs=bs)
    assert stages["new block"].runs == 2 * len(f_block) * (3 + 2)  # seeds x points x (lr grid + other block seeds)
    # the continue runs last as long as the point that needs the most steps for the block's FLOPs
    assert stages["continue"].steps == max(max(1, round(cell["long"] * fb / f_orig)) for fb in f_block)
    assert stages["continue"].runs == 2 * len(cell["continue_lrs"])
    assert stages["base training"].bound and stages["base training"].steps == cell["max_steps"]
    n_all = [max(1, round(cell["long"] * fb / fa)) for fb, fa in zip(f_block, f_all)]
    per_seed = stages["grow-then-train-all"].flops / 2
    assert per_seed == pytest.approx(sum(n * fa for n, fa in zip(n_all, f_all)), rel=0.15)


def test_suite_plan_totals_and_dict(bench_plan):
    assert [p.model for p in bench_plan.plans] == ["llama-16", "mlp-32", "teacher-student", "teacher-last"]
    assert bench_plan.cells == 8 and bench_plan.predicted_s is None
    assert bench_plan.train_flops == sum(s.flops for p in bench_plan.plans for s in p.stages)
    d = bench_plan.to_dict()
    assert d["train_flops"] == bench_plan.train_flops and len(d["plans"]) == 4
    assert d["peak_bytes"] == max(p.peak_bytes for p in bench_plan.plans)
    table = bench_plan.table()
    assert "grow-bench (quick): the run in total" in table and "total (8 cells)" in table
    assert "no time predicted" in table
    # the teacher cases are trained as built: no base training; the MLP has its from-scratch baseline
    names = {p.model: [s.name for s in p.stages] for p in bench_plan.plans}
    assert not any(n.startswith("base") for n in names["teacher-student"])
    assert any(n.startswith("scratch") for n in names["mlp-32"])


def test_merge_counts_and_tensor_bytes():
    a = {"flops_forward": 10, "flops_backward": 20, "activation_bytes_per_example": 5, "fixed_bytes": 7}
    b = {"flops_forward": 30, "flops_backward": 40, "activation_bytes_per_example": 9, "fixed_bytes": 3}
    merged, worst = merge_counts([a, b], [1, 3])
    assert worst == 1 and merged["activation_bytes_per_example"] == 9 and merged["fixed_bytes"] == 7
    assert merged["flops_forward"] == round((10 + 90) / 4) and merged["flops_backward"] == round((20 + 120) / 4)
    x = torch.zeros(10, dtype=torch.float64)
    assert tensor_bytes((x, {"y": x[:5]}, [torch.zeros(3, dtype=torch.int64)])) == 80 + 24


def test_plan_target_flops_equal_the_benchmark_count():
    from widthscope.growth.target import TARGET_SUITES, _grow_once, _model, model_flops
    from widthscope.growth.target_run_plan import plan_target

    plan = plan_target(**TINY_TARGET, time_run=False)
    (p,) = plan.plans
    cell = {**TARGET_SUITES["quick"], "seed": 0}
    W, D, w, d, bs = (cell[k] for k in ("width", "depth", "small_width", "small_depth", "batch_size"))
    ids = torch.randint(0, 256, (bs, cell["seq_len"]), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    target = _model(cell, W, D)
    assert p.parameters == sum(q.numel() for q in target.parameters())
    f_t = model_flops(target, ids)
    stages = {s.name.split(" (")[0]: s for s in p.stages}
    assert stages["scratch"].flops_per_example * bs == f_t and stages["scratch"].steps == cell["steps"]
    B = cell["steps"] * f_t
    for kind, (width, depth) in (("depth", (W, d)), ("width", (w, D))):
        f = model_flops(_model(cell, width, depth), ids)
        s = stages[f"continue-{kind}"]
        assert s.flops_per_example * bs == f
        # the run trains while its FLOPs are below cap x B: the first step count that reaches it
        assert s.steps == math.ceil(cell["cap"] * B * (1 - 1e-12) / f)
        assert (s.steps - 1) * f < cell["cap"] * B <= s.steps * f
    assert stages["stack_copy"].flops_per_example * bs == f_t and stages["widen"].flops_per_example * bs == f_t

    class Ctx:
        pass

    ctx = Ctx()
    ctx.cell = cell  # type: ignore[attr-defined]
    grown = _grow_once(ctx, "zero_block", _model(cell, W, d), D, 0).model  # type: ignore[arg-type]
    assert stages["zero_block"].flops_per_example * bs == model_flops(grown, ids)
    assert stages["zero_block"].bound and stages["zero_block"].runs == 1
    # from the earliest growth (a quarter of B) to cap x B, at most
    assert stages["stack_copy"].steps == math.ceil((cell["cap"] - 0.25) * B / f_t)


def test_plan_target_timed_predicts_a_time():
    from widthscope.growth.target_run_plan import plan_target

    plan = plan_target(quick=True, seeds=(0,), operators=("stack_copy",), schedules=("fixed@0.25",), steps=4)
    (p,) = plan.plans
    assert all(s.step_s is not None and s.step_s >= 0 for s in p.stages)
    assert plan.predicted_s is not None and plan.predicted_s >= sum(s.train_s or 0.0 for s in p.stages)
    assert dict(p.other_s)["data (load + split)"] > 0
    start = dict(plan.other_s)["start-up (first optimizer)"]
    assert plan.predicted_s == pytest.approx(p.predicted_s + start, rel=1e-12)
    assert "timed: start-up (first optimizer)" in plan.table()


def test_cli_grow_bench_plan_trains_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import widthscope.cli.grow_bench as cli

    def refuse(*a, **k):
        raise AssertionError("--plan ran the benchmark")

    monkeypatch.setattr(cli, "run_bench", refuse)
    out = tmp_path / "res" / "gb"
    rc, _, cap = run_cli(["grow-bench", "--quick", "--seeds", "0", "--out", str(out), "--plan-no-time"], capsys)
    assert rc == 0, cap.err
    assert "training stages: grow-bench llama-16" in cap.out and "new block" in cap.out
    assert "the run in total" in cap.out and "largest batch that fits" in cap.out
    assert not (tmp_path / "res").exists()


def test_cli_grow_target_plan_trains_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import widthscope.cli.grow_target as cli

    def refuse(*a, **k):
        raise AssertionError("--plan ran the benchmark")

    monkeypatch.setattr(cli, "run_target", refuse)
    out = tmp_path / "res" / "gt"
    argv = ["grow-target", "--quick", "--seeds", "0", "--operators", "widen", "--schedules", "fixed@0.25"]
    rc, _, cap = run_cli(argv + ["--steps", "4", "--out", str(out), "--plan"], capsys)
    assert rc == 0, cap.err
    assert "scratch (target 32 x 2)" in cap.out and "widen (grown" in cap.out
    predicted = next(ln for ln in cap.out.splitlines() if "predicted wall time" in ln).split()[-2]
    assert float(predicted) > 0
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
    import widthscope.growth.bench_plan as bp
    import widthscope.growth.target_run_plan as tp

    def refuse(*a, **k):
        raise AssertionError("planned despite a bad option")

    monkeypatch.setattr(bp, "plan_bench", refuse)
    monkeypatch.setattr(tp, "plan_target", refuse)
    one_line(argv, capsys, msg)


def test_plan_target_suite_file_counts_without_the_device(tmp_path):
    """A suite file for a device this machine lacks: counted (meta), not timed, the budget as plan_cost's."""
    from widthscope.growth.target_plan import plan_cost, read_suite_file
    from widthscope.growth.target_run_plan import plan_target

    if torch.cuda.is_available():
        pytest.skip("the suite's device is here: the plan would time it")
    f = tmp_path / "s.toml"
    f.write_text(
        'device = "cuda"\nseeds = [0, 1]\n[defaults]\nhead_dim = 16\n'
        "[[suite]]\nwidth = 64\nsmall_width = 32\nsteps = 10\n"
    )
    plan = plan_target(suite_file=str(f))
    (p,) = plan.plans
    assert p.predicted_s is None and any("not timed" in n for n in p.notes) and p.counted_on == "meta"
    (row,) = plan_cost(read_suite_file(f), {})
    assert p.stages[0].flops == 2 * row["budget_flops"] and p.parameters == row["parameters"]
