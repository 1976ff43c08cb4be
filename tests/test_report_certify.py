"""`widthscope report` on the JSON files of several `widthscope certify` runs (a width series)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from widthscope import data, models
from widthscope._io import atomic_write_json
from widthscope.certification import certify_dict
from widthscope.cli import main
from widthscope.errors import WidthscopeError
from widthscope.report import alignment, load_results, report
from widthscope.report.certify_series import is_certify_json, rows_from_certify, series_rows
from widthscope.train import train

WIDTHS = (16, 32, 64)


def _certify_file(path: Path, width: int, depth: int = 2) -> Path:
    """A real certify result: a tiny MLP on digits, a few training steps, M = K in {8, 16}."""
    split = data.load("digits", n_train=96, n_test=48, seed=0)
    torch.manual_seed(width)
    model = models.build("mlp", width, in_dim=64, out_dim=10, depth=depth)
    train(model, split, steps=5, lr=1e-2, batch_size=32, progress=False)
    res = certify_dict(model, data.batches(split.train, 32), data.batches(split.test, 16), M=[8, 16], draws=100,
                  seed=0, interventions=None, progress=False)
    res["settings"].update(model=f"mlp-w{width}", data="digits", width=width, depth=depth)
    return atomic_write_json(path, res)


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("certify")
    return [_certify_file(d / f"mlp-{w}.json", w) for w in WIDTHS]


def _variant(src: Path, dst: Path, edit) -> str:
    res = json.loads(src.read_text())
    edit(res)
    atomic_write_json(dst, res)
    return str(dst)


def test_report_from_certify_files(series, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", *map(str, series), "--out", str(out)]) == 0
    assert str(out / "report.html") in capsys.readouterr().out
    page = (out / "report.html").read_text()
    # The header names every file with its model, data and width; the table has a line per width.
    for f, w in zip(series, WIDTHS):
        assert f"{f} (model mlp-w{w}, data digits, width {w}, depth 2)" in page
        assert f"<td>{w}</td>" in page
    assert (out / "certify-d_align.png").stat().st_size > 1000
    assert (out / "certify-misalignment-vs-width.png").exists()


def test_rows_carry_the_json_numbers(series):
    rows = [r for r in load_results(series) if r["kind"] == "alignment"]
    assert {r["width"] for r in rows} == set(WIDTHS)
    assert {r["source"] for r in rows} == {str(f) for f in series}
    n = 0
    for f in series:
        res = json.loads(f.read_text())
        for pt in res["points"]:
            for c in pt["certificates"]:
                (r,) = [r for r in rows if r["source"] == str(f) and r["point"] == pt["point"]
                        and (r["M"], r["K"]) == (c["M"], c["K"])]
                assert r["two_d_align"] == c["two"]["d_align"] and r["one_d_align"] == c["one"]["d_align"]
                assert r["two_b_exact"] == c["two"]["b_exact"] and r["two_b_align"] == c["two"]["b_align"]
                assert (r["misalignment"], r["misalignment_low"], r["misalignment_high"]) == (
                    c["misalignment"]["probability"], c["misalignment"]["low"], c["misalignment"]["high"])
                n += 1
    assert n == len(rows) == 3 * 2 * 2  # widths x points x (M, K)
    # What the d_align figure draws: per point, the JSON's two-population d_align at each width.
    drawn = alignment.d_align_by_point(rows, "two")
    names = dict(alignment.point_keys(rows))
    for pi, (ws, vals) in drawn.items():
        assert ws == list(WIDTHS)
        want = [next(p for p in json.loads(f.read_text())["points"] if p["point"] == names[pi])
                ["certificates"][0]["two"]["d_align"] for f in series]
        # a vacuous certificate: None in the JSON, no point (NaN) in the figure, never a number
        assert vals == pytest.approx([math.nan if v is None else v for v in want], nan_ok=True)
        assert any(v > 0 for v in vals)  # a real, non-vacuous signal, not all zeros


def test_default_out_dir_is_beside_the_first_file(series):
    page = report([str(f) for f in series])
    assert page == series[0].parent / "report" / "report.html" and page.exists()


def test_points_matched_by_name_across_depths(series, tmp_path):
    deep = _certify_file(tmp_path / "deep.json", 128, depth=3)
    # Drop the first point of one file: positions shift, names must still line up.
    short = _variant(series[1], tmp_path / "short.json", lambda r: r["points"].pop(0))
    rows = series_rows([series[0], short, deep])
    idx = {}
    for r in rows:
        assert idx.setdefault(r["point"], r["point_index"]) == r["point_index"]
    assert idx == {"blocks.0": 0, "blocks.1": 1, "blocks.2": 2}
    assert {r["depth_fraction"] for r in rows if r["source"] == str(deep)} == {1 / 3, 2 / 3, 1.0}


def test_width_falls_back_to_largest_d(series, tmp_path):
    old = _variant(series[0], tmp_path / "old.json", lambda r: r["settings"].pop("width"))
    rows = rows_from_certify(old)
    assert {r["width"] for r in rows} == {max(p["d"] for p in json.loads(Path(old).read_text())["points"])}


def test_non_certify_json_is_refused(tmp_path, capsys):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"fingerprint": "x", "config": {}}))
    assert not is_certify_json(bad)
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and "widthscope certify" in err
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["report", str(tmp_path / "broken.json")]) == 2
    assert "not readable JSON" in capsys.readouterr().err


def test_mixed_settings_are_refused(series, tmp_path):
    def plugin(r):
        r["settings"]["estimator"] = "plugin"
        for p in r["points"]:
            for c in p["certificates"]:
                c["one"]["estimator"] = c["two"]["estimator"] = "plugin"

    other = _variant(series[2], tmp_path / "plugin.json", plugin)
    with pytest.raises(WidthscopeError, match="mix estimators.*plugin.json"):
        load_results([series[0], other])
    fewer = _variant(series[2], tmp_path / "m8.json",
                     lambda r: [p.update(certificates=p["certificates"][:1]) for p in r["points"]])
    with pytest.raises(WidthscopeError, match=r"mix \(M, K\) pairs.*m8.json"):
        load_results([series[0], fewer])
    # Two files at the same (width, seed) would overwrite each other in the figures.
    twin = _variant(series[0], tmp_path / "twin.json", lambda r: None)
    with pytest.raises(WidthscopeError, match="both give family 'certify' width 16 with seed 0"):
        load_results([series[0], twin])
    # Another architecture is its own group: no clash.
    arch = _variant(series[0], tmp_path / "arch.json", lambda r: r["settings"].update(architecture="Other"))
    assert {r["family"] for r in load_results([series[0], arch])} == {"certify", "Other"}


def test_certify_files_mix_with_sweep_rows(series, tmp_path):
    res = tmp_path / "sweep"
    res.mkdir()
    row = {"kind": "alignment", "sweep": "s", "family": "mlp", "width": 8, "seed": 0, "point": "blocks.0",
           "point_index": 0, "M": 8, "K": 8, "two_d_align": 0.1}
    (res / "results.jsonl").write_text(json.dumps(row) + "\n")
    rows = load_results([res, *series])
    assert rows[0]["source"] == str(res) and len(rows) == 1 + 12
    # never NaN: a number, or None for a vacuous certificate (the reporting rule)
    assert all(r["two_d_align"] is None or math.isfinite(r["two_d_align"]) for r in rows)
    assert all((r["two_d_align"] is None) == bool(r.get("two_vacuous")) for r in rows)


def test_training_steps_and_losses_come_from_what_the_checkpoint_recorded(series, tmp_path):
    """Certify's settings["training"] first, else the local checkpoint's config.json extra; '–' only
    when neither records them."""
    from widthscope.report.html import provenance
    from widthscope.certification.pipeline import training_record

    assert training_record({"train": {"steps": 40, "train_loss": 0.5, "test_loss": 0.7, "loss": "ce"}}) == {
        "steps": 40, "train_loss": 0.5, "test_loss": 0.7}
    assert training_record({"steps": 3, "loss": 1.5}) == {"steps": 3, "train_loss": 1.5}
    assert training_record(None) == {} and training_record({"train": {"test_loss": float("nan")}}) == {}

    def recorded(res):
        res["settings"]["training"] = {"steps": 5, "train_loss": 1.25, "test_loss": 1.5}

    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"extra": {"train": {"steps": 7, "train_loss": 2.0,
                                                                     "test_loss": 2.5, "loss": "ce"}}}))

    def in_checkpoint(res):
        res["settings"]["model"] = str(ck)

    a = _variant(series[0], tmp_path / "a.json", recorded)
    b = _variant(series[1], tmp_path / "b.json", in_checkpoint)
    c = str(series[2])
    rows = series_rows([a, b, c])
    by = {r["source"]: r for r in rows if r["kind"] == "alignment"}
    assert (by[a]["steps"], by[a]["train_loss"], by[a]["test_loss"]) == (5, 1.25, 1.5)
    assert (by[b]["steps"], by[b]["train_loss"], by[b]["test_loss"]) == (7, 2.0, 2.5)
    assert "steps" not in by[c] and "train_loss" not in by[c]
    page = provenance(rows, [a, b, c])
    assert "<td>5</td><td>1.25</td><td>1.5</td>" in page
    assert "<td>7</td><td>2</td><td>2.5</td>" in page
    assert "<td>–</td><td>–</td><td>–</td>" in page  # the third file records nothing: genuinely absent
