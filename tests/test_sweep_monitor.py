"""A width sweep over training: ``monitor = {...}`` in sweep configs (docs/monitor.md §8).

Config parsing (defaults, schedules), a tiny sweep end to end (``monitor.jsonl`` per cell, the
``kind="monitor"`` rows, the per-point summary columns checked against the rows, the report's
figure and table), resume without duplicated or lost rows, and training with the monitor giving the
same weights and metrics as without it (also when the probe disturbs the global RNG and training
reads it). Bad configs are in tests/test_bad_input_sweep.py."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from widthscope._io import read_jsonl
from widthscope.sweeps.alignment import load_config, plan_cells, run_sweep
from widthscope.sweeps.config import MONITOR_SUMMARY, MONITOR_TIMING_COLUMNS, TIMING_COLUMNS, monitor_steps
from widthscope.sweeps.grid import cell_id

TINY = {
    "sweep": {"name": "tiny-mon", "seeds": [0], "M": [4, 8], "draws": 50, "interventions": "none"},
    "family": [{"name": "mlp", "widths": [8, 16], "dataset": "digits", "n_train": 128, "n_test": 64,
                "model_options": {"depth": 2}, "train": {"steps": 12, "lr": 0.01, "batch_size": 32},
                "certify": {"n_probe_train": 32, "n_probe_test": 32, "batch_size": 16},
                "monitor": {"every": 4, "n_train": 16, "n_test": 16, "delta": 0.9}}],
}


def _cfg(widths=(8, 16), **monitor):
    raw = copy.deepcopy(TINY)
    raw["family"][0]["widths"] = list(widths)
    if monitor.pop("_off", False):
        del raw["family"][0]["monitor"]
    else:
        raw["family"][0]["monitor"].update(monitor)
    return raw


def test_certified_steps_first_and_from():
    from widthscope.sweeps.cell import certified_steps

    rows = lambda *bs: [{"step": s, "vacuous": b is None, "b_exact": 1.0 if b is None else b}  # noqa: E731
                        for s, b in zip((0, 3, 7, 20), bs)]
    assert certified_steps(rows(0.5, 0.04, 0.2, 0.01), 0.05) == (3, 20)
    assert certified_steps(rows(0.01, 0.02, 0.03, 0.04), 0.05) == (0, 0)
    assert certified_steps(rows(0.01, None, 0.01, 0.2), 0.05) == (0, None)  # a vacuous row never certifies
    assert certified_steps(rows(0.5, 0.5, 0.05, 0.05), 0.05) == (7, 7)   # <= delta
    assert certified_steps(list(reversed(rows(0.5, 0.04, 0.2, 0.01))), 0.05) == (3, 20)  # any order


def test_schedules_and_defaults():
    assert monitor_steps(150, "log", 6) == [0, 1, 3, 12, 43, 150]
    assert monitor_steps(12, 4) == [0, 4, 8, 12] and monitor_steps(10, 4) == [0, 4, 8, 10]  # the trained model too
    assert monitor_steps(10, "log", 2) == [0, 10] and monitor_steps(5, at=[5, 0, 5]) == [0, 5]
    assert len(monitor_steps(3, "log", 8)) == 4  # repeats merged: at most count steps
    m = load_config(TINY).families[0].monitor
    # M, K default to the largest sweep pair that fits the 16-example pools
    assert (m["steps"], m["M"], m["K"], m["n_train"], m["delta"]) == ([0, 4, 8, 12], 8, 8, 16, 0.9)
    raw = copy.deepcopy(TINY)
    raw["family"][0]["monitor"] = {}
    m = load_config(raw).families[0].monitor
    assert m["steps"] == monitor_steps(12, "log", 6) and (m["n_train"], m["n_test"], m["M"]) == (32, 32, 8)
    assert m["delta"] == 0.05 and m["points"] is None and m["probe"] is None
    raw["family"][0]["monitor"] = {"at": [12, 0], "M": 5}
    m = load_config(raw).families[0].monitor
    assert (m["steps"], m["M"], m["K"]) == ([0, 12], 5, 5)


def test_a_config_without_monitor_keeps_its_fingerprint():
    on, off = load_config(TINY), load_config(_cfg(_off=True))
    assert on.fingerprint() != off.fingerprint()  # monitored cells are other cells
    d = off.to_dict()
    for fam in d["families"]:
        for key in ("probes", "probe_seq_len", "monitor"):
            assert fam.pop(key) is None
    import hashlib

    d.pop("out_dir"), d.pop("device"), d.pop("threads")
    assert off.fingerprint() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("mon") / "out"
    res = run_sweep(load_config(TINY), out, show_progress=False)
    return out, res


def _strip(rows, drop=()):
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS + MONITOR_TIMING_COLUMNS + tuple(drop)}
            for r in rows]


def test_end_to_end_rows_file_and_summary(swept):
    out, res = swept
    cfg = load_config(TINY)
    mon_rows = [r for r in res.rows if r["kind"] == "monitor"]
    al = [r for r in res.rows if r["kind"] == "alignment"]
    assert len(mon_rows) == 2 * 4 * 2  # widths x steps x points
    for cell in plan_cells(cfg):
        cid = cell_id(cell)
        got = read_jsonl(out / "artifacts" / cid / "monitor.jsonl")
        assert got[0]["kind"] == "settings" and got[0]["at"] == [0, 4, 8, 12] and got[0]["M"] == 8
        file_rows = [r for r in got if r["kind"] == "row"]
        assert sorted((r["step"], r["point"]) for r in file_rows) == sorted(
            (s, p) for s in (0, 4, 8, 12) for p in ("blocks.0", "blocks.1"))
        mine = sorted((r for r in mon_rows if r["cell_id"] == cid), key=lambda r: (r["step"], r["point"]))
        for f, r in zip(sorted(file_rows, key=lambda r: (r["step"], r["point"])), mine):
            assert {k: f[k] for k in ("d_align", "b_exact", "d_par", "d_2", "misalignment", "vacuous")} == \
                {k: r[k] for k in ("d_align", "b_exact", "d_par", "d_2", "misalignment", "vacuous")}
            assert r["monitor_probe_s"] == f["probe_s"] and r["steps_total"] == 12
        events = {e["point"]: e["step"] for e in got if e["kind"] == "certified"}
        # the oracle: the first probed step whose non-vacuous B_exact <= delta, recomputed from the rows
        for point in ("blocks.0", "blocks.1"):
            ok = [r["step"] for r in sorted(file_rows, key=lambda r: r["step"])
                  if r["point"] == point and not r["vacuous"] and r["b_exact"] <= 0.9]
            expect = ok[0] if ok else None
            assert events.get(point) == expect
            rows_here = [r for r in al if r["cell_id"] == cid and r["point"] == point]
            assert rows_here and all(r["monitor_first_cert_step"] == expect and r["monitor_point"] for r in rows_here)
            assert all(set(MONITOR_SUMMARY) <= set(r) for r in rows_here)
            assert all((r["monitor_delta"], r["monitor_M"], r["monitor_steps_total"], r["monitor_probe"])
                       == (0.9, 8, 12, "in-domain") for r in rows_here)
            ok_all = [(r["step"], not r["vacuous"] and r["b_exact"] <= 0.9)
                      for r in sorted(file_rows, key=lambda r: r["step"]) if r["point"] == point]
            since = next((s for i, (s, _) in enumerate(ok_all) if all(o for _, o in ok_all[i:])), None)
            assert all(r["monitor_cert_from_step"] == since for r in rows_here)
            firsts = [r for r in mine if r["point"] == point and r["first_certified"]]
            assert [r["step"] for r in firsts] == ([expect] if expect is not None else [])
    assert any(r["monitor_first_cert_step"] is not None for r in al), "no event: the oracle check tested nothing"
    assert all(math.isfinite(r["monitor_s"]) and r["monitor_s"] > 0 for r in res.rows)


def test_report_draws_alignment_over_training(swept, tmp_path):
    from widthscope.report import report

    out, _ = swept
    page = report([out], out_dir=tmp_path / "rep")
    text = page.read_text()
    assert "<h2>Alignment over training</h2>" in text and "mlp: alignment over training" in text
    png = tmp_path / "rep" / "mlp-monitor.png"
    assert png.is_file() and png.read_bytes().startswith(b"\x89PNG")
    # the caption says what produced it: steps, pools, data, (M, K), delta
    assert "at optimizer steps 0, 4, 8, 12 of 12" in text and "(M, K) = (8, 8)" in text
    assert "16 train-pool / 16 held-out-pool examples" in text and "delta = 0.9" in text
    assert "first probed step with B_exact &lt;= delta = 0.9, and the step from which" in text
    assert "have no report section" not in text


def test_resume_neither_duplicates_nor_loses_monitor_rows(swept, tmp_path):
    import shutil

    out0, res0 = swept
    out = tmp_path / "out"
    shutil.copytree(out0, out)
    cells = plan_cells(load_config(TINY))
    cid = cell_id(cells[1])
    # as after a kill during that cell's training: no cell record, a partial monitor file with a torn line
    (out / "cells" / f"{cid}.json").unlink()
    mfile = out / "artifacts" / cid / "monitor.jsonl"
    lines = mfile.read_text().splitlines()
    mfile.write_text("\n".join(lines[:4]) + "\n" + lines[4][:30])
    before = (out / "artifacts" / cell_id(cells[0]) / "monitor.jsonl").read_text()
    res = run_sweep(load_config(TINY), out, show_progress=False)
    assert res.skipped == [cell_id(cells[0])] and res.done == [cid]
    assert (out / "artifacts" / cell_id(cells[0]) / "monitor.jsonl").read_text() == before  # a finished cell's
    got = [r for r in read_jsonl(mfile) if r["kind"] == "row"]
    assert len(got) == len({(r["step"], r["point"]) for r in got}) == 8
    assert len([r for r in read_jsonl(mfile) if r["kind"] == "settings"]) == 1
    key = lambda r: (r["cell_id"], r["step"], r["point"])  # noqa: E731
    a = sorted((r for r in res0.rows if r["kind"] == "monitor"), key=key)
    b = sorted((r for r in read_jsonl(out / "results.jsonl") if r["kind"] == "monitor"), key=key)
    assert [key(r) for r in a] == [key(r) for r in b]  # each row once, none lost
    for x, y in zip(_strip(a), _strip(b)):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert y[k] == pytest.approx(x[k], rel=1e-9, abs=1e-12), k
            else:
                assert x[k] == y[k], k


def _noisy_training_and_rng_probe(monkeypatch):
    """Training that reads the global torch RNG (input noise), and a probe that draws from it."""
    import widthscope.monitor.core as core
    import widthscope.train as tr

    real_forward, real_collect = tr._forward, core.collect

    def forward(model, batch, task, loss, device):
        if model.training:
            x, y = batch
            batch = (x + 0.1 * torch.randn_like(x), y)
        return real_forward(model, batch, task, loss, device)

    def collect(*a, **k):
        torch.randn(7)
        return real_collect(*a, **k)

    monkeypatch.setattr(tr, "_forward", forward)
    monkeypatch.setattr(core, "collect", collect)


def _weights(out: Path, cfg) -> list[dict[str, torch.Tensor]]:
    """The trained weights of every cell, as saved in its checkpoint."""
    from safetensors.torch import load_file

    return [load_file(str(out / "artifacts" / cell_id(c) / "model.safetensors")) for c in plan_cells(cfg)]


def test_training_with_the_monitor_equals_training_without(tmp_path, monkeypatch):
    _noisy_training_and_rng_probe(monkeypatch)
    on_cfg, off_cfg = load_config(_cfg((8,), every=3)), load_config(_cfg((8,), _off=True))
    on = run_sweep(on_cfg, tmp_path / "on", show_progress=False).rows
    off = run_sweep(off_cfg, tmp_path / "off", show_progress=False).rows
    for a, b in zip(_weights(tmp_path / "on", on_cfg), _weights(tmp_path / "off", off_cfg)):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical
    drop = set(MONITOR_SUMMARY) | {"config", "cell_id", "env_timestamp"}
    a = _strip([r for r in on if r["kind"] == "alignment"], drop)
    b = _strip([r for r in off if r["kind"] == "alignment"], drop)
    assert a == b  # losses, certificates, misalignment: the same numbers
    # ... and the check can fail: without the restore, the probe's draw shifts the training noise
    import widthscope.monitor.core as core

    monkeypatch.setattr(core.TrainingState, "restore", lambda self: None)
    run_sweep(on_cfg, tmp_path / "broken", show_progress=False)
    broken = _weights(tmp_path / "broken", on_cfg)
    assert any(not torch.equal(x[k], y[k]) for x, y in zip(broken, _weights(tmp_path / "off", off_cfg)) for k in x)


def test_demo_config_monitors_the_llama_family_and_dry_run_shows_it(tmp_path, capsys):
    from widthscope.cli import main

    cfg = Path(__file__).resolve().parents[1] / "configs" / "demo-llama.toml"
    if not cfg.exists():
        pytest.skip("configs/ not shipped with an installed package")
    assert main(["sweep", str(cfg), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "monitor (llama): steps [0, 1, 3, 12, 43, 150], (M, K) = (32, 32), pools 48 + 48, delta 0.1" in out
