"""Activation audit against closed-form derivatives; flags; CLI."""
import json
import math
import sys
import types

import pytest
import torch

from widthscope import WidthscopeError
from widthscope.cli import main
from widthscope.linearization.activations import audit, derivatives

X = torch.linspace(-4, 4, 801, dtype=torch.float64)


def closed_forms():
    t = torch.tanh(X)
    s = torch.sigmoid(X)
    e = 2 / math.sqrt(math.pi) * torch.exp(-X ** 2)
    return {
        "tanh": [t, 1 - t ** 2, -2 * t * (1 - t ** 2), -2 * (1 - t ** 2) * (1 - 3 * t ** 2)],
        "sigmoid": [s, s * (1 - s), s * (1 - s) * (1 - 2 * s), s * (1 - s) * (1 - 6 * s + 6 * s ** 2)],
        # erf^(k) = (2/√π) (−1)^(k−1) H_{k−1}(x) e^{−x²}, H_0 = 1, H_1 = 2x, H_2 = 4x² − 2
        "erf": [torch.erf(X), e, -2 * X * e, (4 * X ** 2 - 2) * e],
    }


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "erf"])
def test_derivatives_match_closed_forms(name):
    fn = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf}[name]
    ders = derivatives(fn, X, 3)
    for k, ref in enumerate(closed_forms()[name]):
        assert torch.allclose(ders[k], ref, atol=1e-12), (name, k)


def test_audit_ratios_equal_closed_form_maxima():
    rows = {r["name"]: r for r in audit(["tanh", "sigmoid", "erf"], K=3, lo=-4, hi=4, grid=801)}
    for name, forms in closed_forms().items():
        for k in (1, 2, 3):
            expected = float(forms[k].abs().max()) / math.factorial(k + 1)
            assert math.isclose(rows[name][f"ratio_{k}"], expected, rel_tol=1e-12), (name, k)
        assert rows[name]["smooth"] and not rows[name]["ratio_grows"]
    # known exact maxima: tanh' = 1 at 0, sigmoid' = 1/4 at 0, erf' = 2/√π at 0
    assert math.isclose(rows["tanh"]["max_1"], 1.0, rel_tol=1e-12)
    assert math.isclose(rows["sigmoid"]["max_1"], 0.25, rel_tol=1e-12)
    assert math.isclose(rows["erf"]["max_1"], 2 / math.sqrt(math.pi), rel_tol=1e-12)


def test_relu_flagged_non_smooth_even_off_grid_kink():
    for lo, hi, grid in [(-5, 5, 2001), (-1.003, 2.0, 300)]:  # 0 on / off the grid
        (row,) = audit(["relu"], K=3, lo=lo, hi=hi, grid=grid)
        assert not row["smooth"] and row["kink_order"] == 1 and abs(row["kink_at"]) < 0.02
        assert "non-smooth" in row["flags"]
    smooth = audit(["gelu", "softplus", "silu"], K=4)
    assert all(r["smooth"] for r in smooth)


def test_user_activation_by_import_path_and_growing_ratio(tmp_path, monkeypatch):
    mod = types.ModuleType("h6_user_acts")
    mod.expsq = lambda x: torch.exp(x ** 2)  # derivatives grow much faster than (k+1)!
    mod.not_callable = 3
    monkeypatch.setitem(sys.modules, "h6_user_acts", mod)
    (row,) = audit(["h6_user_acts:expsq"], K=4, lo=-3, hi=3, grid=601)
    assert row["ratio_grows"] and "ratio grows" in row["flags"]
    with pytest.raises(WidthscopeError, match="no attribute"):
        audit(["h6_user_acts:missing"])
    with pytest.raises(WidthscopeError, match="not callable"):
        audit(["h6_user_acts:not_callable"])
    with pytest.raises(WidthscopeError, match="built-ins"):
        audit(["swishy"])
    with pytest.raises(WidthscopeError, match="cannot import"):
        audit(["no_such_module_h6:f"])


def test_cli_table_and_json(tmp_path, capsys):
    out = tmp_path / "acts.json"
    assert main(["activations", "--names", "relu,tanh", "--K", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ratio_3" in text and "non-smooth" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == ["relu", "tanh"]
    assert main(["activations", "--names", "bogus"]) == 2
    assert "unknown activation" in capsys.readouterr().err


def test_non_tensor_functions_and_non_finite_values_are_reported(capsys):
    # math.sin cannot take a tensor: one error line, exit 2 (was a traceback, exit 1)
    assert main(["activations", "--names", "math:sin", "--K", "2", "--grid", "11"]) == 2
    assert "must be a torch function" in capsys.readouterr().err
    # sqrt is NaN for x < 0: flagged, never reported as "ok"
    (row,) = audit([torch.sqrt], K=2, lo=-1.0, hi=1.0, grid=21)
    assert not row["finite"] and row["nonfinite_order"] == 0 and row["nonfinite_at"] == -1.0
    assert "non-finite" in row["flags"]
    (row,) = audit([torch.sqrt], K=2, lo=1.0, hi=4.0, grid=31)   # inside its domain: fine
    assert row["finite"] and "non-finite" not in row["flags"]
    assert row["ratio_1"] == pytest.approx(0.5 / 2)            # max |(√x)'| = 1/(2√1), / 2!
    with pytest.raises(WidthscopeError, match="finite lo < hi"):
        audit(["tanh"], lo=-5.0, hi=math.inf)
