"""Probe conditions in sweeps: a probe set from another distribution and probe lengths other than
the training length change the probe pools only, never the training; cell ids follow the config."""
from __future__ import annotations

import json

import pytest
import torch

from widthscope import data
from widthscope.sweeps.alignment import load_config, plan_cells, run_sweep
from widthscope.sweeps.pools import apply_shift

BASE = """
[sweep]
name = "probes"
seeds = [0]
M = [8]
draws = 50
interventions = "none"

[[family]]
name = "llama"
widths = [16, 32]
dataset = "text"
data_options = { seq_len = 32, max_bytes = 60000 }
n_train = 256
n_test = 64
model_options = { depth = 2, max_seq_len = 128 }
train = { steps = 8, lr = 3e-3, batch_size = 16 }
certify = { n_probe_train = 16, n_probe_test = 16, batch_size = 16 }
"""
PROBES = BASE + """probes = [{ name = "in-domain" }, { name = "shifted", data = "prose", seq_len = [32, 64] }]
probe_seq_len = [16, 32]
"""


def _load(tmp_path, text, name):
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return load_config(p, out_dir=tmp_path / name)


def test_conditions_and_lengths_change_probes_not_training(tmp_path):
    plain, probed = _load(tmp_path, BASE, "plain"), _load(tmp_path, PROBES, "probed")
    assert {c["config"] for c in plan_cells(plain)}.isdisjoint({c["config"] for c in plan_cells(probed)})
    a = [r for r in run_sweep(plain, show_progress=False).rows if r["kind"] == "alignment"]
    b = [r for r in run_sweep(probed, show_progress=False).rows if r["kind"] == "alignment"]
    key = lambda r: (r["width"], r["point"])  # noqa: E731
    train_a = {key(r): (r["train_loss"], r["test_loss"]) for r in a}
    for r in b:  # the same training, whatever the probe
        assert (r["train_loss"], r["test_loss"]) == train_a[key(r)]
    assert {(r["probe_set"], r["probe_seq_len"]) for r in b} == {("in-domain", 16), ("in-domain", 32), ("shifted", 32),
                                                              ("shifted", 64)}
    # in-domain at the training length is exactly the plain sweep's probe
    same = {key(r): r["two_d_align"] for r in b if r["probe_set"] == "in-domain" and r["probe_seq_len"] == 32}
    assert same == {key(r): r["two_d_align"] for r in a}
    shifted = [r for r in b if r["probe_set"] == "shifted"]
    assert all("prose" in r["probe_data"] for r in shifted)
    assert all(r["two_limit"] in ("d_par", "d_2", None) for r in b)


def test_in_domain_longer_probe_keeps_held_out_text_held_out(tmp_path):
    cfg = _load(tmp_path, PROBES.replace("widths = [16, 32]", "widths = [16]"), "one")
    from widthscope.sweeps.pools import load_split, probe_pools

    fam = cfg.families[0]
    split = load_split(fam, fam.n_train, cfg)
    rec = data.record(split)
    pa, pb, desc, offsets = probe_pools(fam, fam.probes[0], 16, split, cfg)
    buf = b"".join(open(f, "rb").read() for f in split.meta["files"])[: split.meta["bytes"]]
    for row, start in zip(pb[0], offsets["test"].tolist()):
        assert bytes(row.tolist()) == buf[start:start + 16]
        # no held-out probe byte lies in a fitted (trained-on) span
        assert all(start + 16 <= s or e <= start for s, e in rec["fitted"])
        assert any(s <= start and start + 16 <= e for s, e in rec["heldout"])
    for start in offsets["train"].tolist():
        assert any(s <= start and start + 16 <= e for s, e in rec["fitted"])
    assert "re-cut at 16" in desc
    with pytest.raises(Exception, match="lie wholly inside the fitted text"):  # a longer probe than trained:
        probe_pools(fam, fam.probes[0], 128, split, cfg)                     # refused, never a leak


def test_image_shifts_are_fixed_corruptions():
    X = torch.randn(20, 1, 8, 8)
    y = torch.arange(20) % 4
    noisy, _ = apply_shift((X, y), "noise:0.5", (1, 8, 8), 0)
    again, _ = apply_shift((X, y), "noise:0.5", (1, 8, 8), 0)
    assert torch.equal(noisy, again) and (noisy - X).std() == pytest.approx(0.5, rel=0.2)
    flat, _ = apply_shift((X.flatten(1), y), "blur", (64,), 0)
    blurred, _ = apply_shift((X, y), "blur", (1, 8, 8), 0)
    assert torch.allclose(flat, blurred.flatten(1)) and blurred.std() < X.std()
    low, _ = apply_shift((X, y), "contrast:0.5", (1, 8, 8), 0)
    assert torch.allclose(low - low.mean((1, 2, 3), keepdim=True), 0.5 * (X - X.mean((1, 2, 3), keepdim=True)),
                          atol=1e-6)
    Xs, ys = apply_shift((X, y), "classes:1,3", (1, 8, 8), 0)
    assert set(ys.tolist()) == {1, 3} and len(ys) == 10


def test_bad_probe_configs_name_the_key(tmp_path):
    from widthscope.errors import WidthscopeError

    for bad, msg in (('probes = [{ name = "x", data = "nope" }]', "must be a dataset name"),
                     ('probes = [{ name = "x" }, { name = "x" }]', "unique name"),
                     ('probes = [{ name = "x", shift = "wobble" }]', "unknown shift"),
                     ('probe_seq_len = [1]', "probe_seq_len must be")):
        with pytest.raises(WidthscopeError, match=msg):
            _load(tmp_path, BASE + bad + "\n", "bad")


def test_probe_data_keys_make_one_probe_condition(tmp_path):
    cfg = _load(tmp_path, BASE + 'probe_data = "prose"\nprobe_data_options = { max_bytes = 50000 }\n', "single")
    assert cfg.families[0].probes == [{"name": "probe", "data": "prose", "test_data": None,
                                       "data_options": {"max_bytes": 50000}, "shift": None, "seq_len": None}]
    from widthscope.errors import WidthscopeError

    with pytest.raises(WidthscopeError, match="not both"):
        _load(tmp_path, PROBES + 'probe_data = "prose"\n', "both")


def test_training_data_is_always_read_in_domain_and_shifts_need_images(tmp_path):
    from widthscope.errors import WidthscopeError

    with pytest.raises(WidthscopeError, match="takes no data_options"):
        _load(tmp_path, BASE + 'probes = [{ name = "x", data_options = { max_bytes = 1000 } }]\n', "opts")
    # prose train pool, in-domain held-out pool: the held-out side is still the recorded held-out text
    cfg = _load(tmp_path, BASE.replace("widths = [16, 32]", "widths = [16]")
                + 'probes = [{ name = "mixed", data = "prose", test_data = "text", seq_len = [16] }]\n', "mixed")
    from widthscope.sweeps.pools import load_split, probe_pools

    fam = cfg.families[0]
    split = load_split(fam, fam.n_train, cfg)
    rec = data.record(split)
    pa, pb, desc, offsets = probe_pools(fam, fam.probes[0], 16, split, cfg)
    assert desc == "prose train part / held-out part" and set(offsets) == {"test"}
    for start in offsets["test"].tolist():
        assert any(s <= start and start + 16 <= e for s, e in rec["heldout"])
    with pytest.raises(WidthscopeError, match="not to token ids"):
        apply_shift((pa[0], pa[0]), "classes:1,2", (16,), 0)
