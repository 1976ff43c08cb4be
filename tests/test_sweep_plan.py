"""`widthscope sweep --dry-run`'s cost plan (issue 32, on :mod:`widthscope.planning`) and `widthscope
sweep --config` (issue 30): sizes against the real model, each distinct model counted once, the
total over the unfinished cells of the shard, a suite planned from config.json with damaged weights,
a cell's predicted time the sum of its timed parts, and a finished sweep's sweep.json run again."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import hf_tiny
from cli_run import one_line, run_cli
from widthscope import models
from widthscope.sweeps.alignment import load_config, plan_cells
from widthscope.sweeps.grid import cell_id
from widthscope.sweeps.results import read_record

import widthscope.planning  # noqa: F401,E402  (the attribute widthscope.planning is widthscope.stats.plan)

costs_mod = sys.modules["widthscope.planning"]

TINY = """
[sweep]
name = "plan"
seeds = [0, 1]
M = [8, 16]
draws = 100

[[family]]
name = "mlp"
widths = [8, 16]
dataset = "digits"
n_train = 96
n_test = 40
model_options = { depth = 3 }
train = { steps = 7, lr = 0.01, batch_size = 32 }
certify = { n_probe_train = 24, n_probe_test = 20, batch_size = 8 }
"""
STEPS, BATCH, DEPTH, N_ETAS = 7, 32, 3, 9


def _write(tmp: Path, text: str = TINY, name: str = "plan.toml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def test_mlp_costs_match_the_real_model_and_each_width_is_counted_once(tmp_path, monkeypatch):
    cfg = load_config(_write(tmp_path))
    calls = []
    real = costs_mod._alignment_plan
    monkeypatch.setattr(costs_mod, "_alignment_plan", lambda *a: calls.append(1) or real(*a))
    got = costs_mod.plan_alignment(cfg, plan_cells(cfg), lambda c: False)
    assert len(calls) == 2 and [c.label for c in got] == ["mlp @ 8", "mlp @ 16"]  # 4 cells, 2 models
    for c, width in zip(got, (8, 16)):
        real_model = models.build("mlp", width, in_dim=64, out_dim=10, depth=DEPTH)
        p = c.plan
        assert p.parameters == models.count_parameters(real_model)
        assert p.weight_bytes == 4 * p.parameters and p.dtype == "float32"
        assert p.examples == 24 + 20
        assert p.sample_bytes == 8 * (24 + 20) * DEPTH * width  # float64, each point's width
        assert p.bytes_per_example and p.bytes_per_example > 0 and c.cell_s is None
        assert c.cells == 2 and c.left == 2 and p.max_batch is not None and p.max_batch > 1000


def test_dry_run_totals_the_unfinished_cells_and_writes_nothing(tmp_path, capsys):
    cfg_path, out = _write(tmp_path), tmp_path / "o"
    rc, _, cap = run_cli(["sweep", str(cfg_path), "--out", str(out), "--shard", "1/2", "--no-progress"], capsys)
    assert rc == 0, cap.err
    stamp = sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*"))
    rc, _, cap = run_cli(["sweep", str(cfg_path), "--out", str(out), "--dry-run"], capsys)
    assert rc == 0, cap.err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*")) == stamp  # nothing written
    cfg = load_config(cfg_path)
    finished = {p.stem for p in (out / "cells").glob("*.json")}
    assert len(finished) == 2
    got = costs_mod.plan_alignment(cfg, plan_cells(cfg), lambda c: cell_id(c) in finished)
    assert [c.left for c in got] == [1, 1]  # shard 1/2 ran cells 0 and 2: one seed of each width
    assert "total over the 2 unfinished cell(s) of shard 1/1: the largest cell holds" in cap.out, cap.out
    assert re.search(r"mlp @ 8\s+2 \(1\)\s+", cap.out) and "samples / cell" in cap.out
    rc, _, cap = run_cli(["sweep", str(cfg_path), "--out", str(tmp_path / "fresh"), "--dry-run"], capsys)
    assert rc == 0 and not (tmp_path / "fresh").exists()
    assert "total over the 4 unfinished cell(s)" in cap.out


# ----------------------------------------------------------------------------- a suite
def _neox(directory: Path, layers: int = 2) -> int:
    import transformers as tf

    tok = hf_tiny.save_tokenizer(directory)
    cfg = tf.GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = tf.GPTNeoXForCausalLM(cfg)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


SUITE = """
[suite]
name = "plan-suite"
models = ["org/neox"]
revisions = ["step1", "step2"]
data = "{text}"
seq_len = 8
n_train = 12
n_test = 12
batch_size = 6
threads = 1

[suite.certify]
M = [4, 8]
draws = 50
interventions = "none"
"""


@pytest.fixture
def suite(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    n = _neox(tmp_path / "src")
    for i, rev in enumerate(("step1", "step2")):
        hf_tiny.hub_put(cache, "org/neox", tmp_path / "src", str(i + 1) * 40, (rev,))
    text = tmp_path / "train.txt"
    text.write_text("\n\n".join(hf_tiny.corpus(60, seed=0)) + "\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cfg = tmp_path / "suite.toml"
    cfg.write_text(SUITE.format(text=text))
    return {"cfg": cfg, "cache": cache, "parameters": n, "tmp": tmp_path}


def test_suite_plans_from_config_json_with_damaged_weights_counting_each_architecture_once(suite, capsys, monkeypatch):
    snapshots = sorted((suite["cache"] / "models--org--neox" / "snapshots").iterdir())
    for snap in snapshots:  # the weights of both revisions (one blob): garbage now
        (snap / "model.safetensors").resolve().write_bytes(b"not a safetensors file")
    calls = []
    real = costs_mod.plan_certify
    monkeypatch.setattr(costs_mod, "plan_certify", lambda *a, **k: calls.append(k) or real(*a, **k))
    out = suite["tmp"] / "o"
    rc, _, cap = run_cli(["sweep", str(suite["cfg"]), "--out", str(out), "--dry-run"], capsys)
    assert rc == 0, cap.err
    assert calls == [{"time_run": False}]  # two revisions, one architecture: counted once
    assert re.search(rf"org/neox @ step1, step2\s+2 \(2\)\s+{suite['parameters']:,}\s", cap.out), cap.out
    assert "total over the 2 unfinished cell(s)" in cap.out and not out.exists()


def test_suite_record_repeats_the_run(suite, capsys):
    out = suite["tmp"] / "o"
    rc, _, cap = run_cli(["sweep", str(suite["cfg"]), "--out", str(out), "--no-progress"], capsys)
    assert rc == 0, cap.err
    rc, _, cap = run_cli(["sweep", "--config", str(out / "sweep.json"), "--out", str(out), "--no-progress"], capsys)
    assert rc == 0, cap.err
    assert "ran 0 cell(s), 2 already finished" in cap.out


# ----------------------------------------------------------------------------- --config
def test_config_accepts_the_toml_or_a_finished_sweeps_record(tmp_path, capsys):
    cfg_path, out = _write(tmp_path), tmp_path / "o"
    rc, _, cap = run_cli(["sweep", "--config", str(cfg_path), "--out", str(out), "--no-progress"], capsys)
    assert rc == 0, cap.err
    assert "ran 4 cell(s)" in cap.out
    for given in (out, out / "sweep.json"):  # the folder or its record: the same cells, all finished
        rc, _, cap = run_cli(["sweep", "--config", str(given), "--no-progress", "--out", str(out)], capsys)
        assert rc == 0, cap.err
        assert "ran 0 cell(s), 4 already finished" in cap.out
    # into another folder: the dry run lists the same cell ids as the TOML's
    rc, _, cap = run_cli(["sweep", "--config", str(out), "--out", str(tmp_path / "again"), "--dry-run"], capsys)
    assert rc == 0, cap.err
    ids = {cell_id(c) for c in plan_cells(load_config(cfg_path))}
    assert ids == set(re.findall(r"\b([0-9a-f]{16})\b", cap.out))


def test_every_shipped_sweep_config_survives_its_record(tmp_path):
    from widthscope.sweeps.suite import load_suite

    shipped = Path(__file__).resolve().parents[1] / "configs"
    if not shipped.exists():
        pytest.skip("configs/ not shipped with an installed package")
    import tomllib

    seen = 0
    for path in sorted(shipped.glob("*.toml")):
        raw = tomllib.loads(path.read_text())
        if set(raw) == {"suite"}:
            cfg = load_suite(raw, stem=path.stem)
            rec = {"fingerprint": cfg.fingerprint(), "config": cfg.to_dict(), "kind": "suite"}
        elif set(raw) == {"sweep", "family"}:
            cfg = load_config(path)
            rec = {"fingerprint": cfg.fingerprint(), "config": cfg.to_dict(), "options": cfg.options_record()}
        else:
            continue  # another command's config
        (tmp_path / "sweep.json").write_text(json.dumps(rec))
        again, fingerprint, _ = read_record(tmp_path)
        rebuilt = load_suite(again) if "suite" in again else load_config(again)
        assert rebuilt.fingerprint() == fingerprint == cfg.fingerprint(), path.name
        assert rebuilt.to_dict() == cfg.to_dict(), path.name
        seen += 1
    assert seen >= 4


def test_an_edited_record_or_a_config_given_twice_is_one_line(tmp_path, capsys):
    cfg = load_config(_write(tmp_path))
    rec = {"fingerprint": cfg.fingerprint(), "config": cfg.to_dict(), "options": cfg.options_record()}
    rec["config"]["families"][0]["train"]["steps"] = 8
    (tmp_path / "sweep.json").write_text(json.dumps(rec))
    one_line(["sweep", "--config", str(tmp_path / "sweep.json"), "--dry-run"], capsys, "the record says")
    one_line(["sweep", str(tmp_path / "plan.toml"), "--config", str(tmp_path / "plan.toml")], capsys, "given twice")
    one_line(["sweep"], capsys, "no config")
    (tmp_path / "other.json").write_text("{}")
    one_line(["sweep", "--config", str(tmp_path / "other.json")], capsys, "is not a sweep's record")
    one_line(["sweep", "--config", str(tmp_path / "missing")], capsys, "not found")


def test_plan_predicts_the_wall_time_and_writes_nothing(tmp_path, capsys):
    cfg_path, out = _write(tmp_path), tmp_path / "o"
    rc, _, cap = run_cli(["sweep", str(cfg_path), "--out", str(out), "--plan", "--threads", "1"], capsys)
    assert rc == 0, cap.err
    assert not out.exists() and "time / cell" in cap.out
    m = re.search(r"predicted wall time of the 4 unfinished cell\(s\) on this machine: (\S+) (s|min|h)", cap.out)
    assert m and float(m.group(1)) > 0, cap.out  # a time, not a threshold: machines differ


def test_suite_plan_times_each_architecture_once(suite, capsys, monkeypatch):
    calls = []
    real = costs_mod.plan_certify
    monkeypatch.setattr(costs_mod, "plan_certify", lambda *a, **k: calls.append(k) or real(*a, **k))
    rc, _, cap = run_cli(["sweep", str(suite["cfg"]), "--out", str(suite["tmp"] / "o"), "--plan"], capsys)
    assert rc == 0, cap.err
    assert calls == [{"time_run": True}] and "predicted wall time of the 2 unfinished cell(s)" in cap.out


@pytest.mark.parametrize("monitor", [False, True])
def test_plan_time_is_the_cells_parts_each_timed(tmp_path, monkeypatch, monitor):
    # every timed call made to take 1 s and a point's statistics 0.25 s: the cell's predicted time is then
    # its training steps + its probe batches + its points' statistics + the interventions' forwards
    # (+ the monitor's probes), the composition run_cell spends
    text = TINY + ("monitor = { at = [0, 3, 7], n_train = 16, n_test = 16 }\n" if monitor else "")
    cfg = load_config(_write(tmp_path, text))
    stats = []

    def one_second(fn, repeats=2):
        fn()
        return 1.0

    monkeypatch.setattr(costs_mod, "timed", one_second)
    monkeypatch.setattr(costs_mod, "time_statistics", lambda opts, n, d, rows: stats.append((n, d, rows)) or 0.25)
    got = costs_mod.plan_alignment(cfg, plan_cells(cfg), lambda c: False, timed_run=True)
    for c in got:
        probe_batches = -(-24 // 8) + -(-20 // 8)
        interventions = DEPTH * N_ETAS * 16 / 8  # points x steps x the largest K, one forward per example
        want = STEPS + probe_batches + DEPTH * 0.25 + interventions + (3 if monitor else 0)
        assert c.cell_s == pytest.approx(want)
    # one statistics timing per width: the points of one width share their sample shapes
    assert stats == [((24, 20), 8, 1), ((24, 20), 16, 1)]
