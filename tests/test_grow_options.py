"""Typed options of grow and grow-bench (issue 30): validation in the command line's words, the record a
results file keeps and its round trip, keywords as conveniences over the options, ``--config`` repeats."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest
import torch

from cli_run import one_line
from widthscope.cli import main
from widthscope.cli.checks import check_args
from widthscope.errors import WidthscopeError, WidthscopeTypeError
from widthscope.growth import grow, run_grow
from widthscope.growth.bench import run_bench
from widthscope.growth.options import GrowBenchOptions, GrowOptions
from widthscope.validate import RANGES

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- validation
# (field, bad value): the dataclass refuses each with the line `widthscope grow` prints (its shared
# checks, cli.checks.check_args, run first on the command line and keep their words)
SHARED = [
    ("steps", 10**9),
    ("block_width", 10**7),
    ("batch_size", 10**7),
    ("seed", -1),
    ("seed", 2**32),
    ("lr", -1.0),
    ("lr", 0.0),
    ("eta", -0.5),
    ("eta", math.inf),
]
# below the smallest value check_args says ">= lo" where the dataclass gives the whole range
BELOW = [
    ("steps", 0, "in 1..100000000 (steps)"),
    ("block_width", 0, "in 1..1000000 (hidden units)"),
    ("batch_size", 0, "in 1..1000000 (examples per batch)"),
]


@pytest.mark.parametrize("name,value", SHARED, ids=[f"{n}={v}" for n, v in SHARED])
def test_options_refuse_with_the_command_lines_one_line(name, value):
    with pytest.raises(WidthscopeError) as cli:
        check_args(argparse.Namespace(**{name: value}), "grow")
    with pytest.raises(WidthscopeError) as opts:
        GrowOptions(**{name: value})
    assert str(opts.value) == str(cli.value) and "\n" not in str(opts.value)


@pytest.mark.parametrize("name,value,tail", BELOW, ids=[f"{n}={v}" for n, v, _ in BELOW])
def test_options_below_the_range_name_flag_value_and_range(name, value, tail):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(WidthscopeError) as cli:
        check_args(argparse.Namespace(**{name: value}), "grow")
    with pytest.raises(WidthscopeError) as opts:
        GrowOptions(**{name: value})
    assert str(cli.value).startswith(f"{flag} {value}: must be a whole number >= ")
    assert str(opts.value) == f"{flag} {value}: must be a whole number {tail}"


def test_options_own_checks_name_the_flag():
    cases = [
        (dict(M=0), "--M 0: must be a whole number in 1..10000000 (examples)"),
        (dict(K=10**8), "--K 100000000: must be a whole number in 1..10000000 (examples)"),
        (dict(criterion="best"), "--criterion 'best': choose one of bias, block"),
        (dict(n_rank=2), "--n-rank 2: must be a whole number in 4..10000000 (examples)"),
        (dict(lr="1e-3"), "--lr '1e-3': must be a positive finite number, not str"),
        (dict(train_all=1), "--train-all 1: must be true or false"),
    ]
    for kw, msg in cases:
        with pytest.raises(
            WidthscopeError, match="^" + msg.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
        ):
            GrowOptions(**kw)
    with pytest.raises(WidthscopeError, match=r"^--M 2: must be >= 4 \(the unbiased"):  # grow-bench's message since it began
        GrowBenchOptions(M=2)
    with pytest.raises(WidthscopeError, match="--seeds 'a,b': expected comma-separated whole numbers"):
        GrowBenchOptions(seeds="a,b")


def test_whole_number_ranges_are_the_shared_table():
    table = {name: (lo, hi) for name, lo, hi, _ in RANGES}
    meta = {f.name: f.metadata for f in dataclasses.fields(GrowOptions)}
    for name in ("steps", "block_width", "n_rank", "batch_size"):
        assert (meta[name]["lo"], meta[name]["hi"]) == table[name], name


# ----------------------------------------------------------------------------- the record
def test_to_dict_from_dict_round_trip_through_json():
    opts = GrowOptions(
        points="blocks.1, blocks.2",
        M=8,
        K=12,
        steps=7,
        lr=0.02,
        eta=0.5,
        block_width=5,
        train_all=True,
        compare=True,
        criterion="bias",
        n_rank=10,
        batch_size=16,
        seed=9,
    )
    assert opts.points == ("blocks.1", "blocks.2")
    back = GrowOptions.from_dict(json.loads(json.dumps(opts.to_dict())))
    assert back == opts and back != GrowOptions()
    bench = GrowBenchOptions(quick=True, seeds="3,1", M=8, K=16)
    assert bench.seeds == (3, 1) and GrowBenchOptions.from_dict(json.loads(json.dumps(bench.to_dict()))) == bench
    with pytest.raises(WidthscopeError, match="unknown setting"):
        GrowOptions.from_dict({**opts.to_dict(), "stepz": 3})


# ----------------------------------------------------------------------------- keywords vs options
@pytest.fixture(scope="module")
def tiny():
    from widthscope.growth.suite import teacher_student

    student, data, _ = teacher_student(0, width=8, depth=3, n_train=64, n_test=32)
    return student, data


def _same(a, b):
    """Identical code path on identical inputs (one process, one thread): equal to the last bit."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_keywords_and_options_give_the_same_result(tiny):
    model, data = tiny
    kw = dict(M=8, K=8, steps=3, lr=1e-2, compare=True, seed=1, criterion="block", block_width=4)
    by_keywords = grow(model, data, progress=False, **kw)
    by_options = grow(model, data, GrowOptions(**kw), progress=False)
    # a keyword replaces the field of the options it comes with
    overridden = grow(model, data, GrowOptions(**{**kw, "steps": 9, "M": 16}), steps=3, M=8, progress=False)
    assert _same(by_keywords, by_options) and _same(by_keywords, overridden)
    assert by_keywords["options"] == {"grow": GrowOptions(**kw).to_dict()}
    assert GrowOptions.from_dict(by_keywords["options"]["grow"]) == GrowOptions(**kw)
    # the comparison can fail: another setting gives another result
    other = grow(model, data, GrowOptions(**{**kw, "steps": 4}), progress=False)
    assert not _same(by_keywords, other)


class _Stop(BaseException):
    """Raised by a tripwire: work started before the arguments were checked."""


def test_unknown_or_bad_keywords_are_one_error_naming_them_before_any_work(tiny, monkeypatch):
    import widthscope.growth.pipeline as pipeline

    model, data = tiny

    def tripwire(*a, **k):
        raise _Stop("work started")

    monkeypatch.setattr(pipeline, "rank_pairs", tripwire)
    monkeypatch.setattr(pipeline, "builtin_inputs", tripwire)
    cases = [
        (
            lambda: grow(model, data, step=3),
            WidthscopeTypeError,
            "grow(step=...): unknown setting 'step'; did you mean steps?",
        ),
        (
            lambda: grow(model, data, steps=10**9),
            WidthscopeError,
            "grow(steps=...): --steps 1000000000: must be a whole number in 1..100000000 (steps)",
        ),
        (lambda: grow(model, data, lr="fast"), WidthscopeTypeError, "grow(lr=...)"),
        (
            lambda: grow(model, data, options={"M": 8}),
            WidthscopeTypeError,
            "grow(options=...): options must be a GrowOptions, got dict",
        ),
        (lambda: run_grow(None, GrowOptions(), wat=1), WidthscopeTypeError, "run_grow(wat=...): unknown setting"),
        (
            lambda: run_bench("/nonexistent/gb", quick=True, sede=1),
            WidthscopeTypeError,
            "run_bench(sede=...): unknown setting 'sede'; did you mean seeds?",
        ),
        (
            lambda: run_bench("/nonexistent/gb", GrowBenchOptions(quick=True), M=2),
            WidthscopeError,
            "run_bench(M=...): --M 2",
        ),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc) as info:
            call()
        assert str(info.value).startswith(msg) and "\n" not in str(info.value), str(info.value)


# ----------------------------------------------------------------------------- --config
@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    from widthscope import checkpoint
    from widthscope.models import build

    root = tmp_path_factory.mktemp("grow-config")
    torch.manual_seed(0)
    checkpoint.save(build("mlp", 8, in_dim=64, out_dim=10, depth=2), root / "mlp", extra={"dataset": "digits"})
    return root


def test_config_repeats_the_settings_of_a_prior_run(checkpoint_dir, tmp_path, capsys):
    model = ["--model", str(checkpoint_dir / "mlp"), "--n-train", "64", "--n-test", "32"]
    prior, again, changed = tmp_path / "prior.json", tmp_path / "again.json", tmp_path / "changed.json"
    assert (
        main(
            [
                "grow",
                *model,
                "--M",
                "8",
                "--K",
                "8",
                "--steps",
                "2",
                "--lr",
                "0.02",
                "--criterion",
                "block",
                "--block-width",
                "4",
                "--seed",
                "5",
                "--batch-size",
                "16",
                "--out",
                str(prior),
            ]
        )
        == 0
    )
    assert main(["grow", *model, "--config", str(prior), "--out", str(again)]) == 0
    assert main(["grow", *model, "--config", str(prior), "--steps", "3", "--out", str(changed)]) == 0
    capsys.readouterr()
    first, second, third = (json.loads(p.read_text()) for p in (prior, again, changed))
    assert first["options"]["grow"] != GrowOptions().to_dict()  # the prior run's settings are not the defaults
    assert second["options"] == first["options"] and second["settings"] == first["settings"]
    assert third["options"]["grow"] == {**first["options"]["grow"], "steps": 3}
    # a file that records no grow options is one line, exit 2
    (tmp_path / "certify.json").write_text(json.dumps({"options": {"certify": {"draws": 10}}}))
    one_line(["grow", *model, "--config", str(tmp_path / "certify.json")], capsys, "records no grow options")
    one_line(["grow", *model, "--config", str(tmp_path / "missing.json")], capsys, "not found")
    (tmp_path / "bad.json").write_text(json.dumps({"options": {"grow": {**first["options"]["grow"], "steps": 0}}}))
    one_line(["grow", *model, "--config", str(tmp_path / "bad.json")], capsys, "--steps 0: must be a whole number")


def test_grow_bench_config_gives_the_recorded_options(tmp_path, monkeypatch, capsys):
    import widthscope.cli.grow_bench as cli

    seen = []
    monkeypatch.setattr(
        cli,
        "run_bench",
        lambda out, opts, shard=None: seen.append(opts) or {"complete": False, "finished": 0, "cells": 1},
    )
    recorded = GrowBenchOptions(quick=True, seeds=(2, 4), M=8, K=16)
    (tmp_path / "summary.json").write_text(
        json.dumps({"suite": "quick", "options": {"grow_bench": recorded.to_dict()}})
    )
    out = str(tmp_path / "gb")
    assert main(["grow-bench", "--config", str(tmp_path / "summary.json"), "--out", out]) == 0
    assert main(["grow-bench", "--config", str(tmp_path / "summary.json"), "--M", "12", "--out", out]) == 0
    assert main(["grow-bench", "--quick", "--seeds", "1", "--out", out]) == 0
    assert seen == [recorded, recorded.replace(M=12), GrowBenchOptions(quick=True, seeds=(1,))]
    capsys.readouterr()
    (tmp_path / "grow.json").write_text(json.dumps({"options": {"grow": GrowOptions().to_dict()}}))
    one_line(
        ["grow-bench", "--config", str(tmp_path / "grow.json"), "--out", out], capsys, "records no grow-bench options"
    )


def test_help_lists_every_option_field_with_its_default(capsys):
    for command, cls in (("grow", GrowOptions), ("grow-bench", GrowBenchOptions)):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(default None)" not in text and "--config FILE" in text
        for flag, kind, _, help_ in cls.fields_help():
            assert flag in text, (command, flag)
            assert kind == "bool" or "default" in help_, (command, flag)  # the help says what the default is
