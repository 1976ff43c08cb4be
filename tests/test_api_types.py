"""Python API errors name the argument (issue "Nothing lost, nothing silent").

One table of (function, call with one bad argument, exception type, text naming the parameter),
over every public function and each kind of bad argument. Every case must fail before any work:
the model's forward and the function's first step of real work are tripwires that raise a
``BaseException`` no ``except Exception`` (nor ``pytest.raises``) swallows.
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn as nn

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

import widthscope as ws  # noqa: E402
from widthscope import _args  # noqa: E402
from widthscope.certification import certify_dict  # noqa: E402
from widthscope.errors import WidthscopeError, WidthscopeTypeError  # noqa: E402
from widthscope.growth import grow  # noqa: E402
from widthscope.monitor import AlignmentMonitor  # noqa: E402

D64 = torch.float64
_g = torch.Generator().manual_seed(0)
X = torch.randn(12, 4, generator=_g, dtype=D64)
Y = torch.randint(0, 3, (12,), generator=_g)
GOOD = [(X[:6], Y[:6]), (X[6:], Y[6:])]
S = torch.randn(20, 5, generator=_g, dtype=D64)  # sample vectors for the statistics
K4 = torch.eye(3, dtype=D64)[:, :, None, None]    # a (3, 3, 1, 1) kernel
Y1 = torch.ones(3, 1, dtype=D64)
STRINGS = ["a b c", "d e f"]  # "batches" of text: not what the probe takes


class WorkStarted(BaseException):
    """Raised by a tripwire: the function did work before checking its arguments."""


class Tripwire(nn.Module):
    """An MLP (points "body.0".."body.1") whose forward must not run."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(D64)
        self.calls = 0

    def forward(self, x: Any) -> torch.Tensor:
        self.calls += 1
        raise WorkStarted("the model ran before the arguments were checked")


@dataclass
class Case:
    fn: str                          # the public function (name in the completeness check)
    what: str                        # the bad argument, for the test id
    call: Callable[[Tripwire], Any]
    exc: type                        # TypeError (wrong type) or ValueError (right type, bad value)
    needle: str                      # text naming the parameter
    work: tuple[str, ...] = ()       # "module:attr" of the function's first real work (tripwired)


_STATS = ("widthscope.stats.bounds:resolve_moments",)
_COLLECT = ("widthscope.probe.collect:resolve_points",)
_INSERT = ("widthscope.probe.insert:resolve_module",)
_INTERVENE = ("widthscope.probe.interventions:as_examples", "widthscope.probe.interventions:resolve_module")
_NTK = ("widthscope.linear.empirical:params_and_buffers",)
_NNGP = ("widthscope.linear.kernels:as_param_dtype",)
_PREDICT = ("widthscope.linear.trainer:spectral",)
_CORR = ("widthscope.linear.correlation:params_and_buffers",)
_SIDE = ("widthscope.linear.trainer:_model_tensors",)
_LOAD = ("widthscope.data.inputs:_resolve", "widthscope.data.inputs:_check_sources")
_CERTIFY = ("widthscope.certification.pipeline:_resolve",)
_GROW = ("widthscope.growth.pipeline:rank_pairs", "widthscope.growth.pipeline:rank_points")
_MONITOR = ("widthscope.monitor.core:as_batches", "widthscope.monitor.core:check_not_fsdp")

T, V = TypeError, ValueError
CASES = [
    # --- statistics
    Case("moments", "X str", lambda n: ws.moments("samples"), T, "moments(X=...)",
         ("widthscope.stats.estimators:as_matrix",)),
    Case("moments", "X 1-D", lambda n: ws.moments(torch.zeros(10)), V, "moments(X=...)",
         ("widthscope.stats.estimators:as_matrix",)),
    Case("moments", "estimator unknown", lambda n: ws.moments(S, estimator="biased"), V, "moments(estimator=...)",
         ("widthscope.stats.estimators:as_matrix",)),
    Case("moments", "method int", lambda n: ws.moments(S, method=2), T, "moments(method=...)",
         ("widthscope.stats.estimators:as_matrix",)),
    Case("certificate", "train None", lambda n: ws.certificate(None, M=4, K=4), T, "certificate(train=...)", _STATS),
    Case("certificate", "test str", lambda n: ws.certificate(S, "held-out", M=4, K=4), T, "certificate(test=...)",
         _STATS),
    Case("certificate", "M float", lambda n: ws.certificate(S, M=4.0, K=4), T, "certificate(M=...)", _STATS),
    Case("certificate", "K bool", lambda n: ws.certificate(S, M=4, K=True), T, "certificate(K=...)", _STATS),
    Case("certificate", "M zero", lambda n: ws.certificate(S, M=0, K=4), V, "certificate(M=...)", _STATS),
    Case("certificate", "populations unknown", lambda n: ws.certificate(S, M=4, K=4, populations="three"), V,
         "certificate(populations=...)", _STATS),
    Case("misalignment", "test None", lambda n: ws.misalignment(S, None, M=4, K=4), T, "misalignment(test=...)",
         ("widthscope.stats.estimators:as_matrix",)),
    Case("misalignment", "draws str", lambda n: ws.misalignment(S, S, M=4, K=4, draws="1000"), T,
         "misalignment(draws=...)", ("widthscope.stats.estimators:as_matrix",)),
    Case("misalignment", "seed float", lambda n: ws.misalignment(S, S, M=4, K=4, seed=1.5), T,
         "misalignment(seed=...)", ("widthscope.stats.estimators:as_matrix",)),
    Case("misalignment", "scheme unknown", lambda n: ws.misalignment(S, S, M=4, K=4, scheme="random"), V,
         "misalignment(scheme=...)", ("widthscope.stats.estimators:as_matrix",)),
    Case("plan", "target str", lambda n: ws.plan(S, target="0.05"), T, "plan(target=...)", _STATS),
    Case("plan", "target out of range", lambda n: ws.plan(S, target=1.5), V, "plan(target=...)", _STATS),
    Case("plan", "K zero", lambda n: ws.plan(S, target=0.1, K=0), V, "plan(K=...)", _STATS),
    # --- probe
    Case("collect", "model str", lambda n: ws.collect("not a model", GOOD), T, "collect(model=...)", _COLLECT),
    Case("collect", "batches of strings", lambda n: ws.collect(n, STRINGS), T, "collect(batches=...)", _COLLECT),
    Case("collect", "batches None", lambda n: ws.collect(n, None), T, "collect(batches=...)", _COLLECT),
    Case("collect", "batches one float tensor", lambda n: ws.collect(n, X), T, "collect(batches=...)", _COLLECT),
    Case("collect", "one (x, y) batch unwrapped", lambda n: ws.collect(n, (X, Y)), T, "collect(batches=...)",
         _COLLECT),
    Case("collect", "pool unknown", lambda n: ws.collect(n, GOOD, pool="max"), V, "collect(pool=...)", _COLLECT),
    Case("collect", "points of ints", lambda n: ws.collect(n, GOOD, points=[0]), T, "collect(points=...)",
         _COLLECT),
    Case("collect", "progress str", lambda n: ws.collect(n, GOOD, progress="no"), T, "collect(progress=...)",
         _COLLECT),
    Case("collect", "dtype str", lambda n: ws.collect(n, GOOD, dtype="float64"), T, "collect(dtype=...)",
         _COLLECT),
    Case("insertion_points", "model str", lambda n: ws.insertion_points("gpt2"), T, "insertion_points(model=...)"),
    Case("insertion_points", "model None", lambda n: ws.insertion_points(None), T, "insertion_points(model=...)"),
    Case("insert", "model str", lambda n: ws.insert("net", "body.0"), T, "insert(model=...)", _INSERT),
    Case("insert", "point None", lambda n: ws.insert(n, None), T, "insert(point=...)", _INSERT),
    Case("insert", "kind unknown", lambda n: ws.insert(n, "body.0", "mlp"), V, "insert(kind=...)", _INSERT),
    Case("insert", "width float", lambda n: ws.insert(n, "body.0", width=8.0), T, "insert(width=...)", _INSERT),
    Case("insert", "width zero", lambda n: ws.insert(n, "body.0", width=0), V, "insert(width=...)", _INSERT),
    Case("insert", "init_scale str", lambda n: ws.insert(n, "body.0", init_scale="1"), T, "insert(init_scale=...)",
         _INSERT),
    Case("intervene", "model str", lambda n: ws.intervene("net", "body.0", GOOD, GOOD), T, "intervene(model=...)",
         _INTERVENE),
    Case("intervene", "batches of strings", lambda n: ws.intervene(n, "body.0", STRINGS, GOOD), T,
         "intervene(train_batches=...)", _INTERVENE),
    Case("intervene", "test_batches None", lambda n: ws.intervene(n, "body.0", GOOD, None), T,
         "intervene(test_batches=...)", _INTERVENE),
    Case("intervene", "M float", lambda n: ws.intervene(n, "body.0", GOOD, GOOD, M=2.5), T, "intervene(M=...)",
         _INTERVENE),
    Case("intervene", "n_etas zero", lambda n: ws.intervene(n, "body.0", GOOD, GOOD, n_etas=0), V,
         "intervene(n_etas=...)", _INTERVENE),
    Case("intervene", "kind int", lambda n: ws.intervene(n, "body.0", GOOD, GOOD, kind=1), T, "intervene(kind=...)",
         _INTERVENE),
    Case("intervene", "progress int", lambda n: ws.intervene(n, "body.0", GOOD, GOOD, progress=1), T,
         "intervene(progress=...)", _INTERVENE),
    # --- linearization
    Case("linearize", "model str", lambda n: ws.linearize("net"), T, "linearize(model=...)",
         ("widthscope.linear.model:LinearizedModel",)),
    Case("linearize", "allow_stochastic str", lambda n: ws.linearize(n, allow_stochastic="yes"), T,
         "linearize(allow_stochastic=...)", ("widthscope.linear.model:LinearizedModel",)),
    Case("ntk", "model int", lambda n: ws.ntk(3, X), T, "ntk(model=...)", _NTK),
    Case("ntk", "x1 list", lambda n: ws.ntk(n, [[1.0, 2.0, 3.0, 4.0]]), T, "ntk(x1=...)", _NTK),
    Case("ntk", "x1 0-D", lambda n: ws.ntk(n, torch.tensor(1.0)), V, "ntk(x1=...)", _NTK),
    Case("ntk", "batch_size float", lambda n: ws.ntk(n, X, batch_size=2.5), T, "ntk(batch_size=...)", _NTK),
    Case("ntk", "method unknown", lambda n: ws.ntk(n, X, method="fast"), V, "ntk(method=...)", _NTK),
    Case("ntk", "memory_budget str", lambda n: ws.ntk(n, X, memory_budget="2e9"), T, "ntk: memory_budget", _NTK),
    Case("ntk", "chunk_size float", lambda n: ws.ntk(n, X, chunk_size=1.5), T, "ntk: chunk_size", _NTK),
    Case("nngp", "x1 ndarray", lambda n: ws.nngp(n, np.ones((2, 4))), T, "nngp(x1=...)", _NNGP),
    Case("nngp", "readout int", lambda n: ws.nngp(n, X, readout=2), T, "nngp(readout=...)", _NNGP),
    Case("nngp", "dtype integer", lambda n: ws.nngp(n, X, dtype=torch.int64), V, "nngp(dtype=...)", _NNGP),
    Case("kernel_predict", "K_train list", lambda n: ws.kernel_predict([[1.0]], Y1, lr=0.5, t=1.0), T,
         "kernel_predict(K_train=...)", _PREDICT),
    Case("kernel_predict", "K_train 3-D", lambda n: ws.kernel_predict(K4[..., 0], Y1, lr=0.5, t=1.0), V,
         "kernel_predict(K_train=...)", _PREDICT),
    Case("kernel_predict", "y_train None", lambda n: ws.kernel_predict(K4, None, lr=0.5, t=1.0), T,
         "kernel_predict(y_train=...)", _PREDICT),
    Case("kernel_predict", "lr str", lambda n: ws.kernel_predict(K4, Y1, lr="0.5", t=1.0), T, "kernel_predict: lr",
         _PREDICT),
    Case("kernel_predict", "steps fractional", lambda n: ws.kernel_predict(K4, Y1, lr=0.5, steps=2.5), V,
         "kernel_predict: steps", _PREDICT),
    Case("correlation", "model str", lambda n: ws.correlation("net", X[0], X[1:2], D=1, d=1), T,
         "correlation(model=...)", _CORR),
    Case("correlation", "x list", lambda n: ws.correlation(n, [1.0] * 4, X[1:2], D=1, d=1), T,
         "correlation(x=...)", _CORR),
    Case("correlation", "D float", lambda n: ws.correlation(n, X[0], X[1:2], D=1.0, d=1), T, "correlation(D=...)",
         _CORR),
    Case("correlation", "eta zero", lambda n: ws.correlation(n, X[0], X[1:2], D=1, d=1, eta=0), V,
         "correlation(eta=...)", _CORR),
    Case("train_side_by_side", "data one tensor", lambda n: ws.train_side_by_side(n, X, steps=2, lr=0.1), T,
         "train_side_by_side(data=...)", _SIDE),
    Case("train_side_by_side", "steps str", lambda n: ws.train_side_by_side(n, (X, Y), steps="2", lr=0.1), T,
         "train_side_by_side(steps=...)", _SIDE),
    Case("train_side_by_side", "steps negative", lambda n: ws.train_side_by_side(n, (X, Y), steps=-1, lr=0.1), V,
         "train_side_by_side(steps=...)", _SIDE),
    Case("train_side_by_side", "loss unknown",
         lambda n: ws.train_side_by_side(n, (X, Y), steps=2, lr=0.1, loss="l1"), V, "train_side_by_side(loss=...)",
         _SIDE),
    Case("train_side_by_side", "optimizer int",
         lambda n: ws.train_side_by_side(n, (X, Y), steps=2, lr=0.1, optimizer=3), T,
         "train_side_by_side(optimizer=...)", _SIDE),
    Case("train_side_by_side", "log_every zero",
         lambda n: ws.train_side_by_side(n, (X, Y), steps=2, lr=0.1, log_every=0), V,
         "train_side_by_side(log_every=...)", _SIDE),
    # --- inputs
    Case("InputSpec", "model None", lambda n: ws.InputSpec(model=None), T, "input spec field model"),
    Case("InputSpec", "n_train float", lambda n: ws.InputSpec(model="ck", n_train=64.0), T,
         "input spec field n_train"),
    Case("InputSpec", "n_train too small", lambda n: ws.InputSpec(model="ck", n_train=3), V,
         "input spec field n_train"),
    Case("InputSpec", "dtype unknown", lambda n: ws.InputSpec(model="ck", dtype="float8"), V,
         "input spec field dtype"),
    Case("InputSpec", "first str", lambda n: ws.InputSpec(model="ck", first="yes"), T, "input spec field first"),
    Case("load_inputs", "spec str", lambda n: ws.load_inputs("ck"), T, "load_inputs(spec=...)", _LOAD),
    Case("load_inputs", "model str", lambda n: ws.load_inputs(ws.InputSpec(model="ck"), model="net"), T,
         "load_inputs(model=...)", _LOAD),
    Case("load_inputs", "show_progress None",
         lambda n: ws.load_inputs(ws.InputSpec(model="ck"), show_progress=None), T, "load_inputs(show_progress=...)",
         _LOAD),
    # --- pipelines
    Case("certify", "model str", lambda n: certify_dict("not a model", GOOD, GOOD), T, "certify(model=...)", _CERTIFY),
    Case("certify", "batches of strings", lambda n: certify_dict(n, STRINGS, GOOD), T, "certify(train_batches=...)",
         _CERTIFY),
    Case("certify", "M float", lambda n: certify_dict(n, GOOD, GOOD, M=[4.5]), T, "certify(M=...)", _CERTIFY),
    Case("certify", "draws zero", lambda n: certify_dict(n, GOOD, GOOD, M=[4], draws=0), V, "certify(draws=...)",
         _CERTIFY),
    Case("certify", "estimator unknown", lambda n: certify_dict(n, GOOD, GOOD, M=[4], estimator="biased"), V,
         "certify(estimator=...)", _CERTIFY),
    Case("certify", "interventions unknown", lambda n: certify_dict(n, GOOD, GOOD, M=[4], interventions="both"), V,
         "certify(interventions=...)", _CERTIFY),
    Case("certify", "project too small", lambda n: certify_dict(n, GOOD, GOOD, M=[4], project=1), V,
         "certify(project=...)", _CERTIFY),
    Case("certify", "max_rel_step str", lambda n: certify_dict(n, GOOD, GOOD, M=[4], max_rel_step="x"), T,
         "certify(max_rel_step=...)", _CERTIFY),
    Case("grow", "model str", lambda n: grow("net", (GOOD, GOOD)), T, "grow(model=...)", _GROW),
    Case("grow", "data int", lambda n: grow(n, 3), T, "grow(data=...)", _GROW),
    Case("grow", "data of strings", lambda n: grow(n, (STRINGS, GOOD)), T, "grow(data[0]=...)", _GROW),
    Case("grow", "M zero", lambda n: grow(n, (GOOD, GOOD), M=0), V, "grow(M=...)", _GROW),
    Case("grow", "lr str", lambda n: grow(n, (GOOD, GOOD), lr="1e-3"), T, "grow(lr=...)", _GROW),
    Case("grow", "criterion unknown", lambda n: grow(n, (GOOD, GOOD), criterion="best"), V, "grow(criterion=...)",
         _GROW),
    Case("AlignmentMonitor", "model str", lambda n: AlignmentMonitor("net", (X, Y), (X, Y)), T,
         "AlignmentMonitor(model=...)", _MONITOR),
    Case("AlignmentMonitor", "train str", lambda n: AlignmentMonitor(n, "train.txt", (X, Y)), T,
         "AlignmentMonitor(train=...)", _MONITOR),
    Case("AlignmentMonitor", "M float", lambda n: AlignmentMonitor(n, (X, Y), (X, Y), M=16.0), T,
         "AlignmentMonitor(M=...)", _MONITOR),
    Case("AlignmentMonitor", "budget str", lambda n: AlignmentMonitor(n, (X, Y), (X, Y), budget="5%"), T,
         "AlignmentMonitor(budget=...)", _MONITOR),
    Case("AlignmentMonitor", "out int", lambda n: AlignmentMonitor(n, (X, Y), (X, Y), out=3), T,
         "AlignmentMonitor(out=...)", _MONITOR),
    Case("AlignmentMonitor", "delta out of range", lambda n: AlignmentMonitor(n, (X, Y), (X, Y), delta=1.5), V,
         "AlignmentMonitor(delta=...)", _MONITOR),
    # the options dataclasses: a field's flag names it (the same message on the command line)
    Case("MonitorOptions", "draws str", lambda n: ws.MonitorOptions(draws="many"), T, "draws"),
    Case("MonitorOptions", "M tuple", lambda n: ws.MonitorOptions(M=(16, 32)), T, "M"),
    Case("MonitorOptions", "delta out of range", lambda n: ws.MonitorOptions(delta=1.5), V, "delta"),
    Case("GrowOptions", "steps str", lambda n: ws.GrowOptions(steps="many"), T, "--steps"),
    Case("GrowOptions", "lr str", lambda n: ws.GrowOptions(lr="fast"), T, "--lr"),
    Case("GrowOptions", "points int", lambda n: ws.GrowOptions(points=3), T, "--points"),
    Case("GrowOptions", "criterion unknown", lambda n: ws.GrowOptions(criterion="best"), V, "--criterion"),
    Case("GrowOptions", "M zero", lambda n: ws.GrowOptions(M=0), V, "--M"),
    Case("sweep", "config int", lambda n: ws.sweep(3, "/tmp/never"), T, "sweep(config=...)"),
    Case("sweep", "out_dir int", lambda n: ws.sweep({"sweep": {}}, 3), T, "sweep(out_dir=...)"),
    Case("sweep", "no families", lambda n: ws.sweep({"sweep": {}}, "/tmp/never"), V, "no [[family]]"),
    Case("ReportOptions", "strict str", lambda n: ws.ReportOptions(strict="yes"), T, "--strict"),
    Case("ReportOptions", "title int", lambda n: ws.ReportOptions(title=3), T, "--title"),
    Case("CertifyOptions", "draws str", lambda n: ws.CertifyOptions(draws="many"), T, "--draws"),
    Case("CertifyOptions", "draws float", lambda n: ws.CertifyOptions(draws=2.5), T, "--draws"),
    Case("CertifyOptions", "M of str", lambda n: ws.CertifyOptions(M=["a"]), T, "--M"),
    Case("CertifyOptions", "points int", lambda n: ws.CertifyOptions(points=3), T, "--points"),
    Case("CertifyOptions", "estimator unknown", lambda n: ws.CertifyOptions(estimator="biased"), V, "--estimator"),
    Case("CertifyOptions", "draws 0", lambda n: ws.CertifyOptions(draws=0), V, "--draws 0"),
    Case("InterventionOptions", "n_etas str", lambda n: ws.InterventionOptions(n_etas="4"), T, "--n-etas"),
    Case("InterventionOptions", "n_etas too many", lambda n: ws.InterventionOptions(n_etas=10 ** 9), V,
         "--n-etas 1000000000"),
    Case("CertifyResult", "not a mapping", lambda n: ws.CertifyResult.from_dict([1]), T,
         "CertifyResult.from_dict(res=...)"),
    Case("CertifyResult", "no points", lambda n: ws.CertifyResult.from_dict({}), V, "'points' list"),
    Case("PointCertificate", "not a point", lambda n: ws.PointCertificate.from_dict("p"), T,
         "PointCertificate.from_dict(p=...)"),
]


def _trip(*_: Any, **__: Any) -> Any:
    raise WorkStarted("work started before the arguments were checked")


@pytest.mark.parametrize("case", CASES, ids=[f"{c.fn}-{c.what}" for c in CASES])
def test_bad_argument_names_the_parameter_before_any_work(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    for target in case.work:
        mod, attr = target.split(":")
        monkeypatch.setattr(importlib.import_module(mod), attr, _trip)
    net = Tripwire()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(case.exc) as info:
        case.call(net)
    err = info.value
    msg = str(err)
    assert isinstance(err, WidthscopeError), type(err)  # the CLI reports it as a user error
    assert isinstance(err, WidthscopeTypeError) == (case.exc is TypeError), type(err)
    assert case.needle in msg, msg
    assert "\n" not in msg and len(msg) < 400, msg
    assert net.calls == 0 and net.training
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_every_public_function_is_in_the_table() -> None:
    """A new public function without argument checks (no row here) fails this test."""
    public = {n for n in ws.__all__ if callable(getattr(ws, n))
              and not (isinstance(getattr(ws, n), type) and issubclass(getattr(ws, n), BaseException))}
    public |= {"certify", "grow", "sweep", "AlignmentMonitor"}
    covered = collections.Counter(c.fn for c in CASES)
    assert public - set(covered) == set()
    assert set(covered) - public == set()  # no stale rows
    typed = {c.fn for c in CASES if c.exc is TypeError}
    assert typed == public  # every function has a wrong-type row
    assert len(CASES) >= 45


def test_the_issue_example() -> None:
    with pytest.raises(TypeError, match=r"^certify\(model=\.\.\.\): .*torch\.nn\.Module .*got str 'not a model'$"):
        certify_dict("not a model", GOOD, GOOD)


class _Encoding(collections.UserDict):
    """Like transformers' BatchEncoding: a Mapping, not a dict."""


def test_batch_forms_that_work_still_work() -> None:
    lm = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16)).to(D64)
    ids = torch.randint(0, 16, (4, 5), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=6)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(D64)
    for model, batches in ((lm, [ids]), (lm, [{"input_ids": ids}]), (lm, [_Encoding(input_ids=ids)]),
                           (lm, ids[None]), (lm, (b for b in [ids])), (mlp, loader), (mlp, GOOD),
                           (mlp, [[X, Y]]), (mlp, [({"input": X}, Y)])):
        assert _args.batches("collect", "batches", batches) is batches
        q = ws.collect(model, batches, points=["0"], progress=False)
        assert q["0"].shape[0] > 0
    # functions that pool their batches also take one batch
    for one in ((X, Y), ids, {"input_ids": ids}, _Encoding(input_ids=ids)):
        assert _args.batches("intervene", "train_batches", one, single=True) is one


def test_describe_is_short_and_one_line() -> None:
    assert _args.describe("x" * 500).startswith("str 'xxx") and len(_args.describe("x" * 500)) < 60
    assert _args.describe(torch.zeros(2, 3)) == "Tensor of shape (2, 3) float32"
    assert _args.describe(Tripwire()) == "Tripwire"
    assert _args.describe([X, Y]).startswith("list of 2 item(s), the first Tensor of shape (12, 4)")
    assert "\n" not in _args.describe({"a\nb": 1})
