"""A dataset's own train/validation/test splits are the train and held-out pools: a folder of
split files named the way the Hugging Face Hub names them, or a ``DatasetDict`` directory, is
never pooled and re-split (validation text must not reach the train pool). Re-splitting is an
explicit option (``--test-fraction``), reported in the notes and in ``heldout_integrity``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import hf_tiny
from widthscope.cli import main
from widthscope.errors import WidthscopeError

PARTS = ("train", "validation", "test")


def _docs(part: str, n: int = 60) -> list[str]:
    """Short documents that say which split they belong to."""
    seed = PARTS.index(part) if part in PARTS else 7
    return [f"{part} doc {i} " + d for i, d in enumerate(hf_tiny.corpus(n, seed=seed, words=6))]


def _write(path: Path, docs: list[str]) -> None:
    """``docs`` as a table (by suffix) or a text file (one document per paragraph)."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix
    if suffix == ".parquet":
        pq.write_table(pa.table({"text": docs}), path)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    elif suffix == ".csv":
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text"])
            w.writerows([d] for d in docs)
    else:
        path.write_text("\n\n".join(docs) + "\n")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return hf_tiny.save_model(tmp_path_factory.mktemp("m") / "gpt2", "gpt2")


@pytest.fixture(scope="module")
def tok(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


def _load(model: Path, **kw):
    import widthscope as ws

    kw = {"sequences": "per-document", "seq_len": 64, "n_train": 24, "n_test": 12, **kw}
    return ws.load_inputs(ws.InputSpec(model=str(model), **kw), show_progress=False)


def _parts(pool, tok) -> set[str]:
    """Which splits the documents of a per-document pool came from (their first word)."""
    ids = pool["input_ids"] if isinstance(pool, dict) else pool
    return {tok.decode(row, skip_special_tokens=True).split()[0] for row in ids}


# ----------------------------------------------------------------------------- the leak
def test_validation_files_never_reach_the_train_pool(model, tok, tmp_path):
    """The issue's case: --data DIR with train-*.parquet and validation-*.parquet pooled both and
    re-split 90/10 at random; now the train pool reads only train, the held-out pool only validation."""
    d = tmp_path / "ds"
    _write(d / "train-00000-of-00001.parquet", _docs("train"))
    _write(d / "validation-00000-of-00001.parquet", _docs("validation"))
    inp = _load(model, data=str(d), n_train=48, n_test=24)
    assert _parts(inp.train, tok) == {"train"}  # before: 23 of 40 train-pool documents were validation text
    assert _parts(inp.test, tok) == {"validation"}
    info = inp.info
    assert info["split"] == "dataset splits"
    assert info["train"]["source"].startswith(f"split 'train' of {d} (1 .parquet file: train-00000-of-00001.parquet)")
    assert "split 'validation'" in info["test"]["source"]
    assert info["heldout_integrity"] == ("the dataset's own splits: train pool only from split 'train', held-out "
                                         "pool only from split 'validation' (never pooled or re-split)")
    assert inp.notes == []


def test_certify_results_show_the_splits(model, tmp_path, capsys):
    d = tmp_path / "ds"
    _write(d / "data" / "train-00000-of-00001.parquet", _docs("train"))
    _write(d / "data" / "validation-00000-of-00001.parquet", _docs("validation"))
    out = tmp_path / "c.json"
    rc = main(["certify", "--model", str(model), "--data", str(d), "--seq-len", "16", "--n-train", "8",
               "--n-test", "8", "--M", "4", "--draws", "20", "--interventions", "none", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    s = json.loads(out.read_text())["settings"]
    assert s["inputs"]["split"] == "dataset splits"
    assert s["inputs"]["heldout_integrity"].startswith("the dataset's own splits")
    assert "train pool: split 'train' of" in s["data_description"]
    assert "held-out pool: split 'validation' of" in s["data_description"]


# ----------------------------------------------------------------------------- naming layouts
LAYOUTS = {  # files -> (their splits, the held-out split)
    "hub shards": ({"train-00000-of-00001.parquet": "train", "validation-00000-of-00001.parquet": "validation",
                    "test-00000-of-00001.parquet": "test"}, "validation"),
    "data/ shards": ({"data/train-00000-of-00002.parquet": "train", "data/train-00001-of-00002.parquet": "train",
                      "data/validation-00000-of-00001.parquet": "validation", "README.md": None}, "validation"),
    "hashed shards": ({"data/train-00000-of-00001-5c3e9d.parquet": "train",
                       "data/test-00000-of-00001-a1b2c3.parquet": "test"}, "test"),
    "plain names": ({"train.parquet": "train", "validation.parquet": "validation"}, "validation"),
    "jsonl": ({"train.jsonl": "train", "test.jsonl": "test"}, "test"),
    "jsonl shards": ({"data/train-00000-of-00001.jsonl": "train", "data/validation-00000-of-00001.jsonl":
                      "validation"}, "validation"),
    "csv aliases": ({"wikitext-train.csv": "train", "wikitext-dev.csv": "validation", "wikitext-eval.csv": "test"},
                    "validation"),
    "split folders": ({"train/part-0.parquet": "train", "train/part-1.parquet": "train",
                       "validation/part-0.parquet": "validation"}, "validation"),
    "text files": ({"ptb.train.txt": "train", "ptb.valid.txt": "validation", "ptb.test.txt": "test"}, "validation"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_naming_layout_gives_each_pool_its_split(layout, model, tok, tmp_path):
    files, held = LAYOUTS[layout]
    d = tmp_path / "ds"
    for name, part in files.items():
        if part is None:
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text("---\nlicense: mit\n---\n# A dataset card: not data\n")
        else:
            _write(d / name, _docs(part, 40))
    (d / ".gitattributes").write_text("*.parquet filter=lfs\n")
    kw = {"sequences": "concatenate", "seq_len": 8} if layout == "text files" else {}
    inp = _load(model, data=str(d), **kw)
    assert inp.info["split"] == "dataset splits"
    assert inp.info["heldout_integrity"].endswith(f"held-out pool only from split {held!r} (never pooled or "
                                                  "re-split)")
    if layout == "text files":  # concatenated chunks: pieces of one split's text, never another's words
        train, test = (" ".join(tok.decode(r) for r in pool) for pool in (inp.train, inp.test))
        assert "valid" not in train and "test" not in train
        assert "train" not in test and "test" not in test
        assert "split 'validation' of" in inp.info["test"]["source"]
    else:
        assert _parts(inp.train, tok) == {"train"}
        assert _parts(inp.test, tok) == {held}
    if "README.md" in files:
        assert "not read: README.md" in inp.info["train"]["source"]


def test_split_files_rules(tmp_path):
    from widthscope.data.splits import choose_splits, split_files

    d = tmp_path / "a"
    _write(d / "train.jsonl", ["x"])
    _write(d / "validation.jsonl", ["y"])
    _write(d / "extra.jsonl", ["z"])
    fs = split_files(d)
    assert fs is not None and list(fs.splits) == ["train", "validation"] and [p.name for p in fs.unassigned] == [
        "extra.jsonl"]
    choice = choose_splits(d)
    assert choice is not None and (choice.train, choice.test) == ("train", "validation")
    assert any("1 file(s) named for no split not read (extra.jsonl)" in n for n in choice.notes)
    # a file named for two splits could feed train text to the held-out pool: refused
    _write(d / "train_test.jsonl", ["w"])
    with pytest.raises(WidthscopeError, match="named for two splits"):
        split_files(d)
    # any split name of the Hub's shards
    e = tmp_path / "b"
    for part in ("train", "test", "unsupervised"):
        _write(e / "data" / f"{part}-00000-of-00001.parquet", ["t"])
    fs = split_files(e)
    assert fs is not None and list(fs.splits) == ["train", "test", "unsupervised"]
    # not split folders: a corpus of text files whose names hold a split word, mixed files, no split words
    t = tmp_path / "t"
    _write(t / "notes.txt", ["a"])
    _write(t / "test-results.txt", ["b"])
    assert split_files(t) is None
    c = tmp_path / "c"
    _write(c / "train.py", ["a"])
    _write(c / "test_x.py", ["b"])
    assert split_files(c) is None
    n = tmp_path / "n"
    _write(n / "part-0.parquet", ["a"])
    _write(n / "part-1.parquet", ["b"])
    assert split_files(n) is None and choose_splits(n) is None


def test_a_split_of_a_plain_file_is_refused(tmp_path):
    from widthscope.data.corpus import documents

    f = tmp_path / "a.parquet"
    _write(f, ["x"])
    with pytest.raises(WidthscopeError, match="--\\*-split applies to datasets directories and folders of split"):
        documents(f, split="train")
    d = tmp_path / "ds"
    _write(d / "train.parquet", ["x"])
    _write(d / "test.parquet", ["y"])
    with pytest.raises(WidthscopeError, match="holds splits train, test, not 'validation'"):
        documents(d, split="validation")


# ----------------------------------------------------------------------------- DatasetDict
def _dataset_dict(path: Path, parts=PARTS) -> Path:
    import datasets

    datasets.DatasetDict({p: datasets.Dataset.from_dict({"text": _docs(p, 40)}) for p in parts}).save_to_disk(
        str(path))
    return path


def test_a_dataset_dict_folder_uses_its_own_splits(model, tok, tmp_path):
    dd = _dataset_dict(tmp_path / "dd")
    inp = _load(model, data=str(dd))
    assert _parts(inp.train, tok) == {"train"} and _parts(inp.test, tok) == {"validation"}
    assert inp.info["split"] == "dataset splits"
    assert "split 'validation'" in inp.info["test"]["source"]
    assert inp.info["heldout_integrity"].startswith("the dataset's own splits")
    inp = _load(model, data=str(dd), test_split="test")
    assert _parts(inp.test, tok) == {"test"}


def test_a_dataset_dict_of_one_split_is_one_corpus_with_a_note(model, tok, tmp_path):
    dd = _dataset_dict(tmp_path / "dd", parts=("test",))
    inp = _load(model, data=str(dd), n_train=16, n_test=4)
    assert inp.info["split"] == "one split"
    assert _parts(inp.train, tok) == _parts(inp.test, tok) == {"test"}
    assert any("holds one split only ('test')" in n for n in inp.notes)


# ----------------------------------------------------------------------------- choosing splits
def test_train_split_and_test_split_choose_other_splits(model, tok, tmp_path):
    d = tmp_path / "ds"
    for part in PARTS:
        _write(d / f"{part}-00000-of-00001.parquet", _docs(part))
    inp = _load(model, data=str(d), train_split="validation", test_split="test")
    assert _parts(inp.train, tok) == {"validation"} and _parts(inp.test, tok) == {"test"}
    assert "train pool only from split 'validation', held-out pool only from split 'test'" in \
        inp.info["heldout_integrity"]
    inp = _load(model, data=str(d), test_split="valid")  # the Hub's aliases name the same split
    assert _parts(inp.test, tok) == {"validation"}
    with pytest.raises(WidthscopeError, match="--test-split 'dev2'.*has splits train, validation, test"):
        _load(model, data=str(d), test_split="dev2")
    with pytest.raises(WidthscopeError, match="--train-split and --test-split are both 'test'"):
        _load(model, data=str(d), train_split="test", test_split="test")


def test_the_cli_options_choose_splits(model, tok, tmp_path):
    import argparse

    from widthscope.cli.inputs import add_arguments, spec_from_args
    from widthscope.data.inputs import resolve

    d = tmp_path / "ds"
    for part in PARTS:
        _write(d / f"{part}.jsonl", _docs(part))
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    spec = spec_from_args(p.parse_args(["--model", str(model), "--data", str(d), "--test-split", "test",
                                        "--sequences", "per-document", "--seq-len", "64", "--n-train", "16",
                                        "--n-test", "8"]), "inputs")
    inp = resolve(spec, show_progress=False)
    assert _parts(inp.train, tok) == {"train"} and _parts(inp.test, tok) == {"test"}


def test_two_sources_with_splits_read_train_and_validation(model, tok, tmp_path):
    d = tmp_path / "ds"
    for part in PARTS:
        _write(d / f"{part}.parquet", _docs(part))
    inp = _load(model, train_data=str(d), test_data=str(d))
    assert inp.info["split"] == "two sources"
    assert _parts(inp.train, tok) == {"train"} and _parts(inp.test, tok) == {"validation"}
    assert inp.info["heldout_integrity"].startswith(f"two sources: held-out pool only from split 'validation' of {d}")


def test_a_folder_of_one_split_keeps_one_corpus_and_says_so(model, tok, tmp_path):
    d = tmp_path / "ds"
    _write(d / "train-00000-of-00001.parquet", _docs("train", 80))
    inp = _load(model, data=str(d), n_train=24, n_test=6)
    assert inp.info["split"] == "one split"
    rows_tr = {tuple(r) for r in inp.train["input_ids"].tolist()}
    rows_te = {tuple(r) for r in inp.test["input_ids"].tolist()}
    assert not rows_tr & rows_te  # disjoint sequences of the one split
    assert any(n.startswith(f"{d} holds one split only ('train' (train-00000-of-00001.parquet)): read as one "
                            "corpus") for n in inp.notes)
    assert inp.info["heldout_integrity"].startswith("one split only ('train')")
    # its fraction given explicitly: still the one corpus (nothing else to pool), split by that fraction
    inp = _load(model, data=str(d), n_train=16, n_test=12, test_fraction=0.4)
    assert inp.info["split"] == "one split" and "held-out fraction 0.4" in inp.info["rule"]
    # a file named for no split is read with it (the folder is the corpus), and the note names it
    _write(d / "extra.parquet", _docs("extra", 20))
    inp = _load(model, data=str(d), n_train=24, n_test=6)
    assert _parts(inp.train, tok) | _parts(inp.test, tok) == {"train", "extra"}
    assert any("and 1 file(s) named for no split (extra.parquet): read as one corpus" in n for n in inp.notes)


def test_a_re_split_is_asked_for_with_test_fraction_and_reported(model, tok, tmp_path):
    d = tmp_path / "ds"
    _write(d / "train-00000-of-00001.parquet", _docs("train", 120))
    _write(d / "validation-00000-of-00001.parquet", _docs("validation"))
    inp = _load(model, data=str(d), test_fraction=0.25)
    assert inp.info["split"] == "re-split on request"
    assert _parts(inp.train, tok) == _parts(inp.test, tok) == {"train"}  # never pooled with validation
    assert not {tuple(r) for r in inp.train["input_ids"].tolist()} & {tuple(r) for r in inp.test["input_ids"].tolist()}
    assert any("split 'train' (train-00000-of-00001.parquet) re-split into the train and held-out pools on request "
               "(--test-fraction 0.25); split validation not read" in n for n in inp.notes)
    assert inp.info["heldout_integrity"].startswith("re-split on request (--test-fraction 0.25)")
    inp = _load(model, data=str(d), test_fraction=0.5, train_split="validation")
    assert _parts(inp.train, tok) == _parts(inp.test, tok) == {"validation"}
    with pytest.raises(WidthscopeError, match="--test-fraction re-splits one split.*drop one of them"):
        _load(model, data=str(d), test_fraction=0.25, test_split="validation")


def test_a_dataset_dict_re_split_on_request(model, tok, tmp_path):
    dd = _dataset_dict(tmp_path / "dd")
    inp = _load(model, data=str(dd), test_fraction=0.3)
    assert inp.info["split"] == "re-split on request"
    assert _parts(inp.train, tok) == _parts(inp.test, tok) == {"train"}
    assert any("splits validation, test not read" in n for n in inp.notes)


def test_plain_corpora_keep_one_corpus(model, tmp_path):
    d = tmp_path / "docs"
    for i, doc in enumerate(_docs("x", 30)):
        _write(d / f"doc{i}.txt", [doc])
    _write(d / "test-notes.txt", ["notes"])
    inp = _load(model, data=str(d), sequences="concatenate", seq_len=8, n_train=16, n_test=6)
    assert inp.info["split"] == "one corpus"
    assert inp.info["train"]["source"] == f"31 text files under {d}"
    assert inp.info["heldout_integrity"].startswith("one corpus, split here (sequences of one corpus split by a "
                                                    "seeded permutation")
    assert not any("split" in n for n in inp.notes)
