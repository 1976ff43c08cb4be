"""The neural-tangents comparison benchmark: its skip path and row schema without JAX (as in CI), and,
where neural-tangents is installed (``make bench-nt``), float64 agreement of ``ws.ntk`` with
``empirical_ntk_fn`` on models whose weights are shared between the PyTorch and JAX versions."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # the module imports ntk_auto's conv net
    return importlib.import_module("ntk_vs_nt")


def test_without_neural_tangents_the_columns_are_skipped_and_widthscope_is_measured(capsys):
    mod = _mod()
    r = mod.row("tiny", {"kind": "mlp", "width": 8, "n": 4}, reps=2, memory=False, nt_available=False,
                inner_s=0.0)  # one call per timing
    assert mod.NOT_INSTALLED in capsys.readouterr().err
    assert r["skipped"] == {m: mod.NOT_INSTALLED for m in mod.NT_METHODS}
    assert set(r["seconds"]) == set(mod.WS_METHODS) and all(len(v) == 2 for v in r["all_seconds"].values())
    assert all(s > 0 for s in r["seconds"].values())
    assert "nt_over_ws_structured" not in r and "ws_structured_vs_nt_structured" not in r["agreement"]
    assert r["inner"] == {m: 1 for m in mod.WS_METHODS}
    assert r["agreement"]["f32_ws_auto_vs_ws_structured"] < 1e-5  # auto computes the same kernel
    assert r["peak"] == {}  # memory=False: the subprocess workers are not started (test_memory_worker)
    assert r["params"] == 64 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10 and r["n"] == 4
    assert len(r["load_average_before"]) == 3 and len(r["load_average_after"]) == 3
    assert r["setup"]["ws_auto"]["choice"] in ("structured", "jacobian", "products")
    json.dumps(r)  # the row is what the results file stores
    lines = mod.table_lines({"rows": {"tiny": r}})
    assert lines[2].startswith("| tiny | ") and "| skipped | skipped | skipped | skipped |" in lines[2]


def test_memory_worker_reports_the_peak_of_one_call():
    """What each ``--worker mem`` subprocess prints (run in-process here: a subprocess costs a torch import)."""
    p = _mod().worker_mem("ws_structured", {"kind": "mlp", "width": 8, "n": 4})
    assert set(p) == {"peak_MB", "rss_before_MB", "seconds", "cpu_over_wall", "hwm_reset"}
    assert p["peak_MB"] >= 0 and p["rss_before_MB"] > 0 and p["seconds"] > 0


def test_nt_over_ws_is_per_round():
    mod = _mod()
    # round 2 is loaded (both 3× slower): the per-round ratio is not fooled by it
    q = mod.ratios({"ws_structured": [1.0, 3.0, 1.0], "ws_auto": [1.0, 3.0, 2.0], "nt_structured": [2.0, 6.0, 3.0]})
    assert q["nt_over_ws_structured"] == pytest.approx(2.0) and q["nt_over_ws_auto"] == pytest.approx(2.0)
    assert mod.ratios({"ws_structured": [1.0], "ws_auto": [1.0]}) == {}


def test_jacobian_contraction_is_skipped_where_it_is_large():
    mod = _mod()
    assert mod._jacobian_skip({"n": 8}, 1000) is None
    assert "GFLOP" in mod._jacobian_skip({"n": 256}, 1_128_970)


def test_bad_rows_are_refused_before_work(capsys):
    assert _mod().main(["--rows", "no-such-row"]) == 2
    assert "unknown row" in capsys.readouterr().err


@pytest.mark.parametrize("spec", [{"kind": "mlp", "width": 16, "n": 5}, {"kind": "conv", "n": 3},
                                  {"kind": "transformer", "d": 16, "n": 3, "T": 4},
                                  {"kind": "mlp", "width": 16, "n": 5, "layout": "torch"}],
                         ids=["mlp", "conv", "transformer", "mlp-torch-layout"])
def test_ws_ntk_matches_neural_tangents_in_float64(spec):
    """Same weights in PyTorch and in JAX: ``ws.ntk`` (structured and auto) equals neural-tangents'
    implementations 3 and 1 to float64 rounding, and the JAX mirror computes the model's outputs."""
    pytest.importorskip("neural_tangents")
    jax = pytest.importorskip("jax")
    import numpy as np

    mod = _mod()
    prev = jax.config.jax_enable_x64
    try:
        res = mod.worker_agree(spec)
        model, x = mod.make(spec)
        model, x = model.double(), x.double()
        y = np.asarray(mod.jax_fn(spec)(mod.jax_params(model, spec), jax.numpy.asarray(x.numpy())))
    finally:
        jax.config.update("jax_enable_x64", prev)
    assert res["dtype"] == "float64"
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-12, atol=1e-12)
    for key in ("ws_structured_vs_nt_structured", "ws_auto_vs_nt_structured", "ws_structured_vs_nt_jacobian"):
        assert res[key] < 1e-12, (key, res[key])


def test_doc_quantities_come_from_the_rows():
    mod = _mod()

    def r(name, kind, ratio, **spec):
        return {"model": name, "spec": {"kind": kind, **spec}, "nt_over_ws_structured": ratio,
                "agreement": {"ws_structured_vs_nt_structured": 1e-15 * ratio},
                "load_average_before": [ratio, 0, 0], "load_average_after": [2 * ratio, 0, 0]}

    res = {"rows": {"a": r("a", "mlp", 0.5), "b": r("b", "mlp", 2.0), "t": r("t", "mlp", 100.0, layout="torch"),
                    "c": r("c", "conv", 1.25)}}
    assert mod.quantity(res, "ratio/mlp") == "0.50–2.0"  # the torch-layout row is not an MLP of the range
    assert mod.quantity(res, "ratio/t") == "100" and mod.quantity(res, "ratio/conv") == "1.2"
    assert mod.quantity(res, "nt_faster") == "`a`" and mod.quantity(res, "agree") == "1.0·10⁻¹³"
    assert mod.quantity(res, "load") == "0.5–200.0"
    res["rows"]["a"]["previous_runs"] = [{"nt_over_ws_structured": 0.25, "load_average_before": [9.26, 0, 0]}]
    assert mod.quantity(res, "prev/a") == "0.25 at load 9.3" and mod.quantity(res, "loadof/a") == "0.5"
    assert mod.quantity(res, "prev/b") == ""
    with pytest.raises(KeyError):
        mod.quantity(res, "nope")
