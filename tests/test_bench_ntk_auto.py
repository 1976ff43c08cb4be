"""The auto benchmark's per-round ratios and its table (the committed rows re-render)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("ntk_auto", ROOT / "benchmarks" / "ntk_auto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ratios_are_per_round_and_the_section_renders(tmp_path):
    mod = _mod()
    # round 2 is loaded (everything 3× slower): per-round ratios are not fooled by it
    r = {"auto_choice": "structured", "params": 10, "fastest": "jacobian",
         "seconds": {"auto": 1.1, "structured": 1.0, "jacobian": 0.9},
         "all_seconds": {"auto": [1.1, 3.3, 1.0], "structured": [1.0, 3.0, 1.0], "jacobian": [0.8, 2.7, 1.0]}}
    q = mod.ratios(r)
    assert q["choice_ratio"] == pytest.approx(1.0 / 0.9)  # rounds: 1.25, 1.111, 1.0
    assert q["auto_ratio"] == pytest.approx(1.2222222, rel=1e-6)  # rounds: 1.375, 1.222, 1.0
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"m": r}))
    text = mod.section(p)
    assert "| m | 10 | structured | 1 | 0.9 | skipped | 1.1 | jacobian | 1.11 | 1.22 | skipped | – | – |" in text
    # the torch.func reference is timed in the same rounds but is never the "fastest method"
    r["all_seconds"]["vmap_jacrev"], r["seconds"]["vmap_jacrev"] = [0.1, 0.3, 0.1], 0.1
    r["loadavg_start"], r["loadavg_end"] = [3.0, 2, 1], [4.25, 2, 1]
    q = mod.ratios(r)
    assert q["choice_ratio"] == pytest.approx(1.0 / 0.9) and q["vmap_jacrev_over_structured"] == pytest.approx(0.1)
    p.write_text(json.dumps({"m": r}))
    assert "| 1.11 | 1.22 | 0.1 | 0.10 | 3.0–4.2 |" in mod.section(p)


def test_vmap_jacrev_reference_is_the_kernel():
    mod = _mod()
    from widthscope.linear import ntk

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    want = ntk(net, x, method="jacobian")
    assert torch.allclose(mod.vmap_jacrev(net, x), want, rtol=1e-10, atol=1e-12)
    per = 2 * sum(p.numel() for p in net.parameters()) * 8  # bytes of one example's Jacobian
    assert torch.allclose(mod.vmap_jacrev(net, x, budget=2 * 2 * per), want, rtol=1e-10, atol=1e-12)  # chunks of 2


def test_benchmark_models_build_and_run():
    mod = _mod()
    for name, (build, inputs, _) in mod.models().items():
        torch.manual_seed(0)
        model = build().eval()
        out = model(inputs()[:2])
        assert out.shape[0] == 2 and out.dim() == 2, name


def _grid_mod():
    spec = importlib.util.spec_from_file_location("ntk_auto_grid", ROOT / "benchmarks" / "ntk_auto_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_grid_runs_in_quick_mode_and_writes_well_formed_rows(tmp_path):
    mod = _grid_mod()
    out = tmp_path / "grid.json"
    assert mod.main(["--quick", "--reps", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert list(rows) == [mod.key(*pt) for pt in mod.grid(quick=True)]
    for name, r in rows.items():
        assert r["auto_choice"] in mod.METHODS and r["reason"].startswith(r["auto_choice"])
        paths = [m for m in (*mod.METHODS, "vmap_jacrev")]
        for m in paths:  # every path is timed, or says why not
            assert (m in r["seconds"]) + (m in r["skipped"]) + (m in r["failed"]) == 1, (name, m)
        for m, t in r["all_seconds"].items():
            assert len(t) == (1 if m in r["dropped"] else 2) and all(v > 0 for v in t)
            assert r["max_rel_diff_vs_auto"][m] < 1e-4  # every path computes the same kernel
        assert r["fastest"] in r["seconds"] and r["fastest"] != "auto"
        assert r["auto_ratio"] > 0 and r["choice_ratio"] > 0 and len(r["loadavg_start"]) == 3
        assert r["code_rev"] == mod.CODE_REV
        assert r == r | mod.ratios(r)  # the stored ratios are the function of the stored times
    # a second run resumes: nothing is measured again
    before = out.read_text()
    mod.main(["--quick", "--reps", "2", "--out", str(out)])
    assert out.read_text() == before
    # --choice-only times nothing: the current code's choice beside each row's timings; the choice has no timed
    # term (issue 32), so the code that timed the rows picks the same, with the same estimates and ratio
    assert mod.main(["--quick", "--choice-only", "--out", str(out)]) == 0
    for name, r in json.loads(out.read_text()).items():
        again = r.pop("rechosen")
        assert r == rows[name]  # the recorded timings are untouched
        assert again["auto_choice"] == r["auto_choice"] and again["code_rev"] == mod.CODE_REV
        assert again["estimated_s"] == {m: s for m, s in r["estimated_s"].items() if m != "vmap_jacrev"}
        assert again["choice_ratio"] == r["choice_ratio"] and again["reason"] == r["reason"]


def test_grid_ratios_are_per_round_against_every_path():
    mod = _grid_mod()
    r = {"auto_choice": "structured",
         "all_seconds": {"auto": [1.2, 3.3, 1.0], "structured": [1.0, 3.0, 1.1], "vmap_jacrev": [0.8, 3.5, 1.0],
                         "jacobian": [9.0]}}  # jacobian: dropped after round 1
    q = mod.ratios(r)
    assert q["fastest"] == "vmap_jacrev"  # medians: vmap_jacrev 1.0, structured 1.1, jacobian 9
    # per round the fastest is 0.8, 3.0, 1.0: auto 1.5, 1.1, 1.0; its choice 1.25, 1.0, 1.1
    assert q["auto_ratio"] == pytest.approx(1.1) and q["choice_ratio"] == pytest.approx(1.1)
