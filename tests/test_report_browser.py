"""Every kind of report page rendered in headless Chromium at phone width (400 px): no sideways
overflow, every image loads, no ``nan`` in the text, and the findings box starts on the first screen.

Pages: the quick demo's (``run_demo(quick=True)``, about 30 s), the full demo's (its committed rows,
``benchmarks/results/demo-full/``: the run takes minutes), a certify series (three tiny certify
files) and a two-depth model suite (synthetic rows).
``WIDTHSCOPE_SHOTS=DIR`` also writes a 1400 px screenshot of each page's first screen into DIR
(how docs/img/report-*.png were made).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from widthscope.report import load_results, report
from widthscope.report.suite import write_pages

CHROMIUM = "/usr/bin/chromium"
PHONE = 400

PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var f = document.getElementById('findings');
  var r = {scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
           images: imgs.length,
           broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).length,
           findingsTop: f ? f.getBoundingClientRect().top + window.scrollY : null,
           nan: (document.body.innerText.match(/\\bnan\\b/gi) || []).length,
           wide: Array.prototype.slice.call(document.querySelectorAll('body *')).filter(function (e) {
             return e.getBoundingClientRect().right > window.innerWidth + 2 && !e.closest('.tscroll');
           }).slice(0, 5).map(function (e) { return e.tagName + '.' + e.className; })};
  parent.postMessage(JSON.stringify(r), '*');
});
</script>"""

# Headless Chromium keeps windows at least 500 px wide: the page is measured in a 400 px iframe,
# whose probe posts its findings to this wrapper.
FRAME = """<!DOCTYPE html><html><body style="margin:0"><pre id="probe"></pre>
<script>window.addEventListener('message', function (e) { document.getElementById('probe').textContent = e.data; });
</script><iframe src="{src}" style="width:{width}px;height:2000px;border:0"></iframe></body></html>"""


def _chromium(args, tmp_path: Path, timeout=120):
    profile = tmp_path / f"chrome-profile-{len(list(tmp_path.glob('chrome-profile-*')))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HOME": str(tmp_path)})


def measure(page: Path, tmp_path: Path, width: int = PHONE) -> dict:
    """Layout facts of ``page`` as Chromium renders it ``width`` px wide (a copy with a probe script)."""
    probe = page.with_name(page.stem + "-probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    frame = page.with_name(page.stem + "-frame.html")
    frame.write_text(FRAME.replace("{src}", probe.name).replace("{width}", str(width)), encoding="utf-8")
    r = _chromium(["--window-size=1000,2200", "--run-all-compositor-stages-before-draw",
                   "--virtual-time-budget=8000", "--dump-dom", frame.resolve().as_uri()], tmp_path)
    probe.unlink()
    frame.unlink()
    m = re.search(r'<pre id="probe">(.+?)</pre>', r.stdout, re.S)
    assert m, r.stderr[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def check_page(page: Path, tmp_path: Path, name: str) -> dict:
    got = measure(page, tmp_path)
    assert got["innerWidth"] <= PHONE + 2, got  # the window really was phone-sized
    assert got["scrollWidth"] <= PHONE + 2, (page.name, got)
    assert got["images"] > 0 and got["broken"] == 0, (page.name, got)
    assert got["nan"] == 0, (page.name, got)
    assert got["findingsTop"] is not None and got["findingsTop"] < 1000, (page.name, got)
    text = page.read_text(encoding="utf-8")
    assert 'id="findings"' in text and "What these numbers mean" in text and 'class="toc"' in text
    shots = os.environ.get("WIDTHSCOPE_SHOTS")
    if shots:
        out = Path(shots) / f"report-{name}.png"
        _chromium([f"--screenshot={out}", "--window-size=1400,1000", page.resolve().as_uri()], tmp_path)
    return got


# ----------------------------------------------------------------------------- the pages
@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory) -> Path:
    from widthscope.demo import run_demo

    out = tmp_path_factory.mktemp("demo") / "quick"
    run_demo(out, quick=True)
    return out


FULL_DEMO = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "demo-full"


def full_demo_parts() -> list[str]:
    """The full demo's own rows (``widthscope demo``, committed without the per-example probe data by
    ``benchmarks/docnumbers.py --compact``): both alignment sweeps, linearization, interventions, monitor."""
    return [str(FULL_DEMO / part) for part in ("llama", "mlp", "linearize")]


def suite_rows() -> list[dict]:
    """A model suite of two depths (Pythia-like: 6 layers at widths 128/256/512, 12 at 512/1024),
    three revisions each; B_exact vacuous at the first revision."""
    rows = []
    for depth, widths in ((6, (128, 256, 512)), (12, (512, 1024))):
        for w in widths:
            for rev, step in (("step0", 0), ("step1000", 1000), ("step143000", 143000)):
                for pi in range(3):
                    d = (1 + step / 1e5) * w / 64 * (1 + 0.1 * pi) / (depth / 6)
                    b = 1.0 if step == 0 else 1 / (1 + 100 * d)
                    for M in (8, 16):
                        rows.append({
                            "kind": "alignment", "suite": "pythia-like", "revision": rev, "step": step,
                            "commit": f"{w:04d}{step:08d}abcdef", "model_id": f"org/model-d{depth}-w{w}",
                            "model": f"model-d{depth}-w{w}", "width": w, "depth": depth, "M": M, "K": M,
                            "point": f"layers.{pi}", "point_index": pi, "family": "pythia-like",
                            "two_d_align": d, "misalignment": b / 4, "two_b_exact": b, "two_b_align": b,
                            "two_vacuous": step == 0, "estimator": "u", "pool": "mean",
                            "certify_json": f"{depth}-{w}-{rev}.json", "seed": 0, "sweep": "suite"})
    return rows


def certify_series(tmp: Path) -> list[Path]:
    from test_report_certify import _certify_file

    return [_certify_file(tmp / f"mlp-w{w}.json", w) for w in (64, 128, 256)]


# ----------------------------------------------------------------------------- the tests
def test_two_depth_suite_gets_one_width_series_per_depth(tmp_path):
    pages = write_pages(suite_rows(), tmp_path)
    ws = pages[0].read_text(encoding="utf-8")
    # one width section (and figure) per depth, the depth in every table row
    assert ws.count("<h2>pythia-like, depth 6</h2>") == 1 and ws.count("<h2>pythia-like, depth 12</h2>") == 1
    assert sorted(p.name for p in tmp_path.glob("suite-*-width.png")) == [
        "suite-pythia-like-depth12-width.png", "suite-pythia-like-depth6-width.png"]
    depth6 = ws.split("<h2>pythia-like, depth 6</h2>")[1].split("<h2>")[0]
    assert "org/model-d6-w128" in depth6 and "org/model-d12-w1024" not in depth6
    assert re.search(r"<td class=l>org/model-d12-w512</td><td>12</td>", ws)
    assert "depth 6: median d_align grows with width" in ws  # the finding, per depth
    assert "Hollow markers" in ws  # vacuous B_exact not drawn as data
    assert "nan" not in re.sub(r'src="[^"]*"', "", ws)


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="headless chromium not installed (/usr/bin/chromium)")
def test_every_report_kind_reads_on_a_phone(quick_demo, tmp_path):
    pages = [quick_demo / "report" / "report.html"]
    full = tmp_path / "full-demo"
    full.mkdir()
    pages.append(report(full_demo_parts(), full / "report", title="widthscope demo (full)"))
    cert = tmp_path / "certify-series"
    cert.mkdir()
    pages.append(report([str(p) for p in certify_series(cert)], cert / "report"))
    suite = tmp_path / "suite"
    suite.mkdir()
    pages += write_pages(suite_rows(), suite)
    names = ["quick-demo", "full-demo", "certify-series", "suite-width-series", "suite-over-training"]
    for page, name in zip(pages, names, strict=True):
        check_page(page, tmp_path, name)
    # a certify series lists its files by width, numerically (64 before 128)
    text = pages[2].read_text(encoding="utf-8")
    assert text.index("mlp-w64.json") < text.index("mlp-w128.json") < text.index("mlp-w256.json")
