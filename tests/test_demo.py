"""``widthscope demo --quick`` end to end, and the embedded configs against configs/*.toml."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from widthscope import demo
from widthscope.cli import main
from widthscope.sweeps.alignment import load_config, plan_cells

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name,embedded", [("demo-llama", demo.DEMO_LLAMA), ("demo-mlp", demo.DEMO_MLP)])
def test_embedded_configs_equal_shipped_toml(name, embedded):
    path = CONFIGS / f"{name}.toml"
    if not path.exists():
        pytest.skip("configs/ not shipped with an installed package")
    assert tomllib.loads(path.read_text()) == embedded
    cfg = load_config(embedded)
    fam = cfg.families[0]
    # the demo's promise: >= 4 widths, 2 seeds, paired M = K
    assert len(fam.widths) >= 4 and cfg.seeds == [0, 1] and all(m == k for m, k in cfg.MK)


def test_fallback_to_digits_and_quick_grid():
    llama, mlp = demo.demo_configs(quick=True, image_dataset="digits")
    assert mlp["family"][0]["dataset"] == "digits" and mlp["family"][0]["data_options"] == {}
    assert len(plan_cells(load_config(llama))) == 2 and len(plan_cells(load_config(mlp))) == 2
    full = demo.demo_configs(quick=False, image_dataset="fashion-mnist")
    assert full[1]["family"][0]["dataset"] == "fashion-mnist" and full[0] == demo.DEMO_LLAMA


def test_quick_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    page = out / "report" / "report.html"
    assert f"report: {page}" in text
    html = page.read_text()
    assert "Alignment width sweep" in html and html.count('src="data:image/png;base64,') >= 4
    # both regimes, each with its own verdict: in-domain and a shifted corpus at a longer probe length
    assert "llama · probe in-domain, length 16: d_align (two-population) grows with width at" in html
    assert "llama · probe shifted, length 256: d_align (two-population) grows with width at" in html
    assert "Verdict for llama · probe in-domain, length 16" in html and "Verdict for llama · probe shifted, length 256" in html
    assert "<h2>Claims</h2>" in html and "llama · probe shifted, length 256: d_align grows with width" in html
    # the page says what it measured: data (and a fallback's reason), config, training, versions
    assert "What was measured" in html and "config (" in html
    # ... named in words: the stdlib's source code, the pydoc prose, and the linearization's digits
    assert "data: trained on the Python standard library&#x27;s own source code" in html
    assert "English prose shipped with Python (the pydoc help topics" in html
    assert "not recorded in the rows" not in html
    # the console keeps the two probe regimes in separate tables
    assert "alignment sweep, probe in-domain (length 16)" in text
    assert "alignment sweep, probe shifted (length 256)" in text
    assert "final held-out loss" in html and "torch " in html and "transformers " in html
    import widthscope.demo as demo_mod

    if demo_mod._image_dataset() == "digits":
        assert "MLP part: digits, because Fashion-MNIST is not installed" in html
    assert "mlp: d_align (two-population) grows with width at" in html
    # the LLaMA family records alignment over training, and the report draws it
    assert "<h2>Alignment over training</h2>" in html and "llama: alignment over training" in html
    assert "probe shifted: English prose shipped with Python" in html
    assert (out / "report" / "llama-monitor.png").is_file()
    # the plan's count of the report's figures (demo --plan times one and multiplies)
    assert len(list((out / "report").glob("*.png"))) == demo.report_figures(demo.demo_configs(True, "digits", 1), True)
    for part in ("llama", "mlp"):
        assert (out / part / "results.jsonl").exists()
    # resumable: a second run redoes no cell (the cell files are untouched)
    cells = sorted((out / "llama" / "cells").glob("*.json")) + sorted((out / "mlp" / "cells").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    assert len(cells) == 4
    assert main(["demo", "--quick", "--out", str(out), "--no-progress", "--no-linear"]) == 0
    assert [p.stat().st_mtime_ns for p in cells] == stamps
    assert "skipped (--no-linear)" in capsys.readouterr().out
    # the plan of a finished demo: every cell shown finished, nothing left to time, nothing written
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert main(["demo", "--quick", "--out", str(out), "--plan-no-time"]) == 0
    text = capsys.readouterr().out
    assert "[1/4] alignment sweep: llama" in text and "[4/4] report: 17 figures" in text
    assert text.count("total over the 0 unfinished cell(s)") == 2 and "linearization sweep" in text
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == files


def test_demo_plan_predicts_each_part_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    plan = demo.plan_demo(out, quick=True, time_run=True)
    assert not out.exists()
    # the process's fixed costs once, then each part's work (the sweeps' and linearize's, without theirs)
    assert [name for name, _ in plan.parts][1:] == ["llama sweep", "mlp sweep", "linearization sweep", "report"]
    assert plan.parts[0][0].startswith("process start") and all(t is not None and t > 0 for _, t in plan.parts)
    assert plan.predicted_s == pytest.approx(sum(t for _, t in plan.parts if t is not None))
    assert plan.to_dict()["parts"][3] == {"part": "linearization sweep", "seconds": plan.parts[3][1]}
    text = capsys.readouterr().out
    # each sweep: its cells' time and the whole-process totals; linearize's table; the demo's totals last
    assert text.count("predicted wall time") == 6 and "[4/4] report: 17 figures, " in text
    total, peak = text.rstrip().splitlines()[-2:]
    assert total.split()[:5] == ["predicted", "wall", "time", "(whole", "process)"]
    assert float(total.split()[5]) == pytest.approx(plan.predicted_s, rel=5e-3)
    assert peak.split()[:6] == ["predicted", "peak", "memory", "(whole", "process,", "RSS)"] and plan.peak_bytes > 0
    counted = demo.plan_demo(out, quick=True, time_run=False, linear=False)
    assert [t for _, t in counted.parts] == [None, None, None] and counted.predicted_s is None
    assert demo.report_figures(demo.demo_configs(True, "digits", 1), linear=False) == 12
    assert "skipped (--no-linear)" in capsys.readouterr().out and not out.exists()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(demo.WidthscopeError, match="it is a file, not a directory"):
        demo.plan_demo(tmp_path / "a-file", quick=True, time_run=False)
