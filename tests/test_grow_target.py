"""The compute-to-target benchmark: schedules, the alignment signal against a per-example oracle,
first-reach FLOPs, the judgement over seeds, and the whole run (tiny suite) end to end, resumed."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats as st

from widthscope.errors import WidthscopeError
from widthscope.growth import options as gopts
from widthscope.growth.schedule import SCHEDULES, Schedule, alignment_signal
from widthscope.growth.target import OPERATORS, model_flops, reach_flops, run_target
from widthscope.growth.target_compare import answer, compare
from widthscope.models import build
from widthscope.probe.insert import insert
from widthscope.stats import certificate, misalignment


# ----------------------------------------------------------------------------- schedules
def test_fixed_and_plateau_schedules():
    s = Schedule("fixed", fractions=(0.15, 0.35))
    assert s.stages == 2 and s.name == "fixed@0.15+0.35"
    assert [s.due(0, f, []) for f in (0.1, 0.15, 0.5)] == [False, True, True]
    assert not s.due(1, 0.3, []) and s.due(1, 0.35, []) and not s.due(2, 0.9, [])
    p = Schedule("plateau", threshold=0.01, patience=2, earliest=0.1, latest=0.8)
    hist = [3.0, 2.0, 1.99, 1.985]  # best of the last two 1.985 > 0.99 * 2.0: no 1% improvement
    assert p.due(0, 0.5, hist) and not p.due(0, 0.5, [3.0, 2.0, 1.9, 1.8])
    assert not p.due(0, 0.05, hist)  # before earliest
    assert p.due(0, 0.8, [3.0, 2.0, 1.0]) and p.forced(0.8) and not p.forced(0.5)


def test_signal_schedule_calls_measure_only_when_needed():
    calls = []

    def measure() -> float:
        calls.append(1)
        return 0.6

    s = Schedule("certificate", threshold=0.5, earliest=0.1, latest=0.7)
    assert not s.due(0, 0.05, [], measure) and not calls
    assert s.due(0, 0.2, [], measure) and len(calls) == 1
    assert not Schedule("certificate", threshold=0.7).due(0, 0.2, [], measure)
    with pytest.raises(WidthscopeError, match="measure"):
        s.due(0, 0.2, [])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(kind="nope"), "choose one of"),
        (dict(kind="fixed", fractions=(0.5, 0.2)), "increasing"),
        (dict(kind="fixed", fractions=(1.5,)), "increasing"),
        (dict(kind="plateau", earliest=0.8, latest=0.5), "earliest"),
        (dict(kind="plateau", threshold=-1.0), "threshold"),
    ],
)
def test_bad_schedules(kw, match):
    with pytest.raises(WidthscopeError, match=match):
        Schedule(**kw)


def test_alignment_signal_matches_per_example_oracle():
    """B_exact of the signal = the certificate of per-example gradients of a zero bias at the point,
    each taken by its own backward pass (float64)."""
    torch.manual_seed(0)
    m = build("llama", 32, depth=2, heads=2, kv_heads=2, head_dim=16, max_seq_len=8).double().eval()
    x = torch.randint(0, 256, (12, 8), generator=torch.Generator().manual_seed(2))
    tr, te = (x[:6], x[:6]), (x[6:], x[6:])
    got = alignment_signal(m, "model.layers.1", tr, te, kind="certificate", M=6, K=6)
    insert(m, "model.layers.1", "bias")
    b = m.get_submodule("model.layers.1").widthscope_insert.bias

    def grads(xs: torch.Tensor) -> torch.Tensor:
        out = []
        for row in xs:
            # the project's per-example loss: the sum over the sequence's predicted tokens
            logits = m(row[None]).logits[0, :-1]
            loss = torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum")
            out.append(torch.autograd.grad(loss, b)[0])
        return torch.stack(out)

    ga, gb = grads(x[:6]), grads(x[6:])
    want = certificate(ga, gb, M=6, K=6).b_exact
    assert got == pytest.approx(min(want, 1.0) if math.isfinite(want) else 1.0, rel=1e-6, abs=1e-9)
    # the misalignment signal: the resampled probability from the same samples (same draws and seed);
    # the two gradient sums differ by rounding, so a draw right at zero could flip: two of 500 allowed
    from widthscope.probe.insert import remove_insertion

    remove_insertion(m, "model.layers.1")
    mis = alignment_signal(m, "model.layers.1", tr, te, kind="misalignment", M=3, K=3, seed=5)
    ref = misalignment(ga, gb, M=3, K=3, draws=500, seed=5)
    assert mis == pytest.approx(ref.probability, abs=2 / 500)


def test_choose_points_is_the_criterion_argmax():
    from widthscope.growth.schedule import choose_points
    from widthscope.probe.growth import point_criteria

    torch.manual_seed(0)
    m = build("llama", 32, depth=3, heads=2, kv_heads=2, head_dim=16, max_seq_len=8).double().eval()
    x = torch.randint(0, 256, (16, 8), generator=torch.Generator().manual_seed(3))
    tr, te = (x[:8], x[:8]), (x[8:], x[8:])
    pts = [f"model.layers.{i}" for i in range(3)]
    got = choose_points(m, pts, tr, te, k=2, criterion="block", M=8, K=8)
    scores = [point_criteria(m, p, tr, te, M=8, K=8, line_search=False)["block_gain"] for p in pts]
    assert got == [pts[i] for i in np.argsort(scores)[::-1][:2]]
    with pytest.raises(WidthscopeError, match="criterion"):
        choose_points(m, pts, tr, te, criterion="nope")
    with pytest.raises(WidthscopeError, match="k=4"):
        choose_points(m, pts, tr, te, k=4)


# ----------------------------------------------------------------------------- FLOPs and reach
def test_reach_flops_interpolates_first_crossing():
    curve = [[0, 5.0], [10, 3.0], [20, 2.0], [30, 1.0], [40, 2.5]]
    assert reach_flops(curve, 2.5) == pytest.approx(15.0, rel=1e-12)
    assert reach_flops(curve, 1.0) == pytest.approx(30.0, rel=1e-12)
    assert reach_flops(curve, 0.5) is None
    assert reach_flops([[0, 1.0]], 2.0) == 0.0


def test_model_flops_matches_the_matmul_count():
    """One training step of two linear maps ``6 → 4 → 3`` on ``n = 5`` rows: ``2·n·(6·4 + 4·3)``
    forward; backward the weight gradients of both and the input gradient of the second only (the
    data needs none): ``2·n·(6·4 + 2·4·3)``. Cached by shape."""

    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(6, 4, bias=False)
            self.head = torch.nn.Linear(4, 3, bias=False)

        def forward(self, x, labels=None):
            class Out:
                pass

            o = Out()
            o.loss = self.head(self.inner(x.double())).pow(2).mean()
            return o

    m = Lin().double()
    x = torch.randn(5, 6)
    cache: dict = {}
    want = 2 * 5 * (6 * 4 + 4 * 3) + 2 * 5 * (6 * 4 + 2 * 4 * 3)
    assert model_flops(m, x, cache) == want
    assert len(cache) == 1 and model_flops(m, x, cache) == want


# ----------------------------------------------------------------------------- judgement
def _rows(label: str, values, reached=None, **kw):
    return [
        {
            "kind": "grow_target",
            "run": label,
            "seed": s,
            "speedup": v,
            "reached": True if reached is None else reached[s],
            "final_loss": 1.0,
            "target_loss": 1.0,
            **kw,
        }
        for s, v in enumerate(values)
    ]


def test_compare_log_t_interval_and_holm():
    a = [2.0, 2.2, 1.8, 2.1, 1.9]
    b = [1.0, 1.4, 0.7, 1.6, 1.2]
    c = [0.5, 0.55, 0.45, 0.5, 0.52]
    rows = (
        _rows("scratch", [1.0] * 5)
        + _rows("continue-depth", c, small="depth")
        + _rows("op/a", a, operator="op")
        + _rows("op/b", b, operator="op")
    )
    t = {r["run"]: r for r in compare(rows)}
    la = np.log(a)
    half = st.t.ppf(0.975, 4) * la.std(ddof=1) / math.sqrt(5)
    assert t["op/a"]["speedup"] == pytest.approx(math.exp(la.mean()), rel=1e-12)
    assert t["op/a"]["speedup_lo"] == pytest.approx(math.exp(la.mean() - half), rel=1e-9)
    assert t["op/a"]["verdict"] == "holds" and t["op/b"]["verdict"] == "not resolved"
    assert t["continue-depth"]["verdict"] == "does not" and t["scratch"]["verdict"] == "reference"
    # Holm over the three tested labels: the adjusted p is at least the raw one, times the rank factor
    ps = sorted(r["p"] for r in t.values() if r["p_holm"] is not None)
    assert min(r["p_holm"] for r in t.values() if r["p_holm"] is not None) == pytest.approx(3 * ps[0], rel=1e-12)
    ans = answer(list(t.values()))
    assert ans["verdict"] == "yes" and ans["holds"] == ["op/a"] and ans["best"] == "op/a"
    assert ans["lower_bound_above"] == ["op/a"]
    no = answer(compare(_rows("op/c", c, operator="op")))
    assert no["verdict"] == "no"


@pytest.mark.parametrize("values", [[0.1, 0.3, 0.2], [1.0, 1.1], [-0.2, 0.4, 0.1, 0.5, 0.3], [0.3, 0.3]])
@pytest.mark.parametrize("region", [(math.log(1.3), math.inf), (0.0, math.inf), (-1.0, 0.25)])
def test_statistics_are_the_claims_pages(values, region):
    """The grow-target verdicts and the claims page use one test (widthscope.stats.seeds)."""
    from widthscope.growth import target_compare
    from widthscope.report import claims as cs
    from widthscope.stats import seeds as tc

    assert cs.seed_test is tc.seed_test is target_compare.seed_test and cs.holm is tc.holm is target_compare.holm

    a, b = tc.seed_test(values, region), cs.seed_test(values, region)
    for key in ("measured", "low", "high", "p"):
        assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15)
    assert a["direction"] == b["direction"]
    assert tc.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx(cs.holm([0.01, 0.04, 0.03, 0.2]), rel=1e-12)


def test_compare_against_continue_small_paired_by_seed():
    cont = [2.0, 1.0, 4.0]
    grow = [1.0, 1.0, 1.0]
    rows = _rows("continue-depth", cont, small="depth") + _rows("op/x", grow, operator="op", small="depth")
    rows[-1]["events"] = [{"flops": 10.0}]
    rows[-1]["reach_flops"] = 5.0  # reached before it grew
    rows[-2]["events"] = [{"flops": 10.0}]
    rows[-2]["reach_flops"] = 20.0
    t = {r["run"]: r for r in compare(rows)}["op/x"]
    logs = np.log(np.array(grow) / np.array(cont))
    half = st.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert t["vs_continue"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert t["vs_continue_hi"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-9)
    assert t["reached_before_growth"] == 1
    # every seed reached before growing: the label measured the small model, and is not judged
    for r in rows[-3:]:
        r["events"], r["reach_flops"] = [{"flops": 10.0}], 5.0
    t = {r["run"]: r for r in compare(rows)}["op/x"]
    assert t["verdict"] == "reached before growing" and t["p_holm"] is None
    assert answer(compare(rows))["best"] is None


def test_option_names_agree_with_the_suite():
    assert tuple(OPERATORS) == ("stack_copy", "stack_zero", "zero_block", "widen")  # the registry's built-ins
    assert gopts.TARGET_SCHEDULES == tuple(SCHEDULES)
    with pytest.raises(WidthscopeError, match="--schedules"):
        gopts.GrowTargetOptions(schedules=("fixed@0.9",))


# ----------------------------------------------------------------------------- end to end
def test_grow_target_end_to_end_and_resume(tmp_path, capsys):
    from widthscope.cli import grow_target

    p = argparse.ArgumentParser()
    grow_target.add_arguments(p)
    argv = [
        "--quick",
        "--seeds",
        "0",
        "--steps",
        "16",
        "--operators",
        "stack_zero,widen",
        "--schedules",
        "fixed@0.25,certificate>0.5",
        "--out",
        str(tmp_path / "gt"),
    ]
    assert grow_target.run(p.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "stack_zero/fixed@0.25" in out and "continue-width" in out and "1.3x less compute" in out
    rows = [json.loads(line) for line in (tmp_path / "gt" / "results.jsonl").read_text().splitlines()]
    labels = {r["run"] for r in rows}
    assert labels == {
        "scratch",
        "continue-depth",
        "continue-width",
        "stack_zero/fixed@0.25",
        "stack_zero/certificate>0.5",
        "widen/fixed@0.25",
        "widen/certificate>0.5",
    }
    by = {r["run"]: r for r in rows}
    s = by["scratch"]
    assert s["speedup"] == 1.0 and s["budget_flops"] == s["flops"]
    # a fixed-schedule run: the small model's steps at its FLOPs, then the grown model's
    g = by["stack_zero/fixed@0.25"]
    ev = g["events"][0]
    small = by["continue-depth"]["flops"] / by["continue-depth"]["steps"]
    assert g["flops"] == pytest.approx(ev["step"] * small + (g["steps"] - ev["step"]) * ev["step_flops"], rel=1e-12)
    assert ev["fraction"] >= 0.25 and ev["exact"] and g["signal_flops"] == 0
    assert g["reached"] == (g["reach_flops"] is not None)
    c = by["widen/certificate>0.5"]
    assert c["signal_flops"] > 0 and c["events"][0]["signal"] is not None or c["forced"]
    summary = json.loads((tmp_path / "gt" / "summary.json").read_text())
    assert summary["answer"]["verdict"] in ("yes", "no", "not resolved", "crossover beyond budget") and summary["ran"] == 1
    # resume: nothing runs again, same table
    res = run_target(tmp_path / "gt", gopts.GrowTargetOptions.from_dict(summary["options"]["grow_target"]))
    assert res["summary"]["ran"] == 0 and res["summary"]["resumed"] == 1
    # another run's options into the same folder: one error line before any work
    with pytest.raises(WidthscopeError, match="another grow-target run"):
        run_target(tmp_path / "gt", quick=True, seeds=(1,), steps=16)


# ----------------------------------------------------------------------------- suite files and the scale plan
_TINY = """
device = "cpu"
seeds = [0, 1]
sustained_flops = 1.0e9
[defaults]
head_dim = 16
seq_len = 8
batch_size = 2
[[suite]]
width = 32
small_width = 16
depth = 2
small_depth = 1
steps = 3
"""


def test_suite_file_and_plan_cost(tmp_path):
    from widthscope.growth.target import plan_cost, read_suite_file, target_model

    f = tmp_path / "s.toml"
    f.write_text(_TINY)
    plan = read_suite_file(f)
    (s,) = plan["suites"]
    assert plan["seeds"] == (0, 1) and s["cap"] == 1.0 and s["device"] == "cpu"
    (row,) = plan_cost(plan, {"scratch": 1.0, "continue-depth": 0.5})
    # the meta-device count equals a count on real tensors of the same model
    x = torch.zeros(2, 8, dtype=torch.long)
    real = model_flops(target_model(s, 32, 2), x)
    assert row["step_flops"] == real and row["budget_flops"] == 3 * real
    assert row["parameters"] == sum(p.numel() for p in target_model(s, 32, 2).parameters())
    n_runs = 1 + 2 + len(s["operators"]) * len(s["schedules"])
    assert row["runs_per_seed"] == n_runs
    assert row["flops_upper"] == pytest.approx(2 * (1 + (n_runs - 1) * 1.0) * 3 * real, rel=1e-12)
    assert row["flops_predicted"] == pytest.approx(2 * (1 + 0.5 + (n_runs - 2)) * 3 * real, rel=1e-12)
    assert row["gpu_hours_upper"] == pytest.approx(row["flops_upper"] / 1e9 / 3600, rel=1e-12)


@pytest.mark.parametrize(
    "change,match",
    [
        ("bogus = 1\n", "unknown key"),
        ("[[suite]]\nwidth = 40\nsmall_width = 16\n", "multiples of head_dim"),
        ("[[suite]]\nwidth = 32\nsmall_width = 16\ndepth = 2\nsmall_depth = 2\n", "small_depth < depth"),
        ("[[suite]]\nwidth = 32\nsmall_width = 16\nfoo = 2\n", "unknown setting"),
    ],
)
def test_bad_suite_files(tmp_path, change, match):
    from widthscope.growth.target import read_suite_file

    f = tmp_path / "s.toml"
    f.write_text(change + _TINY if change.startswith("bogus") else _TINY + change)
    with pytest.raises(WidthscopeError, match=match):
        read_suite_file(f)


def test_paper_config_is_runnable_as_cells():
    from pathlib import Path

    from widthscope.growth.target import suite_cells

    path = Path(__file__).resolve().parent.parent / "configs" / "grow-target-paper.toml"
    cells = suite_cells(gopts.GrowTargetOptions(suite_file=str(path)))
    assert sorted({c["width"] for c in cells}) == [512, 1024, 2048, 3072]
    assert len(cells) == 4 * 5 and all(c["device"] == "cuda" for c in cells)
    with pytest.raises(WidthscopeError, match="choose one"):
        gopts.GrowTargetOptions(quick=True, suite_file=str(path))


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--operators", "bogus"], "--operators 'bogus': choose from"),
        (["--schedules", "fixed@0.9"], "--schedules"),
        (["--seeds", "x"], "--seeds"),
        (["--steps", "1"], "--steps 1"),
        (["--steps", "100", "--tokens-per-param", "20"], "--steps and --tokens-per-param both set the budget"),
        (["--tokens-per-param", "0"], "--tokens-per-param 0"),
        (["--quick", "--suite-file", "configs/grow-target-paper.toml"], "choose one"),
        (["--suite-file", "/nonexistent/s.toml"], "not found"),
    ],
)
def test_bad_command_line_fails_before_work(tmp_path, argv, match):
    from widthscope.cli import grow_target

    p = argparse.ArgumentParser()
    grow_target.add_arguments(p)
    with pytest.raises(WidthscopeError, match=match):
        grow_target.run(p.parse_args([*argv, "--out", str(tmp_path / "gt")]))
    assert not (tmp_path / "gt").exists()


def test_a_new_growth_operator_is_one_function_and_one_registration():
    """docs/architecture.md, "Extending": write the operator, register it, and grow-target runs it."""
    from widthscope.growth.operators import stack_depth
    from widthscope.growth.target import run_target_cell, target_cells
    from widthscope.registry import GROWTH_OPERATORS

    @GROWTH_OPERATORS.register("stack_bottom", axis="depth")
    def stack_bottom(model, size, *, cell, seed):  # copies the *bottom* layers, zeroed, on top
        d = model.config.num_hidden_layers
        return stack_depth(model, list(range(d)) + list(range(size - d)), mode="zero")

    try:
        assert "stack_bottom" in OPERATORS and OPERATORS["stack_bottom"] == "depth"
        opts = gopts.GrowTargetOptions(quick=True, operators=("stack_bottom",))  # the option takes it
        assert opts.operators == ("stack_bottom",)
        cell = {**target_cells("quick", seeds=(0,))[0], "steps": 16, "operators": ["stack_bottom"],
                "schedules": ["fixed@0.25"]}
        rows = {r["run"]: r for r in run_target_cell(cell)}
        grown = rows["stack_bottom/fixed@0.25"]
        assert grown["events"][0]["exact"] and grown["flops"] > 0
    finally:
        GROWTH_OPERATORS.unregister("stack_bottom")
    assert "stack_bottom" not in OPERATORS
    with pytest.raises(WidthscopeError, match="--operators"):
        gopts.GrowTargetOptions(operators=("stack_bottom",))


def _null_rows(rng, growth: float, ratio: float, sd: float = 0.15, seeds: int = 5):
    """Per-seed speed-ups, log-normal around ``growth`` (against from scratch) and with the paired
    ratio to the continue-small run log-normal around ``ratio``."""
    g = growth * np.exp(rng.normal(0.0, sd, seeds))
    c = g / (ratio * np.exp(rng.normal(0.0, sd, seeds)))
    return (
        _rows("scratch", [1.0] * seeds)
        + _rows("continue-depth", list(c), small="depth")
        + _rows("op/x", list(g), operator="op", small="depth")
    )


def test_verdicts_are_calibrated_by_simulation():
    """At the null's boundary (speed-up exactly 1.3 against from scratch, exactly 1 against continuing
    the small model) the verdict says "holds" in at most 5% of 2,000 simulated 5-seed benchmarks, for
    either comparison; at 2x and 1.5x (seed sd 0.15 in log) it resolves most of them (the power at
    other effects: benchmarks/grow_target_power.py, docs/growth.md)."""
    from widthscope.growth.target_compare import compare

    rng = np.random.default_rng(0)
    reps = 2000
    false_scratch = false_continue = 0
    for _ in range(reps):
        t = {r["run"]: r for r in compare(_null_rows(rng, 1.3, 1.0))}["op/x"]
        false_scratch += t["verdict"] == "holds"
        false_continue += t["verdict_continue"] == "holds"
    assert false_scratch / reps <= 0.05 and false_continue / reps <= 0.05
    # the two families are Holm-adjusted together: each p_holm is at least its raw p
    assert t["p_holm"] >= t["p"] and t["p_holm_continue"] >= t["p_continue"]
    power_scratch = power_continue = 0
    for _ in range(500):
        t = {r["run"]: r for r in compare(_null_rows(rng, 2.0, 1.5))}["op/x"]
        power_scratch += t["verdict"] == "holds"
        power_continue += t["verdict_continue"] == "holds"
    assert power_scratch / 500 >= 0.8 and power_continue / 500 >= 0.8


def test_crossover_budget_and_no_headline_beyond_it():
    from widthscope.growth.target_compare import answer, compare, crossover

    # brute force: the first grid point from which big stays at or below small, on a fine grid
    big = [[0, 5.0], [1, 4.0], [2, 2.5], [3, 2.2], [4, 1.5]]
    small = [[0, 5.0], [0.5, 3.5], [1.5, 2.6], [4, 2.0]]
    fine = np.linspace(0.001, 4, 40001)
    d = np.interp(fine, [f for f, _ in big], [v for _, v in big]) - np.interp(fine, [f for f, _ in small], [v for _, v in small])
    last_above = fine[np.nonzero(d > 0)[0].max()]
    assert crossover(big, small) == pytest.approx(last_above, abs=2e-4)
    assert crossover(big, [[0, 5.0], [4, 1.0]]) is None  # ends above: beyond the budget
    # rows: the target model is behind the small one at B in every seed -> no headline
    rows = _rows("scratch", [1.0] * 5, curve=[[0, 5.0], [4, 2.0]], budget_flops=4.0)
    rows += _rows("continue-depth", [0.9] * 5, small="depth", curve=[[0, 5.0], [4, 1.5]])
    rows += _rows("op/x", [1.5, 1.6, 1.55, 1.5, 1.62], operator="op", small="depth")
    table = compare(rows)
    cont = {r["run"]: r for r in table}["continue-depth"]
    assert cont["crossover_beyond"] == 5 and cont["crossover"] is None
    assert answer(table)["verdict"] == "crossover beyond budget"
    # ahead from half the budget on: the crossover is 0.5 B and the headline stands
    for r in rows[5:10]:
        r["curve"] = [[0, 5.0], [2, 3.0], [4, 2.5]]
    rows[:5] = _rows("scratch", [1.0] * 5, curve=[[0, 5.0], [2, 3.0], [4, 2.0]], budget_flops=4.0)
    table = compare(rows)
    cont = {r["run"]: r for r in table}["continue-depth"]
    assert cont["crossover"] == pytest.approx(0.5) and cont["crossover_beyond"] == 0
    assert answer(table)["verdict"] == "yes"


def test_growth_pays_fit_matches_a_general_least_squares_fit():
    """The grid-and-refine fit reaches the residual of scipy's nonlinear least squares on noisy curves
    (to 0.5%), and its decision follows its own extrapolation."""
    from scipy.optimize import curve_fit

    from widthscope.growth.schedule import growth_pays

    rng = np.random.default_rng(1)
    c = np.geomspace(1e3, 1e6, 15)
    for E, A, a in ((1.5, 40.0, 0.4), (0.8, 5.0, 0.2), (2.0, 300.0, 0.7)):
        y = E + A * c**-a + rng.normal(0, 0.003, len(c))
        got = growth_pays(list(zip(c, y)), 1e7, E + 0.01)
        mine = float(((got["floor"] + got["scale"] * c ** -got["alpha"] - y) ** 2).sum())
        (e, s, al), _ = curve_fit(lambda x, e, s, al: e + s * x**-al, c, y, p0=(E, A, a), maxfev=20000)
        ref = float(((e + s * c**-al - y) ** 2).sum())
        assert mine <= ref * 1.005 + 1e-12
        at = got["floor"] + got["scale"] * 1e7 ** -got["alpha"]
        assert got["loss_at_budget"] == pytest.approx(at, rel=1e-12)
        assert got["decision"] == ("grow" if at > E + 0.01 else "continue")


@pytest.mark.parametrize(
    "curve,budget,target,match",
    [
        ([[1, 2.0], [2, 1.9]], 10.0, 1.0, "at least 3 points"),
        ([[1, 2.0], [2, float("nan")], [4, 1.8]], 10.0, 1.0, "finite"),
        ([[1, 2.0], [2, -1.0], [4, 1.8]], 10.0, 1.0, "losses >= 0"),
        ([[1, 2.0, 3.0], [2, 1.9, 3.0], [4, 1.8, 3.0]], 10.0, 1.0, "pairs"),
        ([[1, 2.0], [2, 1.9], [4, 1.8]], 0.0, 1.0, "budget"),
        ([[1, 2.0], [2, 1.9], [4, 1.8]], 10.0, float("inf"), "target"),
    ],
)
def test_growth_pays_refuses_curves_it_would_misread(curve, budget, target, match):
    from widthscope.growth.schedule import growth_pays

    with pytest.raises(WidthscopeError, match=match):
        growth_pays(curve, budget, target)


def test_a_cell_with_an_unknown_operator_is_one_error_before_any_data():
    from widthscope.growth.target import run_target_cell, target_cells

    cell = {**target_cells("quick", seeds=(0,))[0], "operators": ("stack_cpy",)}
    with pytest.raises(WidthscopeError, match="unknown operator/schedule"):
        run_target_cell(cell)
