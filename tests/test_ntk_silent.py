"""No silent options in the kernel tools: ridge at finite time (against parameter-space oracles),
refused bad options, stochastic and batch-coupled models, and the functional ``f(params, x)`` API."""
import pytest
import torch
from torch import nn

from widthscope.errors import WidthscopeError
from widthscope.linear import kernel_predict

F64 = torch.float64


def _linear_problem(seed: int, N: int = 7, M: int = 4, o: int = 2, P: int = 30):
    """An explicit linear model f(θ) = f_0 + J θ (θ₀ = 0): its kernel is J Jᵀ."""
    g = torch.Generator().manual_seed(seed)
    J = torch.randn(N * o, P, generator=g, dtype=F64) / P ** 0.5
    Jt = torch.randn(M * o, P, generator=g, dtype=F64) / P ** 0.5
    f0, g0 = torch.randn(N * o, generator=g, dtype=F64), torch.randn(M * o, generator=g, dtype=F64)
    y = torch.randn(N * o, generator=g, dtype=F64)
    K = (J @ J.T).reshape(N, o, N, o).permute(0, 2, 1, 3)
    Kt = (Jt @ J.T).reshape(M, o, N, o).permute(0, 2, 1, 3)
    return J, Jt, f0, g0, y, K, Kt, (N, M, o)


def _predict(K, Kt, y, f0, g0, shape, **kw):
    N, M, o = shape
    return kernel_predict(K, y.reshape(N, o), K_test=Kt, f0_train=f0.reshape(N, o), f0_test=g0.reshape(M, o), **kw)


@pytest.mark.parametrize("seed,ridge", [(0, 0.3), (1, 2.0), (2, 0.0), (3, 1e-3)])
def test_ridge_discrete_gd_equals_weight_space_gd_on_the_regularised_loss(seed, ridge):
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(seed)
    N = shape[0]
    lr, steps = 0.7, 25
    theta = torch.zeros(J.shape[1], dtype=F64)
    for _ in range(steps):  # GD on (1/2N)(‖f0 + Jθ − y‖² + λ‖θ‖²)
        theta = theta - (lr / N) * (J.T @ (f0 + J @ theta - y) + ridge * theta)
    got = _predict(K, Kt, y, f0, g0, shape, lr=lr, steps=steps, ridge=ridge)
    assert (got["train"].reshape(-1) - (f0 + J @ theta)).abs().max() < 1e-10
    assert (got["test"].reshape(-1) - (g0 + Jt @ theta)).abs().max() < 1e-10


@pytest.mark.parametrize("seed,ridge,t", [(0, 0.3, 5.0), (1, 2.0, 40.0), (2, 0.05, 0.7), (3, 0.0, 12.0)])
def test_ridge_flow_equals_the_weight_space_flow(seed, ridge, t):
    """dθ/dt = −(η/N)(Jᵀ(f0 + Jθ − y) + λθ), solved exactly by the matrix exponential of the
    augmented linear system in parameter space (no eigendecomposition of the kernel)."""
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(seed)
    N, P = shape[0], J.shape[1]
    lr = 0.9
    Mx = torch.zeros(P + 1, P + 1, dtype=F64)
    Mx[:P, :P] = -(lr / N) * (J.T @ J + ridge * torch.eye(P, dtype=F64))
    Mx[:P, P] = -(lr / N) * (J.T @ (f0 - y))
    theta = torch.linalg.matrix_exp(Mx * t)[:P, P]
    got = _predict(K, Kt, y, f0, g0, shape, lr=lr, t=t, ridge=ridge)
    assert (got["train"].reshape(-1) - (f0 + J @ theta)).abs().max() < 1e-10
    assert (got["test"].reshape(-1) - (g0 + Jt @ theta)).abs().max() < 1e-10


def test_ridge_changes_the_finite_time_answer_and_tends_to_kernel_ridge_regression():
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(4)
    plain = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=30.0)
    reg = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=30.0, ridge=0.5)
    assert (plain["test"] - reg["test"]).abs().max() > 1e-2
    late = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=1e6, ridge=0.5)
    inf = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=float("inf"), ridge=0.5)
    gd_inf = _predict(K, Kt, y, f0, g0, shape, lr=1.0, steps=float("inf"), ridge=0.5)
    for k in ("train", "test"):
        assert (late[k] - inf[k]).abs().max() < 1e-9 and (gd_inf[k] - inf[k]).abs().max() < 1e-12


def test_ridge_matches_the_neural_tangents_conventions():
    """neural-tangents' gradient_descent_mse(K, y, learning_rate, diag_reg) test prediction, written out
    from its source: eigenbasis of K + diag_reg·tr(K)/dim·I (default relative scale), time
    learning_rate·t over y.size. The docs' conversion (ridge = diag_reg·tr(K)/(N·o), t = lr_nt·t_nt/(o·η))
    must give the same numbers."""
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(6)
    N, M, o = shape
    Kf, Ktf = J @ J.T, Jt @ J.T
    diag_reg, lr_nt, t_nt = 0.1, 2.0, 7.0
    reg = diag_reg * torch.trace(Kf) / Kf.shape[0]
    ev, V = torch.linalg.eigh(Kf + reg * torch.eye(N * o, dtype=F64))
    nt_test = g0 + Ktf @ (V @ (torch.expm1(-ev * lr_nt * t_nt / y.numel()) / ev * (V.T @ (f0 - y))))
    eta = 0.3
    ours = _predict(K, Kt, y, f0, g0, shape, lr=eta, t=lr_nt * t_nt / (o * eta), ridge=float(reg))
    assert (ours["test"].reshape(-1) - nt_test).abs().max() < 1e-12


def test_kernel_predict_refuses_bad_options():
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(5)
    N, M, o = shape
    Y = y.reshape(N, o)
    for r in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="kernel_predict: ridge must be a finite number >= 0"):
            kernel_predict(K, Y, lr=0.5, t=1.0, ridge=r)
    for s in (-1, 2.5, float("nan")):
        with pytest.raises(WidthscopeError, match="kernel_predict: steps must be a whole number"):
            kernel_predict(K, Y, lr=0.5, steps=s)
    with pytest.raises(WidthscopeError, match="kernel_predict: t must be a number >= 0"):
        kernel_predict(K, Y, lr=0.5, t=-1.0)
    with pytest.raises(WidthscopeError, match=r"K_train has shape \(7, 7, 2, 1\)"):
        kernel_predict(K[..., :1], Y, lr=0.5, t=1.0)
    with pytest.raises(WidthscopeError, match=r"K_test has shape \(4, 6, 2, 2\)"):
        kernel_predict(K, Y, lr=0.5, t=1.0, K_test=Kt[:, :6])
    with pytest.raises(WidthscopeError, match=r"lr is too large .*ridge"):
        kernel_predict(K, Y, lr=1e4, steps=float("inf"), ridge=1.0)


# ----------------------------------------------------------------------------- bad options
def _mlp(out: int = 2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, out)).double()


def _jac_oracle(f, params: dict, x: torch.Tensor) -> torch.Tensor:
    """Θ = J Jᵀ from one jacrev of the whole batch's outputs, flattened to (n·o, n·o)."""
    from torch.func import jacrev

    J = jacrev(f)(params)
    n_out = f(params).numel()
    Jf = torch.cat([v.reshape(n_out, -1) for v in J.values()], 1)
    return Jf @ Jf.T


def _flat(K: torch.Tensor) -> torch.Tensor:
    n1, n2, o, _ = K.shape
    return K.permute(0, 2, 1, 3).reshape(n1 * o, n2 * o)


def test_ntk_refuses_bad_memory_budget_and_chunk_size():
    from widthscope.linear import ntk

    net, x = _mlp(), torch.randn(4, 3, dtype=F64)
    for b in (0, -1.0, float("nan"), True, "2e9"):
        with pytest.raises(WidthscopeError, match="ntk: memory_budget must be a positive number of bytes"):
            ntk(net, x, memory_budget=b)
    for c in (0, -2, 1.5):
        with pytest.raises(WidthscopeError, match="ntk: chunk_size must be a positive integer"):
            ntk(net, x, chunk_size=c, method="jacobian")


# ----------------------------------------------------------------------------- random layers
class _FunctionalDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 16), nn.Linear(16, 2)

    def forward(self, x):
        return self.b(nn.functional.dropout(torch.tanh(self.a(x)), 0.5, training=True))


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.att, self.out = nn.Linear(3, 8), nn.MultiheadAttention(8, 2, dropout=0.2), nn.Linear(8, 2)

    def forward(self, x):
        h = self.inp(x)[None]
        return self.out(self.att(h, h, h, need_weights=False)[0][0])


@pytest.mark.parametrize("layer,name", [(nn.Dropout(0.1), "Dropout '1'"), (nn.AlphaDropout(0.2), "AlphaDropout '1'"),
                                        (nn.FeatureAlphaDropout(0.2), "FeatureAlphaDropout '1'"),
                                        (nn.RReLU(), "RReLU '1'")])
def test_random_layers_in_training_mode_are_refused_by_name(layer, name):
    from widthscope.linear import linearize, nngp, ntk

    net = nn.Sequential(nn.Linear(3, 16), layer, nn.Linear(16, 2)).double().train()
    x = torch.randn(4, 3, dtype=F64)
    for call in (lambda: ntk(net, x), lambda: ntk(net, x, method="jacobian"), lambda: nngp(net, x)):
        with pytest.raises(WidthscopeError, match=f"{name}.* training mode .*call model.eval"):
            call()
    with pytest.raises(WidthscopeError, match=f"linearize: {name}.*model.eval.*allow_stochastic=True"):
        linearize(net)
    net.eval()  # the same model in eval mode is deterministic: no refusal
    assert ntk(net, x).shape == (4, 4, 2, 2) and nngp(net, x).shape == (4, 4)
    torch.testing.assert_close(linearize(net)(x), net(x))


def test_dropout_without_a_module_and_attention_dropout_are_found():
    from widthscope.linear import linearize, nngp, ntk

    x = torch.randn(4, 3, dtype=F64)
    fd = _FunctionalDropout().double()
    for call in (lambda: ntk(fd, x), lambda: nngp(fd, x)):
        with pytest.raises(WidthscopeError, match="two calls of the forward pass on the same inputs differ"):
            call()
    att = _Attention().double().train()
    with pytest.raises(WidthscopeError, match=r"MultiheadAttention 'att' \(dropout=0.2\)"):
        ntk(att, x)
    with pytest.raises(WidthscopeError, match=r"MultiheadAttention 'att'"):
        linearize(att)
    att.eval()
    assert ntk(att, x, method="jacobian").shape == (4, 4, 2, 2)
    # p = 0 in training mode draws nothing
    off = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.0), nn.Linear(4, 1)).double().train()
    assert ntk(off, x).shape == (4, 4, 1, 1)


def test_linearize_allow_stochastic_and_dropout_switched_on_later():
    from widthscope.linear import linearize

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 64), nn.Dropout(0.5), nn.Linear(64, 2)).double()
    x = torch.randn(4, 3, dtype=F64)
    lin = linearize(net.train(), allow_stochastic=True)
    assert (lin(x) - lin(x)).abs().max() > 1e-3  # each call is one random draw, as asked
    lin = linearize(net.eval())
    torch.testing.assert_close(lin(x), net(x))
    lin.train()
    with pytest.raises(WidthscopeError, match="linearized model: Dropout '1'.*allow_stochastic=True"):
        lin(x)


# ----------------------------------------------------------------------------- batch coupling
class _Centred(nn.Module):
    """h − h.mean(0): every example's output depends on the whole batch."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h - h.mean(0))


def test_batch_coupling_is_refused_for_per_example_kernels_and_exact_for_one_batch():
    from torch.func import functional_call

    from widthscope.linear import ntk

    torch.manual_seed(0)
    net, x = _Centred().double(), torch.randn(5, 3, dtype=F64)
    for m in ("auto", "structured"):
        with pytest.raises(WidthscopeError, match=f"examples are coupled.*method={m!r}.*own example only"):
            ntk(net, x, method=m)
    params = {k: v.detach() for k, v in net.named_parameters()}
    want = _jac_oracle(lambda p: functional_call(net, p, (x,)), params, x)
    for m in ("jacobian", "products"):
        info: dict = {}
        got = _flat(ntk(net, x, method=m, info=info))
        assert (got - want).abs().max() < 1e-12 and "examples are coupled" in info["batch_coupled"]
    for kw, why in ((dict(x2=x), "x2 is given"), (dict(batch_size=2), "batch_size is set"),
                    (dict(diagonal=True), "diagonal=True")):
        with pytest.raises(WidthscopeError, match=f"one batch at once, but {why}"):
            ntk(net, x, method="jacobian", **kw)
    with pytest.raises(WidthscopeError, match=r"whole batch at once: chunk_size=2 < 5"):
        ntk(net, x, method="jacobian", chunk_size=2)


def test_batchnorm_messages_match_their_cause():
    from widthscope.linear import nngp, ntk

    x = torch.randn(6, 4, dtype=F64)
    frozen = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, track_running_stats=False), nn.Linear(3, 2)).double()
    with pytest.raises(WidthscopeError, match=r"BatchNorm1d '1' uses batch statistics: it has track_running_stats="
                                              r"False.*model.eval\(\) does not change this.*track_running_stats=True"
                                              r".*method='jacobian'"):
        ntk(frozen.eval(), x)
    with pytest.raises(WidthscopeError, match=r"BatchNorm1d '1' uses batch statistics \(training mode\).*"
                                              r"model.eval\(\)"):
        ntk(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)).double().train(), x)
    with pytest.raises(WidthscopeError, match="nngp: BatchNorm1d '1' uses batch statistics") as e:
        nngp(frozen.eval(), x)
    assert "method='jacobian'" not in str(e.value)  # nngp has no such route


def test_training_mode_batchnorm_kernel_of_one_batch_leaves_the_model_alone():
    from torch.func import functional_call

    from widthscope.linear import ntk

    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double().train()
    x = torch.randn(7, 4, dtype=F64)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    got = _flat(ntk(net, x, method="jacobian"))
    ref = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, track_running_stats=False), nn.Tanh(),
                        nn.Linear(6, 2)).double().train()
    ref.load_state_dict({k: v for k, v in state.items() if "running" not in k and "num_batches" not in k})
    params = {k: v.detach() for k, v in ref.named_parameters()}
    want = _jac_oracle(lambda p: functional_call(ref, p, (x,)), params, x)
    assert (got - want).abs().max() < 1e-12
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())  # running stats untouched


def test_linearize_training_mode_batchnorm_is_a_clear_error_not_a_torch_crash():
    from widthscope.linear import linearize

    x = torch.randn(5, 3, dtype=F64)
    net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).double()
    with pytest.raises(WidthscopeError, match=r"linearize: BatchNorm1d '1' is in training mode .*model.eval\(\)"):
        linearize(net.train())
    lin = linearize(net.eval())
    torch.testing.assert_close(lin(x), net(x))
    with pytest.raises(WidthscopeError, match=r"linearized model: BatchNorm1d '1' is in training mode"):
        lin.train()(x)
    free = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, 2)).double()
    torch.testing.assert_close(linearize(free.train())(x), free(x))  # batch statistics, no updates: fine


def test_no_false_coupling_alarm_in_float32():
    from widthscope.linear import ntk

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.LayerNorm(256), nn.Linear(256, 10))
    info: dict = {}
    ntk(net, torch.randn(64, 20), trace=True, info=info)
    assert info["method"] == "structured" and "batch_coupled" not in info


# ----------------------------------------------------------------------------- functional API
def test_functional_call_of_a_module_equals_the_module_api():
    from torch.func import functional_call

    import widthscope as ws

    net = _mlp(out=3)
    x, x2 = torch.randn(6, 3, dtype=F64), torch.randn(4, 3, dtype=F64)
    p = {k: v.detach().clone() for k, v in net.named_parameters()}
    f = lambda q, z: functional_call(net, q, (z,))  # noqa: E731
    for kw in ({}, dict(x2=x2), dict(trace=True), dict(diagonal=True), dict(method="products")):
        a, b = ws.ntk(f, x, params=p, **kw), ws.ntk(net, x, **kw)
        assert a.shape == b.shape and (a - b).abs().max() < 1e-12, kw
    assert (ws.nngp(f, x, x2, params=p) - ws.nngp(net, x, x2)).abs().max() < 1e-12
    with pytest.raises(WidthscopeError, match="nngp: parameter '0.weight' is not a readout applied once"):
        ws.nngp(f, x, params=p, readout="0.weight")
    lin, lin_m = ws.linearize(f, params=p), ws.linearize(net)
    torch.testing.assert_close(lin(x), net(x), rtol=0, atol=1e-14)
    with torch.no_grad():  # the same step in both: the two linear models agree
        for (n, a), (m, b) in zip(lin.named_parameters(), lin_m.named_parameters()):
            assert n == m
            d = 0.1 * torch.randn_like(a)
            a.add_(d)
            b.add_(d)
    assert (lin(x) - lin_m(x)).abs().max() < 1e-12
    assert all(torch.equal(p[k], v) for k, v in net.named_parameters())  # θ₀ not moved


def test_hand_written_function_with_a_pytree_of_parameters():
    from torch.func import jacrev, jvp

    from widthscope.linear import linearize, nngp, ntk

    g = torch.Generator().manual_seed(3)
    params = {"hidden": (torch.randn(5, 3, generator=g, dtype=F64), torch.randn(5, generator=g, dtype=F64)),
              "out": torch.randn(2, 5, generator=g, dtype=F64), "scale": 1.5}

    def f(p, x):
        w, b = p["hidden"]
        return p["scale"] * torch.sin(x @ w.T + b) @ p["out"].T

    x = torch.randn(4, 3, generator=g, dtype=F64)
    leaves = {"w": params["hidden"][0], "b": params["hidden"][1], "o": params["out"]}
    as_p = lambda q: {"hidden": (q["w"], q["b"]), "out": q["o"], "scale": 1.5}  # noqa: E731
    J = jacrev(lambda q: f(as_p(q), x))(leaves)
    Jf = torch.cat([v.reshape(8, -1) for v in J.values()], 1)
    assert (_flat(ntk(f, x, params=params)) - Jf @ Jf.T).abs().max() < 1e-12
    phi = 1.5 * torch.sin(x @ params["hidden"][0].T + params["hidden"][1])
    assert (nngp(f, x, params=params) - phi @ phi.T).abs().max() < 1e-12  # readout: the 2-row "out"
    lin = linearize(f, params=params)
    delta = {n: 0.01 * torch.randn(p.shape, generator=g, dtype=F64) for n, p in lin.named_parameters()}
    with torch.no_grad():
        for n, p in lin.named_parameters():
            p.add_(delta[n])
    names = dict(zip(["p0", "p1", "p2"], ["w", "b", "o"]))
    want = f(params, x) + jvp(lambda q: f(as_p(q), x), (leaves,), ({names[n]: d for n, d in delta.items()},))[1]
    assert (lin(x) - want).abs().max() < 1e-12


def test_functional_api_errors():
    from widthscope.linear import linearize, nngp, ntk

    net, x = _mlp(), torch.randn(3, 3, dtype=F64)
    for fn, who in ((ntk, "ntk"), (nngp, "nngp"), (linearize, "linearize")):
        args = () if fn is linearize else (x,)
        with pytest.raises(WidthscopeError, match=f"{who}: got a function, not an nn.Module: pass its parameters"):
            fn(lambda p, z: z, *args)
        with pytest.raises(WidthscopeError, match=f"{who}: params= is for a plain function"):
            fn(net, *args, params=dict(net.named_parameters()))
        with pytest.raises(WidthscopeError, match=f"{who}: params must be a dict .* floating tensor"):
            fn(lambda p, z: z, *args, params={"k": torch.arange(3)})
        with pytest.raises(WidthscopeError, match=f"{who}: expected an nn.Module or a function"):
            fn(3, *args)


def test_top_level_exports():
    import widthscope as ws
    from widthscope import linear

    assert ws.nngp is linear.nngp and ws.kernel_predict is linear.kernel_predict and ws.ntk is linear.ntk
