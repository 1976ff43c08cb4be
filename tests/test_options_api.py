"""Options as data (one typed spec per setting: validation, command line, record, --config) and the
public API that matches the docs (``ws.certify(model, data, M=...)`` -> a typed result)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn as nn

import widthscope as ws
from widthscope.certification import certify_dict
from widthscope.cli import main
from widthscope.errors import WidthscopeError
from widthscope.options import CertifyOptions, CertifyRunOptions, InterventionOptions

FAST = ["--train-steps", "3", "--n-train", "32", "--n-test", "32", "--M", "8", "--draws", "50"]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 3))
    x, y = torch.randn(96, 6), torch.randint(0, 3, (96,))
    return net, [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)], [(x[64:], y[64:])]


# ----------------------------------------------------------------------------- the dataclasses
@pytest.mark.parametrize("kw,msg", [
    ({"draws": 0}, "--draws 0: must be a whole number in 1..1000000 (resamples)"),
    ({"draws": 10 ** 7}, "--draws 10000000: must be a whole number in 1..1000000"),
    ({"draws": 2.5}, "--draws 2.5: must be a whole number"),
    ({"draws": True}, "--draws True: must be a whole number"),
    ({"seed": -1}, "--seed -1: must be a whole number in 0..4294967295"),
    ({"n_etas": 101}, "--n-etas 101: must be a whole number in 1..100 (step sizes)"),
    ({"estimator": "biased"}, "--estimator 'biased': choose one of unbiased, plugin"),
    ({"pool": "max"}, "--pool 'max': choose one of sum, mean, flatten, token"),
    ({"interventions": "all"}, "--interventions 'all': choose one of bias, block, none"),
    ({"M": ()}, "--M is empty"),
    ({"M": "8,x"}, "--M '8,x': expected comma-separated whole numbers"),
    ({"M": (8, 0)}, "--M 0: every entry must be a whole number in 1..10000000"),
    ({"M": (8, 16), "K": (4, 4, 4)}, "K has 3 values but M has 2"),
    ({"etas": (0.1, -1.0)}, "every entry must be a finite number >= 0.0"),
    ({"etas": (0.0,)}, "step sizes must be positive finite numbers"),
    ({"max_rel_step": 1e-5}, "--max-rel-step 1e-05: must be a finite number above the smallest step"),
    ({"project": 1}, "--project 1: must be a whole number >= 2"),
    ({"project": 8, "estimator": "plugin"}, "--project corrects the unbiased estimators only"),
    ({"points": 3}, "--points 3: expected a list of names"),
])
def test_every_field_is_validated_when_made(kw, msg):
    with pytest.raises(WidthscopeError) as e:
        CertifyOptions(**kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_values_are_normalised_and_round_trip():
    o = CertifyOptions(M="8,16", K=[4], etas=[0.1, 1], points="a, b")
    assert o.M == (8, 16) and o.K == (4,) and o.etas == (0.1, 1.0) and o.points == ("a", "b")
    assert o.pairs == [(8, 4), (16, 4)]
    assert CertifyOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    with pytest.raises(WidthscopeError, match="unknown setting"):
        CertifyOptions.from_dict({"drwas": 3})  # a misspelt setting never falls back to a default silently
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.draws = 3  # type: ignore[misc]
    assert isinstance(o, InterventionOptions) and o.kind == "bias" and o.replace(interventions="none").kind is None


@pytest.mark.parametrize("data", [[("M", 4)], None, "M=4"])
def test_from_dict_of_something_else_names_the_class(data):
    with pytest.raises(TypeError, match="CertifyOptions.from_dict: expected a mapping of settings") as e:
        CertifyOptions.from_dict(data)
    assert isinstance(e.value, WidthscopeError)


def test_certify_refuses_a_keyword_it_does_not_take_by_name(tiny):
    net, tr, te = tiny
    with pytest.raises(TypeError, match=r"certify\(device=...\): not a setting of certify; .*model.to\(device\)"):
        ws.certify(net, tr, te, device="cpu")
    with pytest.raises(TypeError, match=r"certify\(drows=...\): .*did you mean draws\?"):
        ws.certify(net, tr, te, drows=10)


def test_presets_are_instances():
    p = CertifyOptions.published()
    assert (p.estimator, p.draw_scheme, p.interventions, p.M) == ("plugin", "per-pair", "none", (16, 32, 64, 128))
    assert CertifyOptions.published(draws=10).draws == 10


def test_the_command_line_is_generated_from_the_fields(capsys):
    with pytest.raises(SystemExit):
        main(["certify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for cls in (CertifyOptions, CertifyRunOptions):
        for flag, kind, default, help_ in cls.fields_help():
            assert flag in text, flag
            assert " ".join(help_.split())[:40] in text, flag
    assert "{unbiased,plugin}" in text and "{bias,block,none}" in text  # choices from the dataclass


# ----------------------------------------------------------------------------- records and --config
def test_a_results_file_records_its_options_and_config_repeats_the_run(tmp_path, capsys):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["certify", *FAST, "--n-etas", "3", "--seed", "2", "--out", str(one)]) == 0
    rec = json.loads(one.read_text())["options"]
    assert rec["certify"]["n_etas"] == 3 and rec["certify"]["seed"] == 2 and rec["run"]["train_steps"] == 3
    assert rec["inputs"]["n_train"] == 32
    assert main(["certify", "--config", str(one), "--out", str(two)]) == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a["points"] == b["points"] and a["settings"] == b["settings"] and a["options"] == b["options"]
    # an option given with --config overrides the recorded one
    three = tmp_path / "three.json"
    assert main(["certify", "--config", str(one), "--draws", "20", "--out", str(three)]) == 0
    c = json.loads(three.read_text())
    assert c["settings"]["draws"] == 20 and c["options"]["certify"]["seed"] == 2
    capsys.readouterr()
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["certify", "--config", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x.json")]) == 2
    assert "holds no options" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the public API
def test_ws_certify_is_the_function_the_readme_shows(tiny):
    net, tr, te = tiny
    res = ws.certify(net, tr, te, M=[8, 16], draws=100, progress=False)
    assert isinstance(res, ws.CertifyResult)
    raw = certify_dict(net, tr, te, M=[8, 16], draws=100, progress=False)  # the dict, same numbers
    assert res.to_dict()["points"] == raw["points"]
    assert [p.point for p in res.points] == [p["point"] for p in raw["points"]]
    c = res.point(res.points[0].point).certificate(16)
    assert c.d_align == raw["points"][0]["certificates"][1]["two"]["d_align"] and c.K == 16
    assert res.options == CertifyOptions(M=(8, 16), draws=100)
    df = res.to_pandas()
    assert len(df) == 2 * len(res.points) and set(df["M"]) == {8, 16}
    # the same settings as an options object, and the data as one pair
    again = ws.certify(net, (tr, te), options=CertifyOptions(M=(8, 16), draws=100), progress=False)
    assert again.to_dict()["points"] == raw["points"]
    with pytest.raises(WidthscopeError, match=r"no certificate at M=32"):
        res.points[0].certificate(32)


def test_a_results_json_reads_back_as_the_typed_result(tmp_path):
    out = tmp_path / "c.json"
    assert main(["certify", *FAST, "--out", str(out)]) == 0
    res = ws.CertifyResult.load(out)
    assert res.to_dict() == json.loads(out.read_text()) and res.options.draws == 50
    assert len(res.rows()) == len(res.points) and res.ranking


def test_the_api_names_the_argument_it_refuses(tiny):
    net, tr, te = tiny
    with pytest.raises(TypeError, match=r"certify\(data=...\)"):
        ws.certify(net, "not data")
    with pytest.raises(TypeError, match=r"options must be a CertifyOptions"):
        ws.certify(net, tr, te, options={"M": 8})
    with pytest.raises(WidthscopeError, match=r"certify\(draws=...\): draws must be a positive integer"):
        ws.certify(net, tr, te, options=CertifyOptions(), draws=0)


def test_exports_match_the_docs():
    for name in ("certify", "grow", "AlignmentMonitor", "CertifyOptions", "CertifyResult", "InputSpec",
                 "load_inputs", "ntk", "linearize"):
        assert name in ws.__all__ and callable(getattr(ws, name)), name
    import widthscope.growth.bench  # noqa: F401  (importing a subpackage must not hide the function)

    assert callable(ws.grow) and callable(ws.certify)


@pytest.mark.parametrize("first", ["functions", "packages"])
def test_the_public_functions_are_plain_functions_in_either_import_order(first):
    """``ws.certify``/``ws.grow``/``ws.sweep`` are functions of widthscope.api, never a package (the
    pipelines live in widthscope.certification/growth/sweeps, nouns, so nothing shadows them)."""
    import subprocess
    import sys

    imports = "import widthscope.certification.pipeline, widthscope.growth.bench, widthscope.sweeps.grid"
    code = (f"{imports}\nimport widthscope as ws\n" if first == "packages" else
            f"import widthscope as ws\nws.certify, ws.grow, ws.sweep\n{imports}\n") + (
        "import types, widthscope.api as api\n"
        "for n in ('certify', 'grow', 'sweep'):\n"
        "    f = getattr(ws, n)\n"
        "    assert isinstance(f, types.FunctionType) and f is getattr(api, n), (n, f)\n"
        "assert ws.certify.__annotations__['return'] == 'CertifyResult'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_module_shadows_a_top_level_export():
    """Importing every module of widthscope leaves each top-level name what it was (a module named
    like an export, e.g. ``widthscope/plan.py`` beside ``ws.plan``, would replace it on import)."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, types, widthscope as ws\n"
        "before = {n: getattr(ws, n) for n in ws.__all__}\n"
        "for m in pkgutil.walk_packages(ws.__path__, 'widthscope.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "moved = [n for n in ws.__all__ if getattr(ws, n) is not before[n]]\n"
        "assert not moved, moved\n"
        "assert not any(isinstance(getattr(ws, n), types.ModuleType) for n in ws.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_readme_quick_start_runs(capsys):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    assert "ws.certify(net" in code
    torch.manual_seed(0)
    exec(compile(code, "README.md", "exec"), {})
    assert "d_align" in capsys.readouterr().out


def test_a_result_without_recorded_options_never_claims_defaults(tiny):
    net, tr, te = tiny
    raw = certify_dict(net, tr, te, M=[8, 16], draws=100, progress=False)
    old = {k: v for k, v in raw.items() if k != "options"}  # a file written before options were recorded
    assert ws.CertifyResult.from_dict(old).options == CertifyOptions(M=(8, 16), K=(8, 16), draws=100)
    broken = {**old, "settings": {**old["settings"], "draws": 0}}  # settings no valid options match
    assert ws.CertifyResult.from_dict(broken).options is None
