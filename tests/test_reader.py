"""What the user reads is what was measured (issue 19): console tables per probe condition, one
vacuous rule across rows / JSON / tables / plot data, the data named in words in rows and the
report, figure titles that fit, and advice that fits the probe condition."""
from __future__ import annotations

import dataclasses
import html
import io
import json
import math
from pathlib import Path

import pytest

import widthscope.stats as wstats
from widthscope import data
from widthscope.certification import data_description
from widthscope.report import alignment, load_results, report
from widthscope.report._plot import fit_titles
from widthscope.report.html import data_descriptions
from widthscope.stats import vacuous_rule
from widthscope.sweeps.alignment import run_sweep
from widthscope.sweeps.results import print_summary, summary_rows


def _row(probe: str, L: int, seed: int, w: int, d: float, **kw):
    return {"kind": "alignment", "sweep": "s", "family": "llama", "budget": 64, "width": w, "seed": seed,
            "point": "layers.0", "point_index": 0, "M": 8, "K": 8, "probe_set": probe, "probe_seq_len": L,
            "two_d_align": d, "two_d_par": d, "two_d_2": 2 * d, "one_d_align": d, "two_vacuous": False,
            "misalignment": 0.1, "two_b_exact": 0.2, "two_b_align": 0.3, "test_loss": 3.0, **kw}


# ----------------------------------------------------------------------------- console grouping
def test_console_table_never_averages_two_probe_conditions():
    # in-domain d_align 1.0 / 1.2, shifted 100 / 120: a pooled mean (55.55) would be neither regime
    rows = [_row("in-domain", 64, s, 32, 1.0 + 0.2 * s) for s in (0, 1)]
    rows += [_row("shifted", 256, s, 32, 100.0 + 20 * s, probe_in_domain=False) for s in (0, 1)]
    table = summary_rows(rows)
    got = {(r["probe_set"], r["probe_seq_len"]): r["d_align"] for r in table}
    assert got == {("in-domain", 64): pytest.approx(1.1), ("shifted", 256): pytest.approx(110.0)}
    buf = io.StringIO()
    print_summary(rows, Path("/tmp/x"), file=buf)
    text = buf.getvalue()
    head_in, head_sh = "alignment sweep, probe in-domain (length 64)", "alignment sweep, probe shifted (length 256)"
    assert head_in in text and head_sh in text
    a, b = text.index(head_in), text.index(head_sh)
    assert "1.1" in text[a:b] and "110" in text[b:] and "110" not in text[a:b]
    assert "55.5" not in text


# ----------------------------------------------------------------------------- the vacuous rule
@pytest.mark.parametrize("given, want", [
    # a vacuous term: d_align undefined (None), the resolved term kept, no limit
    ({"d_par": 0.0, "d_2": 1.2, "d_align": 1.2, "vacuous": True, "limit": "d_par"},
     {"d_par": None, "d_2": 1.2, "d_align": None, "vacuous": True, "limit": None}),
    ({"d_par": 0.7, "d_2": 0.0, "d_align": 0.7, "vacuous": True, "limit": "d_2"},
     {"d_par": 0.7, "d_2": None, "d_align": None, "vacuous": True, "limit": None}),
    # E[A] <= 0: nothing defined
    ({"d_par": 0.0, "d_2": 0.0, "d_align": 0.0, "vacuous": True},
     {"d_par": None, "d_2": None, "d_align": None, "vacuous": True}),
    # a certified row is unchanged
    ({"d_par": 0.7, "d_2": 1.2, "d_align": 0.7, "vacuous": False, "limit": None},
     {"d_par": 0.7, "d_2": 1.2, "d_align": 0.7, "vacuous": False, "limit": "d_par"}),
    # absent columns stay absent and void nothing
    ({"d_align": 0.5}, {"d_align": 0.5}),
])
def test_vacuous_rule(given, want):
    got = vacuous_rule(dict(given))
    assert got == want
    assert vacuous_rule(dict(got)) == got  # idempotent: old and new rows read the same


def test_vacuous_rule_on_a_real_certificate():
    import torch

    g = torch.Generator().manual_seed(0)
    Xa = torch.randn(60, 6, generator=g, dtype=torch.float64) + 0.5
    Xb = torch.randn(50, 6, generator=g, dtype=torch.float64) + 0.5
    m = dataclasses.replace(wstats.cross_moments(Xa, Xb), b_sigma_a_b=-1e-3)  # an estimate <= 0
    c = wstats.certificate(m, M=8, K=8)
    assert c.vacuous and c.d_par == 0 and c.d_align == pytest.approx(c.d_2) and c.d_2 > 0  # per-term object
    row = vacuous_rule({f"two_{f}": getattr(c, f) for f in ("d_par", "d_2", "d_align", "vacuous")}, "two_")
    assert row["two_d_align"] is None and row["two_d_par"] is None and row["two_d_2"] == pytest.approx(c.d_2)


TINY = {
    "sweep": {"name": "reader", "seeds": [0, 1], "M": [8], "draws": 50, "interventions": "none"},
    "family": [{"name": "mlp", "widths": [8, 16], "dataset": "digits", "n_train": 128, "n_test": 32,
                "model_options": {"depth": 2}, "train": {"steps": 10, "lr": 1e-2, "batch_size": 32},
                "certify": {"n_probe_train": 24, "n_probe_test": 24, "batch_size": 24}}],
}


@pytest.fixture(scope="module")
def vacuous_sweep(tmp_path_factory):
    """A tiny sweep whose two-population certificates at width 8 are vacuous in a term (bᵀΣ_a b
    <= 0) while d_2 is resolved: exactly the case the user met."""
    out = tmp_path_factory.mktemp("reader") / "sweep"
    real = wstats.certificate

    def certificate(m, **kw):
        if isinstance(m, wstats.CrossMoments) and m.d == 8:
            m = dataclasses.replace(m, ab=abs(m.ab) + 1e-9, b_sigma_a_b=-abs(m.b_sigma_a_b) - 1e-12,
                                    a_sigma_b_a=abs(m.a_sigma_b_a) + 1e-12,
                                    tr_sigma_a_sigma_b=abs(m.tr_sigma_a_sigma_b) + 1e-12)
        return real(m, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(wstats, "certificate", certificate)
    try:
        res = run_sweep(TINY, out, show_progress=False)
    finally:
        mp.undo()
    return out, res


def test_vacuous_rule_is_one_rule_in_json_console_table_and_plot(vacuous_sweep):
    out, res = vacuous_sweep
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["kind"] == "alignment"]
    vac = [r for r in rows if r["width"] == 8]
    ok = [r for r in rows if r["width"] == 16]
    assert vac and ok
    for r in vac:  # JSON rows: flagged, d_align missing, the resolved term kept, no limit
        assert r["two_vacuous"] and r["two_d_align"] is None and r["two_limit"] is None
        assert r["two_d_par"] is None and r["two_d_2"] > 0 and r["two_b_align"] == 1.0
    for r in ok:
        if not r["two_vacuous"]:
            assert r["two_d_align"] == pytest.approx(min(r["two_d_par"], r["two_d_2"]))
            assert r["two_limit"] == ("d_par" if r["two_d_par"] <= r["two_d_2"] else "d_2")
    # console
    table = {(r["width"], r["point"]): r for r in summary_rows(rows)}
    for (w, _), r in table.items():
        if w == 8:
            assert r["d_align"] is None and r["vacuous"] == "2/2"
    # plot data: no value (NaN) where every seed is vacuous, the rows' mean elsewhere
    drawn = alignment.d_align_by_point(list(alignment.groups(rows).values())[0], "two")
    for pi, (ws, vals) in drawn.items():
        by = dict(zip(ws, vals))
        assert math.isnan(by[8])
        want = [r["two_d_align"] for r in ok if r["point_index"] == pi and r["two_d_align"] is not None]
        assert by[16] == pytest.approx(sum(want) / len(want) if want else math.nan, nan_ok=True)
    # report table: '–' for d_align and 2/2 vacuous at width 8, no 'limit' named there
    (tab,) = alignment.tables(rows)
    for tr in tab["html"].split("<tr>")[2:]:
        cells = [c.split("</td>")[0] for c in tr.split("<td")[1:]]
        cells = [c.split(">", 1)[1] for c in cells]
        if cells[0] == "8":
            assert cells[3] == "2/2" and cells[6] == "–" and cells[9] == "–"


# ----------------------------------------------------------------------------- data in words
def test_describe_names_corpus_split_and_size():
    text = data.describe(data.load("text", n_train=40, n_test=10, seq_len=32, max_bytes=50_000))
    assert "Python standard library's own source code" in text and "50,000 bytes" in text
    assert "32-byte chunks" in text and "40 train / 10 held-out chunks" in text
    prose = data.describe(data.load("prose", n_train=20, n_test=10, seq_len=64))
    assert "English prose shipped with Python" in prose and "pydoc help topics" in prose
    digits = data.describe(data.load("digits", n_train=30, n_test=20))
    assert "scikit-learn's 8x8 handwritten digits" in digits and "30 train / 20 held-out examples" in digits
    info = {"dataset": "prose", "n_train": 16, "n_test": 16, "seq_len": 64, "tokenizer": "bytes",
            "train_pool": "a fresh seeded sample of the train part"}
    words = data_description(info)
    assert "English prose shipped with Python" in words and "16 train-pool / 16 held-out-pool" in words


def test_sweep_rows_and_report_name_the_data(vacuous_sweep, tmp_path):
    out, res = vacuous_sweep
    rows = [r for r in res.rows if r["kind"] == "alignment"]
    words = {r["data_description"] for r in rows}
    assert len(words) == 1 and "scikit-learn's 8x8 handwritten digits" in next(iter(words))
    page = report([out], tmp_path / "rep").read_text()
    assert "data: " + html.escape(next(iter(words))) in page and "not recorded in the rows" not in page


def test_old_rows_without_the_column_name_their_dataset_in_words():
    rows = [{"kind": "alignment", "dataset": "text"}, {"kind": "intervention", "dataset": "text"}]
    assert data_descriptions(rows) == [data.describe_name("text")]
    assert "Python standard library's own source code" in data.describe_name("text")
    assert "pydoc help topics" in data.describe_name("prose")
    # new rows: their own words only, once
    new = [dict(r, data_description="trained on X: 4 train / 2 held-out chunks") for r in rows]
    assert data_descriptions(new) == ["trained on X: 4 train / 2 held-out chunks"]


def test_linearization_rows_and_old_rows_name_their_data(tmp_path):
    from widthscope.linearization.run import run_sweep as linear_sweep

    cfg = {"name": "t", "widths": [4, 8, 16, 32, 64], "seeds": [0],
           "data": {"name": "digits", "n_train": 16, "n_test": 16},
           "train": {"alphas": [0.0], "steps": 2, "log_steps": [0, 2], "dtype": "float64", "probe": 2},
           "correlations": {"measure": []}, "fit": {"steps": [2]}}
    out = tmp_path / "lin"
    rows = linear_sweep(cfg, out, quiet=True)["rows"]
    assert rows and all("scikit-learn's 8x8 handwritten digits" in r["data_description"] for r in rows)
    page = report([out], tmp_path / "rep").read_text()
    assert "16 train / 16 held-out examples" in page and "not recorded in the rows" not in page
    # rows written before the column: the config names the data
    old = [{k: v for k, v in r.items() if k != "data_description"} for r in rows]
    assert any("scikit-learn's 8x8 handwritten digits" in d for d in data_descriptions(old, str(out)))


def test_certify_json_names_its_data(tmp_path):
    from widthscope.cli import main

    out = tmp_path / "c.json"
    assert main(["certify", "--train-steps", "5", "--n-train", "24", "--n-test", "24", "--M", "8", "--draws", "20",
                 "--batch-size", "12", "--interventions", "none", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    words = res["settings"]["data_description"]
    assert "scikit-learn's 8x8 handwritten digits" in words and "24 train-pool / 24 held-out-pool" in words
    rows = [r for r in load_results([out]) if r["kind"] == "alignment"]
    assert {r["data_description"] for r in rows} == {words}
    for r in rows:  # certify JSON and its rows share the vacuous rule
        c = next(c for p in res["points"] if p["point"] == r["point"] for c in p["certificates"]
                 if (c["M"], c["K"]) == (r["M"], r["K"]))
        assert r["two_d_align"] == c["two"]["d_align"]
        assert (c["two"]["d_align"] is None) == c["two"]["vacuous"]


# ----------------------------------------------------------------------------- figures
def test_figure_titles_fit_inside_the_figure_and_do_not_overlap(vacuous_sweep, tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out, res = vacuous_sweep
    rows = [dict(r, family="a-long-family-name-for-wrapping", probe_set="shifted-prose-probe", probe_seq_len=256)
            for r in res.rows if r["kind"] == "alignment"]
    rows += [dict(r, probe_set="in-domain") for r in rows]  # two conditions: the label names the probe
    saved = []
    from matplotlib.figure import Figure

    orig = Figure.savefig

    def spy(self, *a, **kw):
        saved.append(self)
        return orig(self, *a, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(Figure, "savefig", spy)
    try:
        alignment.figures(rows, tmp_path)
    finally:
        mp.undo()
    assert saved
    for fig in saved:
        canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)
        canvas.draw()
        r = canvas.get_renderer()
        box = fig.bbox
        texts = [t for ax in fig.axes for t in (ax.title,) if t.get_text()] + [fig._suptitle]
        assert "· probe " in fig._suptitle.get_text().replace("\n", " ")  # the PNG alone names its regime
        ext = [t.get_window_extent(r) for t in texts]
        for e in ext:
            assert box.x0 - 0.5 <= e.x0 and e.x1 <= box.x1 + 0.5 and box.y0 - 0.5 <= e.y0 and e.y1 <= box.y1 + 0.5
        for i in range(len(ext)):
            for j in range(i + 1, len(ext)):
                assert not ext[i].overlaps(ext[j]), (texts[i].get_text(), texts[j].get_text())


def test_fit_titles_wraps_a_title_wider_than_its_axes():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3), dpi=90, layout="constrained")
    a, b = fig.subplots(1, 2)
    long = "a very long panel title that is clearly far wider than half of a six inch figure can hold"
    a.set_title(long)
    b.set_title(long)
    fit_titles(fig)
    r = fig.canvas.get_renderer()
    assert "\n" in a.title.get_text()
    assert a.title.get_window_extent(r).x1 <= b.title.get_window_extent(r).x0  # side by side, no overlap
    assert a.title.get_window_extent(r).width <= a.get_window_extent(r).width


# ----------------------------------------------------------------------------- advice
def test_advice_fits_the_probe_condition():
    rows = [_row(p, L, 0, w, 1.0 / w, probe_in_domain=(p == "in-domain")) for p, L in (("in-domain", 64),
                                                                                   ("shifted", 256))
            for w in (16, 32, 64)]
    text = alignment.summary(rows)
    adv = {line.split(" for ")[1].split(":")[0]: line for line in text if line.startswith("What to try next")}
    ind = next(v for k, v in adv.items() if "in-domain" in k)
    sh = next(v for k, v in adv.items() if "shifted" in k)
    assert "a shifted probe set" in ind and "longer probe sequences" in ind
    assert "a shifted probe set" not in sh and "already shifted" in sh and "in-domain" in sh
    # image models: no 'longer probe sequences'; old rows without probe_in_domain read from probe_data
    img = [dict(r, dataset="digits", probe_seq_len=None, probe_in_domain=None,
                probe_data="digits train part / digits held-out part, shift noise:0.5") for r in rows
           if r["probe_set"] == "shifted"]
    (line,) = [x for x in alignment.summary(img) if x.startswith("What to try next")]
    assert "already shifted" in line and "longer probe sequences" not in line
