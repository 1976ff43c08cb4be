"""Nothing lost, nothing silent: a table of bad command lines (colliding outputs, outputs inside
inputs, paths the OS refuses, numbers past their range, text in another encoding), each refused
with one line and exit status 2 before any work, leaving no file or folder behind.

Add a row for every defect found: (id, argv, the first line must contain)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from widthscope.cli import main

from cli_run import one_line

TRAINED = "builtin: MLP width 128"  # what certify prints once the built-in model has trained
LONG = "x" * 300  # one path component over NAME_MAX (255 bytes)
DEEP = "/".join(["d"] * 2100)  # every part short, the whole path over PATH_MAX (4096 bytes)
FAST = ["--train-steps", "2", "--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Inputs of every kind the table names: a widthscope LM checkpoint, a results folder, samples,
    text in UTF-8/16/32, configs."""
    from widthscope import checkpoint
    from widthscope.certification.samples import save
    from widthscope.models import build

    r = tmp_path_factory.mktemp("table")
    torch.manual_seed(0)
    checkpoint.save(build("llama", 16, depth=1, max_seq_len=32), r / "lm", extra={"dataset": "text"})
    (r / "a.txt").write_text("some words of text.\n" * 80, encoding="utf-8")
    (r / "b.txt").write_text("other words of text.\n" * 80, encoding="utf-8")
    for enc in ("utf-16", "utf-16-be", "utf-32"):
        text = "some words of text.\n" * 80
        data = text.encode(enc)
        if enc == "utf-16-be":
            data = b"\xfe\xff" + data  # Python writes no mark for an explicit byte order
        (r / f"{enc}.txt").write_bytes(data)
    (r / "cfg-utf16.toml").write_bytes('name = "x"\nwidths = [8]\n'.encode("utf-16"))
    g = torch.Generator().manual_seed(0)
    save(r / "s.safetensors", {"p": torch.randn(16, 4, generator=g, dtype=torch.float64)},
         {"p": torch.randn(16, 4, generator=g, dtype=torch.float64)}, {"settings": {"M": [4]}})
    torch.save({"p": torch.randn(16, 4, generator=g)}, r / "a.pt")
    torch.save({"p": torch.randn(16, 4, generator=g)}, r / "b.pt")
    res = r / "results"
    res.mkdir()
    (res / "results.jsonl").write_text('{"kind": "alignment", "family": "f", "width": 8, "seed": 0, "point": "p", '
                                       '"M": 4, "K": 4}\n')
    (r / "sweep.toml").write_text('name = "x"\nwidths = [8]\n')
    (r / "target.json").write_text("{}")
    for name, block in (("list", "[1, 2]"), ("abc", '{"M": "abc"}'), ("huge", '{"draws": 1e400}')):
        (r / f"cfg-{name}.json").write_text(f'{{"options": {{"certify": {block}}}}}')
    (r / "cfg-run-list.json").write_text('{"options": {"certify": {}, "run": [1]}}')
    os.symlink(r / "target.json", r / "link.json")
    os.symlink(res, r / "results-link")
    return r


LM = ["--model", "{root}/lm", "--seq-len", "16", "--n-train", "8", "--n-test", "8", "--M", "4", "--draws", "10"]

TABLE = [
    # --------------------------------------------------------------- outputs that collide
    ("same-file", ["certify", *FAST, "--out", "{tmp}/o.json", "--save-samples", "{tmp}/o.json"],
     "are the same file"),
    ("same-file-dot", ["certify", *FAST, "--out", "{tmp}/o.json", "--save-samples", "{tmp}/./o.json"],
     "are the same file"),
    ("same-file-dotdot", ["certify", *FAST, "--out", "{tmp}/o.json", "--save-samples", "{tmp}/new/../o.json"],
     "are the same file"),
    ("same-file-symlink", ["certify", *FAST, "--out", "{root}/link.json", "--save-samples", "{root}/target.json"],
     "are the same file"),
    ("samples-into-parts", ["certify", *FAST, "--out", "{tmp}/o.json", "--save-samples", "{tmp}/o.json.parts"],
     "give --save-samples another path"),
    # --------------------------------------------------------------- outputs that are (inside) inputs
    ("out-in-model-dir", ["certify", *LM, "--data", "{root}/a.txt", "--out", "{root}/lm/c.json"],
     "lies inside the input --model"),
    ("out-is-weights", ["certify", *LM[2:], "--model", "{root}/lm/model.safetensors", "--data", "{root}/a.txt",
                        "--out", "{root}/lm/model.safetensors"], "is the input --model"),
    ("out-replaces-weights", ["certify", *LM, "--data", "{root}/a.txt", "--out", "{root}/lm/model.safetensors"],
     "lies inside the input --model"),
    ("out-is-data", ["certify", *LM, "--data", "{root}/a.txt", "--out", "{root}/a.txt"], "is the input --data"),
    ("samples-is-train-data", ["certify", *LM, "--train-data", "{root}/a.txt", "--test-data", "{root}/b.txt",
                               "--save-samples", "{root}/a.txt", "--out", "{tmp}/c.json"],
     "is the input --train-data"),
    ("stats-out-is-samples", ["stats", "{root}/s.safetensors", "--out", "{root}/s.safetensors"],
     "is the input samples"),
    ("stats-out-is-train", ["stats", "--train", "{root}/a.pt", "--test", "{root}/b.pt", "--out", "{root}/a.pt"],
     "is the input --train"),
    ("stats-out-is-test", ["stats", "--train", "{root}/a.pt", "--test", "{root}/b.pt", "--out", "{root}/b.pt"],
     "is the input --test"),
    ("report-out-is-results", ["report", "{root}/results", "--out", "{root}/results"], "is the input results"),
    ("report-out-is-jsonl", ["report", "{root}/results/results.jsonl", "--out", "{root}/results/results.jsonl"],
     "it is a file, not a directory"),
    ("report-out-inside-results", ["report", "{root}/results", "--out", "{root}/results/cells"],
     "lies inside the input results"),
    ("sweep-out-is-config", ["sweep", "{root}/sweep.toml", "--out", "{root}/sweep.toml"], "it is a file, not a"),
    ("linearize-out-is-config", ["linearize", "{root}/sweep.toml", "--out", "{root}/sweep.toml"],
     "it is a file, not a directory"),
    ("report-out-dotdot-is-results", ["report", "{root}/results", "--out", "{root}/lm/../results"],
     "is the input results"),
    ("report-out-is-results-link", ["report", "{root}/results", "--out", "{root}/results-link"],
     "is the input results"),
    ("grow-out-in-model-dir", ["grow", "--model", "{root}/lm", "--data", "{root}/a.txt", "--out", "{root}/lm/g.json"],
     "lies inside the input --model"),
    # --------------------------------------------------------------- paths the OS refuses
    ("long-out", ["certify", *FAST, "--out", "{tmp}/" + LONG], "is too long"),
    ("deep-out", ["certify", *FAST, "--out", "{tmp}/" + DEEP], "is too long"),
    ("long-samples", ["certify", *FAST, "--out", "{tmp}/c.json", "--save-samples", "{tmp}/" + LONG], "is too long"),
    ("long-model", ["certify", "--model", "{tmp}/" + LONG, "--out", "{tmp}/c.json"], "--model"),
    ("long-data", ["certify", *LM, "--data", "{tmp}/" + LONG, "--out", "{tmp}/c.json"], "--data"),
    ("long-tokenizer", ["certify", *LM, "--tokenizer", "{tmp}/" + LONG, "--out", "{tmp}/c.json"], "--tokenizer"),
    ("long-stats", ["stats", "{tmp}/" + LONG], "samples"),
    ("long-report", ["report", "{tmp}/" + LONG], "results"),
    ("long-report-out", ["report", "{root}/results", "--out", "{tmp}/" + LONG], "is too long"),
    ("long-sweep-config", ["sweep", "{tmp}/" + LONG], "config"),
    ("deep-sweep-config", ["sweep", DEEP], "config"),
    ("long-linearize-config", ["linearize", "{tmp}/" + LONG], "config"),
    ("long-grow-out", ["grow", "--model", "builtin", "--out", "{tmp}/" + LONG], "is too long"),
    ("long-grow-bench-out", ["grow-bench", "--quick", "--out", "{tmp}/" + LONG], "is too long"),
    ("long-demo-out", ["demo", "--out", "{tmp}/" + LONG], "is too long"),
    ("long-activations-json", ["activations", "--json", "{tmp}/" + LONG], "is too long"),
    # --------------------------------------------------------------- numbers past their range
    ("n-etas-huge", ["certify", *FAST, "--n-etas", "1000000000", "--out", "{tmp}/c.json"],
     "--n-etas 1000000000: must be a whole number in 1..100"),
    ("n-etas-101", ["certify", *FAST, "--n-etas", "101", "--out", "{tmp}/c.json"], "in 1..100"),
    ("etas-too-many", ["certify", *FAST, "--etas", ",".join(["0.1"] * 101), "--out", "{tmp}/c.json"],
     "101 step sizes; at most 100"),
    ("etas-inf", ["certify", *FAST, "--etas", "0.1,inf", "--out", "{tmp}/c.json"], "positive finite numbers"),
    ("etas-nan", ["certify", *FAST, "--etas", "nan", "--out", "{tmp}/c.json"], "positive finite numbers"),
    ("draws-huge", ["certify", *FAST, "--draws", "100000000", "--out", "{tmp}/c.json"], "--draws 100000000"),
    ("project-huge", ["certify", *FAST, "--project", "2000000", "--out", "{tmp}/c.json"],
     "--project 2000000 is not below any point's dimension"),
    ("n-train-huge", ["certify", "--n-train", "100000000", "--out", "{tmp}/c.json"], "--n-train 100000000"),
    ("n-test-huge", ["certify", "--n-test", "100000000", "--out", "{tmp}/c.json"], "--n-test 100000000"),
    ("batch-size-huge", ["certify", *FAST, "--batch-size", "10000000", "--out", "{tmp}/c.json"], "--batch-size"),
    ("threads-huge", ["certify", *FAST, "--threads", "100000", "--out", "{tmp}/c.json"], "--threads 100000"),
    ("train-steps-huge", ["certify", "--train-steps", "1000000000", "--out", "{tmp}/c.json"], "--train-steps"),
    ("seq-len-huge", ["certify", *LM, "--seq-len", "10000000", "--data", "{root}/a.txt", "--out", "{tmp}/c.json"],
     "--seq-len 10000000"),
    ("max-tokens-huge", ["certify", *LM, "--max-tokens", "10000000000000", "--data", "{root}/a.txt",
                         "--out", "{tmp}/c.json"], "--max-tokens"),
    ("M-huge", ["certify", "--M", "100000000000", "--out", "{tmp}/c.json"], "M=100000000000: at most"),
    ("K-huge", ["certify", "--M", "4", "--K", "100000000000", "--out", "{tmp}/c.json"], "K=100000000000: at most"),
    ("grow-steps-huge", ["grow", "--model", "builtin", "--steps", "1000000000", "--out", "{tmp}/g.json"], "--steps"),
    ("grow-block-width-huge", ["grow", "--model", "builtin", "--block-width", "10000000", "--out", "{tmp}/g.json"],
     "--block-width"),
    ("K-over-all-test", ["certify", "--train-steps", "2", "--n-test", "all", "--M", "4", "--K", "999",
                         "--out", "{tmp}/c.json"], "(--n-test all took every one): lower --K"),
    ("M-over-all-train", ["certify", "--train-steps", "2", "--n-train", "all", "--M", "5000", "--K", "4",
                          "--out", "{tmp}/c.json"], "(--n-train all took every one): lower --M"),
    # --------------------------------------------------------------- configs and combinations that mean nothing
    ("config-certify-list", ["certify", "--config", "{root}/cfg-list.json", "--out", "{tmp}/c.json"],
     "its 'certify' is not a mapping of settings"),
    ("config-M-text", ["certify", "--config", "{root}/cfg-abc.json", "--out", "{tmp}/c.json"],
     "--M 'abc': expected comma-separated whole numbers"),
    ("config-draws-inf", ["certify", "--config", "{root}/cfg-huge.json", "--out", "{tmp}/c.json"],
     "--draws inf: must be a whole number"),
    ("config-run-list", ["certify", "--config", "{root}/cfg-run-list.json", "--out", "{tmp}/c.json"],
     "its 'run' is not a mapping of settings"),
    ("points-comma", ["certify", *FAST, "--points", ",", "--out", "{tmp}/c.json"],
     "--points is empty (',' names nothing)"),
    ("grow-points-comma", ["grow", "--model", "builtin", "--points", ",", "--out", "{tmp}/g.json"],
     "--points is empty (',' names nothing)"),
    ("plan-list-points", ["certify", "--plan", "--list-points"], "so --list-points would do nothing"),
    ("plan-resume", ["certify", "--plan", "--resume", "--out", "{tmp}/c.json"], "so --resume would do nothing"),
    ("plan-save-samples", ["certify", "--plan-no-time", "--save-samples", "{tmp}/s.safetensors"],
     "so --save-samples would do nothing"),
    ("sweep-plan-dry-run", ["sweep", "{root}/sweep.toml", "--plan", "--dry-run", "--out", "{tmp}/s"],
     "so --dry-run would do nothing"),
    ("grow-bench-plan-bad-shard", ["grow-bench", "--quick", "--plan-no-time", "--shard", "3/2", "--out", "{tmp}/g"],
     "--shard '3/2': need 1 <= k <= n"),
    ("linearize-plan-bad-shard", ["linearize", "{root}/sweep.toml", "--plan-no-time", "--shard", "0/2",
                                  "--out", "{tmp}/s"], "--shard '0/2'"),
    # --------------------------------------------------------------- text in another encoding
    ("utf16-data", ["certify", *LM, "--data", "{root}/utf-16.txt", "--out", "{tmp}/c.json"],
     "is UTF-16LE text (it starts with a UTF-16LE byte-order mark)"),
    ("utf16be-data", ["certify", *LM, "--data", "{root}/utf-16-be.txt", "--out", "{tmp}/c.json"], "is UTF-16BE text"),
    ("utf32-data", ["certify", *LM, "--data", "{root}/utf-32.txt", "--out", "{tmp}/c.json"], "is UTF-32LE text"),
    ("utf16-train-data", ["certify", *LM, "--train-data", "{root}/utf-16.txt", "--test-data", "{root}/a.txt",
                          "--out", "{tmp}/c.json"], "iconv -f UTF-16 -t UTF-8"),
    ("utf16-sweep-config", ["sweep", "{root}/cfg-utf16.toml", "--out", "{tmp}/s"], "save it as UTF-8"),
    ("utf16-linearize-config", ["linearize", "{root}/cfg-utf16.toml", "--out", "{tmp}/s"], "save it as UTF-8"),
]


def _fill(argv, root, tmp):
    return [a.replace("{root}", str(root)).replace("{tmp}", str(tmp)) for a in argv]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_the_table_is_large_and_its_ids_unique():
    ids = [case[0] for case in TABLE]
    assert len(ids) == len(set(ids)) and len(ids) >= 55


@pytest.mark.parametrize("case", TABLE, ids=[c[0] for c in TABLE])
def test_bad_command_line_is_one_line_before_any_work(case, root, tmp_path, capsys):
    _, argv, msg = case
    before = _tree(root)
    tmp = tmp_path / "new"  # nothing may be created under it, not even the folder
    cap = one_line(_fill(argv, root, tmp), capsys, msg)
    assert TRAINED not in cap.out and cap.out.strip() == ""  # refused before training, probing or printing
    assert not tmp.exists()
    assert _tree(root) == before  # no input was written


def test_pools_that_cannot_fit_in_memory_are_refused_before_training(tmp_path, monkeypatch, capsys):
    import widthscope.certification.pipeline as pl

    monkeypatch.setattr(pl, "device_memory", lambda device: (10_000, "MemAvailable"))
    rc = main(["certify", *FAST, "--out", str(tmp_path / "c.json")])
    cap = capsys.readouterr()
    assert rc == 2 and "of memory" in cap.err and "only 10.0 KB is available" in cap.err, cap.err
    assert TRAINED not in cap.out and not (tmp_path / "c.json").exists()
    monkeypatch.setattr(pl, "device_memory", lambda device: (None, "unknown"))  # unknown: the run goes ahead
    assert main(["certify", *FAST, "--interventions", "none", "--out", str(tmp_path / "c.json")]) == 0


def test_a_utf8_file_with_a_byte_order_mark_is_still_text(tmp_path):
    from widthscope.data.sniff import sniff, unicode_bom

    (tmp_path / "bom8.txt").write_bytes(b"\xef\xbb\xbf" + b"plain text\n" * 10)
    assert sniff(tmp_path / "bom8.txt") is None and unicode_bom(b"\xef\xbb\xbfx") is None
    assert unicode_bom("x".encode("utf-32")) == "UTF-32LE"  # not mistaken for UTF-16LE (same first bytes)
