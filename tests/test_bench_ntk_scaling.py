"""The NTK scaling benchmark's references compute the same kernel, and its table renders."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("ntk_scaling", ROOT / "benchmarks" / "ntk_scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_references_agree_and_the_section_renders(tmp_path, monkeypatch):
    mod = _mod()
    from widthscope.linear import ntk
    from widthscope.models import build

    torch.manual_seed(0)
    model = build("mlp", 16, in_dim=64, out_dim=10, depth=2).double()
    x = torch.randn(5, 64, dtype=torch.float64)
    want = ntk(model, x, method="jacobian")
    for chunk in (2, 5):  # chunk pairs and a single block
        assert torch.allclose(mod._vmap_jacrev(model, x, chunk).double(), want, rtol=1e-10, atol=1e-12)
    rows = {}
    for method in ("structured", "floor", "vmap_jacrev"):
        r = mod.worker(method, 32, 8)
        assert r["seconds"] > 0 and r["params"] == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
        rows[f"{method}/256/64"] = {**r, "width": 256, "n": 64}
    assert rows["vmap_jacrev/256/64"]["max_rel_err_vs_structured"] < 1e-4
    out = tmp_path / "r.json"
    out.write_text(json.dumps(rows))
    monkeypatch.setattr(mod, "OUT", out)
    text = mod.section()
    assert "| 256 | 64 |" in text and "(vmap_jacrev)" in text
