"""Every option is honoured or refused with one line, before any work, for every model kind; the
output checks mean it (writable, room for the estimated size, no empty folder left behind); each
message names the real problem and the fix."""
from __future__ import annotations

import errno
import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from widthscope.cli import main
from widthscope.validate import APPLIES, KINDS

import hf_tiny
from cli_run import one_line, run_cli

TRAINED = "builtin: MLP width 128"  # what certify prints once the built-in model has trained


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """One tiny model directory per input kind of the option table (``builtin`` needs none)."""
    from widthscope import checkpoint
    from widthscope.models import build

    root = tmp_path_factory.mktemp("kinds")
    torch.manual_seed(0)
    checkpoint.save(build("mlp", 8, in_dim=64, out_dim=10, depth=2), root / "ws-cls", extra={"dataset": "digits"})
    checkpoint.save(build("llama", 16, depth=1, max_seq_len=32), root / "ws-lm", extra={"dataset": "text"})
    hf_tiny.save_model(root / "hf-causal", "gpt2")
    hf_tiny.save_model(root / "hf-masked", "bert")
    hf_tiny.save_model(root / "hf-cls", "bert-cls")
    hf_tiny.save_vit(root / "hf-image")
    (root / "a.txt").write_text("some words of text.\n" * 50)
    (root / "a_file").write_text("not a directory")
    return {"builtin": "builtin", "widthscope-classifier": str(root / "ws-cls"), "widthscope-lm": str(root / "ws-lm"),
            "hf-causal-lm": str(root / "hf-causal"), "hf-masked-lm": str(root / "hf-masked"),
            "hf-sequence-classification": str(root / "hf-cls"), "hf-image-classification": str(root / "hf-image"),
            "root": root}


# A value for each option of the table (argv after the flag; [] for a switch).
VALUES = {"task": ["causal-lm"], "tokenizer": ["bytes"], "data": ["digits"], "train_data": ["{root}/a.txt"],
          "test_data": ["{root}/a.txt"], "train_split": ["train"], "test_split": ["validation"],
          "data_root": ["{root}"], "text_field": ["text"], "label_field": ["label"], "seq_len": ["16"],
          "sequences": ["per-document"], "empty_docs": ["eos"], "max_tokens": ["100"], "train_pool": ["fresh"],
          "test_fraction": ["0.2"],
          "first": [], "train_steps": ["5"]}
Case = namedtuple("Case", "command dest kind")
TABLE = [Case(c, d, k) for c, table in APPLIES.items() for d, fits in table.items() for k in KINDS if k not in fits]


_run, _one_line = run_cli, one_line  # tests/cli_run.py, shared by the bad-input tests


def test_the_table_covers_every_option_value():
    assert set(VALUES) >= {d for table in APPLIES.values() for d in table}
    assert len(TABLE) > 60  # the walk below is not empty


@pytest.mark.parametrize("case", TABLE, ids=[f"{c.command}-{c.dest}-{c.kind}" for c in TABLE])
def test_every_option_that_does_not_fit_the_model_is_refused(case, kinds, capsys, tmp_path):
    value = [v.replace("{root}", str(kinds["root"])) for v in VALUES[case.dest]]
    out = tmp_path / "new" / "r.json"
    argv = [case.command, "--model", kinds[case.kind], "--" + case.dest.replace("_", "-"), *value, "--out", str(out)]
    _one_line(argv, capsys, f"--{case.dest.replace('_', '-')} applies to ")
    assert not (tmp_path / "new").exists()  # nothing left behind, not even the folder


def test_input_kind_reads_only_the_config(kinds):
    from widthscope.validate import input_kind

    for kind in KINDS:
        assert input_kind(kinds[kind]) == kind
    assert input_kind(str(kinds["root"] / "missing")) is None


# ----------------------------------------------------------------------------- one line, before any work
BUILTIN = ["--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10", "--interventions", "none"]
BAD = [  # (argv, what the one line must say); none of them may train the built-in model first
    (["certify", "--project", "100000000000"], "--project 100000000000 is not below any point's dimension"),
    (["certify", "--points", "no.such.point"], "unknown insertion point 'no.such.point'"),
    (["certify", "--seq-len", "16"], "--seq-len applies to text models"),
    (["certify", "--all"], "--all only changes what --list-points prints"),
    (["certify", "--etas", "0.1"], "--etas sets the step sizes of the interventions, but none run"),
    (["certify", "--n-etas", "3"], "--n-etas sets the number of intervention steps, but none run"),
    (["certify", "--n-etas", "3", "--etas", "0.1"], "--n-etas sets the size of the default step grid, --etas"),
    (["certify", "--n-etas", "0"], "--n-etas 0: must be a whole number >= 1 (step sizes)"),
    (["certify", "--max-rel-step", "0.1", "--interventions", "none"],
     "--max-rel-step sets the largest intervention step, but none run"),
    (["certify", "--max-rel-step", "1", "--etas", "0.1"], "--max-rel-step sets the largest step of the default grid"),
    (["certify", "--max-rel-step", "1e-5"], "--max-rel-step 1e-05: must be a finite number above the smallest step"),
    (["certify", "--max-rel-step", "nan"], "--max-rel-step nan: must be a finite number above the smallest step"),
    (["certify", "--project", "4", "--estimator", "plugin"], "--project corrects the unbiased estimators only"),
    (["certify", "--text-field", "text"], "--text-field applies to text models"),
    (["certify", "--data", "digits"], "--data applies to checkpoints"),
    (["grow", "--model", "builtin", "--n-train", "100000"], "--n-train 100000 but the train part of digits gave only"),
    (["grow", "--model", "builtin", "--n-test", "16", "--K", "16"], "K=16 is larger than the held-out ranking pool"),
    (["grow", "--model", "builtin", "--points", "nope"], "unknown insertion point 'nope'"),
    (["grow", "--model", "builtin", "--first"], "--first applies to checkpoints"),
    (["activations", "--K", "100000"], "--K 100000: must be a whole number in 1..10"),
    (["activations", "--json", "{file}/x.json"], "cannot write"),
    (["stats", "{samples}", "--point", "nope"], "--point 'nope'"),
    (["stats", "{root}"], "is a directory"),
    (["report", "{root}/a.txt"], "is a .txt file, not results"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from widthscope.certification.samples import save

    root = tmp_path_factory.mktemp("bad")
    (root / "a_file").write_text("x")
    (root / "a.txt").write_text("text")
    g = torch.Generator().manual_seed(0)
    save(root / "s.safetensors", {"p": torch.randn(16, 4, generator=g, dtype=torch.float64)},
         {"p": torch.randn(16, 4, generator=g, dtype=torch.float64)}, {"settings": {"M": [4]}})
    (root / "results.jsonl").write_text(json.dumps({"kind": "alignment", "family": "f", "width": 8, "seed": 0,
                                                    "point": "p", "M": 4, "K": 4}) + "\n")
    return root


@pytest.mark.parametrize("argv,msg", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_before_any_work(argv, msg, files, capsys, tmp_path):
    argv = [a.replace("{file}", str(files / "a_file")).replace("{samples}", str(files / "s.safetensors"))
            .replace("{root}", str(files)) for a in argv]
    if argv[0] == "certify":
        argv += [*BUILTIN, "--out", str(tmp_path / "new" / "c.json")]
    elif argv[0] == "grow":
        argv += ["--steps", "2", "--out", str(tmp_path / "new" / "g.json")]
    cap = _one_line(argv, capsys, msg)
    assert TRAINED not in cap.out and cap.out.strip() == ""  # refused before training, probing or printing
    assert not (tmp_path / "new").exists()


def test_unpicklable_pt_is_one_line(tmp_path, capsys):
    import pickle

    (tmp_path / "bad.pt").write_bytes(pickle.dumps({"a": torch.nn.Linear(2, 2)}))  # a pickled module
    torch.save({"p": torch.zeros(2, 2)}, tmp_path / "ok.pt")
    cap = _one_line(["stats", "--train", str(tmp_path / "bad.pt"), "--test", str(tmp_path / "ok.pt")], capsys,
                    "holds pickled Python objects")
    assert "Warning" not in cap.err


def test_report_refuses_rows_widthscope_did_not_write(tmp_path, capsys):
    (tmp_path / "other.jsonl").write_text(json.dumps({"loss": 1.0, "epoch": 3}) + "\n")
    _one_line(["report", str(tmp_path / "other.jsonl"), "--out", str(tmp_path / "rep")], capsys,
              "none widthscope wrote")
    assert not (tmp_path / "rep").exists()


def test_stats_point_selects_the_point(files, capsys, tmp_path):
    from widthscope.certification.samples import save

    g = torch.Generator().manual_seed(1)
    a = {n: torch.randn(16, 3, generator=g, dtype=torch.float64) for n in ("p", "q")}
    b = {n: torch.randn(16, 3, generator=g, dtype=torch.float64) for n in ("p", "q")}
    save(tmp_path / "two.safetensors", a, b, {"settings": {"M": [4]}})
    assert main(["stats", str(tmp_path / "two.safetensors"), "--point", "q", "--out", str(tmp_path / "r.json")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert [p["point"] for p in res["points"]] == ["q"] and res["settings"]["points"] == ["q"]


# ----------------------------------------------------------------------------- outputs
@pytest.mark.parametrize("argv", [["certify", *BUILTIN, "--out", "{out}/c.json"],
                                  ["certify", *BUILTIN, "--out", "{big}/c.json", "--save-samples", "{out}/s.st"],
                                  ["grow", "--model", "builtin", "--steps", "2", "--out", "{out}/g.json"],
                                  ["stats", "{samples}", "--out", "{out}/r.json"],
                                  ["report", "{results}", "--out", "{out}/rep"],
                                  ["activations", "--json", "{out}/a.json"]],
                         ids=["certify", "certify-samples", "grow", "stats", "report", "activations"])
def test_a_full_disk_is_refused_before_any_work(argv, files, tmp_path, monkeypatch, capsys):
    """An empty probe file fits on a full disk; the estimate of what will be written does not."""
    real = shutil.disk_usage
    big = tmp_path / "roomy"
    big.mkdir()
    Usage = namedtuple("Usage", "total used free")
    # the samples' disk is full (1 kB free); the JSON's disk (only in the second case) has room
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p) if Path(p) == big else Usage(10 ** 9, 10 ** 9, 1000))
    argv = [a.replace("{out}", str(tmp_path / "new")).replace("{big}", str(big))
            .replace("{samples}", str(files / "s.safetensors")).replace("{results}", str(files / "results.jsonl"))
            for a in argv]
    cap = _one_line(argv, capsys, "only 1.0 KB is free on the disk")
    assert TRAINED not in cap.out and "need about" in cap.err
    assert not (tmp_path / "new").exists() and not list(big.iterdir())


def test_space_estimate_covers_what_certify_writes(tmp_path, monkeypatch, capsys):
    """The estimate is an upper bound: a run with exactly the estimated free space succeeds."""
    import widthscope._io as io

    need = {}
    real = io.check_space

    def record(path, n, what="the results"):
        need[Path(path).name] = n
        return real(path, n, what)

    monkeypatch.setattr(io, "check_space", record)
    out, smp = tmp_path / "c.json", tmp_path / "s.safetensors"
    assert main(["certify", "--train-steps", "2", "--n-train", "16", "--n-test", "16", "--M", "4,8", "--draws", "10",
                 "--out", str(out), "--save-samples", str(smp)]) == 0
    assert out.stat().st_size <= need["c.json"] / 2 <= 3 * out.stat().st_size  # JSON + parts = 2x
    assert smp.stat().st_size <= need["s.safetensors"] <= 3 * smp.stat().st_size


def test_no_empty_folder_left_by_a_refused_report(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, lines, _ = _run(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "a" / "b")], capsys)
    assert rc == 2 and len(lines) == 1
    assert not (tmp_path / "a").exists()


# ----------------------------------------------------------------------------- inputs read the right way
def _args(argv):
    import argparse

    from widthscope.cli.inputs import add_arguments, spec_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    return spec_from_args(p.parse_args(argv), "inputs")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, kinds):
    root = tmp_path_factory.mktemp("corpora")
    docs = hf_tiny.corpus(60, seed=3)
    tr = hf_tiny.write_text_files(root / "train", docs[:40], "train")
    te = hf_tiny.write_text_files(root / "test", docs[40:], "test")
    jdir = root / "jsonl_dir"
    jdir.mkdir()
    for i in range(2):
        (jdir / f"part{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[20 * i:20 * i + 20]))
    return {"train": tr, "test": te, "jsonl_dir": jdir, "root": root}


def test_a_folder_of_jsonl_is_read_record_by_record(corpora, kinds):
    from widthscope.data.inputs import resolve

    argv = ["--model", kinds["hf-causal-lm"], "--seq-len", "16", "--n-train", "8", "--n-test", "8",
            "--test-data", str(corpora["test"]["txt"])]
    inp = resolve(_args([*argv, "--train-data", str(corpora["jsonl_dir"])]), show_progress=False)
    assert "2 .jsonl files" in inp.info["train"]["source"] and "field 'text'" in inp.info["train"]["source"]
    assert inp.info["train"]["documents_read"] <= 40
    # the same records from one file give the same token stream (no braces or keys read as prose)
    one = corpora["root"] / "one.jsonl"
    one.write_text("".join((corpora["jsonl_dir"] / f"part{i}.jsonl").read_text() for i in range(2)))
    ref = resolve(_args([*argv, "--train-data", str(one)]), show_progress=False)
    assert torch.equal(torch.as_tensor(inp.train), torch.as_tensor(ref.train))


@pytest.mark.parametrize("extra,msg", [
    (["--data", "{txt}", "--text-field", "text"], "--text-field 'text' applies to tables"),
    (["--data", "{jsonl}", "--label-field", "label"], "--label-field applies to HF sequence classifiers only"),
    (["--train-data", "{txt}", "--test-data", "{test_txt}", "--test-fraction", "0.1"],
     "--test-fraction does not apply to --train-data/--test-data"),
])
def test_options_equal_to_their_default_are_refused_where_they_mean_nothing(extra, msg, corpora, kinds, capsys,
                                                                          tmp_path):
    extra = [e.replace("{txt}", str(corpora["train"]["txt"])).replace("{jsonl}", str(corpora["train"]["jsonl"]))
             .replace("{test_txt}", str(corpora["test"]["txt"])) for e in extra]
    _one_line(["certify", "--model", kinds["hf-causal-lm"], *extra, "--seq-len", "16", "--n-train", "8",
               "--n-test", "8", "--M", "4", "--out", str(tmp_path / "c.json")], capsys, msg)


def test_too_few_sequences_names_only_fixes_that_help(corpora, kinds):
    from widthscope.data.inputs import resolve
    from widthscope.errors import WidthscopeError

    base = ["--model", kinds["hf-causal-lm"], "--data", str(corpora["train"]["txt"]), "--n-test", "4"]
    with pytest.raises(WidthscopeError) as e:  # the whole file was read: --max-tokens cannot help
        resolve(_args([*base, "--seq-len", "16", "--n-train", "5000"]), show_progress=False)
    assert "--max-tokens" not in str(e.value) and "whole source was read" in str(e.value)
    assert "lower --seq-len" in str(e.value)
    with pytest.raises(WidthscopeError) as e:  # one sequence per document: --seq-len cannot help
        resolve(_args([*base, "--seq-len", "16", "--n-train", "5000", "--sequences", "per-document",
                       "--data", str(corpora["train"]["jsonl"])]), show_progress=False)
    assert "--seq-len" not in str(e.value) and "--max-tokens" not in str(e.value)
    with pytest.raises(WidthscopeError) as e:  # only a window was read: --max-tokens helps
        resolve(_args([*base, "--seq-len", "16", "--n-train", "40", "--max-tokens", "200",
                       "--data", str(corpora["train"]["jsonl"])]), show_progress=False)
    assert "raise --max-tokens (only the first 200 tokens were read)" in str(e.value)


def test_one_sequence_is_singular():
    from widthscope.data.pools import pick_pool
    from widthscope.errors import WidthscopeError

    with pytest.raises(WidthscopeError, match=r"gave only 1 train sequence: lower"):
        pick_pool(1, 4, 0, False, "train sequences", "--n-train", "x.txt")


def test_no_tokenizer_never_suggests_bytes_that_do_not_fit(tmp_path, capsys):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=200, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    tf.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    (tmp_path / "a.txt").write_text("words " * 200)
    cap = _one_line(["certify", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "a.txt"), "--n-train", "8",
                     "--n-test", "8", "--M", "4", "--out", str(tmp_path / "c.json")], capsys, "no tokenizer in")
    assert "--tokenizer bytes" not in cap.err and "do not fit its 200-token vocabulary" in cap.err


def test_grow_help_names_real_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["grow", "--help"])
    assert "(default None)" not in capsys.readouterr().out


def test_grow_builtin_honours_the_pool_sizes(tmp_path):
    assert main(["grow", "--model", "builtin", "--n-train", "64", "--n-test", "32", "--M", "8", "--K", "8",
                 "--steps", "2", "--out", str(tmp_path / "g.json")]) == 0
    s = json.loads((tmp_path / "g.json").read_text())["settings"]
    assert (s["n_train"], s["n_rank"], s["n_eval"]) == (64, 16, 16)


def test_resume_with_other_settings_is_refused(tmp_path, stop_second_intervention, capsys):
    stop_second_intervention.on()
    argv = ["certify", "--train-steps", "3", "--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10",
            "--out", str(tmp_path / "c.json")]
    assert main(argv) == 130
    stop_second_intervention.off()
    capsys.readouterr()
    cap = _one_line([*argv, "--seed", "1", "--resume"], capsys, "--seed 0 (now 1)")
    assert "drop --resume to start over" in cap.err and TRAINED not in cap.out
    assert len(list((tmp_path / "c.json.parts").glob("*.json"))) == 1  # the finished point is kept
    assert main([*argv, "--resume"]) == 0  # the same settings continue


def test_a_failing_json_write_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    """A write that fails anyway (the estimate fitted) is still one line, with no partial file."""
    import os

    import widthscope._io as io

    real = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io.os, "replace", full)
    rc, lines, _ = _run(["activations", "--names", "tanh", "--K", "2", "--grid", "11",
                         "--json", str(tmp_path / "a.json")], capsys)
    monkeypatch.setattr(io.os, "replace", real)
    assert rc == 2 and len(lines) == 1 and "No space left on device" in lines[0]
    assert not list(tmp_path.iterdir())


def test_a_protocol_preset_is_not_an_option_the_user_gave(tmp_path, capsys):
    """--protocol published sets text settings (concatenated chunks); on the built-in model they do not
    apply, and since the user did not give them the run goes ahead (it was refused after training)."""
    rc, lines, cap = _run(["certify", "--protocol", "published", "--train-steps", "2", "--n-train", "16",
                           "--n-test", "16", "--M", "4", "--draws", "10", "--out", str(tmp_path / "c.json")], capsys)
    assert rc == 0, cap.err
    assert json.loads((tmp_path / "c.json").read_text())["settings"]["estimator"] == "plugin"


@pytest.mark.parametrize("extra,msg", [
    (["--data", "{root}/a.txt", "--data-root", "{root}"], "--data-root does not apply to data files"),
    (["--data", "{root}/a.txt", "--train-pool", "fresh"], "--train-pool does not apply to data files"),
    (["--data", "text", "--sequences", "per-document"], "--sequences does not apply to the named dataset 'text'"),
    (["--data", "text", "--max-tokens", "1000"], "--max-tokens does not apply to the named dataset 'text'"),
])
def test_data_options_the_source_does_not_use_are_refused(extra, msg, kinds, capsys, tmp_path):
    extra = [e.replace("{root}", str(kinds["root"])) for e in extra]
    _one_line(["certify", "--model", kinds["widthscope-lm"], *extra, "--seq-len", "16", "--n-train", "8",
               "--n-test", "8", "--M", "4", "--out", str(tmp_path / "c.json")], capsys, msg)
