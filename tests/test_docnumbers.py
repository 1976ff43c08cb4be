"""Numbers in README.md and docs/ agree with the committed result rows (benchmarks/docnumbers.py).

Reads committed files only (no training): the marked spans are recomputed and compared as text,
the README's "What we measured" section may hold no unmarked digits, the benchmark page's tables
render from docs/benchmarks.json, and the committed linearization slopes refit from their rows.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _module(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the benchmark modules import _common
    spec = importlib.util.spec_from_file_location(f"_t_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dn = _module("docnumbers")


def test_every_marked_number_agrees_with_the_rows():
    problems = dn.check()
    assert not problems, "run `python benchmarks/docnumbers.py --write` (or fix the rows):\n" + "\n".join(problems)
    assert sum(len(dn.spans(p.read_text())) for p in dn.pages()) > 50  # the pages are marked, not empty


def test_readme_measurements_have_no_unmarked_numbers():
    found = dn.unmarked()
    assert not found, "mark these with <!--n:KEY-->...<!--/n--> (or allow them in SECTIONS):\n" + "\n".join(found)


def test_check_catches_a_wrong_number_and_write_fixes_it(tmp_path):
    page = tmp_path / "page.md"
    right = dn.compute(["bench.probe_speedup_llama"])["bench.probe_speedup_llama"]
    page.write_text("The probe is <!--n:bench.probe_speedup_llama-->1–2<!--/n-->× faster.\n")
    assert right != "1–2"
    problems = dn.check([page])
    assert len(problems) == 1 and "bench.probe_speedup_llama" in problems[0] and repr(right) in problems[0]
    assert dn.write([page]) == [page]
    assert page.read_text() == f"The probe is <!--n:bench.probe_speedup_llama-->{right}<!--/n-->× faster.\n"
    assert dn.check([page]) == []


def test_unknown_or_failing_quantities_are_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x <!--n:no.such.key-->3<!--/n-->\n")
    with pytest.raises(RuntimeError, match="unknown quantity .no.such.key."):
        dn.check([page])
    errors: dict[str, str] = {}
    assert dn.write([page], errors=errors) == [] and "no.such.key" in errors
    assert page.read_text() == "x <!--n:no.such.key-->3<!--/n-->\n"  # left as it was


def test_lint_refuses_markers_that_change_the_rendering():
    assert dn.lint("word <!--n:a-->1<!--/n--> word\n") == []
    assert "begins a line" in dn.lint("text\n  <!--n:a-->1<!--/n--> more\n")[0]
    assert dn.lint("<!--n:t-->\n\n| a |\n|---|\n\n<!--/n-->\n") == []
    assert "multi-line" in dn.lint("<!--n:t-->\n| a |\n|---|<!--/n-->\n")[0]


def test_unmarked_digits_are_found_outside_markers_and_code(tmp_path, monkeypatch):
    page = tmp_path / "README.md"
    page.write_text("## S\n\nfast: <!--n:a-->2–8<!--/n-->× in float64 and `M = 64`, width 1024 and n = 256, "
                    "then 17 more\n## T\n9\n")
    monkeypatch.setattr(dn, "SECTIONS", {("README.md", "## S"): ("width 1024 and n = 256",)})
    found = dn.unmarked(tmp_path)
    assert len(found) == 1 and "'17'" in found[0]


def test_an_opener_without_closer_swallows_nothing():
    text = "prose shows `<!--n:KEY-->` and <!--n:a-->1 then <!--n:b-->2<!--/n-->\n"
    assert dn.spans(text) == [("b", "2")]


def test_formatting_helpers():
    assert dn.fixed(-0.004, 2) == "0.00" and dn.fixed(-1.226, 2) == "−1.23" and dn.fixed(-1.2, 1, "-") == "-1.2"
    assert dn.sig(0.003314, 3) == "0.00331" and dn.sig(2.154, 2) == "2.2" and dn.sig(316.2, 2) == "316"  # integer digits are kept
    assert dn.span(0.1, 2.2, lambda v: dn.sig(v, 2)) == "0.10–2.2" and dn.span(3, 3, str) == "3"
    assert dn.sci(4.311e-5) == "4.3·10⁻⁵" and dn.sci(9.97e-4) == "1.0·10⁻³"


def test_benchmark_page_tables_render_from_the_recorded_json():
    """docs/benchmarks.md is written by run_all from docs/benchmarks.json: every section's table
    and the separately recorded large-model and NTK-at-scale tables re-render verbatim."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    raw = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
    run_all = _module("run_all")
    for k, v in raw["machine"].items():
        assert f"- **{k}**: {v}\n" in page, f"docs/benchmarks.md machine line {k!r} differs"
    assert f" in {raw['total_s']:.0f} s." in page
    for name, rows in raw["results"].items():
        mod = run_all._load(BENCH / f"bench_{name}.py")
        table = mod.markdown(rows) if hasattr(mod, "markdown") else run_all._generic_table(rows)
        assert table in page, f"docs/benchmarks.md section {name!r} differs from docs/benchmarks.json"
    for extra in ("large_memory", "ntk_scaling", "ntk_auto", "ntk_vs_nt"):
        assert _module(extra).section().strip() in page, f"docs/benchmarks.md: {extra} section differs"


@pytest.mark.parametrize("run", sorted(p.parent.name for p in (BENCH / "results").glob("linearize-*/slopes.json")))
def test_committed_slopes_refit_from_their_rows(run):
    """slopes.json is what widthscope.linearization.summary.summarize gives on the committed rows (same code,
    same seeded bootstrap: equal to 1e-9)."""
    from widthscope.linearization.summary import summarize

    d = BENCH / "results" / run
    rows = [json.loads(line) for line in (d / "results.jsonl").read_text().splitlines() if line.strip()]
    recorded = json.loads((d / "slopes.json").read_text())
    refit = summarize(rows, recorded["config"])
    assert [(s["metric"], s["alpha"], s["step"]) for s in refit] == \
        [(s["metric"], s["alpha"], s["step"]) for s in recorded["slopes"]]
    for a, b in zip(refit, recorded["slopes"]):
        for k in ("slope", "ci_low", "ci_high"):
            assert a[k] == pytest.approx(b[k], abs=1e-9), (run, a["metric"], a["alpha"], a["step"], k)


def test_markers_render_invisibly_in_commonmark():
    """An oracle for ``lint``: a CommonMark parser sees each inline marker as inline HTML (never an
    HTML block carrying text) and each table span as a table."""
    markdown_it = pytest.importorskip("markdown_it")
    import re

    md = markdown_it.MarkdownIt("commonmark").enable("table")
    for page in dn.pages():
        text = page.read_text()
        tokens = md.parse(text)
        for t in tokens:
            if t.type == "html_block" and "<!--n:" in t.content:
                assert not re.sub(r"<!--/?n(:[^>]*)?-->", "", t.content).strip(), (page.name, t.content[:80])
        tables = sum("\n|" in body for _, body in dn.spans(text))
        assert sum(t.type == "table_open" for t in tokens) >= tables, page.name
    bad = md.parse("text\n<!--n:a-->1<!--/n--> more\n")
    assert any(t.type == "html_block" for t in bad)  # what lint refuses really breaks the paragraph


def test_compact_keeps_every_row_once_in_cell_order_without_probe_data(tmp_path):
    src, dst = tmp_path / "sweep", tmp_path / "out"
    (src / "cells").mkdir(parents=True)
    (src / "artifacts").mkdir()
    (src / "artifacts" / "model.safetensors").write_bytes(b"x" * 10)
    for cell in (1, 0):
        rows = [{"cell_index": cell, "row_index": i, "v": 10 * cell + i, "probe_data": "long text"} for i in (1, 0)]
        (src / "cells" / f"c{cell}.json").write_text(json.dumps({"rows": rows}))
    (src / "sweep.json").write_text('{"fingerprint": "f"}')
    assert dn.compact(src, dst) == 4
    got = [json.loads(line) for line in (dst / "results.jsonl").read_text().splitlines()]
    assert [r["v"] for r in got] == [0, 1, 10, 11] and all("probe_data" not in r for r in got)
    assert sorted(p.name for p in dst.iterdir()) == ["results.jsonl", "sweep.json"]


def test_digits_section_words_follow_from_the_slopes():
    """docs/linearization.md, digits: "the smooth activation follows 1/n, the non-smooth one decays
    more slowly" is what the committed intervals say (the interval words themselves are computed)."""
    assert dn.resolve("lin/digits-tanh/versus/dev_rms/0.0/100/-1")() == "contains −1.0"
    assert dn.resolve("lin/digits/versus/dev_rms/0.0/100/-1")() == "flatter than −1.0"
    assert dn.resolve("lin/digits/versus/dev_rms/0.0/100/-0.3")() == "steeper than −0.3"  # and still decays
    page = (ROOT / "docs" / "linearization.md").read_text()
    assert "the smooth activation follows `1/n`, the non-smooth one\n  decays more slowly" in page


def test_versus_words_are_where_the_interval_lies():
    s = {"slope": -1.0, "ci_low": -1.2, "ci_high": -0.8}
    import unittest.mock as um

    with um.patch.object(dn, "_lin_slope", lambda *a: s):
        assert dn.resolve("lin/digits/versus/dev_rms/0.0/100/-1")() == "contains −1.0"
        assert dn.resolve("lin/digits/versus/dev_rms/0.0/100/-0.5")() == "steeper than −0.5"
        assert dn.resolve("lin/digits/versus/dev_rms/0.0/100/-2")() == "flatter than −2.0"
