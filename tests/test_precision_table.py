"""The precision benchmark (benchmarks/precision_table.py) in its quick setting: a tiny LLaMA,
briefly trained, certified in float64/float32/bfloat16/float16 on text whose shared target aligns
the gradients (the case of tests/test_lowprec.py). Checks the rows' structure, that bf16/fp16
stay within the tolerances of docs/performance.md §3 (units of u), and that a real defect (a
quarter of the bf16 samples halved) is caught by the same check."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import precision_table as pt  # noqa: E402
from widthscope.certification import samples as saved  # noqa: E402
from widthscope.certification.per_point import statistics  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("precision")
    return pt.run(pt.QUICK, work), work


def test_rows_structure(quick):
    res, _ = quick
    rows = res["rows"]
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16", "float16"}
    assert {r["quantity"] for r in rows} == set(pt.QUANTITIES)  # every headline number is compared
    ck = res["checkpoints"][0]
    n_points, n_m = len(ck["points"]), len(pt.QUICK.M)
    for dt in ("float32", "bfloat16", "float16"):
        mine = [r for r in rows if r["dtype"] == dt]
        assert len([r for r in mine if r["key"].endswith("|two|d_align")]) == n_points * n_m
        assert len([r for r in mine if r["quantity"] == "‖μ‖²"]) == 2 * n_points  # train and held-out
        for r in mine:
            assert r["reference"] == pt.REFERENCE[dt]
            if r["rel_diff"] is not None:
                want = abs(r["value"] - r["reference_value"]) / abs(r["reference_value"])
                assert math.isclose(r["rel_diff"], want, rel_tol=1e-9)
                assert math.isclose(r["rel_diff_u"], r["rel_diff"] / pt.UNIT[dt], rel_tol=1e-9)
    # the statistical yardstick exists for the moments, and the --plan dtype is the run's
    assert all(r["se"] and r["se"] > 0 for r in rows if r["quantity"] in ("‖μ‖²", "aᵀb"))
    assert ck["plan"] == {dt: {"dtype": dt, "source": "--dtype"} for dt in pt.DTYPES}
    assert ck["settings_dtype"] == {dt: dt for dt in pt.DTYPES}
    v = ck["verdicts"]["bfloat16"]
    assert v["certificates"] == 2 * n_points * n_m and 0 <= v["sign_agrees"] <= v["certificates"]
    assert {s["quantity"] for s in res["summary"]} == set(pt.QUANTITIES)


def test_low_precision_within_documented_tolerance(quick):
    res, _ = quick
    assert res["tolerance_failures"] == []
    checked = [
        r
        for r in res["rows"]
        if r["dtype"] in ("bfloat16", "float16")
        and r["rel_diff"] is not None
        and r["key"].rsplit("|", 1)[1] in pt.TOLERANCE_U
    ]
    assert len(checked) >= 20  # the check saw the rows, it did not pass vacuously
    # the rounding is the dtype's: bf16 moves the statistics more than fp16, float32 far less
    mx = {
        dt: max(r["rel_diff"] for r in res["rows"] if r["dtype"] == dt and r["quantity"] == "‖μ‖²")
        for dt in ("float32", "bfloat16", "float16")
    }
    assert mx["float32"] < mx["float16"] < mx["bfloat16"]


def test_scaled_samples_fail_the_check(quick):
    """A real defect (a quarter of the bf16 samples halved, a pooling bug) breaks the tolerance."""
    res, work = quick
    ref, low = res["_results"]["llama"]["float32"], copy.deepcopy(res["_results"]["llama"]["bfloat16"])
    train, test, _ = saved.load(work / "llama-bfloat16.safetensors")
    for x in (*train.values(), *test.values()):
        x[::4] *= 0.5
    rows, _ = statistics(train, test, pairs=[(m, m) for m in pt.QUICK.M], draws=pt.QUICK.draws, seed=0)
    for old, new in zip(low["points"], rows):
        old.update({k: new[k] for k in ("moments_train", "moments_test", "cross_moments", "certificates")})
    bad = pt.tolerance_failures(pt.compare(ref, low, {}, "bfloat16", "llama"))
    assert any("d_align" in b for b in bad) and any("mu_sq" in b for b in bad)
    # unchanged samples recomputed the same way pass: the failure is the defect's
    train, test, _ = saved.load(work / "llama-bfloat16.safetensors")
    rows, _ = statistics(train, test, pairs=[(m, m) for m in pt.QUICK.M], draws=pt.QUICK.draws, seed=0)
    for old, new in zip(low["points"], rows):
        old.update({k: new[k] for k in ("moments_train", "moments_test", "cross_moments", "certificates")})
    assert pt.tolerance_failures(pt.compare(ref, low, {}, "bfloat16", "llama")) == []
