"""Held-out integrity by construction: a model trained at one sequence length and probed at
another draws its held-out pool only from held-out text and its train pool only from the text it
was fitted on; classifiers' train pools are their fitted examples."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

import hf_tiny
from widthscope import checkpoint, data
from widthscope.cli import main
from widthscope.cli.inputs import add_arguments, spec_from_args
from widthscope.data.inputs import resolve
from widthscope.models import build
from widthscope.train import train


def _args(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    return spec_from_args(p.parse_args(argv), "inputs")


def _intervals(starts, length):
    return [(int(s), int(s) + length) for s in starts]


def _overlap(a, b):
    """Total bytes shared by two lists of [start, end) intervals."""
    total = 0
    for i, (s1, e1) in enumerate(sorted(a)):
        for s2, e2 in b:
            total += max(0, min(e1, e2) - max(s1, s2))
    return total


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(hf_tiny.corpus(150, seed=7)):
        (corpus / f"d{i:03d}.txt").write_text(doc + "\n")
    opts = {"root": str(corpus), "seq_len": 64, "max_bytes": 200_000}
    split = data.load("text", n_train=120, n_test=40, seed=3, **opts)
    torch.manual_seed(0)
    model = build("llama", 32, depth=2, max_seq_len=128)
    train(model, split, steps=3, lr=1e-3, batch_size=16, seed=0, progress=False)
    checkpoint.save(model, root / "ck", extra={"dataset": "text", "data_options": opts, "data_seed": 3,
                                               "data_record": data.record(split)})
    fitted = _intervals([i * 64 for i in split.meta["train_indices"]], 64)
    return root / "ck", fitted, split, opts


@pytest.mark.parametrize("L", [16, 32, 48])
def test_probe_at_another_length_never_holds_out_training_text(trained_lm, L):
    ck, fitted, split, opts = trained_lm
    inp = resolve(_args(["--model", str(ck), "--seq-len", str(L), "--n-train", "24", "--n-test", "16"]),
                  show_progress=False)
    assert inp.info["heldout_integrity"].startswith("verified")
    test_iv = _intervals(inp.offsets["test"].tolist(), L)
    train_iv = _intervals(inp.offsets["train"].tolist(), L)
    assert _overlap(test_iv, fitted) == 0  # no held-out probe byte was trained on
    assert all(_overlap([iv], fitted) == L for iv in train_iv)  # every train-pool byte was fitted
    corpus = b"".join(open(f, "rb").read() for f in split.meta["files"])[: split.meta["bytes"]]
    for row, start in zip(inp.test, inp.offsets["test"].tolist()):
        assert bytes(row.tolist()) == corpus[start:start + L]


def test_without_a_record_the_recut_split_leaks_and_certify_says_so(trained_lm, tmp_path, capsys):
    ck, fitted, split, opts = trained_lm
    # The control: re-cutting the corpus at another length and re-splitting it (what certify did
    # before the record) holds out text the model trained on — the test above can fail.
    recut = data.load("text", seed=3, **{**opts, "seq_len": 16})
    leaked = _overlap(_intervals([i * 16 for i in recut.meta["test_indices"]], 16), fitted)
    assert leaked > 0
    cfg = json.loads((ck / "config.json").read_text())
    del cfg["extra"]["data_record"]
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(cfg))
    (old / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes())
    rc = main(["certify", "--model", str(old), "--seq-len", "16", "--n-train", "16", "--n-test", "16", "--M", "4",
               "--draws", "20", "--interventions", "none", "--out", str(tmp_path / "c.json")])
    assert rc == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "c.json").read_text())
    assert res["settings"]["inputs"]["heldout_integrity"].startswith("unverified")
    assert sum("held-out integrity unverified" in ln for ln in out.splitlines()) == 1
    # A changed corpus is caught by its hash.
    f = split.meta["files"][0]
    with open(f, "a") as fh:
        fh.write("changed\n")
    try:
        inp = resolve(_args(["--model", str(ck), "--seq-len", "16", "--n-train", "8", "--n-test", "8"]),
                      show_progress=False)
        assert inp.info["heldout_integrity"].startswith("unverified") and "SHA-256" in inp.info["heldout_integrity"]
    finally:
        text = open(f).read()
        open(f, "w").write(text[: -len("changed\n")])


def test_fresh_train_pool_option_samples_the_whole_train_part(trained_lm):
    ck, fitted, split, opts = trained_lm
    inp = resolve(_args(["--model", str(ck), "--seq-len", "32", "--train-pool", "fresh", "--n-train", "200",
                         "--n-test", "8"]), show_progress=False)
    iv = _intervals(inp.offsets["train"].tolist(), 32)
    inside = sum(_overlap([v], fitted) == 32 for v in iv)
    assert 0 < inside < len(iv)  # some fitted, some never-fitted train text
    assert _overlap(_intervals(inp.offsets["test"].tolist(), 32), fitted) == 0


def test_classifier_train_pool_is_its_fitted_examples(tmp_path):
    split = data.load("digits", n_train=150, seed=2)
    torch.manual_seed(0)
    model = build("mlp", 16, in_dim=64, out_dim=10, depth=2)
    checkpoint.save(model, tmp_path / "ck", extra={"dataset": "digits", "data_options": {}, "data_seed": 2,
                                                   "data_record": data.record(split)})
    fitted = {tuple(r.tolist()) for r in split.train[0]}
    inp = resolve(_args(["--model", str(tmp_path / "ck"), "--n-train", "64", "--n-test", "32"]), show_progress=False)
    assert all(tuple(r.tolist()) in fitted for r in inp.train[0])
    assert "fitted on" in inp.info["train_pool"]
    fresh = resolve(_args(["--model", str(tmp_path / "ck"), "--n-train", "400", "--n-test", "32",
                           "--train-pool", "fresh"]), show_progress=False)
    assert not all(tuple(r.tolist()) in fitted for r in fresh.train[0])
    with pytest.raises(Exception, match="--n-train 400"):
        resolve(_args(["--model", str(tmp_path / "ck"), "--n-train", "400", "--n-test", "32"]), show_progress=False)


def test_longer_probe_than_training_takes_only_whole_held_out_runs(trained_lm):
    """At twice the trained length a held-out chunk needs two adjacent held-out training chunks;
    when there are too few the error says where the pool came from, never a silent leak."""
    ck, fitted, split, opts = trained_lm
    try:
        inp = resolve(_args(["--model", str(ck), "--seq-len", "128", "--n-train", "4", "--n-test", "4"]),
                      show_progress=False)
    except Exception as exc:
        assert "recorded" in str(exc) and "ranges at --seq-len 128" in str(exc)
    else:
        assert _overlap(_intervals(inp.offsets["test"].tolist(), 128), fitted) == 0
