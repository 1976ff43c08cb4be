"""Bring your own model and data: every architecture and format through the CLI, the refusals,
and the published protocol against an independent implementation written here."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import hf_tiny
from widthscope.cli import main
from widthscope.errors import WidthscopeError


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            d = root / arch
            if arch == "vit":
                hf_tiny.save_vit(d)
            else:
                hf_tiny.save_model(d, arch)
            made[arch] = d
        return made[arch]
    return get


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    train = hf_tiny.write_text_files(root, hf_tiny.corpus(160, seed=0), "train")
    val = hf_tiny.write_text_files(root, hf_tiny.corpus(80, seed=1), "val")
    return {"train": train, "val": val, "root": root}


def _run(argv, capsys):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _err_line(rc, err):
    assert rc == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _finite(res):
    for p in res["points"]:
        for c in p["certificates"]:
            for form in ("one", "two"):
                for k in ("expectation", "variance", "b_exact", "b_align"):
                    assert c[form][k] is not None and math.isfinite(c[form][k])
                for k in ("d_par", "d_2", "d_align"):  # the vacuous rule: a positive number or None
                    assert c[form][k] is None or (math.isfinite(c[form][k]) and c[form][k] > 0)
                assert (c[form]["d_align"] is None) == c[form]["vacuous"]
            assert 0 <= c["misalignment"]["probability"] <= 1


# ----------------------------------------------------------------------------- architectures
ARCHS = [*hf_tiny.CAUSAL, "bert", "bert-cls", "vit"]
TASK = {"bert": "masked-lm", "bert-cls": "sequence-classification", "vit": "image-classification"}
STACK = {"llama": "model.layers", "gpt_neox": "gpt_neox.layers", "gpt2": "transformer.h", "qwen2": "model.layers",
         "mistral": "model.layers", "phi3": "model.layers", "gemma": "model.layers", "opt": "model.decoder.layers",
         "bert": "bert.encoder.layer", "bert-cls": "bert.encoder.layer"}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_certify_and_grow_through_the_cli(arch, zoo, corpora, tmp_path, capsys):
    model = zoo(arch)
    if arch == "vit":
        imgs = hf_tiny.image_folder(tmp_path / "imgs", per_class=10)
        data = ["--data", str(imgs), "--test-fraction", "0.4"]
    else:
        data = ["--train-data", str(corpora["train"]["parquet"]), "--test-data", str(corpora["val"]["jsonl"]),
                "--seq-len", "16"]
    rc, out, err = _run(["certify", "--model", str(model), *data, "--n-train", "12", "--n-test", "8", "--M", "4,8",
                         "--draws", "50", "--out", str(tmp_path / "c.json")], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "c.json").read_text())
    assert res["settings"]["task"] == TASK.get(arch, "causal-lm")
    points = [p["point"] for p in res["points"]]
    stack = STACK.get(arch, "vit.layers" if arch == "vit" else None)
    assert points == [f"{stack}.0", f"{stack}.1"]
    assert all(p["n_train"] == 12 and p["n_test"] == 8 and p["d"] == 32 for p in res["points"])
    assert res["settings"]["width"] == 32 and res["settings"]["depth"] == 2
    _finite(res)
    assert all(len(p["interventions"]) > 0 for p in res["points"])  # the bias probe inserted at HF blocks
    assert "S" in out and "T" in out  # S, V, T columns in the terminal table
    rc, out, err = _run(["grow", "--model", str(model), *data, "--n-train", "16", "--n-test", "8", "--M", "4",
                         "--K", "4", "--steps", "2", "--out", str(tmp_path / "g.json")], capsys)
    assert rc == 0, err
    g = json.loads((tmp_path / "g.json").read_text())
    assert g["chosen"] in points and g["growth"][0]["new_parameters"] > 0


def test_list_points_shows_the_main_stack_and_every_module(zoo, capsys):
    rc, out, _ = _run(["certify", "--model", str(zoo("gpt2")), "--list-points"], capsys)
    assert rc == 0 and out.split() == ["transformer.h.0", "transformer.h.1"]
    rc, out, _ = _run(["certify", "--model", str(zoo("gpt2")), "--list-points", "--all"], capsys)
    assert "transformer.h.0.attn" in out.split() and "lm_head" in out.split()


def test_sharded_safetensors_and_bin_checkpoints_load(zoo, tmp_path):
    from transformers import AutoModelForCausalLM

    from widthscope import checkpoint

    ref = AutoModelForCausalLM.from_pretrained(str(zoo("llama")))
    x = torch.randint(0, 300, (2, 8))
    for name in ("sharded", "bin"):
        d = tmp_path / name
        ref.save_pretrained(d, max_shard_size="20KB")
        if name == "bin":  # the pre-safetensors layout: one pickled state dict, read with weights_only
            torch.save(ref.state_dict(), d / "pytorch_model.bin")
            for f in d.glob("model*.safetensors*"):
                f.unlink()
        if name == "sharded":
            assert (d / "model.safetensors.index.json").is_file()
        else:
            assert (d / "pytorch_model.bin").is_file() and not list(d.glob("*.safetensors"))
        m = checkpoint.load(d)
        assert m.widthscope_hf["weights"].startswith("pytorch_model.bin" if name == "bin" else "")
        with torch.no_grad():
            assert torch.allclose(m(x).logits, ref(x).logits, atol=1e-5)


def test_weights_that_do_not_match_the_config_are_refused(zoo, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from widthscope import checkpoint

    d = tmp_path / "bad"
    LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = 32
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WidthscopeError, match=r"do not match .*shape mismatch .* in the file vs .* in the config") as e:
        checkpoint.load(d)
    assert "ignore_mismatched_sizes" not in str(e.value)  # no hint about an option the user never set


def test_dtype_option_and_float64_statistics(zoo, corpora, tmp_path, capsys):
    rc, _, err = _run(["certify", "--model", str(zoo("llama")), "--dtype", "bfloat16", "--data",
                       str(corpora["train"]["txt"]), "--seq-len", "16", "--n-train", "8", "--n-test", "8", "--M", "4",
                       "--draws", "20", "--interventions", "none", "--out", str(tmp_path / "c.json")], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "c.json").read_text())
    assert res["settings"]["dtype"] == "bfloat16"
    _finite(res)
    from widthscope.data.inputs import load_model
    from widthscope.probe import collect

    m = load_model(str(zoo("llama")), dtype="bfloat16")
    assert next(m.parameters()).dtype == torch.bfloat16
    q = collect(m, [torch.randint(0, 300, (2, 8))], progress=False)
    assert all(v.dtype == torch.float64 for v in q.values())


# ----------------------------------------------------------------------------- formats
def _args(argv):
    import argparse

    from widthscope.cli.inputs import add_arguments, spec_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    return spec_from_args(p.parse_args(argv), "inputs")


def _reference_chunks(tok, docs, seq_len, n):
    """The published construction, written independently: non-empty documents tokenized without
    special tokens, each followed by EOS, concatenated, cut into seq_len chunks, tail dropped; first n."""
    stream = []
    for d in docs:
        if not d.strip():
            continue  # the scripts skip empty and whitespace-only records
        stream += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    chunks = [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
    return torch.tensor(chunks[:n])


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "dataset", "dataset_dict"])
def test_tabular_formats_give_the_published_chunks(fmt, zoo, corpora, tmp_path):
    import datasets
    from transformers import AutoTokenizer

    from widthscope.data.inputs import resolve

    train_docs, val_docs = hf_tiny.corpus(160, seed=0), hf_tiny.corpus(80, seed=1)
    if fmt == "dataset":
        tr, te = tmp_path / "tr", tmp_path / "te"
        datasets.Dataset.from_dict({"text": train_docs}).save_to_disk(str(tr))
        datasets.Dataset.from_dict({"text": val_docs}).save_to_disk(str(te))
        data = ["--train-data", str(tr), "--test-data", str(te)]
    elif fmt == "dataset_dict":
        dd = tmp_path / "dd"
        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train_docs}),
                              "validation": datasets.Dataset.from_dict({"text": val_docs})}).save_to_disk(str(dd))
        data = ["--data", str(dd)]
    else:
        data = ["--train-data", str(corpora["train"][fmt]), "--test-data", str(corpora["val"][fmt])]
    model = zoo("gpt2")
    args = _args(["--model", str(model), *data, "--seq-len", "16", "--first", "--n-train", "20", "--n-test", "10"])
    inp = resolve(args, show_progress=False)
    tok = AutoTokenizer.from_pretrained(str(model))
    assert torch.equal(inp.train, _reference_chunks(tok, train_docs, 16, 20))
    assert torch.equal(inp.test, _reference_chunks(tok, val_docs, 16, 10))
    assert inp.info["separator_id"] == tok.eos_token_id
    if fmt == "dataset_dict":
        assert inp.info["split"] == "dataset splits"


def test_random_pools_are_seeded_subsets_and_one_corpus_splits_disjointly(zoo, corpora):
    from widthscope.data.inputs import resolve

    base = ["--model", str(zoo("gpt2")), "--data", str(corpora["train"]["parquet"]), "--seq-len", "16",
            "--n-train", "24", "--n-test", "8"]
    a = resolve(_args(base), show_progress=False)
    b = resolve(_args(base), show_progress=False)
    c = resolve(_args(base + ["--seed", "5"]), show_progress=False)
    assert torch.equal(a.train, b.train) and not torch.equal(a.train, c.train)
    rows_tr = {tuple(r) for r in a.train.tolist()}
    rows_te = {tuple(r) for r in a.test.tolist()}
    assert not rows_tr & rows_te  # disjoint chunks of the one corpus


def test_text_file_directory_and_skipped_binaries(zoo, corpora, tmp_path, capsys):
    d = tmp_path / "docs"
    d.mkdir()
    for i, doc in enumerate(hf_tiny.corpus(40, seed=3)):
        (d / f"doc{i}.dat").write_text(doc)  # text by content, whatever the suffix
    (d / "weights.bin").write_bytes(b"\x00\x01\x02" * 100)
    import shutil

    shutil.copy(corpora["train"]["parquet"], d / "table.txt")
    rc, out, err = _run(["certify", "--model", str(zoo("gpt2")), "--data", str(d), "--seq-len", "16",
                         "--n-train", "8", "--n-test", "8", "--M", "4", "--draws", "20", "--interventions", "none",
                         "--out", str(tmp_path / "c.json")], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "c.json").read_text())
    assert res["settings"]["inputs"]["train"]["skipped_files"] == 2
    assert any("2 non-text file(s) skipped" in n for n in res["notes"])
    assert "40 text files" in res["settings"]["inputs"]["train"]["source"]


def test_per_document_sequences_pad_with_a_mask(zoo, corpora):
    from widthscope.data.inputs import resolve

    inp = resolve(_args(["--model", str(zoo("gpt2")), "--train-data", str(corpora["train"]["jsonl"]),
                         "--test-data", str(corpora["val"]["jsonl"]), "--sequences", "per-document", "--seq-len",
                         "64", "--first", "--n-train", "8", "--n-test", "8"]), show_progress=False)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(zoo("gpt2")))
    docs = hf_tiny.corpus(160, seed=0)[:8]
    for i, doc in enumerate(docs):
        ids = tok(doc, truncation=True, max_length=64)["input_ids"]
        assert inp.train["attention_mask"][i].sum() == len(ids)
        assert inp.train["input_ids"][i, :len(ids)].tolist() == ids


def test_streaming_stops_once_the_pools_are_full(zoo, tmp_path):
    from widthscope.data.inputs import resolve

    big = tmp_path / "big.txt"
    with open(big, "w") as f:
        for i in range(60):
            f.write(" ".join(hf_tiny.corpus(200, seed=i)) + "\n")
    size = big.stat().st_size
    assert size > 2_000_000
    inp = resolve(_args(["--model", str(zoo("gpt2")), "--data", str(big), "--seq-len", "16", "--first",
                         "--n-train", "16", "--n-test", "4"]), show_progress=False)
    src = inp.info["train"]
    assert not src["corpus_exhausted"] and src["tokens_read"] < size / 10


# ----------------------------------------------------------------------------- refusals
def test_binary_files_given_as_text_are_refused(zoo, corpora, tmp_path, capsys):
    import gzip
    import shutil

    cases = {}
    shutil.copy(corpora["train"]["parquet"], tmp_path / "train.txt")
    cases["train.txt"] = "Parquet"
    (tmp_path / "img.txt").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    cases["img.txt"] = "PNG"
    (tmp_path / "z.txt").write_bytes(gzip.compress(b"hello " * 100))
    cases["z.txt"] = "gzip"
    (tmp_path / "nul.txt").write_bytes(b"abc\x00def" * 100)
    cases["nul.txt"] = "NUL"
    (tmp_path / "latin.txt").write_bytes(bytes(range(128, 256)) * 20)
    cases["latin.txt"] = "not UTF-8"
    (tmp_path / "fake.parquet").write_text("text\nhello\n")
    cases["fake.parquet"] = "not a Parquet file"
    for name, what in cases.items():
        rc, out, err = _run(["certify", "--model", str(zoo("gpt2")), "--data", str(tmp_path / name),
                             "--out", str(tmp_path / "never.json")], capsys)
        line = _err_line(rc, err)
        assert what in line and name in line, line
    assert not (tmp_path / "never.json").exists()


def test_wrong_vocabulary_and_bad_options_are_one_error_line(zoo, corpora, tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    small = tmp_path / "small"
    LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(small)
    hf_tiny.save_tokenizer(small)  # 400 tokens for a 100-row embedding
    data = ["--data", str(corpora["train"]["txt"]), "--seq-len", "16", "--n-train", "8", "--n-test", "8", "--M", "4"]
    line = _err_line(*_run(["certify", "--model", str(small), *data], capsys)[::2])
    assert "400 tokens" in line and "100 rows" in line
    line = _err_line(*_run(["certify", "--model", str(small), "--tokenizer", str(zoo("bert")), *data], capsys)[::2])
    assert "100 rows" in line
    nok = tmp_path / "notok"
    LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(nok)
    line = _err_line(*_run(["certify", "--model", str(nok), *data], capsys)[::2])
    assert "no tokenizer" in line and "--tokenizer" in line
    gpt2 = str(zoo("gpt2"))
    line = _err_line(*_run(["certify", "--model", gpt2, "--data", str(corpora["train"]["jsonl"]),
                            "--text-field", "body", "--M", "4", "--n-train", "8", "--n-test", "8"], capsys)[::2])
    assert "'body'" in line and "text, label" in line
    line = _err_line(*_run(["certify", "--model", gpt2, "--data", str(corpora["train"]["txt"]), "--seq-len", "4096"],
                           capsys)[::2])
    assert "maximum sequence length 128" in line
    line = _err_line(*_run(["certify", "--model", gpt2, "--train-data", str(corpora["train"]["txt"]),
                            "--test-data", str(corpora["train"]["txt"])], capsys)[::2])
    assert "same source" in line
    line = _err_line(*_run(["certify", "--model", gpt2, "--train-data", str(corpora["train"]["txt"])], capsys)[::2])
    assert "together" in line
    line = _err_line(*_run(["certify", "--model", gpt2, "--data", str(corpora["train"]["txt"]), "--seq-len", "16",
                            "--first", "--n-train", "100000", "--M", "4"], capsys)[::2])
    assert "--n-train 100000" in line


def test_check_ids_names_both_sizes():
    from transformers import GPT2Config, GPT2LMHeadModel

    from widthscope.data.objects import check_ids

    m = GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=1, vocab_size=50))
    check_ids(torch.tensor([[0, 49]]), m, "train")
    with pytest.raises(WidthscopeError, match=r"0\.\.300 but the model's vocabulary has 50"):
        check_ids(torch.tensor([[0, 300]]), m, "train")


def test_a_tokenizer_that_cannot_read_the_text_is_refused(zoo, tmp_path):
    from widthscope.data.corpus import documents, sequences
    from widthscope.data.inputs import load_tokenizer, load_model

    m = load_model(str(zoo("bert")))
    tok = load_tokenizer(None, m, "masked-lm")
    p = tmp_path / "greek.txt"
    p.write_text("αβγ δεζ ηθι " * 200)
    docs, _ = documents(p)
    with pytest.raises(WidthscopeError, match="unknown token"):
        sequences(docs, tok, seq_len=16)


# ----------------------------------------------------------------------------- masked LM
def test_mask_tokens_and_masked_lm_loss():
    from widthscope.data.objects import mask_tokens
    from widthscope.probe.collect import masked_lm_loss

    class Tok:
        mask_token_id = 4
        all_special_ids = [0, 2, 3, 4]

    ids = torch.tensor([[2, 10, 11, 12, 13, 14, 15, 16, 3, 0], [2, 20, 3, 0, 0, 0, 0, 0, 0, 0], [2, 3, 0, 0, 0, 0, 0, 0, 0, 0]])
    att = (ids != 0).long()
    att[:, 0] = 1
    batch, dropped = mask_tokens(ids, att, Tok(), rate=0.3, seed=1)
    assert dropped == 1  # the third row has no ordinary token
    lab = batch["labels"]
    assert (lab[0] != -100).sum() == 2 and (lab[1] != -100).sum() == 1  # round(0.3 * 7) = 2; at least one
    assert torch.all(batch["input_ids"][lab != -100] == 4)
    assert torch.equal(lab[lab != -100], ids[:2][lab != -100])
    assert not torch.isin(lab[lab != -100], torch.tensor(Tok.all_special_ids)).any()
    logits = torch.randn(2, 10, 30, dtype=torch.float64)
    got = masked_lm_loss(logits, batch)
    for i in range(2):
        pos = (lab[i] != -100).nonzero().flatten()
        want = torch.nn.functional.cross_entropy(logits[i, pos], lab[i, pos])
        assert torch.allclose(got[i], want)


# ----------------------------------------------------------------------------- published protocol
def _per_example_q(model, ids, points):
    """Per-example activation gradients by a loop of single-sequence backward passes."""
    mods = dict(model.named_modules())
    out = {p: [] for p in points}
    for i in range(ids.shape[0]):
        held = {}

        def hook(name):
            def f(m, inp, o):
                h = o[0] if isinstance(o, tuple) else o
                h.retain_grad()
                held[name] = h
            return f
        hs = [mods[p].register_forward_hook(hook(p)) for p in points]
        x = ids[i:i + 1]
        logits = model(x).logits.double()
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:])
        loss.backward()
        for h in hs:
            h.remove()
        for p in points:
            out[p].append(held[p].grad[0].double().sum(0))
    return {p: torch.stack(v) for p, v in out.items()}


def _plugin(X):
    mu = X.mean(0)
    S = torch.cov(X.T, correction=1)
    return mu, S


def test_published_protocol_matches_an_independent_implementation(zoo, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = zoo("llama")
    train_docs, val_docs = hf_tiny.corpus(120, seed=10), hf_tiny.corpus(120, seed=11)
    pq.write_table(pa.table({"content": train_docs}), tmp_path / "train.parquet")
    pq.write_table(pa.table({"content": val_docs}), tmp_path / "validation.parquet")
    n, T = 40, 24
    rc, out, err = _run(["certify", "--model", str(model_dir), "--protocol", "published",
                         "--train-data", str(tmp_path / "train.parquet"), "--test-data",
                         str(tmp_path / "validation.parquet"), "--text-field", "content", "--seq-len", str(T),
                         "--n-train", str(n), "--n-test", str(n), "--M", "8,16", "--out", str(tmp_path / "p.json")],
                        capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "p.json").read_text())
    s = res["settings"]
    assert (s["estimator"], s["pool"], s["draws"], s["interventions"]) == ("plugin", "sum", 1000, None)
    assert s["inputs"]["first"] and s["inputs"]["sequences"] == "concatenate"
    # Independent: tokenizer, chunking, per-example loop, explicit covariance.
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    ids_a, ids_b = _reference_chunks(tok, train_docs, T, n), _reference_chunks(tok, val_docs, T, n)
    points = [p["point"] for p in res["points"]]
    qa, qb = _per_example_q(model, ids_a, points), _per_example_q(model, ids_b, points)
    for p in res["points"]:
        A, B = qa[p["point"]], qb[p["point"]]
        a, Sa = _plugin(A)
        b, Sb = _plugin(B)
        S, V, Tr = float(a @ a), float(a @ Sa @ a), float(torch.trace(Sa @ Sa))
        for c in p["certificates"]:
            one, two = c["one"], c["two"]
            assert one["expectation"] == pytest.approx(S, rel=1e-4)
            assert one["e_dir_train"] == pytest.approx(V, rel=1e-4)
            assert one["e_cov"] == pytest.approx(Tr, rel=1e-4)
            if not one["vacuous"]:
                assert one["d_par"] == pytest.approx(S ** 2 / V, rel=1e-4)
                assert one["d_2"] == pytest.approx(S ** 2 / Tr, rel=1e-4)
                assert one["d_align"] == pytest.approx(min(S ** 2 / V, S ** 2 / Tr), rel=1e-4)
            ab = float(a @ b)
            assert two["expectation"] == pytest.approx(ab, rel=1e-4, abs=1e-12)
            assert two["e_dir_train"] == pytest.approx(float(b @ Sa @ b), rel=1e-3, abs=1e-12)
            assert two["e_dir_test"] == pytest.approx(float(a @ Sb @ a), rel=1e-3, abs=1e-12)
            assert two["e_cov"] == pytest.approx(float(torch.trace(Sa @ Sb)), rel=1e-3)
            # Flip probability: our own resampling, within binomial error of the tool's.
            M, K = c["M"], c["K"]
            g = torch.Generator().manual_seed(123)
            flips = 0
            for _ in range(1000):
                ia, ib = torch.randperm(n, generator=g)[:M], torch.randperm(n, generator=g)[:K]
                flips += float(A[ia].mean(0) @ B[ib].mean(0)) <= 0
            ours, theirs = flips / 1000, c["misalignment"]["probability"]
            se = math.sqrt(max(ours * (1 - ours), 1e-3) * 2 / 1000)
            assert abs(ours - theirs) <= 4 * se + 1e-9, (p["point"], M, ours, theirs)
    assert "S" in out.split("\n")[1] or " S " in out


# ----------------------------------------------------------------------------- widthscope byte models
def test_own_byte_model_reads_a_parquet_column_not_its_bytes(corpora, tmp_path, capsys):
    from widthscope import checkpoint, data
    from widthscope.data.inputs import resolve
    from widthscope.models import build

    torch.manual_seed(0)
    checkpoint.save(build("llama", 32, depth=2, max_seq_len=64), tmp_path / "ck",
                    extra={"dataset": "text", "data_options": {"seq_len": 32, "max_bytes": 20000}})
    argv = ["--model", str(tmp_path / "ck"), "--data", str(corpora["train"]["parquet"]), "--seq-len", "32",
            "--first", "--n-train", "8", "--n-test", "4"]
    inp = resolve(_args(argv), show_progress=False)
    assert inp.info["tokenizer"] == "bytes" and inp.task == "lm"
    text = "".join(hf_tiny.corpus(160, seed=0)).encode()  # byte models: no separator between documents
    assert bytes(inp.train[0].tolist()) == text[:32]
    assert b"PAR1" not in bytes(inp.train.flatten().tolist())
    rc, _, err = _run(["certify", *argv, "--M", "4", "--K", "4", "--draws", "20", "--interventions", "none",
                       "--out", str(tmp_path / "c.json")], capsys)
    assert rc == 0, err
    with pytest.raises(WidthscopeError, match="table, not raw text"):
        data.load("text", root=str(corpora["train"]["parquet"]))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"PAR1" + b"\x00" * 64)
    with pytest.raises(WidthscopeError, match="Parquet"):
        data.load("text", root=str(bad))


def test_inputs_a_model_cannot_read_are_refused(zoo, corpora, tmp_path, capsys):
    """Options and data that would be ignored or misread give one error line, never numbers."""
    txt = str(corpora["train"]["txt"])
    cases = [
        (["--model", str(zoo("bert-cls")), "--data", "text"], "has no labels"),
        (["--model", str(zoo("vit")), "--data", "digits"], "ImageFolder directory"),
        (["--model", str(zoo("vit")), "--data", txt, "--seq-len", "16"], "applies to text models"),
        (["--model", str(zoo("gpt2")), "--data", txt, "--label-field", "y"], "--label-field applies"),
        (["--model", str(zoo("gpt2")), "--data", txt, "--text-field", "body"], "applies to tables"),
        (["--model", str(zoo("bert")), "--data", txt, "--task", "causal-lm"], "names BertForMaskedLM"),
        (["--model", "builtin", "--task", "causal-lm"], "--task"),
    ]
    from widthscope import checkpoint
    from widthscope.models import build

    checkpoint.save(build("mlp", 8, in_dim=64, out_dim=10), tmp_path / "own")
    cases.append((["--model", str(tmp_path / "own"), "--data", "digits", "--task", "causal-lm"],
                  "applies to Hugging Face checkpoints"))
    for argv, msg in cases:
        rc, out, err = _run(["certify", *argv, "--n-train", "8", "--n-test", "8", "--M", "4",
                             "--out", str(tmp_path / "never.json")], capsys)
        line = _err_line(rc, err)
        assert msg in line, (argv, line)
    assert not (tmp_path / "never.json").exists()


def test_dtype_applies_to_float_inputs_too(zoo, tmp_path, capsys):
    """--dtype casts image/feature inputs with the model, so every model dtype runs on the same data."""
    imgs = hf_tiny.image_folder(tmp_path / "imgs", per_class=6)
    for argv in (["--model", "builtin", "--train-steps", "2", "--dtype", "float64"],
                 ["--model", str(zoo("vit")), "--data", str(imgs), "--test-fraction", "0.4", "--dtype", "bfloat16"]):
        rc, _, err = _run(["certify", *argv, "--n-train", "8", "--n-test", "6", "--M", "4", "--draws", "20",
                           "--interventions", "bias", "--out", str(tmp_path / "c.json")], capsys)
        assert rc == 0, err
        _finite(json.loads((tmp_path / "c.json").read_text()))
    rc, _, err = _run(["grow", "--model", "builtin", "--dtype", "float64", "--steps", "2", "--M", "4", "--K", "4",
                       "--out", str(tmp_path / "g.json")], capsys)
    assert rc == 0, err
