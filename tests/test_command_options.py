"""Typed options of `stats`, `activations`, `linearize`, `demo` and `repair` (issue 30): each
dataclass validates itself (one line naming the flag), round-trips through to_dict/from_dict (and
JSON), and `--config FILE` repeats a recorded run; a file that records no such options is one line,
exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_run import one_line, run_cli
from widthscope.certification.samples import StatsOptions
from widthscope.demo import DemoOptions
from widthscope.errors import WidthscopeError
from widthscope.linearization.activations import ActivationsOptions
from widthscope.linearization.run import LinearizeOptions
from widthscope.repair import RepairOptions

# A sweep of seconds: 5 widths x 1 seed x 1 alpha, 2 steps on 16 digits.
TINY = {
    "name": "tiny-opts",
    "widths": [4, 8, 16, 32, 64],
    "seeds": [0],
    "model": {"depth": 2, "activation": "tanh"},
    "data": {"name": "digits", "n_train": 16, "n_test": 8},
    "train": {"alphas": [0.0], "steps": 2, "log_steps": [0, 2], "dtype": "float64", "probe": 2},
    "correlations": {"measure": ["C02"], "n_tuples": 2},
}


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda: StatsOptions(draws=0), "--draws 0: must be a whole number in 1..1000000 (resamples)"),
        (lambda: StatsOptions(M="4,x"), "--M '4,x': expected comma-separated whole numbers"),
        (lambda: StatsOptions(estimator="mle"), "--estimator 'mle': choose one of unbiased, plugin"),
        (lambda: StatsOptions(samples="s.safetensors", train="a.npy"), "give a samples file or --train/--test"),
        (lambda: ActivationsOptions(K=11), "--K 11: must be a whole number in 1..10"),
        (lambda: ActivationsOptions(names=""), "--names is empty"),
        (lambda: ActivationsOptions(grid=2), "--grid 2: must be a whole number >= 3 (grid points)"),
        (lambda: ActivationsOptions(range=(1.0, -1.0)), "need finite lo < hi"),
        (lambda: ActivationsOptions(range=(0.0,)), "--range 0.0: give two numbers, LO HI"),
        (lambda: LinearizeOptions(shard="3/2"), "--shard '3/2': need 1 <= k <= n"),
        (lambda: LinearizeOptions(sweep={"widths": [8, 16]}), "widths must list at least 5 positive integers"),
        (lambda: LinearizeOptions(sweep=[1, 2]), "the sweep config must be a table of settings"),
        (lambda: DemoOptions(threads=0), "--threads 0: must be a whole number in 1..4096 (threads)"),
        (lambda: DemoOptions(quick="yes"), "--quick 'yes': must be true or false"),
        (lambda: RepairOptions(dry_run=1), "--dry-run 1: must be true or false"),
    ],
)
def test_options_validate_themselves(make, msg):
    with pytest.raises(WidthscopeError) as info:
        make()
    assert msg in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "opts",
    [
        StatsOptions(
            samples="s.safetensors", point="a,b", M=(4, 8), K=(4,), draws=20, seed=3, estimator="plugin", strict=True
        ),
        StatsOptions(train="a.npy", test="b.npy"),
        ActivationsOptions(names=("tanh", "math:sin"), K=3, range=(-2.0, 1.5), grid=101),
        LinearizeOptions(shard="2/3", sweep=TINY),
        DemoOptions(quick=True, no_linear=True, no_progress=True, threads=3),
        DemoOptions(threads=None),
        RepairOptions(dry_run=True),
    ],
)
def test_to_dict_from_dict_round_trip(opts):
    cls = type(opts)
    assert cls.from_dict(opts.to_dict()) == opts
    assert cls.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts  # as a results file keeps it
    with pytest.raises(WidthscopeError, match="unknown setting"):
        cls.from_dict({**opts.to_dict(), "bogus": 1})


def test_list_options_are_normalised():
    assert StatsOptions(M="4, 8").M == (4, 8) and StatsOptions(M=[4]).M == (4,)
    assert ActivationsOptions(names="relu, tanh").names == ("relu", "tanh")
    sweep = dict(TINY)
    opts = LinearizeOptions(sweep=sweep)
    sweep["name"] = "changed"  # the options keep their own copy
    assert opts.sweep is not None and opts.sweep["name"] == "tiny-opts"


# ----------------------------------------------------------------------------- --config repeats a run
@pytest.fixture()
def matrices(tmp_path):
    g = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", g.normal(0.3, 1.0, (40, 5)))
    np.save(tmp_path / "b.npy", g.normal(0.3, 1.0, (30, 5)))
    return tmp_path / "a.npy", tmp_path / "b.npy"


def test_stats_config_repeats_the_run(matrices, tmp_path, capsys):
    a, b = matrices
    first, again, other = tmp_path / "r1.json", tmp_path / "r2.json", tmp_path / "r3.json"
    rc, _, cap = run_cli(
        [
            "stats",
            "--train",
            str(a),
            "--test",
            str(b),
            "--M",
            "4,8",
            "--draws",
            "20",
            "--seed",
            "3",
            "--estimator",
            "plugin",
            "--out",
            str(first),
        ],
        capsys,
    )
    assert rc == 0, cap.err
    r1 = json.loads(first.read_text())
    assert (
        r1["options"]["stats"]
        == StatsOptions(train=str(a), test=str(b), M=(4, 8), draws=20, seed=3, estimator="plugin").to_dict()
    )
    rc, _, cap = run_cli(["stats", "--config", str(first), "--out", str(again)], capsys)
    assert rc == 0, cap.err
    r2 = json.loads(again.read_text())
    # the same inputs through the same code path: identical numbers
    assert {k: r2[k] for k in ("settings", "points", "ranking", "options", "source")} == {
        k: r1[k] for k in ("settings", "points", "ranking", "options", "source")
    }
    # a flag given overrides the recorded value; the rest is kept
    rc, _, cap = run_cli(["stats", "--config", str(first), "--draws", "30", "--out", str(other)], capsys)
    assert rc == 0, cap.err
    r3 = json.loads(other.read_text())
    assert r3["settings"]["draws"] == 30 and r3["settings"]["M"] == [4, 8] and r3["settings"]["seed"] == 3
    assert r3["settings"]["estimator"] == "plugin"


def test_stats_config_sources_given_replace_the_recorded_ones(matrices, tmp_path, capsys):
    a, b = matrices
    cfg = tmp_path / "opts.json"
    cfg.write_text(json.dumps({"stats": {"samples": str(tmp_path / "gone.safetensors"), "M": [4], "draws": 10}}))
    out = tmp_path / "r.json"
    rc, _, cap = run_cli(
        ["stats", "--config", str(cfg), "--train", str(a), "--test", str(b), "--out", str(out)], capsys
    )
    assert rc == 0, cap.err
    res = json.loads(out.read_text())
    assert res["source"] == {"train": str(a), "test": str(b)} and res["settings"]["draws"] == 10


def test_activations_config_repeats_the_run(tmp_path, capsys):
    first, again, other = tmp_path / "a1.json", tmp_path / "a2.json", tmp_path / "a3.json"
    rc, _, cap = run_cli(
        ["activations", "--names", "tanh,relu", "--K", "2", "--grid", "11", "--range", "-2", "1", "--json", str(first)],
        capsys,
    )
    assert rc == 0, cap.err
    r1 = json.loads(first.read_text())
    assert (
        r1["options"]["activations"]
        == ActivationsOptions(names=("tanh", "relu"), K=2, grid=11, range=(-2.0, 1.0)).to_dict()
    )
    assert (r1["K"], r1["range"], r1["grid"]) == (2, [-2.0, 1.0], 11)  # the existing keys, as before
    rc, _, cap = run_cli(["activations", "--config", str(first), "--json", str(again)], capsys)
    assert rc == 0, cap.err
    assert json.loads(again.read_text()) == r1
    rc, _, cap = run_cli(["activations", "--config", str(first), "--K", "3", "--json", str(other)], capsys)
    assert rc == 0, cap.err
    r3 = json.loads(other.read_text())
    assert r3["K"] == 3 and r3["grid"] == 11 and [r["name"] for r in r3["rows"]] == ["tanh", "relu"]


def test_linearize_config_repeats_the_sweep(tmp_path, capsys):
    toml = tmp_path / "tiny.toml"
    toml.write_text(
        'name = "tiny-opts"\nwidths = [4, 8, 16, 32, 64]\nseeds = [0]\n'
        '[model]\ndepth = 2\nactivation = "tanh"\n[data]\nname = "digits"\nn_train = 16\nn_test = 8\n'
        '[train]\nalphas = [0.0]\nsteps = 2\nlog_steps = [0, 2]\ndtype = "float64"\nprobe = 2\n'
        '[correlations]\nmeasure = ["C02"]\nn_tuples = 2\n'
    )
    first, again = tmp_path / "o1", tmp_path / "o2"
    rc, _, cap = run_cli(["linearize", str(toml), "--out", str(first)], capsys)
    assert rc == 0, cap.err
    s1 = json.loads((first / "slopes.json").read_text())
    assert s1["options"]["linearize"] == {"shard": None, "sweep": s1["config"]}
    rc, _, cap = run_cli(["linearize", "--config", str(first / "slopes.json"), "--out", str(again)], capsys)
    assert rc == 0, cap.err
    s2 = json.loads((again / "slopes.json").read_text())
    assert s2 == s1  # same config, seeds and code path: the same rows and fits
    rows = [
        [
            {k: v for k, v in json.loads(line).items() if "seconds" not in k}  # wall-clock timings differ
            for line in (d / "results.jsonl").read_text().splitlines()
        ]
        for d in (first, again)
    ]
    # the same process, code path and seeds: the same rows to the last digit (ntk's auto choice has no timed term
    # since issue 32, so it takes the same method, with the same rounding, in both runs)
    assert rows[0] == rows[1] and len(rows[0]) == 5 * 2 + 5  # 5 cells: 2 logged steps + 1 correlation each
    # linearize_config.json (written by every run, finished or not) names the same sweep: rerun in its
    # folder, every cell is found finished (same config hash: no cell file is written again)
    cells = sorted((first / "cells").glob("*.json"))
    stamps = [c.stat().st_mtime_ns for c in cells]
    rc, _, cap = run_cli(["linearize", "--config", str(first / "linearize_config.json"), "--out", str(first)], capsys)
    assert rc == 0, cap.err
    assert len(cells) == 5 and [c.stat().st_mtime_ns for c in cells] == stamps
    assert json.loads((first / "slopes.json").read_text()) == s1
    one_line(["linearize", str(toml), "--config", str(first / "slopes.json")], capsys, "not both")


def test_linearize_needs_a_toml_or_a_config(capsys):
    one_line(["linearize"], capsys, "give a TOML CONFIG")


def test_demo_records_its_options_and_config_repeats_them(tmp_path, capsys, monkeypatch):
    """run_demo writes DIR/demo.json with its options; `demo --config` of it repeats them. The parts
    are stubbed here (the real quick demo runs in tests/test_demo.py)."""
    import types

    import widthscope.demo as demo_mod
    import widthscope.report as report_mod
    import widthscope.report.alignment as report_alignment
    import widthscope.report.claims as report_claims
    import widthscope.sweeps.alignment as sweep_alignment
    import widthscope.sweeps.results as sweep_results

    monkeypatch.setattr(demo_mod, "_image_dataset", lambda: "digits")
    monkeypatch.setattr(sweep_alignment, "run_sweep", lambda cfg, sub, show_progress: types.SimpleNamespace(rows=[]))
    monkeypatch.setattr(sweep_results, "print_summary", lambda rows, sub, file=None: None)
    monkeypatch.setattr(report_mod, "report", lambda parts, out, title, notes: out / "report.html")
    monkeypatch.setattr(report_mod, "load_results", lambda parts: [])
    monkeypatch.setattr(report_claims, "claims", lambda rows: [])
    monkeypatch.setattr(report_alignment, "summary", lambda rows, found: [])
    out = tmp_path / "demo"
    rc, _, cap = run_cli(["demo", "--quick", "--no-linear", "--no-progress", "--out", str(out)], capsys)
    assert rc == 0, cap.err
    rec = json.loads((out / "demo.json").read_text())
    assert rec["options"]["demo"] == DemoOptions(quick=True, no_linear=True, no_progress=True).to_dict()
    assert rec["failed"] == [] and len(rec["parts"]) == 2 and rec["report"] == str(out / "report" / "report.html")

    import widthscope.cli.demo as cli_demo

    seen: list[dict] = []
    monkeypatch.setattr(cli_demo, "run_demo", lambda out_dir, **kw: seen.append({"out": out_dir, **kw}))
    again = str(tmp_path / "again")
    assert run_cli(["demo", "--config", str(out / "demo.json"), "--out", again], capsys)[0] == 0
    assert seen[-1] == {"out": again, "quick": True, "linear": False, "show_progress": False, "threads": 1}
    assert run_cli(["demo", "--config", str(out / "demo.json"), "--threads", "2", "--out", again], capsys)[0] == 0
    assert seen[-1]["threads"] == 2 and seen[-1]["quick"] is True


def test_repair_config_file(tmp_path, capsys):
    folder = tmp_path / "res"
    folder.mkdir()
    text = '{"a": 1}\nnot json\n'
    (folder / "results.jsonl").write_text(text)
    cfg = tmp_path / "repair.json"
    cfg.write_text(json.dumps({"repair": {"dry_run": True}}))
    rc, _, cap = run_cli(["repair", str(folder), "--config", str(cfg)], capsys)
    assert rc == 0, cap.err
    assert "dry run: nothing was written" in cap.out
    assert (folder / "results.jsonl").read_text() == text and not (folder / "backup").exists()


# ----------------------------------------------------------------------------- a file without such options
@pytest.fixture()
def certify_like(tmp_path):
    path = tmp_path / "certify.json"
    path.write_text(json.dumps({"settings": {}, "options": {"certify": {"draws": 10}, "run": {}, "inputs": {}}}))
    return path


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["stats", "--train", "{a}", "--test", "{b}"], "records no stats options"),
        (["activations"], "records no activations options"),
        (["linearize"], "records no linearize options"),
        (["demo", "--out", "{tmp}/d"], "records no demo options"),
        (["repair", "{tmp}"], "records no repair options"),
    ],
)
def test_config_without_such_options_is_one_line(argv, msg, certify_like, matrices, tmp_path, capsys):
    a, b = matrices
    argv = [x.format(a=a, b=b, tmp=tmp_path) for x in argv]
    one_line([*argv, "--config", str(certify_like)], capsys, msg)


@pytest.mark.parametrize(
    "command,section", [("stats", "stats"), ("activations", "activations"), ("demo", "demo"), ("repair", "repair")]
)
def test_config_with_a_bad_setting_is_one_line(command, section, tmp_path, capsys):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"options": {section: {"bogus": 1}}}))
    argv = [command, *([str(tmp_path)] if command == "repair" else [])]
    one_line([*argv, "--config", str(cfg)], capsys, "unknown setting(s) bogus")


def test_config_that_is_not_json_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("not json")
    one_line(["activations", "--config", str(bad)], capsys, "is not a JSON file")
    one_line(["activations", "--config", str(tmp_path / "missing.json")], capsys, "not found")


def test_the_commands_package_does_not_shadow_ws_linearize():
    """The linearization commands live in widthscope.linearization: a package named
    widthscope.linearize would replace the public function ws.linearize once imported."""
    import torch

    import widthscope as ws
    import widthscope.linearization.run  # noqa: F401

    assert callable(ws.linearize) and not isinstance(ws.linearize, type(ws))
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    assert torch.allclose(ws.linearize(net)(x), net(x), rtol=0, atol=1e-12)  # F_lin = F at the init point


def test_certify_help_is_in_argument_groups(capsys):
    """``certify --help`` lists its options under named groups, none of them a flat list of dozens."""
    import re

    from widthscope.cli import main

    with pytest.raises(SystemExit):
        main(["certify", "--help"])
    out = capsys.readouterr().out
    titles = re.findall(r"^([a-z][a-z ]+):$", out, re.M)
    for title in ("model", "data", "probe pools", "run", "insertion points", "statistics", "interventions",
                  "output and plan"):
        assert title in titles, titles
    sizes = [len(re.findall(r"^  --", block, re.M)) for block in re.split(r"^[a-z][a-z ]+:$", out, flags=re.M)[1:]]
    assert max(sizes) <= 16, sizes
