"""The claims page's verdicts: calibration under the null by simulation, power, and each rule
(t interval, Holm, seeds needed, bounds with vacuous/missing rows, retention at the default step,
equivalence to the published slope)."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from widthscope.report.claims import (ALPHA, PUBLISHED_TOLERANCE, claims, holm, html_table, seed_test,
                                      seeds_needed)

ROOT = Path(__file__).resolve().parents[1]
INF = math.inf


def _bench():
    spec = importlib.util.spec_from_file_location("claims_calibration", ROOT / "benchmarks" / "claims_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rerun():
    """The calibration simulation rerun with the committed file's settings (~15k pages, seconds)."""
    mod = _bench()
    committed = json.loads(mod.OUT.read_text(encoding="utf-8"))
    st = committed["settings"]
    return committed, mod.run(st["n_null"], st["n_other"], st["rng_seed"])


def _tol(n: int, rate: float = ALPHA) -> float:
    """Three binomial SDs at the nominal rate: a rule whose true rate is <= 5% exceeds 5% + this in
    fewer than 0.2% of runs; one at 9% or more (n = 1000) would fail."""
    return 3 * math.sqrt(rate * (1 - rate) / n)


def test_committed_calibration_numbers_agree_with_a_rerun(rerun):
    committed, new = rerun
    assert committed["settings"] == new["settings"]
    for part in ("null", "power", "equivalence_boundary", "band_boundary", "monitor_null", "monitor_censored_null",
                 "monitor_power"):
        assert committed[part].keys() == new[part].keys()
        for key, v in committed[part].items():
            # same seed, same code: equal counts up to a rare last-bit tie across CPUs (<= 1% of pages)
            assert abs(v["count"] - new[part][key]["count"]) <= 0.01 * v["pages"], (part, key)
    assert abs(committed["bound_boundary"]["count"] - new["bound_boundary"]["count"]) <= 3


def test_docs_quote_the_committed_calibration_table():
    mod = _bench()
    committed = json.loads(mod.OUT.read_text(encoding="utf-8"))
    assert mod.markdown(committed) in (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    assert mod.markdown_monitor(committed) in (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")


def test_no_trend_gives_at_most_five_percent_decisions(rerun):
    _, res = rerun
    for noise in ("normal", "heavy"):
        for ns in (2, 3, 5, 10):
            v = res["null"][f"{noise}/{ns}"]
            assert v["rate"] <= ALPHA + _tol(v["pages"]), (noise, ns, v)
    assert res["null_pooled"]["rate"] <= ALPHA + _tol(res["null_pooled"]["pages"])
    # the simulation can fail a rule: the old mean ± 2 SE rule decides far too often with 2-3 seeds
    assert res["null"]["normal/2"]["baseline"]["rate"] > 0.2
    assert res["null"]["normal/3"]["baseline"]["rate"] > 0.12


def test_boundaries_of_band_equivalence_and_bound_are_calibrated(rerun):
    _, res = rerun
    for part in ("equivalence_boundary", "band_boundary"):
        for ns, v in res[part].items():
            assert v["rate"] <= ALPHA + _tol(v["pages"]), (part, ns, v)
    v = res["bound_boundary"]
    assert v["rate"] <= ALPHA + _tol(v["pages"])


def test_power_for_slope_half_grows_with_seeds(rerun):
    _, res = rerun
    for noise in ("normal", "heavy"):
        p = [res["power"][f"{noise}/{ns}"]["rate"] for ns in (2, 3, 5, 10)]
        assert p[0] < p[1] < p[2] <= p[3] + 0.02
        assert p[2] >= 0.7 and p[3] >= 0.9  # 5 seeds: ~0.8 at slope 0.5 per log width (the docs quote it)


# ----------------------------------------------------------------------------- the statistics
def test_seed_test_is_the_one_sample_t_test():
    rng = np.random.default_rng(1)
    for n in (2, 3, 7):
        x = rng.normal(0.3, 1.0, n)
        t = seed_test(list(x), (0.0, INF))
        ref = stats.ttest_1samp(x, 0.0)
        assert t["p"] == pytest.approx(ref.pvalue, rel=1e-9)
        lo, hi = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=x.std(ddof=1) / math.sqrt(n))
        assert (t["low"], t["high"]) == pytest.approx((lo, hi), rel=1e-9)
        assert (t["p"] <= 0.05) == (lo > 0 or hi < 0)
    assert seed_test([1.0], (0.0, INF))["p"] is None       # one seed: nothing to test
    # two seeds: t_{0.975,1} = 12.7, a +-1 SE interval is 25 SEs wide
    assert seed_test([1.0, 1.2], (0.0, INF))["low"] == pytest.approx(1.1 - 12.706 * 0.1, abs=1e-3)


def test_band_and_equivalence_decisions_follow_the_interval():
    tight = [0.975, 0.976, 0.974, 0.975, 0.977]
    assert seed_test(tight, (0.96, 0.99))["direction"] == "holds" and seed_test(tight, (0.96, 0.99))["p"] < 0.05
    above = [1.0, 1.001, 0.999, 1.0, 1.0005]
    t = seed_test(above, (0.96, 0.99))
    assert t["direction"] == "does not" and t["p"] < 0.05
    # equivalence: widening the spread around the published value can only lose the "holds"
    pub = -1.14
    ps = [seed_test([pub + d * k for d in (-0.02, 0.0, 0.02, 0.01, -0.01)],
                    (pub - PUBLISHED_TOLERANCE, pub + PUBLISHED_TOLERANCE))["p_holds"] for k in (1, 3, 10, 100)]
    # p_holds rises with the spread (to 1/2 in the limit): noise never helps "holds"
    assert all(a <= b + 1e-12 for a, b in zip(ps, ps[1:])) and ps[0] < 0.025 and ps[-1] > 0.4


def test_holm_matches_its_definition():
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    # sorted 0.005, 0.01, 0.03, 0.04, 0.5 -> 5*, 4*, 3*, 2*, 1* with running max
    expect = {3: 0.025, 0: 0.04, 2: 0.09, 1: 0.09, 4: 0.5}
    assert holm(p) == pytest.approx([expect[i] for i in range(5)])


def test_seeds_needed_is_the_noncentral_t_power():
    for eff, sd, level in ((0.5, 0.3, 0.05), (0.1, 1.0, 0.05), (0.3, 0.3, 0.01), (1.0, 1.0, 0.001)):
        n = seeds_needed(eff, sd, level)
        power = lambda k: stats.nct.sf(stats.t.ppf(1 - level / 2, k - 1), k - 1, eff * math.sqrt(k) / sd)  # noqa: E731
        assert power(n) >= 0.8 and (n == 2 or power(n - 1) < 0.8)
    assert seeds_needed(0.0, 1.0, 0.05) is None and seeds_needed(1e-4, 1.0, 0.05) is None  # > 10^4 seeds


# ----------------------------------------------------------------------------- the rules on rows
def _align(width, seed, point, **kw):
    return {"kind": "alignment", "family": "f", "width": width, "seed": seed, "point": point, "M": 8, "K": 8, **kw}


def _by_id(rows):
    return {c["id"]: c for c in claims(rows)}


def test_bound_rule_counts_vacuous_and_missing_rows_apart():
    ok = [_align(64, 0, f"p{i}", two_b_exact=0.5, two_b_align=0.6, misalignment=0.1, misalignment_low=0.08,
                 misalignment_draws=1000) for i in range(3)]
    c = _by_id(ok)
    assert c["b_exact_bound"]["verdict"] == "holds" and c["b_align_order"]["verdict"] == "holds"
    vac = [_align(64, 0, f"p{i}", two_b_exact=1.0, two_b_align=1.0, misalignment=0.6, misalignment_draws=1000)
           for i in range(3)]
    c = _by_id(vac)  # vacuous rows are no support
    assert c["b_exact_bound"]["verdict"] == "not resolved" and c["b_exact_bound"]["counts"]["vacuous"] == 3
    assert c["b_align_order"]["verdict"] == "not resolved" and c["b_align_order"]["counts"]["vacuous"] == 3
    miss = [_align(64, 0, f"p{i}", two_b_exact=0.5, misalignment=0.1) for i in range(3)]  # no B_align, no draws
    c = _by_id(miss)
    assert c["b_exact_bound"]["counts"]["missing"] == 3 and c["b_exact_bound"]["verdict"] == "not resolved"
    assert c["b_align_order"]["counts"]["missing"] == 3 and c["b_align_order"]["verdict"] == "not resolved"
    # a missing B_align is never defaulted to 1: one present row below B_exact fails the order claim
    c = _by_id(miss + [_align(64, 0, "q", two_b_exact=0.5, two_b_align=0.4, misalignment=0.1,
                              misalignment_draws=1000)])
    assert c["b_align_order"]["verdict"] == "does not" and c["b_align_order"]["counts"]["missing"] == 3


def test_bound_rule_uses_the_binomial_count_not_the_point_estimate():
    # rate 0.105 of 1000 vs bound 0.1: above the bound by the point estimate, not significantly
    near = [_align(64, 0, f"p{i}", two_b_exact=0.1, two_b_align=0.2, misalignment=0.105, misalignment_low=0.088,
                   misalignment_draws=1000) for i in range(2)]
    c = _by_id(near)["b_exact_bound"]
    assert c["verdict"] == "not resolved" and c["counts"]["point_above_bound"] == 2
    assert c["counts"]["wilson_low_above_bound"] == 0 and c["support_note"]
    far = near + [_align(64, 0, "x", two_b_exact=0.1, two_b_align=0.2, misalignment=0.2, misalignment_low=0.176,
                         misalignment_draws=1000)]
    c = _by_id(far)["b_exact_bound"]
    assert c["verdict"] == "does not" and c["counts"]["wilson_low_above_bound"] == 1


def _iv(seed, point, rel, ret):
    return {"kind": "intervention", "probe": "bias", "family": "f", "width": 64, "seed": seed, "point": point,
            "eta": rel, "rel_step": rel, "retention": ret, "predicted": -1.0, "actual": -ret}


def test_retention_is_judged_at_the_default_step_and_the_smallest_step_apart():
    grid = [10 ** (-4 + 0.5 * i) for i in range(9)]
    rng = np.random.default_rng(0)

    def rows(at_default):
        return [_iv(s, f"p{p}", rel, 1.0 if rel < 3e-4 else (at_default + rng.normal(0, 0.002) if rel < 3e-3
                                                             else 0.5))
                for s in range(5) for p in range(3) for rel in grid]

    c = _by_id(rows(0.975))
    assert c["retention_paper_step"]["verdict"] == "holds"
    assert c["retention_paper_step"]["measured"] == pytest.approx(0.975, abs=0.003)
    assert c["retention_smallest_step"]["verdict"] == "holds" and not c["retention_smallest_step"]["family"]
    c = _by_id(rows(0.90))  # Taylor at 1e-4 says nothing about the claim at the default step
    assert c["retention_paper_step"]["verdict"] == "does not" and c["retention_smallest_step"]["verdict"] == "holds"
    no_rel = [{**r, "rel_step": None} for r in rows(0.975)]
    c = _by_id(no_rel)
    assert c["retention_paper_step"]["verdict"] == "not resolved" and "15 curve(s) without" in \
        c["retention_paper_step"]["basis"]


def _dev(seed, width, slope, jitter):
    return {"kind": "linearization", "alpha": 0.0, "step": 100, "width": width, "seed": seed,
            "dev_mse": math.exp((slope + jitter) * math.log(width) + seed)}


def test_published_slope_is_an_equivalence_test():
    ws = (32, 64, 128, 256, 512)
    j = [-0.02, 0.01, 0.0, 0.02, -0.01]
    c = _by_id([_dev(s, w, -1.14, j[s]) for s in range(5) for w in ws])["dev_mse_0"]
    assert c["verdict"] == "holds" and c["reference"] == -1.14
    c = _by_id([_dev(s, w, -0.75, j[s]) for s in range(5) for w in ws])["dev_mse_0"]
    assert c["verdict"] == "does not"
    wide = [-1.0, 1.0, 0.5, -0.5, 0.0]  # centred on the published slope, but noisy: not "holds"
    c = _by_id([_dev(s, w, -1.14, wide[s]) for s in range(5) for w in ws])["dev_mse_0"]
    assert c["verdict"] == "not resolved" and c["measured"] == pytest.approx(-1.14, abs=1e-9)


def test_correlation_claim_uses_the_spec_reference():
    from widthscope.linearization.summary import reference_slope

    assert reference_slope("C02") == reference_slope("C11") and reference_slope("C02")[0] == -0.5
    rows = [{"kind": "correlation", "name": "C02", "D": 0, "d": 2, "width": w, "seed": s,
             "rms": math.exp(-1.0 * math.log(w) + 0.01 * s * math.log(w) + s)}
            for w in (32, 64, 128, 256, 512) for s in range(4)]
    c = _by_id(rows)["corr_C02"]
    assert c["reference"] == -0.5 and c["verdict"] == "holds" and "n^-0.5" in c["claim"]


def test_holm_can_leave_an_uncorrected_decision_unresolved_and_the_table_shows_it():
    rng = np.random.default_rng(3)
    rows = []
    for s, b in enumerate((0.3, 0.38, 0.22)):  # d_align slopes: t = 6.5 on 2 df, p = 0.023
        for w in (32, 64, 128, 256):  # plus d_par, d_2 and misalignment claims without a trend
            rows.append(_align(w, s, "p", two_d_align=math.exp(b * math.log(w) + s), two_d_par=1 + rng.random(),
                               two_d_2=1 + rng.random(), misalignment=0.3 + 0.01 * rng.random()))
    c = _by_id(rows)["d_align_grows"]
    assert c["verdict_uncorrected"] == "holds" and 0.05 / 3 < c["p"] <= 0.05
    assert c["family_size"] == 4 and c["p_adjusted"] > 0.05 and c["verdict"] == "not resolved"
    assert c["seeds_needed"] and c["seeds_needed"] > 3
    page = html_table(claims(rows))
    assert "p (Holm)" in page and "seeds for 80% power" in page and "95% interval (t over seeds)" in page


def test_linearization_verdicts_quote_the_claims_page():
    from widthscope.report.linearization import summary

    rows = [json.loads(line) for line in
            (ROOT / "benchmarks" / "results" / "linearize-fashion-wide" / "results.jsonl").read_text().splitlines()]
    page = {c["id"]: c for c in claims(rows)}
    c = page["dev_rms_0"]  # 5 seeds, slope about -0.75 against the bound -1: flatter, resolved
    assert c["reference"] == -1.0 and c["verdict"] == "does not"
    text = "\n".join(summary(rows, found=list(page.values())))
    step = c["claim"].rsplit("step ", 1)[1].rstrip(")")
    assert (f"α=0, step {step}: " in text and f"per-seed t interval [{c['low']:.2f}, {c['high']:.2f}], "
            f"p = {c['p']:.2g} (claims page, Holm-corrected): flatter than the bound." in text)


def test_a_failing_claims_page_becomes_a_note_not_a_lost_report(tmp_path, monkeypatch):
    import widthscope.report.claims as rc
    from widthscope.report.html import build_report

    def boom(rows):
        raise ValueError("kaputt")

    monkeypatch.setattr(rc, "claims", boom)
    rows = [_align(w, s, "p", two_d_align=1.0 + s, misalignment=0.1) for w in (32, 64) for s in range(2)]
    page = build_report(rows, tmp_path).read_text()
    assert "claims page failed: ValueError: kaputt" in page and "<h2>Claims</h2>" not in page


# ----------------------------------------------------------------------------- wider models certify earlier
def _mon(width, seed, point, step, b_exact, delta=0.05, vacuous=False, family="f"):
    return {"kind": "row", "family": family, "width": width, "seed": seed, "point": point, "step": step,
            "b_exact": b_exact, "vacuous": vacuous, "delta": delta, "M": 16, "K": 16}


def _cell(width, seed, first, steps=range(0, 101, 10), points=("a", "b"), **kw):
    """Monitor rows of one cell whose points certify from step ``first[p]`` on (None: never)."""
    first = first if isinstance(first, dict) else {p: first for p in points}
    return [_mon(width, seed, p, s, 0.01 if first[p] is not None and s >= first[p] else 0.5, **kw)
            for s in steps for p in points]


def _earlier(rows):
    return next(c for c in claims(rows) if c["id"] == "certify_earlier")


def test_certify_earlier_holds_does_not_and_its_value_by_hand():
    ws = (32, 64, 128, 256)
    first = {32: 80, 64: 40, 128: 20, 256: 10}
    jit = {0: 0, 1: 10, 2: -10}  # the width-64 cell of seed 1 certifies one grid step later, of seed 2 earlier
    rows = [r for s in range(3) for w in ws for r in _cell(w, s, first[w] + (jit[s] if w == 64 else 0))]
    c = _earlier(rows)
    x = np.log(ws)
    by_hand = [np.polyfit(x, np.log1p([first[w] + (jit[s] if w == 64 else 0) for w in ws]), 1)[0] for s in range(3)]
    assert c["measured"] == pytest.approx(np.mean(by_hand), rel=1e-12) and c["seeds"] == 3
    assert c["verdict"] == "holds" and c["high"] < 0 and c["region"] == [-INF, 0.0]
    later = {32: 10, 64: 20, 128: 40, 256: 80}
    rows = [r for s in range(3) for w in ws for r in _cell(w, s, later[w] + (jit[s] if w == 128 else 0))]
    assert _earlier(rows)["verdict"] == "does not"


def test_censored_points_are_set_to_the_common_horizon():
    # width 32 never certifies within 100 steps: censored at 100, not dropped (dropping would lose the effect)
    rows = [r for s in range(3) for w, f in ((32, None), (64, 30 + 10 * s), (128, 20)) for r in _cell(w, s, f)]
    c = _earlier(rows)
    assert "6 of 18 (cell, point) not certified at the last common step" in c["basis"]
    ys = [np.polyfit(np.log([32, 64, 128]), np.log1p([100, 30 + 10 * s, 20]), 1)[0] for s in range(3)]
    assert c["measured"] == pytest.approx(np.mean(ys), rel=1e-12)
    # a cell that trained longer is cut at the seed's common horizon: certifying at 150 there counts as censored
    longer = [r for s in range(3) for w, f in ((32, 150), (64, 30 + 10 * s), (128, 20))
              for r in _cell(w, s, f, steps=range(0, 201 if w == 32 else 101, 10))]
    assert _earlier(longer)["measured"] == pytest.approx(c["measured"], rel=1e-12)


def test_a_denser_schedule_in_one_width_cannot_make_it_look_earlier():
    # every cell certifies at step 15; the wide cell is probed every step, the narrow ones every 10
    rows = [r for s in range(3) for w in (32, 64, 128) for r in
            _cell(w, s, 15, steps=range(0, 101, 1 if w == 128 else 10))]
    c = _earlier(rows)  # on the common grid all certify at 20: nothing to come earlier
    assert c["measured"] == 0 and c["verdict"] == "not resolved" and "same certification step" in c["basis"]


def test_the_step_is_where_certification_stays_not_the_first_hit():
    # certified at initialisation, lost, regained: the claim reads the regained step (first hit 0 everywhere)
    def cell(w, s, back):
        return [_mon(w, s, p, g, 0.01 if g == 0 or g >= back else 0.5) for g in range(0, 101, 10) for p in ("a", "b")]
    back = {32: 80, 64: 40, 128: 20}
    rows = [r for s in range(3) for w in (32, 64, 128) for r in cell(w, s, back[w] + (10 if s == 1 and w == 64 else 0))]
    c = _earlier(rows)
    ys = [np.polyfit(np.log([32, 64, 128]), np.log1p([80, 40 + (10 if s == 1 else 0), 20]), 1)[0] for s in range(3)]
    assert c["measured"] == pytest.approx(np.mean(ys), rel=1e-12) and c["verdict"] == "holds"
    # the sweep's summary column monitor_cert_from_step gives the same claim
    from widthscope.report.claims import SUMMARY
    summ = [{"family": "f", "width": w, "seed": s, SUMMARY["steps"]: list(range(0, 101, 10)), SUMMARY["delta"]: 0.05,
             SUMMARY["first_cert"]: {"a": 0, "b": 0},
             SUMMARY["cert_from"]: {p: back[w] + (10 if s == 1 and w == 64 else 0) for p in ("a", "b")}}
            for s in range(3) for w in (32, 64, 128)]
    assert _earlier(summ)["measured"] == pytest.approx(c["measured"], rel=1e-12)
    # lost again at the last step: censored at the horizon, not counted as certified
    lost = [r if not (r["step"] == 100 and r["width"] == 128) else {**r, "b_exact": 0.5} for r in rows]
    assert "6 of 18" in _earlier(lost)["basis"]


def test_vacuous_rows_and_missing_bounds_never_count_as_certified():
    rows = []
    for s in range(3):
        for w in (32, 64, 128):
            rows += _cell(w, s, 50)
            rows += [_mon(w, s, "a", 0, 0.0, vacuous=True), _mon(w, s, "b", 0, None)]  # step 0 rows
    rows = [r for r in rows if not (r["step"] == 0 and r["b_exact"] == 0.5)]
    c = _earlier(rows)
    assert c["measured"] == 0 and "0 of 18" in c["basis"] and c["verdict"] == "not resolved"


def test_summary_columns_give_the_same_claim_as_the_monitor_rows():
    from widthscope.report.claims import SUMMARY

    rng = np.random.default_rng(4)
    firsts = {(w, s, p): (int(rng.integers(0, 11)) * 10 if rng.random() > 0.2 else None)
              for w in (32, 64, 128) for s in range(4) for p in ("a", "b")}
    rows = [r for w in (32, 64, 128) for s in range(4)
            for r in _cell(w, s, {p: firsts[(w, s, p)] for p in ("a", "b")})]
    as_dict = [{"family": "f", "width": w, "seed": s, SUMMARY["steps_total"]: 100, SUMMARY["delta"]: 0.05,
                SUMMARY["first_cert"]: {p: firsts[(w, s, p)] for p in ("a", "b")}}
               for w in (32, 64, 128) for s in range(4)]
    per_point = [{"kind": "alignment", "family": "f", "width": w, "seed": s, "point": p,
                  SUMMARY["steps_total"]: 105, SUMMARY["steps"]: list(range(0, 101, 10)), SUMMARY["delta"]: 0.05,
                  SUMMARY["first_cert"]: float("nan") if firsts[(w, s, p)] is None else firsts[(w, s, p)]}
                 for w in (32, 64, 128) for s in range(4) for p in ("a", "b")]
    unmonitored = [{**r, "point": "z", SUMMARY["first_cert"]: None, SUMMARY["monitored"]: False} for r in per_point]
    per_point = per_point + unmonitored  # alignment rows of points the monitor did not probe: not censored ones
    ref = _earlier(rows)
    for other in (as_dict, per_point):
        c = _earlier(other)
        assert c["measured"] == pytest.approx(ref["measured"], rel=1e-12, abs=1e-15) and c["verdict"] == ref["verdict"]
        assert c["basis"] == ref["basis"]
    assert _earlier(rows + as_dict)["measured"] == pytest.approx(ref["measured"], rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("make, reason", [
    (lambda s, w: _cell(w, s, None), "no point certified"),
    (lambda s, w: _cell(w, s, 30, delta=0.05 if w == 32 else 0.1), "different δ"),
    (lambda s, w: _cell(w, s, {32: 60, 64: 30, 128: 20}[w]), "every seed gives the same slope"),
])
def test_certify_earlier_gates(make, reason):
    c = _earlier([r for s in range(3) for w in (32, 64, 128) for r in make(s, w)])
    assert c["verdict"] == "not resolved" and reason in c["basis"] and c["p"] is None


def test_certify_earlier_joins_the_holm_family():
    rows = [_align(w, s, "p", two_d_align=math.exp(0.3 * math.log(w) + s), misalignment=0.3)
            for w in (32, 64) for s in range(3)]
    alone = _by_id(rows)["d_align_grows"]["family_size"]
    mon = [r for s in range(3) for w, f in ((32, 80), (64, 40 + 10 * s)) for r in _cell(w, s, f)]
    c = _by_id(rows + mon)
    assert c["certify_earlier"]["family"] and c["d_align_grows"]["family_size"] == alone + 1


def test_certify_earlier_calibration(rerun):
    _, res = rerun
    for part in ("monitor_null", "monitor_censored_null"):
        for key, v in res[part].items():
            assert v["rate"] <= ALPHA + _tol(v["pages"]), (part, key, v)
    assert res["monitor_null_pooled"]["rate"] <= ALPHA + _tol(res["monitor_null_pooled"]["pages"])
    holds = sum(v["holds"]["count"] for v in res["monitor_null"].values())  # the error to avoid: a false "holds"
    n = res["monitor_null_pooled"]["pages"]
    assert holds / n <= ALPHA / 2 + _tol(n, ALPHA / 2)
    assert 0.05 < min(v["censored"] for v in res["monitor_null"].values())  # censoring is really exercised
    assert min(v["censored"] for v in res["monitor_censored_null"].values()) > 0.35
    for noise in ("normal", "heavy"):
        p = [res["monitor_power"][f"{noise}/{ns}"]["rate"] for ns in (2, 3, 5, 10)]
        assert p[0] < p[2] <= p[3] + 0.02 and p[2] >= 0.6 and p[3] >= 0.9
    rf = res["monitor_row_form"]
    assert rf["pages"] >= 40 and rf["agree"] == rf["pages"]
