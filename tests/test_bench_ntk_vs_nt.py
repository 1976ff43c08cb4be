"""The neural-tangents comparison benchmark: its skip path and row schema without JAX (as in CI), and,
where neural-tangents is installed (``make bench-nt``), float64 agreement of ``ws.ntk`` with
``empirical_ntk_fn`` on models whose weights are shared between the PyTorch and JAX versions."""
from __future__ import annotations

import collections
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
    assert r["setup"]["ws_auto"]["choice"] in ("structured", "per_example", "jacobian", "products")
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


def _ridge_problem(seed: int = 0, N: int = 6, M: int = 4, o: int = 2):
    """A tiny tanh MLP in float64: its empirical NTK (N, N, o, o) / (M, N, o, o) from ``ws.ntk``, its NNGP
    (per-output, (N, N) / (M, N)) from ``ws.nngp``, outputs at init and targets."""
    import torch
    from torch import nn

    import widthscope as ws

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, o)).double()
    X, Xt = torch.randn(N, 3, dtype=torch.float64), torch.randn(M, 3, dtype=torch.float64)
    y = torch.randn(N, o, dtype=torch.float64)
    with torch.no_grad():
        f0, g0 = net(X), net(Xt)
    return {"K": ws.ntk(net, X), "Kt": ws.ntk(net, Xt, X), "G": ws.nngp(net, X), "Gt": ws.nngp(net, Xt, X),
            "y": y, "f0": f0, "g0": g0}


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


# Conventions mapped (kernel_predict docstring): nt's time is learning_rate·t in units where its loss is the
# mean over all N·o outputs, ours η·t over the mean over N examples, so lr_nt·t_nt = o·η·t; nt's relative
# diag_reg is diag_reg·trace(K2d)/dim(K2d) (dim = N·o for trace_axes=(), N for the per-output kernel of
# trace_axes=(-1,)), our ridge is absolute. nt's regularised *train* outputs come from its test formula with
# k_test_train = k_train_train (its docstring); its own train output is f0 + expm1(−(K+λ)τ)(f0 − y).
_ETA, _LR_NT = 0.7, 0.5
_TIMES = [0.3, 2.0, 25.0, float("inf")]


@pytest.mark.parametrize("ridge_rel", [0.0, 1e-3, 0.1, 2.0])
@pytest.mark.parametrize("absolute", [True, False], ids=["absolute", "relative"])
def test_kernel_predict_ridge_matches_nt_gradient_descent_mse(ridge_rel, absolute):
    """``kernel_predict(K, y, lr=η, t=τ, ridge=λ)`` on ws.ntk kernels equals
    ``nt.predict.gradient_descent_mse(K, y, learning_rate, diag_reg)`` (trace_axes=(), full output kernel)
    at finite and infinite times, train and test, to 1e-10 relative in float64."""
    pytest.importorskip("neural_tangents")
    jax = pytest.importorskip("jax")
    import numpy as np
    import neural_tangents as nt

    from widthscope.linear import kernel_predict

    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        p = _ridge_problem()
        K, Kt, y, f0, g0 = (p[k].numpy() for k in ("K", "Kt", "y", "f0", "g0"))
        N, o = y.shape
        K2 = K.transpose(0, 2, 1, 3).reshape(N * o, N * o)
        ridge = ridge_rel if absolute else ridge_rel * np.trace(K2) / (N * o)  # our absolute λ
        diag_reg = ridge if absolute else ridge_rel
        pred = nt.predict.gradient_descent_mse(K, y, learning_rate=_LR_NT, diag_reg=diag_reg,
                                               diag_reg_absolute_scale=absolute, trace_axes=())
        worst = 0.0
        for t_nt in _TIMES + [None]:
            tau = float("inf") if t_nt is None else _LR_NT * t_nt / (o * _ETA)
            ours = kernel_predict(p["K"], p["y"], lr=_ETA, t=tau, ridge=float(ridge), K_test=p["Kt"],
                                  f0_train=p["f0"], f0_test=p["g0"])
            nt_train, nt_test = pred(t_nt, f0, g0, Kt)
            nt_reg_train = pred(t_nt, f0, f0, K)[1]  # the regularised train outputs (test formula at K)
            for got, ref in ((ours["test"], nt_test), (ours["train"], nt_reg_train)):
                worst = max(worst, _rel(got.numpy(), ref))
            if ridge == 0:  # without ridge nt's own train output is ours too (y at t = ∞)
                worst = max(worst, _rel(ours["train"].numpy(), nt_train))
            else:  # and with ridge it is not: it decays with K + λI (guards against a vacuous mapping)
                assert t_nt is None or _rel(ours["train"].numpy(), nt_train) > 1e-8
    finally:
        jax.config.update("jax_enable_x64", prev)
    print(f"max relative difference (ridge_rel={ridge_rel}, absolute={absolute}): {worst:.2e}")
    assert worst < 1e-10


@pytest.mark.parametrize("diag_reg", [0.0, 0.05, 1.0])
@pytest.mark.parametrize("absolute", [True, False], ids=["absolute", "relative"])
@pytest.mark.parametrize("get", ["ntk", "nngp"])
def test_kernel_predict_is_the_nt_ensemble_mean(get, absolute, diag_reg):
    """``gradient_descent_mse_ensemble(kernel_fn, ..., diag_reg)`` mean (the f0 = 0 prediction)
    with kernel_fn returning the ws.ntk (trace_axes=()) or ws.nngp (per-output, nt's default trace_axes=(-1,),
    i.e. K ⊗ I_o for us) matrices equals ``kernel_predict`` with ``f0 = 0`` to 1e-10 relative."""
    pytest.importorskip("neural_tangents")
    jax = pytest.importorskip("jax")
    import numpy as np
    import torch
    import neural_tangents as nt

    from widthscope.linear import kernel_predict

    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        p = _ridge_problem(1)
        N, o = p["y"].shape
        M = p["g0"].shape[0]
        if get == "ntk":
            K, Kt, axes = p["K"], p["Kt"], ()
        else:  # the per-output kernel, block-diagonal over outputs
            eye = torch.eye(o, dtype=torch.float64)
            K, Kt, axes = p["G"][:, :, None, None] * eye, p["Gt"][:, :, None, None] * eye, (-1,)
        mats = {(N, N): (p["K"] if get == "ntk" else p["G"]).numpy(),
                (M, N): (p["Kt"] if get == "ntk" else p["Gt"]).numpy()}

        def kernel_fn(x1, x2, g, **kw):  # the precomputed matrices, looked up by the inputs' sizes
            k = mats[(x1.shape[0], N if x2 is None else x2.shape[0])]
            if isinstance(g, str):  # nt asks for one kernel as an array, for a tuple of them as a namedtuple
                return k
            assert tuple(g) == (get,), g
            return collections.namedtuple("Kernels", [get])(k)

        xtr, xte = np.zeros((N, 1)), np.zeros((M, 1))
        # relative: nt scales by trace/dim of the matrix it is given, (N·o)² or (N)² — trace(K ⊗ I)/(N·o) alike
        ridge = diag_reg if absolute else diag_reg * float(torch.einsum("iiaa->", K)) / (N * o)
        pred = nt.predict.gradient_descent_mse_ensemble(kernel_fn, xtr, p["y"].numpy(), learning_rate=_LR_NT,
                                                        diag_reg=diag_reg, diag_reg_absolute_scale=absolute,
                                                        trace_axes=axes)
        worst = 0.0
        for t_nt in _TIMES + [None]:
            tau = float("inf") if t_nt is None else _LR_NT * t_nt / (o * _ETA)
            ours = kernel_predict(K, p["y"], lr=_ETA, t=tau, ridge=ridge, K_test=Kt)
            worst = max(worst, _rel(ours["test"].numpy(), pred(t_nt, xte, get)))
            # nt's (regularised) train mean: x_test = x_train
            worst = max(worst, _rel(ours["train"].numpy(), pred(t_nt, xtr, get)))
    finally:
        jax.config.update("jax_enable_x64", prev)
    print(f"max relative difference ({get}, diag_reg={diag_reg}, absolute={absolute}): {worst:.2e}")
    assert worst < 1e-10
