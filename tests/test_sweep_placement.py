"""Big-model placement in sweeps (issue 32): ``device_map`` / ``max_memory`` / ``offload_folder`` in
``[sweep]``, ``[[family]]`` and ``[suite]``; checked at load, recorded per cell, not in the
fingerprint, and the rows of an offloaded run equal the plain run's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import hf_tiny
from cli_run import one_line, run_cli
from widthscope.sweeps.alignment import load_config, plan_cells, run_sweep
from widthscope.sweeps.config import TIMING_COLUMNS
from widthscope.sweeps.grid import load_rows
from widthscope.sweeps.placement import cell_folder, check_placement
from widthscope.sweeps.results import read_record

pytest.importorskip("accelerate")

# four hidden layers of 32 units: a budget of a third of the weights sends most blocks to disk
TINY = """
[sweep]
name = "placed"
seeds = [0]
M = [8, 16]
draws = 200
{sweep_extra}

[[family]]
name = "mlp"
widths = [16, 32]
dataset = "digits"
n_train = 128
n_test = 48
model_options = {{ depth = 4 }}
train = {{ steps = 30, lr = 0.01, batch_size = 32 }}
certify = {{ n_probe_train = 32, n_probe_test = 32, batch_size = 16 }}
{family_extra}
"""
# width 32: 22.3 KB of weights; 18 KB keeps two blocks on the CPU (accelerate keeps room there for the
# largest offloaded block) and sends three modules to disk; width 16 (8.1 KB) fits whole
BUDGET = 'device_map = "auto"\nmax_memory = "cpu=18KB,disk"'


def _cfg(tmp: Path, sweep_extra: str = "", family_extra: str = "", name: str = "cfg.toml") -> Path:
    p = tmp / name
    p.write_text(TINY.format(sweep_extra=sweep_extra, family_extra=family_extra))
    return p


def _numbers_equal(a: list[dict], b: list[dict]) -> None:
    """Rows equal but for timing and the placement column; floats within float32 rounding of the
    probe (the dispatched model runs the same operations, but accelerate's hooks may copy tensors)."""
    assert len(a) == len(b) > 0
    skip = set(TIMING_COLUMNS) | {"placement"}
    for ra, rb in zip(a, b):
        assert {k for k in ra if k not in skip} == {k for k in rb if k not in skip}
        for k in ra:
            if k in skip:
                continue
            if isinstance(ra[k], float) and isinstance(rb[k], float) and not (math.isnan(ra[k]) and math.isnan(rb[k])):
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-9), k
            elif not (isinstance(ra[k], float) and math.isnan(ra[k])):
                assert ra[k] == rb[k], k


def test_disk_offload_gives_the_plain_rows_and_records_the_placement(tmp_path):
    plain_cfg = load_config(_cfg(tmp_path))
    placed_cfg = load_config(
        _cfg(tmp_path, sweep_extra=BUDGET + f'\noffload_folder = "{tmp_path / "off"}"', name="placed.toml")
    )
    assert placed_cfg.fingerprint() == plain_cfg.fingerprint()  # placement changes no number
    plain = run_sweep(plain_cfg, tmp_path / "plain", show_progress=False)
    placed = run_sweep(placed_cfg, tmp_path / "placed", show_progress=False)
    _numbers_equal(plain.rows, placed.rows)
    offloaded = {r["width"]: r["placement"] for r in placed.rows}
    assert offloaded == {
        16: "device_map=auto max_memory=cpu=18KB,disk offloaded=0",
        32: "device_map=auto max_memory=cpu=18KB,disk offloaded=3",
    }
    assert "placement" not in plain.rows[0]
    cells = sorted((tmp_path / "placed" / "cells").glob("*.json"))
    assert len(cells) == 2
    rec = json.loads(cells[0].read_text())
    assert rec["placement"]["max_memory"] == "cpu=18KB,disk"
    # each cell's own offload folder, removed after the cell (its weights are in the checkpoint)
    assert (tmp_path / "off").exists() and not any((tmp_path / "off").iterdir())
    assert json.loads((tmp_path / "placed" / "sweep.json").read_text())["config"]["placement"]["device_map"] == "auto"
    # the record repeats the run with its placement (widthscope sweep --config)
    raw, fingerprint, _ = read_record(tmp_path / "placed")
    again = load_config(raw)
    assert again.fingerprint() == fingerprint and again.families[0].placement == placed_cfg.families[0].placement


def test_resume_with_another_budget_reuses_every_cell(tmp_path):
    first = _cfg(tmp_path, family_extra=BUDGET.replace("18KB", "20KB"), name="a.toml")
    out = tmp_path / "o"
    run_sweep(load_config(first), out, show_progress=False)
    again = run_sweep(load_config(_cfg(tmp_path, family_extra=BUDGET, name="b.toml")), out, show_progress=False)
    assert again.done == [] and len(again.skipped) == 2


def test_family_keys_override_the_sweep_keys():
    cfg = load_config(
        {
            "sweep": {"device_map": "auto", "max_memory": "cpu=1GB", "M": [8]},
            "family": [
                {"name": "a", "model": "mlp", "widths": [8], "dataset": "digits", "n_train": 64,
                 "train": {"steps": 1, "lr": 0.1}, "certify": {"n_probe_train": 8, "n_probe_test": 8}},
                {"name": "b", "model": "mlp", "widths": [8], "dataset": "digits", "n_train": 64,
                 "max_memory": "cpu=2MB,disk", "train": {"steps": 1, "lr": 0.1},
                 "certify": {"n_probe_train": 8, "n_probe_test": 8}},
            ],
        }
    )  # fmt: skip
    assert cfg.families[0].placement == {"device_map": "auto", "max_memory": "cpu=1GB"}
    assert cfg.families[1].placement == {"device_map": "auto", "max_memory": "cpu=2MB,disk"}
    assert len({c["config"] for c in plan_cells(cfg)}) == 1


def test_cell_folders_differ_per_cell():
    p = {"device_map": "auto", "offload_folder": "/x"}
    assert cell_folder(p, "aaa") != cell_folder(p, "bbb")
    assert cell_folder({"device_map": "auto"}, "aaa") is None


BAD = [
    ('device_map = "everywhere"', "", "[sweep] device_map"),
    ('max_memory = "cpu=2GB"', "", "[sweep] max_memory needs device_map"),
    ('device_map = "auto"\nmax_memory = "cpu=2 parsecs"', "", "is not a size"),
    ('device_map = "auto"\nmax_memory = "gpu7=2GB"', "", "unknown device 'gpu7'"),
    ("", 'offload_folder = "/tmp/x"', "family 'mlp' offload_folder needs device_map"),
    ("", 'device_mapp = "auto"', "'device_mapp' (did you mean 'device_map'?)"),
    ('device_map = "auto"\noffload_folder = 3', "", "offload_folder must be a folder path"),
]


@pytest.mark.parametrize("sweep_extra, family_extra, msg", BAD)
def test_bad_placement_is_one_line_exit_2_before_any_work(sweep_extra, family_extra, msg, tmp_path, capsys):
    cfg = _cfg(tmp_path, sweep_extra, family_extra)
    one_line(["sweep", str(cfg), "--out", str(tmp_path / "o")], capsys, msg)
    assert not (tmp_path / "o").exists()


def test_check_placement_keeps_only_the_set_keys():
    assert check_placement({}, "w") == {}
    assert check_placement({"offload_folder": "f"}, "w", base={"device_map": "auto"}) == {
        "device_map": "auto",
        "offload_folder": "f",
    }


def test_dry_run_shows_the_placement(tmp_path, capsys):
    cfg = _cfg(tmp_path, sweep_extra=BUDGET)
    rc, _, cap = run_cli(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--dry-run"], capsys)
    assert rc == 0, cap.err
    assert "device_map=auto max_memory=cpu=18KB,disk" in cap.out


# ----------------------------------------------------------------------------- a suite
def _neox(directory: Path, width: int, layers: int = 6) -> int:
    """A tiny GPT-NeoX checkpoint; returns its weight bytes."""
    import torch
    import transformers as tf

    tok = hf_tiny.save_tokenizer(directory)
    cfg = tf.GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * width,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(width)
    model = tf.GPTNeoXForCausalLM(cfg)
    model.save_pretrained(directory)
    return sum(p.numel() * p.element_size() for p in model.parameters())


SUITE = """
[suite]
name = "placed-suite"
models = ["org/neox"]
revisions = ["step1"]
data = "{text}"
seq_len = 8
n_train = 12
n_test = 12
batch_size = 6
threads = 1
{extra}
[suite.certify]
M = [4, 8]
draws = 50
n_etas = 2
"""


@pytest.fixture
def neox_hub(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    weights = _neox(tmp_path / "src", 32)
    hf_tiny.hub_put(cache, "org/neox", tmp_path / "src", "a" * 40, ("step1", "main"))
    text = tmp_path / "train.txt"
    text.write_text("\n\n".join(hf_tiny.corpus(60, seed=0)) + "\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return {"text": text, "weights": weights, "tmp": tmp_path}


def _suite(hub: dict, extra: str = "", name: str = "suite.toml") -> Path:
    p = hub["tmp"] / name
    p.write_text(SUITE.format(text=hub["text"], extra=extra))
    return p


def test_suite_with_disk_offload_gives_the_plain_rows(neox_hub, capsys):
    budget = neox_hub["weights"] // 2  # half the weights: the embedding and one block stay, five blocks go to disk
    folder = neox_hub["tmp"] / "off"
    extra = f'device_map = "auto"\nmax_memory = "cpu={budget}B,disk"\noffload_folder = "{folder}"'
    plain, placed = neox_hub["tmp"] / "plain", neox_hub["tmp"] / "placed"
    for cfg, out in ((_suite(neox_hub), plain), (_suite(neox_hub, extra, "placed.toml"), placed)):
        rc, _, cap = run_cli(["sweep", str(cfg), "--out", str(out), "--no-progress"], capsys)
        assert rc == 0, cap.err
    a, b = load_rows(plain), load_rows(placed)
    skip = {"certify_json"}  # the cell file's path differs with the folder
    _numbers_equal(
        [{k: v for k, v in r.items() if k not in skip} for r in a],
        [{k: v for k, v in r.items() if k not in skip} for r in b],
    )
    res = json.loads(next((placed / "cells").glob("*.json")).read_text())
    offloaded = res["settings"]["placement"]["offloaded"]
    assert "gpt_neox.layers.5" in offloaded and "gpt_neox.embed_in" not in offloaded
    assert {r["placement"] for r in b} == {f"device_map=auto max_memory=cpu={budget}B,disk offloaded={len(offloaded)}"}
    assert (
        json.loads((plain / "sweep.json").read_text())["fingerprint"]
        == json.loads((placed / "sweep.json").read_text())["fingerprint"]
    )
    assert not folder.exists() or not any(folder.iterdir())  # the cell's own folder is removed


def test_suite_bad_placement_is_one_line(neox_hub, capsys):
    cfg = _suite(neox_hub, 'max_memory = "cpu=2GB"')
    one_line(["sweep", str(cfg), "--out", str(neox_hub["tmp"] / "o")], capsys, "needs device_map")
    assert not (neox_hub["tmp"] / "o").exists()


def test_offload_folder_is_refused_where_it_would_write_into_an_input_or_the_results(tmp_path):
    """The offload folder is an output: the results folder itself, or a folder inside a local model
    the suite reads, is one error line before any cell runs."""
    from types import SimpleNamespace

    from widthscope.errors import WidthscopeError
    from widthscope.sweeps.run import _check_offload_folders
    from widthscope.sweeps.suite import SuiteConfig

    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "res"
    out.mkdir()
    suite = SuiteConfig(name="s", out_dir=str(out), models=[str(model)], revisions=[None])
    for folder, words in ((model / "off", r"inside the input \[suite\] model"), (out, "same file")):
        suite.inputs = {"device_map": "auto", "offload_folder": str(folder)}
        with pytest.raises(WidthscopeError, match=words):
            _check_offload_folders(suite, out)
    suite.inputs = {"device_map": "auto", "offload_folder": str(tmp_path / "elsewhere")}
    _check_offload_folders(suite, out)  # a folder of its own is fine
    sweep = SimpleNamespace(placement={"offload_folder": str(out)}, families=[])
    with pytest.raises(WidthscopeError, match="same file"):
        _check_offload_folders(sweep, out)
