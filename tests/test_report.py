"""The HTML report: alignment section (figures, table, verdict), framework, CLI, real Chromium render."""
from __future__ import annotations

import base64
import math
import os
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from widthscope.cli import main
from widthscope.report import alignment, html as rhtml, load_results, report
from widthscope.sweeps.grid import run_grid

CHROMIUM = "/usr/bin/chromium"
WIDTHS = [32, 64, 128, 256]
POINTS = ["layers.0", "layers.1", "layers.2", "layers.3"]


def synthetic_rows(seeds=(0, 1), mks=((16, 16), (32, 32), (64, 64))):
    """Alignment rows with a known structure: d_align = 2 + c_p * log2(N/32) + seed jitter with
    c = (+1, +0.5, +2, -1) per point (grows at 3/4 points, falls at layers.3). The certificate numbers
    follow the spec's formulas from d_align; the empirical misalignment is B_exact / 3 (below the bound)."""
    slopes = [1.0, 0.5, 2.0, -1.0]
    rows = []
    for w in WIDTHS:
        for s in seeds:
            for pi, p in enumerate(POINTS):
                d = 3.0 + slopes[pi] * math.log2(w / 32) + 0.1 * s
                for M, K in mks:
                    n_eff = M * K / (M + K + 1)
                    b_align = 1 / (1 + n_eff * d)
                    b_exact = 0.7 * b_align
                    mis = b_exact / 3
                    rows.append({
                        "kind": "alignment", "sweep": "syn", "family": "llama", "budget": 512, "width": w,
                        "seed": s, "point": p, "point_index": pi, "M": M, "K": K, "n_params": 1000 * w,
                        "test_loss": 3.0 - 0.1 * math.log2(w), "train_loss": 2.5,
                        "two_d_align": d, "two_d_par": d, "two_d_2": 2 * d, "one_d_align": 1.5 * d,
                        "two_b_exact": b_exact, "two_b_align": b_align, "two_vacuous": False,
                        "misalignment": mis, "misalignment_low": mis * 0.5, "misalignment_high": mis * 1.5,
                        "misalignment_draws": 1000})
    return rows


def test_trend_matches_definition():
    assert alignment.trend([1, 2, 3, 4], [1, 2, 3, 4]) == "up"
    assert alignment.trend([1, 2, 3, 4], [4, 3, 2, 1]) == "down"
    assert alignment.trend([1, 2, 3, 4], [1, 3, 2, 4]) == "up"          # rho = 0.8
    assert alignment.trend([1, 2, 3, 4], [2, 1, 1, 2]) == "flat"        # rho = 0, ends equal
    assert alignment.trend([1, 2, 3, 4], [5, 5, 5, 5]) == "flat"
    assert alignment.trend([1, 2], [1.0, 0.5]) == "down"
    assert alignment.trend([1, 2, 3], [1.0, float("nan"), 2.0]) == "up"  # NaN (vacuous) dropped
    assert alignment.trend([1], [1.0]) == "flat"


def test_summary_counts_points_where_mechanism_holds():
    lines = alignment.summary(synthetic_rows())
    text = "\n".join(lines)
    assert "grows with width at 3/4 insertion points (layers.0, layers.1, layers.2)" in text
    assert "falls at 1 (layers.3)" in text
    assert "One-population d_align (train samples only) grows at 3/4 points, falls at 1." in text
    # misalignment is monotone decreasing in d_align, so it falls exactly where d_align grows
    assert "falls with width at 3/4 points, rises at 1" in text
    # 4 widths x 2 seeds x 4 points x 3 MK = 96 rows; b_align = 1 (d = 0) at layers.3, width 256: vacuous
    assert "the rate is above the bound in 0/96 tested rows" in text
    assert "B_align >= B_exact: holds (93/93 non-vacuous rows, 3 vacuous, 0 missing)" in text
    assert "Verdict for llama (the claims page's test" in text
    five = "\n".join(alignment.summary(synthetic_rows(seeds=(0, 1, 2, 3, 4))))
    assert "The width mechanism holds here." in five and "What to try next" not in five


def test_summary_verdict_quotes_the_claims_page():
    from widthscope.report.claims import claims

    rows = synthetic_rows(seeds=(0, 1, 2, 3, 4))
    for r in rows:  # seed-dependent width trend: the page's slope has a real interval
        r["two_d_align"] *= (r["width"] / 32) ** (0.05 * r["seed"])
    found = {c["id"]: c for c in claims(rows) if c["group"] == "llama"}
    text = "\n".join(alignment.summary(rows))
    g = found["d_align_grows"]
    assert f"d_align grows with width — {g['verdict']} (log-log slope {g['measured']:+.3g}, 95% interval " \
           f"[{g['low']:.3g}, {g['high']:.3g}], p = {g['p']:.2g}, Holm p = {g['p_adjusted']:.2g}, 5 seeds)" in text


def test_summary_when_claim_fails_and_bound_violated():
    rows = synthetic_rows(seeds=(0,))
    for r in rows:
        r["two_d_align"] = 10.0 / r["width"]          # shrinks with width at every point
        if r["width"] == 64 and r["point_index"] == 0:  # an empirical rate far above its bound
            r["misalignment"] = r["misalignment_low"] = min(1.0, r["two_b_exact"] * 3 + 0.05)
    text = "\n".join(alignment.summary(rows))
    assert "grows with width at 0/4 insertion points" in text and "falls at 4" in text
    assert "B_exact vs the empirical misalignment (claims page): does not; the rate is above the bound in " \
           "3/48 tested rows, significantly (Wilson lower end above it) in 3" in text
    assert "The width mechanism is not resolved." in text  # one seed: no interval


def test_aggregation_is_mean_and_range_over_seeds():
    rows = synthetic_rows(seeds=(0, 1, 2))
    agg = alignment.aggregate(rows, "two_d_align", by=("point_index", "width"))
    mean, lo, hi, n = agg[(2, 128)]
    truth = [3.0 + 2.0 * 2 + 0.1 * s for s in range(3)]
    assert n == 3 and mean == pytest.approx(np.mean(truth)) and (lo, hi) == pytest.approx((min(truth), max(truth)))


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.external = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        for key in ("src", "href"):
            v = a.get(key)
            if v and not v.startswith(("data:", "#")):  # in-page anchors (contents, findings) are not outside
                self.external.append((tag, v))
        if tag == "link" or (tag == "script" and a.get("src")):
            self.external.append((tag, a))


def _check_images(page_html: str, expected: int):
    p = _Imgs()
    p.feed(page_html)
    assert not p.external, p.external
    # the findings box shows the headline figure again (the same data URI): count distinct figures
    assert len(set(p.imgs)) == expected
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,")
        raw = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n")
        import matplotlib.image as mpimg
        import io

        img = mpimg.imread(io.BytesIO(raw), format="png")
        assert img.shape[0] > 100 and img.shape[1] > 100 and float(img[..., :3].std()) > 0.01
    return p.imgs


def test_page_is_self_contained(tmp_path):
    page = rhtml.build_report(synthetic_rows(), tmp_path, title="syn <test>", sources=["x"])
    text = page.read_text()
    assert "syn &lt;test&gt;" in text and "<style>" in text
    _check_images(text, expected=3)  # d_align, misalignment vs width, misalignment vs M=K
    assert "grows with width at 3/4" in text
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "llama-d_align.png", "llama-misalignment-vs-MK.png", "llama-misalignment-vs-width.png"]
    # the alignment table (header + one line per (width, point)) and what was measured (header + one
    # line per (family, width))
    # (the claims and what was measured follow the sections)
    section = text.split("<h2>Alignment width sweep</h2>")[1].split("<h2>")[0]
    assert section.count("<tr>") == 1 + len(WIDTHS) * len(POINTS)
    measured = text.split("<h2>What was measured</h2>")[1].split("<h2>")[0]
    assert measured.count("<tr>") == 1 + len(WIDTHS)
    assert "<h2>Claims</h2>" in text and "d_align grows with width" in text
    assert "What was measured" in text and "widthscope 0.1.0" in text and "torch " in text


def test_sections_only_for_present_kinds_and_missing_modules(tmp_path, monkeypatch):
    rows = synthetic_rows(seeds=(0,)) + [{"kind": "mystery", "x": 1}]
    monkeypatch.setattr(rhtml, "SECTIONS", rhtml.SECTIONS + [("Ghost", "widthscope.report._no_such_mod", ("ghost",))])
    monkeypatch.setattr(alignment, "figures", lambda rows, out_dir: [])  # plots are tested elsewhere
    sections, notes = rhtml.collect_sections(rows + [{"kind": "ghost"}], tmp_path)
    assert [s["title"] for s in sections] == ["Alignment width sweep"]
    assert any("'mystery' have no report section" in n for n in notes)
    assert any("widthscope.report._no_such_mod is not available" in n for n in notes)


def test_broken_section_becomes_a_note(tmp_path, monkeypatch):
    def boom(rows, out_dir):
        raise RuntimeError("kaputt")

    monkeypatch.setattr(alignment, "figures", boom)
    sections, notes = rhtml.collect_sections(synthetic_rows(seeds=(0,)), tmp_path)
    assert any("kaputt" in n for n in notes) and sections[0]["summary"]


def _results_dir(tmp_path: Path) -> Path:
    rows = synthetic_rows()
    by_cell = {}
    for r in rows:
        by_cell.setdefault((r["width"], r["seed"]), []).append(r)
    cells = [{"width": w, "seed": s} for (w, s) in by_cell]
    out = tmp_path / "res"
    run_grid(cells, lambda c, d: [dict(r) for r in by_cell[(c["width"], c["seed"])]], out)
    return out


def test_cli_report_from_results_dir(tmp_path, capsys):
    res = _results_dir(tmp_path)
    before = (res / "results.jsonl").read_bytes()
    assert main(["report", str(res), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "rep" / "report.html") in out
    assert (res / "results.jsonl").read_bytes() == before  # the report only reads its inputs
    assert len(load_results([res])) == len(synthetic_rows())
    # several dirs: rows concatenated, each tagged with its source
    rows = load_results([res, res / "results.jsonl"])
    assert len(rows) == 2 * len(synthetic_rows()) and {r["source"] for r in rows} == {str(res), str(res / "results.jsonl")}


def test_cli_report_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "neither results.jsonl nor cells/" in capsys.readouterr().err


def _chromium(args, tmp_path, timeout=90):
    profile = tmp_path / "chrome-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": str(tmp_path)})


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="headless chromium not installed (/usr/bin/chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    page = report(_results_dir(tmp_path), tmp_path / "rep")
    url = page.resolve().as_uri()
    dom = _chromium(["--dump-dom", url], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the DOM chromium built holds every image, each a decodable PNG data URI, nothing external
    _check_images(dom.stdout, expected=3)
    assert "Alignment width sweep" in dom.stdout
    shot = tmp_path / "shot.png"
    r = _chromium([f"--screenshot={shot}", "--window-size=1200,3000", "--hide-scrollbars", url], tmp_path)
    assert shot.exists(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (3000, 1200)
    nonwhite = (img < 0.95).any(axis=-1)
    # header bar, text and plots: a real page covers a good part of the window; a blank one does not
    assert nonwhite.mean() > 0.05, nonwhite.mean()
    assert nonwhite[:80].mean() > 0.5            # the dark header band rendered
    assert float(img.std()) > 0.1


def test_groups_are_labelled_by_sweep_and_budget(tmp_path):
    a = synthetic_rows(seeds=(0,), mks=((16, 16),))
    b = [{**r, "sweep": "other"} for r in a]
    c = [{**r, "sweep": "other", "budget": 1024} for r in a]
    lines = alignment.summary(a + b + c)
    heads = [line.split(":")[0] for line in lines if "d_align (two-population) grows" in line]
    assert heads == ["syn/llama", "other/llama (n_train=512)", "other/llama (n_train=1024)"]
    figs = alignment.figures(a + b + c, tmp_path)
    # one misalignment-vs-M=K figure needs >= 2 paired sizes, so 2 figures per group here
    assert len(figs) == 6 and len({f["png"] for f in figs}) == 6
    assert all(Path(f["png"]).stat().st_size > 1000 for f in figs)


def test_points_vacuous_at_most_widths_are_not_called_a_trend():
    rows = synthetic_rows(seeds=(0,))
    for r in rows:
        if r["point_index"] == 1 and r["width"] < 256:
            r["two_d_align"], r["two_vacuous"] = 0.0, True   # only the widest width certifies
    text = "\n".join(alignment.summary(rows))
    assert "grows with width at 2/4 insertion points (layers.0, layers.2)" in text
    assert "is vacuous (d_align missing) at most widths at 1 (layers.1)" in text
    assert "9/48 two-population certificates are vacuous" in text


def test_verdict_weighs_seed_spread_against_the_width_trend():
    rows = synthetic_rows()                     # seed jitter 0.1 << change across widths (>= 1.5)
    text = "\n".join(alignment.summary(rows))
    assert "exceeds its change from the narrowest to the widest width at 0/4 points (2 seeds)." in text
    for r in rows:                              # seed 1 shifted by 10: spread 10 > change at every point
        if r["seed"] == 1:
            r["two_d_align"] += 10.0
    text = "\n".join(alignment.summary(rows))
    assert "at 4/4 points (2 seeds): more seeds are needed" in text
    assert "The width mechanism is not resolved." in text and "seeds at the observed spread (2 now)" in text
    text = "\n".join(alignment.summary(synthetic_rows(seeds=(0,))))
    assert "One seed: the seed-to-seed spread is unknown" in text and "is not resolved" in text


def test_many_intervention_curves_get_small_multiples_and_labelled_sign_counts(tmp_path):
    from widthscope.report import interventions as riv

    rows = []
    for w in (32, 64, 128, 256):
        for p in range(4):
            for s in range(2):
                for i, eta in enumerate((1e-3, 1e-2, 1e-1, 1.0)):
                    pred = -eta * (1 + p)
                    rows.append({"kind": "intervention", "probe": "bias", "family": "llama", "width": w, "seed": s,
                                 "point": f"layers.{p}", "eta": eta, "rel_step": eta, "predicted": pred,
                                 "actual": pred * (1 - eta), "retention": 1 - eta, "sign_agrees": i < 3})
    figs = riv.figures(rows, tmp_path)
    names = [Path(f["png"]).name for f in figs]
    assert "interventions_retention_by_width.png" in names  # 32 curves: one panel per width
    wide = [dict(r, width=r["width"] + k) for r in rows for k in (0, 1, 2)]  # 12 widths: 8 panels at most
    cap = next(f["caption"] for f in riv.figures(wide, tmp_path) if "retention_by_width" in f["png"])
    assert "8 of 12 widths drawn, 4 left out" in cap  # the widths left out are said on the page
    text = " ".join(riv.summary(rows))
    assert "per step of the η grid" in text and "96 of 128 steps" in text
    assert "at the smallest step of each curve: sign right in 32 of 32 curves" in text


def test_claims_are_computed_from_the_rows_and_can_fail():
    from widthscope.report.claims import claims

    def rows(sign):
        return [{"kind": "alignment", "family": "f", "width": w, "seed": s, "point": p, "M": m, "K": m,
                 "two_d_align": (0.1 * w) ** sign * (1 + 0.05 * s), "two_d_par": 1.0, "two_d_2": 1.0,
                 "misalignment": 0.2 * (w / 8) ** (-sign) / m * (1 + 0.01 * s), "misalignment_low": 0.0,
                 "misalignment_draws": 1000, "two_b_exact": 0.9, "two_b_align": 0.95}
                for w in (8, 16, 32, 64) for s in (0, 1, 2) for p in ("a", "b") for m in (8, 16)]

    up = {c["claim"]: c for c in claims(rows(+1))}
    down = {c["claim"]: c for c in claims(rows(-1))}
    key = "f: d_align grows with width"
    assert up[key]["verdict"] == "holds" and down[key]["verdict"] == "does not"
    assert up[key]["measured"] == pytest.approx(1.0, abs=1e-6)
    mk = "f: misalignment falls with width at M=K=8"
    assert up[mk]["verdict"] == "holds" and down[mk]["verdict"] == "does not"
    one_seed = [r for r in rows(+1) if r["seed"] == 0]
    assert {c["claim"]: c["verdict"] for c in claims(one_seed)}[key] == "not resolved"
    assert up["f: B_exact >= empirical misalignment"]["verdict"] == "holds"  # every rate far below 0.9
    bad = rows(+1)
    bad[0]["two_b_exact"] = 0.001  # far below the empirical rate 0.025 of 1000 draws: the bound claim fails
    bad[1]["two_b_align"] = 0.5    # below B_exact: the order claim fails (arithmetic, no test)
    found = {c["claim"]: c["verdict"] for c in claims(bad)}
    assert found["f: B_exact >= empirical misalignment"] == "does not"
    assert found["f: B_align >= B_exact"] == "does not"


def test_alignment_table_and_summary_quote_the_claims_mk():
    """The claims test the width trends at the smallest (M, K); the table and the summary sentence
    show their numbers at that pair, labelled, and the largest pair only in columns labelled with it."""
    from widthscope.report.claims import claims

    rows = synthetic_rows(mks=((8, 8), (64, 64)))
    found = claims(rows)
    assert any(c["claim"].endswith("misalignment falls with width at M=K=8") for c in found)
    t = alignment.tables(rows)[0]
    assert "numbers at M=8, K=8, the (M, K) at which the claims are tested" in t["title"]
    assert "M=64, K=64, in the last two columns" in t["title"]
    for col in ("misalign M=8,K=8", "B_exact M=8,K=8", "misalign M=64,K=64", "B_exact M=64,K=64"):
        assert f"<th>{col}</th>" in t["html"]
    r8 = next(r for r in rows if r["M"] == 8 and r["width"] == 32 and r["point"] == "layers.0" and r["seed"] == 0)
    r8b = next(r for r in rows if r["M"] == 8 and r["width"] == 32 and r["point"] == "layers.0" and r["seed"] == 1)
    assert f"<td>{(r8['misalignment'] + r8b['misalignment']) / 2:.3g}</td>" in t["html"]
    text = "\n".join(alignment.summary(rows))
    assert "Empirical misalignment at M=8, K=8" in text and "M=64, K=64 falls" not in text
    one = alignment.tables(synthetic_rows(mks=((16, 16),)))[0]
    assert "last two columns" not in one["title"] and "misalign M=16,K=16" in one["html"]
