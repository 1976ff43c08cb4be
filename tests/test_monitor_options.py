"""MonitorOptions (issue 30): one typed options dataclass for the monitor, its statistical fields
made from CertifyOptions' declarations; options and keywords give the same monitor; the out= file
records the options once."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch.nn as nn

from test_monitor import POINTS, make_model, pools, train
from widthscope.errors import WidthscopeError
from widthscope.monitor import AlignmentMonitor, MonitorOptions
from widthscope.monitor.core import monitor_from
from widthscope.options import CertifyOptions

SHARED = ("points", "draws", "seed", "estimator", "pool")  # declared by CertifyOptions, copied as they are
TIMES = ("probe_s", "stats_s")  # wall-clock columns: differ run to run


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


# ----------------------------------------------------------------------------- one source
def test_statistical_fields_are_certify_options_declarations():
    mine, theirs = _fields(MonitorOptions), _fields(CertifyOptions)
    for name in SHARED:
        assert mine[name].metadata == theirs[name].metadata, name
        assert mine[name].default == theirs[name].default, name
    for name in ("M", "K"):  # one size each (certify: lists); the range is certify's
        for key in ("lo", "hi", "unit", "choices"):
            assert mine[name].metadata[key] == theirs[name].metadata[key], (name, key)
        assert mine[name].metadata["kind"] == "int" and theirs[name].metadata["kind"] == "ints"
    assert MonitorOptions().M == 16 and CertifyOptions().M != 16
    assert "certify takes a list" in mine["M"].metadata["help"]


@pytest.mark.parametrize(
    "name, bad",
    [("draws", 0), ("draws", 10**7), ("seed", -1), ("estimator", "median"), ("pool", "max"), ("M", 0), ("K", 10**8)],
)
def test_statistical_checks_are_certify_options_checks(name, bad):
    """The same bad value fails both classes with the same message, up to the flag (the keyword here)."""
    with pytest.raises(WidthscopeError) as mon:
        MonitorOptions(**{name: bad})
    with pytest.raises(WidthscopeError) as cert:
        CertifyOptions(**{name: (bad,) if name in ("M", "K") else bad})
    listed = name in ("M", "K")  # certify's message says "every entry" of its list
    expect = str(cert.value).replace(CertifyOptions.flag(name), name, 1)
    assert str(mon.value) == (expect.replace("every entry ", "") if listed else expect)
    assert str(mon.value).startswith(f"{name} ")


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(M=0), r"^M 0: must be a whole number in 1\.\."),
        (dict(M=True), r"^M True: must be a whole number .*not bool"),
        (dict(M=2.5), r"^M 2\.5: must be a whole number"),
        (dict(K=0), r"^K 0: must be a whole number"),
        (dict(every=0), r"^every 0: must be a whole number >= 1 \(optimizer steps\)"),
        (dict(at=[]), r"^at is empty: give the optimizer steps"),
        (dict(at=[3, -1]), r"^at -1: every entry must be a whole number >= 0"),
        (dict(every=5, at=[3]), r"^give either every=N or at=\[steps\], not both"),
        (dict(budget=0), r"^budget must be a share of training time > 0"),
        (dict(budget=-0.1), r"^budget must be a share"),
        (dict(budget="5%"), r"^budget must be a share.*'5%'"),
        (dict(budget=math.nan), r"^budget must be a share"),
        (dict(delta=0.0), r"^delta 0: must be a probability in \(0, 1\)"),
        (dict(delta=1.5), r"^delta 1\.5: must be a finite number in 0\.0\.\.1\.0"),
        (dict(batch_size=0), r"^batch_size 0: must be a whole number in 1\.\."),
        (dict(points=5), r"^points 5: expected a list of names"),
    ],
)
def test_bad_options_are_one_line_naming_the_keyword(kw, match):
    with pytest.raises(WidthscopeError, match=match) as exc:
        MonitorOptions(**kw)
    assert "\n" not in str(exc.value)


def test_normalised_values():
    import numpy as np

    o = MonitorOptions(at=[9, np.int64(3), 9], M=np.int64(8), points="a, b", budget=math.inf)
    assert o.at == (3, 9) and type(o.M) is int and o.M == 8 and o.points == ("a", "b")
    assert o.budget_in_force == math.inf and MonitorOptions(every=3).budget_in_force is None
    assert MonitorOptions().budget_in_force == 0.05 and MonitorOptions(at=[1], budget=0.2).budget_in_force == 0.2
    assert MonitorOptions(M=12).K_or_M == 12 and MonitorOptions(M=12, K=7).K_or_M == 7


@pytest.mark.parametrize(
    "opts",
    [
        MonitorOptions(),
        MonitorOptions(
            points=["2", "5"],
            M=32,
            K=24,
            draws=50,
            seed=7,
            estimator="plugin",
            pool="mean",
            every=4,
            delta=0.2,
            batch_size=16,
        ),
        MonitorOptions(at=[0, 10, 5], budget=0.1),
        MonitorOptions(budget=math.inf),
    ],
)
def test_round_trip_through_json(opts):
    text = json.dumps(opts.to_dict(), allow_nan=False)  # plain JSON: budget=inf is written "inf"
    assert MonitorOptions.from_dict(json.loads(text)) == opts


def test_from_dict_refuses_an_unknown_setting():
    with pytest.raises(WidthscopeError, match="MonitorOptions: unknown setting.*evry"):
        MonitorOptions.from_dict({"evry": 3})


# ----------------------------------------------------------------------------- the monitor
def test_unknown_keyword_is_one_error_naming_it():
    tr, te = pools()
    with pytest.raises(WidthscopeError, match=r"unknown keyword argument 'evry'; did you mean every\?") as exc:
        AlignmentMonitor(make_model(), tr, te, points=POINTS, evry=3)
    assert "\n" not in str(exc.value)
    with pytest.raises(TypeError, match="options must be a MonitorOptions"):
        AlignmentMonitor(make_model(), tr, te, {"M": 32})


def _probe_rows(mon: AlignmentMonitor, model: nn.Module) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in mon.probe(model, 3)]


def test_options_and_keywords_give_identical_probes():
    settings = dict(points=POINTS, M=32, K=24, draws=200, seed=3, estimator="plugin", every=2, delta=0.3, batch_size=48)
    model = make_model()
    train(model, 3)
    tr, te = pools()
    by_kw = AlignmentMonitor(model, tr, te, **settings)
    by_opts = AlignmentMonitor(model, tr, te, MonitorOptions(**settings))
    mixed = AlignmentMonitor(model, tr, te, MonitorOptions(**{**settings, "M": 16, "seed": 0}), M=32, seed=3)
    assert by_kw.options == by_opts.options == mixed.options == MonitorOptions(**settings)
    ref = _probe_rows(by_kw, model)
    # the same code path on the same tensors: equal to the last bit (see docs/architecture.md)
    assert _probe_rows(by_opts, model) == ref == _probe_rows(mixed, model)
    assert {(r["M"], r["K"], r["draws"], r["delta"]) for r in ref} == {(32, 24, 200, 0.3)}
    assert len(by_opts.train) == 4 and by_opts.estimator == "plugin" and by_opts.seed == 3  # batch_size=48 of 192


OLD_SETTINGS_KEYS = {
    "kind",
    "points",
    "M",
    "K",
    "every",
    "at",
    "delta",
    "draws",
    "seed",
    "estimator",
    "pool",
    "budget",
    "n_train",
    "n_test",
}


def test_the_out_file_records_the_options_once(tmp_path):
    out = tmp_path / "m.jsonl"
    opts = MonitorOptions(points=POINTS, M=32, draws=100, every=2, budget=math.inf)
    model = make_model()
    mon = AlignmentMonitor(model, *pools(), opts, out=out)
    train(model, 4, monitor=mon)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    head = lines[0]
    assert head["kind"] == "settings" and set(head) == OLD_SETTINGS_KEYS | {"options"}  # the old keys, kept
    assert (head["M"], head["K"], head["every"], head["budget"], head["points"]) == (32, 32, 2, None, POINTS)
    assert head["options"] == opts.to_dict() and MonitorOptions.from_dict(head["options"]) == opts
    assert sum("options" in x for x in lines) == 1 and [x["kind"] for x in lines[1:]].count("settings") == 0
    # the recorded options rebuild the monitor: it resumes the file
    again = AlignmentMonitor(model, *pools(), MonitorOptions.from_dict(head["options"]), out=out)
    assert len(again.rows) == len(mon.rows) and not again.should_probe(4) and again.should_probe(6)
    with pytest.raises(WidthscopeError, match=r"other settings \(options\)"):
        AlignmentMonitor(model, *pools(), opts.replace(batch_size=48), out=out)


def test_a_file_written_before_the_options_block_resumes(tmp_path):
    out = tmp_path / "m.jsonl"
    model = make_model()
    mon = AlignmentMonitor(model, *pools(), points=POINTS, M=32, draws=100, every=2, out=out)
    mon.step(model, 0)
    lines = out.read_text().splitlines()
    head = json.loads(lines[0])
    del head["options"]
    out.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    again = AlignmentMonitor(model, *pools(), points=POINTS, M=32, draws=100, every=2, out=out)
    assert len(again.rows) == len(POINTS) and not again.should_probe(0)


# ----------------------------------------------------------------------------- the callbacks
def test_callbacks_build_their_monitor_from_options():
    pytest.importorskip("transformers")
    from widthscope.monitor import hf

    model = make_model()
    tr, te = pools()
    opts = MonitorOptions(points=POINTS, M=32, draws=100, every=5)
    cb = hf.AlignmentCallback(model=model, train=tr, test=te, options=opts, seed=2)
    assert cb.monitor.options == opts.replace(seed=2) and cb.monitor.model is model

    class FakeTrainer:  # attach: the trainer's model, and add_callback
        def __init__(self) -> None:
            self.model, self.callbacks = model, []

        def add_callback(self, c) -> None:
            self.callbacks.append(c)

    trainer = FakeTrainer()
    cb2 = hf.attach(trainer, train=tr, test=te, options=opts)
    assert trainer.callbacks == [cb2] and cb2.monitor.options == opts and cb2.trainer is trainer
    with pytest.raises(WidthscopeError, match="either a monitor or the pools"):
        hf.AlignmentCallback(cb.monitor, model=model, train=tr, test=te, options=opts)
    with pytest.raises(WidthscopeError, match="no monitor given and no train, test"):
        hf.AlignmentCallback(model=model, options=opts)
    pl = pytest.importorskip("lightning")
    from widthscope.monitor import lightning as wl

    lcb = wl.AlignmentCallback(model=model, train=tr, test=te, options=opts)
    assert isinstance(lcb, pl.Callback) and lcb.monitor.options == opts
    with pytest.raises(WidthscopeError, match="no monitor given and no model"):
        wl.AlignmentCallback(train=tr, test=te, options=opts)


def test_monitor_from_refuses_a_non_monitor():
    with pytest.raises(WidthscopeError, match="monitor must be an AlignmentMonitor, not dict"):
        monitor_from({}, None, None, None, None, {}, "AlignmentCallback")  # type: ignore[arg-type]
