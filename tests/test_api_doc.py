"""docs/api.md is generated from the docstrings and the options dataclasses: it is what the code says."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gen():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_api_page_is_current():
    assert _gen().main(["--check"]) == 0, "run python docs/gen_api.py"


def test_the_page_changes_with_the_code(monkeypatch):
    import widthscope.options as options

    gen = _gen()
    before = gen.render()
    monkeypatch.setattr(options.CertifyOptions, "__doc__", "Changed.")
    assert gen.render() != before
