"""Report figures stay readable: legends capped at 8 entries and outside the axes, panels with
more than 12 curves thinned (the caption says how many are drawn), and the linearization legend's
slope interval is the slope table's (issue 43). Synthetic rows, as in tests/test_report.py."""
from __future__ import annotations

import math

import pytest

from widthscope.report import _plot, interventions as riv, linearization as rlin, monitor as rmon


def _capture(monkeypatch, module):
    """Replace ``module.save_figure`` by one that draws and keeps the figure (and returns an entry)."""
    kept = []

    def save(fig, path, title, caption="", **kw):
        fig.canvas.draw()
        kept.append((fig, title, caption))
        return {"title": title, "png": str(path), "caption": caption}

    monkeypatch.setattr(module, "save_figure", save)
    return kept


def _legend_checks(fig):
    """Every legend: at most 8 entries, and left of it no axes' data area it belongs to."""
    n = 0
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        n += 1
        assert len(leg.get_texts()) <= _plot.LEGEND_CAP
        assert leg.get_window_extent().x0 >= ax.get_window_extent().x1 - 1  # outside, right of the axes
    return n


def _lin_rows(widths, alphas=(0.0,), seeds=(0, 1, 2), steps=(10, 100)):
    rows = []
    for a in alphas:
        for w in widths:
            for s in seeds:
                for st in steps:
                    dev = math.exp((a - 1 + 0.02 * s) * math.log(w) + 0.01 * s)
                    rows.append({"kind": "linearization", "alpha": a, "width": w, "seed": s, "step": st,
                                 "dev_rms": dev * st / 100, "dev_mse": (dev * st / 100) ** 2})
    return rows


def test_linearization_legend_interval_is_the_tables(monkeypatch, tmp_path):
    rows = _lin_rows((32, 64, 128, 256))
    kept = _capture(monkeypatch, rlin)
    rlin.figures(rows, tmp_path)
    slopes = [s for s in rlin.slopes_from_rows(rows) if s["metric"] == "dev_rms" and s["step"] == 100]
    table = rlin.tables(rows)[0]["html"]
    fig = next(f for f, t, _ in kept if t.startswith("Deviation from the linear model"))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    for s in slopes:
        text = rlin.slope_text(s)
        assert any(text in lab for lab in labels)  # the legend quotes the table's slope and interval
        assert text.split(" ", 1)[1] in table
    # a bound rounding to 0 in 2 decimals is shown the same (not 0) in the table and the legend
    assert rlin.slope_text({"slope": -0.01, "ci_low": -0.02, "ci_high": -0.004}) == "-0.01 [-0.02, -0.004]"
    assert rlin.slope_text({"slope": float("nan"), "ci_low": None, "ci_high": None}) == "– [–, –]"
    for f, _, _ in kept:
        _legend_checks(f)


def test_linearization_many_widths_are_thinned_and_said_so(monkeypatch, tmp_path):
    widths = [8 * (i + 1) for i in range(20)]
    kept = _capture(monkeypatch, rlin)
    rlin.figures(_lin_rows(widths, seeds=(0, 1)), tmp_path)
    fig, _, cap = next(k for k in kept if k[1].startswith("Deviation vs training step"))
    assert len(fig.axes[0].get_lines()) == _plot.CURVE_CAP
    assert "12 of 20 widths drawn" in cap
    assert _legend_checks(fig) == 1
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[-1] == "… 5 more, not listed" and len(labels) == 8


def _iv_rows(n_points):
    rows = []
    for p in range(n_points):
        for i, eta in enumerate((1e-3, 1e-2, 1e-1)):
            pred = -eta * (1 + p)
            rows.append({"kind": "intervention", "probe": "bias", "family": "llama", "width": 64, "seed": 0,
                         "point": f"layers.{p}", "eta": eta, "rel_step": eta, "predicted": pred,
                         "actual": pred * (1 - eta), "retention": 1 - eta, "sign_agrees": True})
    return rows


@pytest.mark.parametrize("n", [5, 62])
def test_intervention_panels_are_thinned_and_legends_capped(monkeypatch, tmp_path, n):
    kept = _capture(monkeypatch, riv)
    riv.figures(_iv_rows(n), tmp_path)
    by_title = {t: (f, c) for f, t, c in kept}
    for title in ("Actual vs predicted held-out loss change", "Retention vs step size"):
        fig, cap = by_title[title]
        ax = fig.axes[0]
        curves = [ln for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")]
        curves = [ln for ln in curves if ln.get_label().startswith("layers.")]
        assert len(curves) == min(n, _plot.CURVE_CAP)
        assert _legend_checks(fig) == 1
        assert ("12 of 62 curves drawn" in cap) == (n == 62)


def _mon_rows(n_points):
    rows = []
    for w in (16, 32):
        for p in range(n_points):
            for s in (0, 1):
                for st in (0, 4, 8):
                    rows.append({"kind": "monitor", "sweep": "syn", "family": "mlp", "budget": None, "width": w,
                                 "seed": s, "point": f"layers.{p}", "step": st, "steps_total": 8,
                                 "d_align": 1.0 + st + p, "b_exact": 0.5 / (1 + st), "vacuous": False,
                                 "delta": 0.2, "M": 8, "K": 8, "n_train": 16, "n_test": 16})
    return rows


def test_monitor_legend_capped_outside_and_points_thinned(monkeypatch, tmp_path):
    kept = []

    def save(fig, path, title):
        fig.canvas.draw()
        kept.append(fig)

    monkeypatch.setattr(rmon, "save_figure", save)
    figs = rmon.figures(_mon_rows(15), tmp_path)
    assert "12 of 15 insertion points drawn" in figs[0]["caption"]
    assert _legend_checks(kept[0]) == 1
    kept.clear()
    figs = rmon.figures(_mon_rows(3), tmp_path)
    assert "drawn" not in figs[0]["caption"] and _legend_checks(kept[0]) == 1


def test_thin_keeps_ends_and_cap():
    assert _plot.thin(list(range(5))) == list(range(5))
    t = _plot.thin(list(range(62)))
    assert len(t) == 12 and t[0] == 0 and t[-1] == 61
