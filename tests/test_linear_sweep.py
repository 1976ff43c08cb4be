"""Power-law fits, sweep config validation, a tiny resumable/sharded sweep and its report figures."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from widthscope import WidthscopeError
from widthscope.cli import main
from widthscope.linear.powerlaw import fit_slope
from widthscope.linearization.config import DEMO_CONFIG, load_toml, validate_config
from widthscope.linearization.run import run_sweep

WIDTHS = np.array([64, 128, 256, 512, 1024, 2048])


def synthetic(p, n_seeds, rng, sigma=0.15, seed_sigma=0.1):
    """c n^p with per-seed offsets and per-point log-normal noise."""
    offs = seed_sigma * rng.normal(size=(n_seeds, 1))
    return 2.0 * WIDTHS[None, :] ** p * np.exp(offs + sigma * rng.normal(size=(n_seeds, WIDTHS.size)))


def test_fit_slope_recovers_known_exponent_and_interval_covers_truth():
    rng = np.random.default_rng(0)
    fit = fit_slope(WIDTHS, synthetic(-1.3, 10, rng))
    assert abs(fit.slope + 1.3) < 0.08 and abs(fit.intercept - math.log(2.0)) < 0.6
    assert fit.ci_low < -1.3 < fit.ci_high
    assert not (fit.ci_low < -1.0 < fit.ci_high)  # a wrong exponent is excluded
    # coverage of the 95% t interval over repetitions, with 10, 3 and 2 seeds: 400 repetitions each,
    # so a rate below 0.91 (3 binomial SD under 0.95) means the interval is too narrow
    for n_seeds in (10, 3, 2):
        reps = 400
        hits = sum(fit_slope(WIDTHS, synthetic(-0.5, n_seeds, np.random.default_rng(100 + r))).ci_low <= -0.5
                   <= fit_slope(WIDTHS, synthetic(-0.5, n_seeds, np.random.default_rng(100 + r))).ci_high
                   for r in range(reps))
        assert hits / reps >= 0.91, (n_seeds, hits / reps)


def test_fit_slope_exact_line_missing_values_and_errors():
    vals = 3.0 * WIDTHS[None, :] ** -0.7 * np.ones((3, 1))
    vals[0, 2] = np.nan  # a diverged seed
    vals[1, 4] = 0.0     # non-positive: ignored in log space
    fit = fit_slope(WIDTHS, vals)
    assert math.isclose(fit.slope, -0.7, abs_tol=1e-12) and math.isclose(fit.ci_high, -0.7, abs_tol=1e-12)
    one = fit_slope(WIDTHS, vals[2])
    assert math.isclose(one.slope, -0.7, abs_tol=1e-12) and math.isnan(one.ci_low)
    with pytest.raises(WidthscopeError, match="n_widths"):
        fit_slope(WIDTHS, np.ones((2, 3)))


BASE = {"widths": [8, 16, 32, 64, 128]}


@pytest.mark.parametrize("patch,match", [
    ({"widths": [8, 16, 32, 64]}, "at least 5"),
    ({"widths": [8, 16, 64, 32, 128]}, "increasing"),
    ({"widths": [8, 9, 64, 128, 256]}, "geometric"),
    ({"train": {"bogus": 1}}, "unknown key train.'bogus'"),
    ({"train": {"steps": 10, "log_steps": [0, 20]}}, "log_steps"),
    ({"fit": {"steps": [7]}}, "fit.steps"),
    ({"correlations": {"measure": ["C21"]}}, "D=2"),
    ({"model": {"family": "llama"}}, "mlp"),
    # checked before any cell runs (these used to fail inside the first cell, or not at all)
    ({"train": {"eta0": 0.0}}, r"train.eta0 must be a finite number > 0"),
    ({"train": {"eta0": -0.5}}, r"train.eta0 must be a finite number > 0"),
    ({"train": {"alphas": [0.0, float("nan")]}}, "train.alphas must be finite"),
    ({"train": {"optimizer": "lbfgs"}}, "train.optimizer 'lbfgs'"),
    ({"train": {"loss": "l1"}}, "train.loss 'l1'"),
    ({"train": {"batch_size": -1}}, "train.batch_size"),
    ({"train": {"probe": 0}}, "train.probe"),
    ({"data": {"n_train": 0}}, "data.n_train"),
    ({"correlations": {"n_tuples": 0}}, "correlations.n_tuples"),
    ({"correlations": {"output": "rand"}}, "correlations.output"),
])
def test_config_errors_name_the_problem(patch, match):
    with pytest.raises(WidthscopeError, match=match):
        validate_config({**BASE, **patch})


def test_demo_toml_matches_embedded_demo_config():
    root = Path(__file__).resolve().parents[1]
    assert validate_config(load_toml(str(root / "configs" / "linearize-demo.toml"))) == validate_config(DEMO_CONFIG)
    for name in ("linearize-digits.toml", "linearize-digits-tanh.toml"):
        assert len(validate_config(load_toml(str(root / "configs" / name)))["widths"]) >= 5


TINY = {
    "name": "tiny", "widths": [8, 16, 32, 64, 128], "seeds": [0, 1],
    "model": {"depth": 2, "activation": "tanh", "parametrization": "ntk"},
    "data": {"name": "digits", "n_train": 24, "n_test": 16},
    "train": {"eta0": 0.5, "alphas": [0.0, -1.0], "steps": 4, "log_steps": [0, 2, 4], "dtype": "float64",
              "probe": 3},
    "correlations": {"measure": ["C02", "C11"], "n_tuples": 2, "output": "random"},
    "fit": {"steps": [2, 4]},
}


def test_tiny_sweep_sharded_resumable_slopes_and_figures(tmp_path, capsys):
    out = tmp_path / "run"
    r1 = run_sweep(TINY, out, shard=(1, 2), quiet=True)
    assert not r1["complete"] and not (out / "slopes.json").exists()
    r2 = run_sweep(TINY, out, shard=(2, 2))
    assert r2["complete"]
    rows = r2["rows"]
    lin = [r for r in rows if r["kind"] == "linearization"]
    corr = [r for r in rows if r["kind"] == "correlation"]
    assert len(lin) == 5 * 2 * 2 * 3 and len(corr) == 5 * 2 * 2  # widths*seeds*alphas*steps; corr at first α
    assert all(r["dev_rms"] == 0 for r in lin if r["step"] == 0)
    assert all(math.isclose(r["lr"], 0.5 * r["width"] ** r["alpha"]) for r in lin)
    assert {r["output"] for r in corr} == {"random unit combination (seed 0)", "random unit combination (seed 1)"}
    slopes = json.loads((out / "slopes.json").read_text())["slopes"]
    got = {(s["metric"], s["alpha"], s["step"]) for s in slopes}
    assert ("dev_rms", -1.0, 4) in got and ("C02", None, None) in got and ("kernel_drift", 0.0, 4) in got
    dev = next(s for s in slopes if s["metric"] == "dev_mse" and s["alpha"] == 0.0 and s["step"] == 4)
    assert dev["published"] == -1.14 and dev["reference"] == -2
    assert dev["slope"] < 0  # wider is more linear even in 4 steps
    assert "log-log slopes" in capsys.readouterr().out
    # resuming does no work and returns the same rows
    r3 = run_sweep(TINY, out, quiet=True)
    assert len(r3["rows"]) == len(rows)
    # report section
    from widthscope.report.linearization import figures, summary, tables

    figs = figures(rows, tmp_path / "fig")
    assert len(figs) == 5 and all(Path(f["png"]).read_bytes()[:4] == b"\x89PNG" for f in figs)
    assert any(f["png"].endswith("linearization_side_by_side.png") for f in figs)
    assert tables(rows)[0]["html"].startswith("<table>") and summary(rows)
    # side by side: full-batch GD makes the linear model the kernel prediction (closed form either way)
    from widthscope.report.linearization import side_by_side

    side = side_by_side(rows)
    assert len(side) == 5 * 2 and all(r["seeds"] == 2 for r in side)
    assert all(math.isclose(r["test_loss_lin"], r["test_loss_kernel"], rel_tol=1e-9) for r in side)
    assert all(r["test_loss_kernel_inf"] != r["test_loss_kernel"] for r in side)
    assert {r["linear"] for r in lin} == {"kernel"}
    assert any(t["title"].startswith("Held-out loss") for t in tables(rows))


def test_cli_reports_bad_config_without_traceback(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("widths = [8, 16, 32, 16, 64]\n")
    assert main(["linearize", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "increasing" in err and "Traceback" not in err
    assert main(["linearize", str(tmp_path / "missing.toml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_config_defaults_and_free_form_loader_options():
    cfg = validate_config({**BASE, "data": {"name": "cifar10", "options": {"grayscale": True}}})
    assert cfg["data"]["options"] == {"grayscale": True} and cfg["train"]["log_steps"] == [0, 10, 30, 100]
    assert cfg["fit"]["steps"] == [100] and cfg["train"]["batch_size"] == 0
