"""Alignment width sweep: config validation, rows against brute-force oracles, resume after
SIGKILL, sharding, CLI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from widthscope.cli import main
from widthscope.errors import WidthscopeError
from widthscope.sweeps.alignment import load_config, plan_cells, run_sweep
from widthscope.sweeps.config import TIMING_COLUMNS
from widthscope.sweeps.pools import take_examples
from widthscope.sweeps.grid import cell_id, load_rows

TINY = """
[sweep]
name = "tiny"
seeds = [0, 1]
M = [8, 16]
draws = 300

[[family]]
name = "mlp"
widths = [8, 16, 32]
dataset = "digits"
n_train = 256
n_test = 64
model_options = { depth = 2 }
train = { steps = 120, lr = 0.01, batch_size = 32 }
certify = { n_probe_train = 40, n_probe_test = 32, batch_size = 16 }
"""
N_CELLS, N_POINTS, N_MK = 3 * 2, 2, 2
N_ETAS = 9  # default intervention grid
ROWS_PER_CELL = N_POINTS * N_MK + N_POINTS * N_ETAS  # alignment rows + intervention rows


def _write(tmp: Path, text: str, name: str = "cfg.toml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


def _same(a, b):
    """Rows equal up to timing columns (floats to 1e-9 relative: same code, same seeds)."""
    assert len(a) == len(b)
    for ra, rb in zip(_strip(a), _strip(b)):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float) and isinstance(rb[k], float):
                assert ra[k] == pytest.approx(rb[k], rel=1e-9, abs=1e-12), k
            else:
                assert ra[k] == rb[k], k


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    cfg_path = _write(tmp, TINY)
    out = tmp / "full"
    result = run_sweep(load_config(cfg_path), out, show_progress=False)
    return cfg_path, out, result


# ----------------------------------------------------------------------------- config
BAD = [
    ("[sweep]\nseed = [0]\n" + TINY.split("[[family]]")[1].join(["[[family]]", ""]), "unknown key(s) 'seed' (did you mean 'seeds'?)"),
    (TINY.replace("widths = [8, 16, 32]", "widths = [16, 8]"), "strictly increasing"),
    (TINY.replace("widths = [8, 16, 32]", "widths = [0, 8]"), "positive"),
    (TINY.replace("n_test = 64", "n_test = 64\nlearning_rate = 1"), "valid keys: name, model, widths"),
    (TINY.replace("steps = 120", "stepz = 120"), "'stepz' (did you mean 'steps'?)"),
    (TINY.replace("steps = 120, ", ""), "train.steps is required"),
    (TINY.replace("M = [8, 16]", "M = [8, 64]"), "(M, K) = (64, 64) needs at least 64 train"),
    (TINY.replace("M = [8, 16]", "M = [8, 16]\nK = [8]"), "paired = true needs M and K of equal length"),
    (TINY.replace("n_train = 256", "n_train = 20"), "n_probe_train=40 exceeds the training set size 20"),
    (TINY.replace('dataset = "digits"\n', ""), "missing required key 'dataset'"),
    (TINY.replace('draws = 300', 'estimator = "fancy"'), "estimator 'fancy' unknown; valid: unbiased, plugin"),
    (TINY + TINY.split("[sweep]")[1].split("\n\n", 1)[1], "family names must be unique"),
    ("[sweep]\nname = 'x'\n", "no [[family]] entries"),
    ("[sweep\n", "is not valid TOML"),
    (TINY.replace("draws = 300", "draws = 300\nthreads = 0"), "[sweep] threads must be a whole number >= 1"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_config_errors_name_the_problem(tmp_path, text, message):
    with pytest.raises(WidthscopeError) as exc:
        load_config(_write(tmp_path, text))
    assert message in str(exc.value)


def test_config_error_via_cli_has_no_traceback(tmp_path, capsys):
    assert main(["sweep", str(_write(tmp_path, BAD[1][0]))]) == 2
    err = capsys.readouterr().err
    assert "strictly increasing" in err and "Traceback" not in err
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_grid_plan_and_dry_run(tmp_path, capsys):
    cfg = load_config(_write(tmp_path, TINY.replace("seeds = [0, 1]", "seeds = [0, 1]\nbudgets = [128, 256]")))
    cells = plan_cells(cfg)
    assert len(cells) == 2 * 3 * 2 and len({cell_id(c) for c in cells}) == len(cells)
    assert [(c["budget"], c["width"], c["seed"]) for c in cells[:3]] == [(128, 8, 0), (128, 8, 1), (128, 16, 0)]
    assert cfg.MK == [(8, 8), (16, 16)]
    assert main(["sweep", str(_write(tmp_path, TINY, "t.toml")), "--dry-run", "--out", str(tmp_path / "o"),
                 "--shard", "2/3"]) == 0
    out = capsys.readouterr().out
    assert "2 of 6 cells in shard 2/3" in out and not (tmp_path / "o" / "cells").exists()
    # a changed config gets new cell ids, and the results dir refuses to mix the two
    other = load_config(_write(tmp_path, TINY.replace("steps = 120", "steps = 121"), "u.toml"))
    assert {cell_id(c) for c in plan_cells(other)}.isdisjoint(cell_id(c) for c in plan_cells(load_config(tmp_path / "t.toml")))


# ----------------------------------------------------------------------------- rows
def _per_example_grads(model, X, y, point):
    """Brute force: one forward/backward per example, gradient of its loss at ``point``'s output."""
    out = []
    mod = model.get_submodule(point)
    for i in range(len(X)):
        store = {}
        h = mod.register_forward_hook(lambda m, inp, o: store.__setitem__("z", o))
        logits = model(X[i:i + 1])
        h.remove()
        loss = torch.nn.functional.cross_entropy(logits, y[i:i + 1])
        (g,) = torch.autograd.grad(loss, store["z"])
        out.append(g.reshape(-1).double())
    return torch.stack(out)


def test_tiny_sweep_rows_match_oracles(tiny):
    cfg_path, out, result = tiny
    with open(out / "results.jsonl") as f:  # what a pandas user loads
        assert [json.loads(line) for line in f] == result.rows
    rows = [r for r in result.rows if r["kind"] == "alignment"]
    ivs = [r for r in result.rows if r["kind"] == "intervention"]
    assert len(result.done) == N_CELLS and len(rows) == N_CELLS * N_POINTS * N_MK
    assert {(r["width"], r["seed"]) for r in rows} == {(w, s) for w in (8, 16, 32) for s in (0, 1)}
    # one bias intervention per cell and point (default eta grid of 9), summarised on the rows
    assert len(ivs) == N_CELLS * N_POINTS * N_ETAS and len(ivs) + len(rows) == len(result.rows)
    for r in rows:
        mine = [v for v in ivs if v["cell_id"] == r["cell_id"] and v["point"] == r["point"]]
        small = min(mine, key=lambda v: v["eta"])
        assert r["iv_retention"] == small["retention"] == pytest.approx(small["actual"] / small["predicted"])
        assert r["iv_sign_agrees"] == small["sign_agrees"] and small["M"] == 16 and small["K"] == 16
    for r in rows:
        assert r["kind"] == "alignment" and r["family"] == "mlp" and r["d"] == r["width"]
        assert r["point"] == f"blocks.{r['point_index']}" and r["depth_fraction"] == (r["point_index"] + 1) / 2
        assert r["misalignment_low"] <= r["misalignment"] <= r["misalignment_high"]
        assert r["misalignment_draws"] == 300 and r["budget"] == 256
        for f in ("one", "two"):
            n_eff = r["M"] * r["K"] / (r["M"] + r["K"] + 1)
            assert r[f"{f}_n_eff"] == pytest.approx(n_eff)
            if not r[f"{f}_vacuous"]:
                assert r[f"{f}_d_align"] == pytest.approx(min(r[f"{f}_d_par"], r[f"{f}_d_2"]))
                assert r[f"{f}_b_align"] == pytest.approx(1 / (1 + n_eff * r[f"{f}_d_align"]))
                E, V = r[f"{f}_expectation"], r[f"{f}_variance"]
                assert r[f"{f}_b_exact"] == pytest.approx(V / (V + E * E))
                assert r[f"{f}_b_exact"] <= r[f"{f}_b_align"] + 1e-12
        for t in TIMING_COLUMNS:
            assert r[t] >= 0

    # Oracle for one cell: reload its checkpoint, recompute per-example gradients one example at a
    # time, and check the recorded losses and the unbiased means exactly.
    from widthscope import checkpoint, data
    from widthscope.train import evaluate

    r0 = next(r for r in rows if r["width"] == 16 and r["seed"] == 1)
    model = checkpoint.load(out / "artifacts" / r0["cell_id"])
    split = data.load("digits", n_train=256, n_test=64, seed=0)
    assert evaluate(model, split.test, "classification")["loss"] == pytest.approx(r0["test_loss"], rel=1e-5)
    for pi in (0, 1):
        # the probe pools: seeded random subsets of each part (data_seed 0), as the sweep takes them
        (xa, ya), (xb, yb) = take_examples(split.train, 40, 0), take_examples(split.test, 32, 1)
        Xa = _per_example_grads(model, xa, ya, f"blocks.{pi}")
        Xb = _per_example_grads(model, xb, yb, f"blocks.{pi}")
        sa = Xa.sum(0)
        one_E = (sa @ sa - (Xa * Xa).sum()) / (40 * 39)       # U-statistic of ||mu||^2
        two_E = (Xa @ Xb.T).mean()                              # unbiased a.b
        for r in rows:
            if r["cell_id"] == r0["cell_id"] and r["point_index"] == pi:
                assert r["one_expectation"] == pytest.approx(float(one_E), rel=1e-4)
                assert r["two_expectation"] == pytest.approx(float(two_E), rel=1e-4)


def test_shards_union_equals_unsharded(tiny, tmp_path):
    cfg_path, out, full = tiny
    cfg = load_config(cfg_path)
    r1 = run_sweep(cfg, tmp_path / "s1", shard=(1, 2), show_progress=False)
    r2 = run_sweep(cfg, tmp_path / "s2", shard=(2, 2), show_progress=False)
    assert len(r1.done) == 3 and len(r2.done) == 3 and not set(r1.done) & set(r2.done)
    union = sorted(r1.rows + r2.rows, key=lambda r: (r["cell_index"], r["row_index"]))
    _same(union, full.rows)
    # copying the shards' cells into one directory gives the unsharded results file
    merged = tmp_path / "merged" / "cells"
    merged.mkdir(parents=True)
    for d in ("s1", "s2"):
        for p in (tmp_path / d / "cells").glob("*.json"):
            (merged / p.name).write_bytes(p.read_bytes())
    _same(load_rows(merged.parent), full.rows)


def _sweep_cmd(cfg_path: Path, out: Path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WIDTHSCOPE_PROGRESS": "0"}
    return [sys.executable, "-m", "widthscope", "sweep", str(cfg_path), "--out", str(out), "--no-progress"], env


def test_resume_after_sigkill(tiny, tmp_path):
    cfg_path, _, full = tiny
    out = tmp_path / "killed"
    cmd, env = _sweep_cmd(cfg_path, out)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if list((out / "cells").glob("*.json")):
                break
            time.sleep(0.01)
        assert proc.poll() is None, "sweep finished before it could be killed: " + proc.stdout.read().decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    n_before = len(list((out / "cells").glob("*.json")))
    assert proc.returncode == -signal.SIGKILL and 1 <= n_before < N_CELLS
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ran {N_CELLS - n_before} cell(s), {n_before} already finished" in done.stdout
    assert "results:" in done.stdout and "d_align" in done.stdout  # the summary table
    with open(out / "results.jsonl") as f:
        rows = [json.loads(line) for line in f]
    ids = [(r["cell_id"], r["row_index"]) for r in rows]
    assert len(ids) == len(set(ids)) == N_CELLS * ROWS_PER_CELL  # every cell exactly once
    _same(rows, full.rows)


def test_rerun_is_a_no_op_and_other_config_refused(tiny, tmp_path, capsys):
    cfg_path, out, full = tiny
    again = run_sweep(load_config(cfg_path), out, show_progress=False)
    assert again.done == [] and len(again.skipped) == N_CELLS
    other = _write(tmp_path, TINY.replace("draws = 300", "draws = 301"), "o.toml")
    assert main(["sweep", str(other), "--out", str(out)]) == 2
    assert "holds a sweep with a different config" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_and_docs_example_validate():
    import re

    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    paths = [p for p in sorted((ROOT / "configs").glob("*.toml")) if "[[family]]" in p.read_text()]
    if not paths:
        pytest.skip("configs/ not present")
    for p in paths:
        cfg = load_config(p)
        assert plan_cells(cfg), p
    doc = ROOT / "docs" / "sweeps.md"
    block = re.search(r"## Config reference \(TOML\)\n\n```toml\n(.*?)```", doc.read_text(), re.S).group(1)
    cfg = load_config(tomllib.loads(block))
    assert cfg.MK == [(16, 16), (32, 32), (64, 64)] and len(plan_cells(cfg)) == 2 * 4 * 2


# ----------------------------------------------------------------------------- certify options (issue 30)
def test_family_certify_table_loads_into_certify_options(tmp_path):
    from widthscope.options import CertifyOptions

    cfg = load_config(_write(tmp_path, TINY))
    fam = cfg.families[0]
    assert isinstance(fam.certify, CertifyOptions) and isinstance(cfg.certify, CertifyOptions)
    # [sweep]'s statistics keys are the options of every family that does not set its own
    assert fam.certify.pairs == cfg.MK == [(8, 8), (16, 16)] and fam.certify.draws == cfg.draws == 300
    # the fingerprint of a config written before the options existed is unchanged (old results folders resume);
    # the value was computed by the code before this change
    assert cfg.fingerprint() == "8826af157b59"
    over = TINY.replace("batch_size = 16 }", 'batch_size = 16, draws = 40, estimator = "plugin", M = [4], n_etas = 2 }')
    other = load_config(_write(tmp_path, over, "o.toml"))
    oc = other.families[0].certify
    assert (oc.draws, oc.estimator, oc.pairs, oc.n_etas) == (40, "plugin", [(4, 4)], 2)
    assert other.certify == cfg.certify and other.fingerprint() != cfg.fingerprint()
    recorded = other.options_record()["families"]["mlp"]
    assert CertifyOptions.from_dict(recorded) == oc


BAD_CERTIFY = [
    ("draws = 0", "sweep config family 'mlp': certify.draws 0: must be a whole number in 1..1000000 (resamples)"),
    ('estimator = "fancy"', "certify.estimator 'fancy': choose one of unbiased, plugin"),
    ('draw_scheme = "mine"', "certify.draw_scheme 'mine': choose one of shared, per-pair"),
    ("M = [8, 16], K = [8, 16, 32]", "K has 3 values but M has 2"),
    ('pool = "token"', "certify.pool 'token': a sweep cell pools each example to one sample vector"),
    ("project = 8", "certify.project: a sweep cell keeps its probe samples whole"),
    ("drawz = 3", "unknown key(s) 'drawz' (did you mean 'draws'?)"),
    ("M = [8, 64]", "(M, K) = (64, 64) needs at least 64 train"),
]


@pytest.mark.parametrize("keys,message", BAD_CERTIFY)
def test_family_certify_options_are_checked_by_the_dataclass(tmp_path, keys, message):
    text = TINY.replace("batch_size = 16 }", f"batch_size = 16, {keys} }}")
    with pytest.raises(WidthscopeError) as exc:
        load_config(_write(tmp_path, text))
    assert message in str(exc.value)


def test_cells_compute_with_their_family_options_and_record_them_once(tmp_path):
    from widthscope.options import CertifyOptions

    text = (TINY.replace("seeds = [0, 1]", "seeds = [3]").replace("widths = [8, 16, 32]", "widths = [8]")
            .replace("steps = 120", "steps = 10")
            .replace("batch_size = 16 }", 'batch_size = 16, draws = 40, estimator = "plugin", M = [4], K = [6], '
                     'n_etas = 2, max_rel_step = 0.5, seed = 5 }'))
    res = run_sweep(load_config(_write(tmp_path, text)), tmp_path / "o", show_progress=False)
    al = [r for r in res.rows if r["kind"] == "alignment"]
    ivs = [r for r in res.rows if r["kind"] == "intervention"]
    assert {(r["M"], r["K"], r["estimator"], r["misalignment_draws"]) for r in al} == {(4, 6, "plugin", 40)}
    assert len(ivs) == N_POINTS * 2  # n_etas = 2 per point
    (cell_file,) = (tmp_path / "o" / "cells").glob("*.json")
    rec = json.loads(cell_file.read_text())
    opts = CertifyOptions.from_dict(rec["options"])
    assert opts.seed == 3 + 5 and opts.draws == 40 and opts.pairs == [(4, 6)]  # the cell's seed + certify.seed
    assert all("options" not in r for r in rec["rows"])  # once per cell, not per row
    sweep_json = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert CertifyOptions.from_dict(sweep_json["options"]["families"]["mlp"]).draws == 40
