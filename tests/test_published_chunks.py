"""The published scripts' chunking on a WikiText-shaped corpus, against a reimplementation written
here from their documented behaviour (not from widthscope's code):

- every record whose text is empty or whitespace-only is skipped before tokenizing;
- concatenated (``--concatenate``, and the flip script): each remaining record tokenized without
  special tokens and followed by EOS, the stream cut into L-token chunks, tail dropped, the first B
  (``0``: all);
- per record (the alignment script's default): each remaining record tokenized with its special
  tokens, kept only if it has at least L tokens, cut to L; the first B.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

import hf_tiny
from widthscope.cli import main
from widthscope.errors import WidthscopeError

L = 12


def _wikitext(seed: int) -> list[str]:
    """Rows shaped like WikiText's parquet: blank rows, headings, short rows, long paragraphs, a row
    of exactly ``NA`` / ``null`` / ``None`` / ``NaN`` text, whitespace-only rows."""
    paras = hf_tiny.corpus(40, seed=seed, words=30)
    rows: list[str] = []
    for i, p in enumerate(paras):
        if i % 8 == 0:
            rows += ["", f" = Heading {i} = \n", ""]
        if i % 5 == 0:
            rows += ["", f" = = Sub {i} = = \n"]
        rows.append(f" {p} \n")
        if i % 7 == 3:
            rows += [" \n", "   "]
        if i % 6 == 2:
            rows.append(" short .\n")
    rows[5:5] = ["NA", "null", "", "None", "NaN"]
    return rows


def _ref_concat(tok, rows: list[str], n: int | None) -> torch.Tensor:
    stream: list[int] = []
    for text in rows:
        if text.strip() == "":
            continue
        stream.extend(tok.encode(text, add_special_tokens=False))
        stream.append(tok.eos_token_id)
    chunks = [stream[s:s + L] for s in range(0, (len(stream) // L) * L, L)]
    return torch.tensor(chunks if n is None else chunks[:n])


def _ref_records(tok, rows: list[str], n: int | None) -> torch.Tensor:
    out = []
    for text in rows:
        if text.strip() == "":
            continue
        ids = tok.encode(text, add_special_tokens=True)
        if len(ids) >= L:
            out.append(ids[:L])
        if n is not None and len(out) == n:
            break
    return torch.tensor(out)


def _write(rows: list[str], base: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    base.parent.mkdir(parents=True, exist_ok=True)
    out = {"parquet": base.with_suffix(".parquet"), "jsonl": base.with_suffix(".jsonl"),
           "csv": base.with_suffix(".csv")}
    pq.write_table(pa.table({"text": rows}), out["parquet"])
    out["jsonl"].write_text("".join(json.dumps({"text": r}) + "\n" for r in rows), encoding="utf-8")
    with open(out["csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        for r in rows:
            w.writerow([r])
    return out


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("wiki")
    model = hf_tiny.save_model(root / "llama", "llama")
    train, val = _wikitext(0), _wikitext(1)
    return {"model": model, "tok": AutoTokenizer.from_pretrained(str(model)), "train_rows": train, "val_rows": val,
            "train": _write(train, root / "train"), "val": _write(val, root / "validation"),
            "val_clean": _write([r for r in val if r.strip()], root / "clean" / "validation"),
            "train_clean": _write([r for r in train if r.strip()], root / "clean" / "train")}


def _args(argv):
    import argparse

    from widthscope.cli.inputs import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _resolve(wiki, extra, fmt="parquet", train="train", val="val"):
    from widthscope.cli.inputs import spec_from_args
    from widthscope.data.inputs import resolve

    args = _args(["--model", str(wiki["model"]), "--train-data", str(wiki[train][fmt]), "--test-data",
                  str(wiki[val][fmt]), "--seq-len", str(L), "--first", *extra])
    return resolve(spec_from_args(args, "inputs"), show_progress=False)


def test_fixture_is_wikitext_shaped(wiki):
    rows = wiki["val_rows"]
    blank = sum(not r.strip() for r in rows)
    assert blank >= 10 and any(r == "NA" for r in rows) and any(r.startswith(" = ") for r in rows)
    tok = wiki["tok"]
    assert any(0 < len(tok.encode(r)) < L for r in rows if r.strip())  # short records exist
    assert tok.encode("") == [] and tok.encode(" \n")  # whitespace would add tokens if not skipped


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_concatenated_pools_equal_the_reference_and_all_takes_every_chunk(wiki, fmt):
    inp = _resolve(wiki, ["--sequences", "concatenate", "--n-train", "9", "--n-test", "all"], fmt)
    assert torch.equal(inp.train, _ref_concat(wiki["tok"], wiki["train_rows"], 9))
    want = _ref_concat(wiki["tok"], wiki["val_rows"], None)
    assert len(want) > 20 and torch.equal(inp.test, want)
    blank = sum(not r.strip() for r in wiki["val_rows"])
    assert inp.info["test"]["empty_documents"] == blank and inp.info["test"]["empty_rule"] == "skip"
    assert any(f"{blank} of {len(wiki['val_rows'])} documents read were empty" in n for n in inp.notes)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_per_record_pools_equal_the_reference(wiki, fmt):
    inp = _resolve(wiki, ["--sequences", "truncate", "--n-train", "8", "--n-test", "all"], fmt)
    ref_tr = _ref_records(wiki["tok"], wiki["train_rows"], 8)
    ref_te = _ref_records(wiki["tok"], wiki["val_rows"], None)
    assert ref_tr.shape == (8, L) and torch.equal(inp.train, ref_tr)
    assert len(ref_te) > 10 and torch.equal(inp.test, ref_te)
    assert not isinstance(inp.test, dict)  # no padding, no attention mask: every row has L real tokens


def test_csv_keeps_na_strings_as_text_like_jsonl(wiki):
    from widthscope.data.corpus import documents

    got = {fmt: ["".join(d) for d in documents(wiki["val"][fmt])[0]] for fmt in ("csv", "jsonl", "parquet")}
    assert got["csv"] == got["jsonl"] == got["parquet"] == wiki["val_rows"]
    a = _resolve(wiki, ["--n-train", "9", "--n-test", "all"], "csv")
    b = _resolve(wiki, ["--n-train", "9", "--n-test", "all"], "jsonl")
    assert torch.equal(a.train, b.train) and torch.equal(a.test, b.test)


def test_empty_docs_eos_is_the_old_rule_and_is_explicit(wiki):
    inp = _resolve(wiki, ["--sequences", "concatenate", "--n-train", "6", "--n-test", "6", "--empty-docs", "eos"])
    stream: list[int] = []
    for text in wiki["train_rows"]:
        stream += wiki["tok"].encode(text, add_special_tokens=False) + [wiki["tok"].eos_token_id]
    assert torch.equal(inp.train, torch.tensor([stream[s:s + L] for s in range(0, 6 * L, L)]))
    assert not torch.equal(inp.train, _ref_concat(wiki["tok"], wiki["train_rows"], 6))
    assert any("--empty-docs eos" in n for n in inp.notes)


def test_too_large_pool_error_fits_the_mode(wiki):
    n = len(_ref_concat(wiki["tok"], wiki["val_rows"], None))
    with pytest.raises(WidthscopeError) as e:
        _resolve(wiki, ["--n-train", "4", "--n-test", str(n + 1)])
    msg = str(e.value)
    assert f"gave only {n} held-out sequences" in msg and "--n-test all" in msg and "--max-tokens" not in msg
    with pytest.raises(WidthscopeError) as e:
        _resolve(wiki, ["--sequences", "truncate", "--n-train", "4", "--n-test", "10000"])
    assert "more documents are long enough" in str(e.value) and "--max-tokens" not in str(e.value)


def _certify(wiki, tmp_path, train, val, name, capsys, extra=()):
    out = tmp_path / f"{name}.json"
    rc = main(["certify", "--model", str(wiki["model"]), "--protocol", "published", "--train-data",
               str(wiki[train]["parquet"]), "--test-data", str(wiki[val]["parquet"]), "--seq-len", str(L),
               "--n-train", "16", "--M", "4,8", "--draws", "50", "--out", str(out), *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(out.read_text())


@pytest.mark.parametrize("mode", ["concatenate", "truncate"])
def test_d_align_is_the_same_with_and_without_the_empty_rows(wiki, tmp_path, capsys, mode):
    extra = ["--sequences", mode]
    full = _certify(wiki, tmp_path, "train", "val", "full", capsys, extra + ["--save-samples", str(tmp_path / "s.st")])
    # `widthscope stats` on the saved samples redraws with the recorded scheme: the same flip counts
    assert main(["stats", str(tmp_path / "s.st"), "--out", str(tmp_path / "re.json")]) == 0
    again = json.loads((tmp_path / "re.json").read_text())
    assert [c["misalignment"]["count"] for p in again["points"] for c in p["certificates"]] == \
        [c["misalignment"]["count"] for p in full["points"] for c in p["certificates"]]
    clean = _certify(wiki, tmp_path, "train_clean", "val_clean", "clean", capsys, extra)
    n_all = len((_ref_concat if mode == "concatenate" else _ref_records)(wiki["tok"], wiki["val_rows"], None))
    assert full["settings"]["inputs"]["n_test"] == n_all  # the preset's default: every held-out chunk
    assert full["settings"]["draw_scheme"] == "per-pair"
    assert any("documents read were empty or whitespace-only: skipped" in n for n in full["notes"])
    assert not any("were empty" in n for n in clean["notes"])
    for a, b in zip(full["points"], clean["points"], strict=True):
        assert a["n_test"] == b["n_test"] == n_all
        for ca, cb in zip(a["certificates"], b["certificates"], strict=True):
            for form in ("one", "two"):
                for k in ("expectation", "e_dir_train", "e_cov"):
                    # same pools, same code path: equal up to float64 rounding
                    assert ca[form][k] == pytest.approx(cb[form][k], rel=1e-12, abs=1e-300)
                if ca[form]["d_align"] is not None:
                    assert ca[form]["d_align"] == pytest.approx(cb[form]["d_align"], rel=1e-12)


def test_n_test_all_is_refused_where_it_does_not_apply():
    import argparse

    from widthscope.cli.checks import check_args

    with pytest.raises(WidthscopeError, match="--n-test all applies to certify"):
        check_args(argparse.Namespace(n_test="all"), "grow")
    check_args(argparse.Namespace(n_test="all", n_train="all"), "inputs")  # accepted


def test_the_preset_reads_every_held_out_chunk_only_from_a_held_out_source(tmp_path):
    import argparse

    import datasets

    from widthscope.cli.certify import INPUT_PRESETS
    from widthscope.cli.certify import input_preset

    def preset(**given):
        args = argparse.Namespace(**{k: None for k in INPUT_PRESETS["published"]}, protocol="published",
                                  data=None, test_data=None)
        args.first = False
        for k, v in given.items():
            setattr(args, k, v)
        values, _ = input_preset(args)  # the namespace is not changed: the preset's values fill it here
        return argparse.Namespace(**{**vars(args), **values})

    assert preset(test_data="validation.parquet").n_test == "all"
    assert preset(data="corpus.jsonl").n_test == 256  # one corpus to split: never read whole by default
    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]}),
                          "validation": datasets.Dataset.from_dict({"text": ["b"]})}).save_to_disk(str(dd))
    assert preset(data=str(dd)).n_test == "all"
    assert preset(test_data="v.parquet", n_test=64).n_test == 64  # given explicitly: it wins
    assert preset(test_data="v.parquet").empty_docs == "skip"


@pytest.mark.parametrize("mode", [None, "truncate"])
def test_the_preset_pools_equal_the_reference_in_both_modes(wiki, mode):
    """The pools --protocol published builds (its own defaults: concatenated, first, empty rows
    skipped, every held-out chunk), and with --sequences truncate the per-record rule."""
    import argparse

    from widthscope.cli.certify import add_arguments, input_preset
    from widthscope.data.inputs import resolve

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--model", str(wiki["model"]), "--protocol", "published", "--train-data",
                         str(wiki["train"]["parquet"]), "--test-data", str(wiki["val"]["parquet"]), "--seq-len", str(L),
                         "--n-train", "8", *(["--sequences", mode] if mode else [])])
    preset, _ = input_preset(args)
    from widthscope.cli.inputs import spec_from_args

    inp = resolve(spec_from_args(args, "certify", preset=preset, seed=0), show_progress=False)
    ref = _ref_concat if mode is None else _ref_records
    assert torch.equal(inp.train, ref(wiki["tok"], wiki["train_rows"], 8))
    assert torch.equal(inp.test, ref(wiki["tok"], wiki["val_rows"], None))


def test_per_pair_draws_replay_the_flip_script():
    """The flip script's draws, written out here: one generator seeded once; per (M, K) pair in
    order, R rows of uniform keys over each pool, argsorted, the first M (K) indices; a flip is
    mean(train rows) . mean(held-out rows) <= 0."""
    from widthscope.stats import misalignment_from_gram

    g = torch.Generator().manual_seed(3)
    Xa = torch.randn(40, 6, generator=g, dtype=torch.float64) + 0.15
    Xb = torch.randn(30, 6, generator=g, dtype=torch.float64) + 0.15
    pairs, R, seed = [(4, 4), (8, 16), (2, 3)], 300, 42
    gen = torch.Generator(device="cpu").manual_seed(seed)
    inner = {}
    for m, k in pairs:
        ti = torch.rand((R, Xa.shape[0]), generator=gen).argsort(dim=1)[:, :m]
        vi = torch.rand((R, Xb.shape[0]), generator=gen).argsort(dim=1)[:, :k]
        inner[(m, k)] = (Xa[ti].mean(dim=1) * Xb[vi].mean(dim=1)).sum(dim=1)
    got = misalignment_from_gram(Xa @ Xb.T, pairs=pairs, draws=R, seed=seed, scheme="per-pair")
    for r in got:
        x = inner[(r.M, r.K)]
        assert float(x.abs().min()) > 1e-9  # no near-tie whose sign rounding could decide
        assert r.count == int((x <= 0).sum()) and 0 < r.count < R
        assert r.mean_alignment == pytest.approx(float(x.mean()), rel=1e-9)
    shared = misalignment_from_gram(Xa @ Xb.T, pairs=pairs, draws=R, seed=seed)
    assert [r.count for r in shared] != [r.count for r in got]  # the default draws are other draws
