"""In-memory objects as certify / monitor pools (widthscope.data.objects): the same model and
texts give the same numbers by every route; a DatasetDict's validation split is the held-out pool;
wrong types name the argument."""

from __future__ import annotations

import math

import pytest
import torch

import widthscope as ws
from hf_tiny import corpus, save_tokenizer
from widthscope.errors import WidthscopeError, WidthscopeTypeError

KW = dict(M=4, K=4, draws=50, seed=0, interventions="none", progress=False)
SEQ = 24


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    import transformers as tf

    tok = save_tokenizer(tmp_path_factory.mktemp("tok"))
    cfg = tf.GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=1
    )
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg).eval()
    return model, tok


@pytest.fixture(scope="module")
def texts():
    docs = corpus(40, seed=5, words=8)
    return docs[:24], docs[24:]


def _numbers(res):
    out = []
    for p in res.to_dict()["points"]:
        out.append(
            (p["point"], p["n_train"], p["n_test"], p["moments_train"], p["moments_test"], p.get("certificates"))
        )
    return out


def _close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.fixture(scope="module")
def reference(gpt2, texts):
    model, tok = gpt2
    train, test = texts
    return ws.certify(model, train, test, tokenizer=tok, seq_len=SEQ, batch_size=8, **KW)


def _enc(tok, texts):
    return tok(texts, truncation=True, max_length=SEQ, padding=True, return_tensors="pt")


def test_texts_give_numbers(reference, texts):
    pts = reference.to_dict()["points"]
    assert pts and all(p["n_train"] == len(texts[0]) and p["n_test"] == len(texts[1]) for p in pts)
    assert reference.settings["data_objects"]["train"] == f"{len(texts[0])} texts"


def test_same_numbers_every_route(gpt2, texts, reference):
    import datasets
    from torch.utils.data import DataLoader

    model, tok = gpt2
    train, test = texts
    ref = _numbers(reference)
    enc_tr, enc_te = _enc(tok, train), _enc(tok, test)
    routes = {
        "BatchEncoding": (enc_tr, enc_te),
        "Dataset text column": (
            datasets.Dataset.from_dict({"text": train}),
            datasets.Dataset.from_dict({"text": test}),
        ),
        "tokenized Dataset": tuple(
            datasets.Dataset.from_dict(dict(tok(t, truncation=True, max_length=SEQ))) for t in (train, test)
        ),
        "DataLoader": tuple(
            DataLoader([{k: v[i] for k, v in e.items()} for i in range(len(e["input_ids"]))], batch_size=8)
            for e in (enc_tr, enc_te)
        ),
        "dict batches": tuple(
            [{k: v[i : i + 8] for k, v in e.items()} for i in range(0, len(e["input_ids"]), 8)]
            for e in (enc_tr, enc_te)
        ),
    }
    for name, (a, b) in routes.items():
        res = ws.certify(model, a, b, tokenizer=tok, seq_len=SEQ, batch_size=8, **KW)
        assert _close(_numbers(res), ref), name
    # the pair form and the tokenizer-less BatchEncoding route
    res = ws.certify(model, (enc_tr, enc_te), batch_size=8, **KW)
    assert _close(_numbers(res), ref)


def test_dataset_dict_validation_is_held_out(gpt2, texts):
    import datasets

    model, tok = gpt2
    train, test = texts
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": train}),
            "validation": datasets.Dataset.from_dict({"text": test[:12]}),
            "test": datasets.Dataset.from_dict({"text": test}),
        }
    )
    res = ws.certify(model, dd, tokenizer=tok, seq_len=SEQ, batch_size=8, **KW)
    pts = res.to_dict()["points"]
    assert all(p["n_train"] == len(dd["train"]) and p["n_test"] == len(dd["validation"]) for p in pts)
    assert "validation" in res.settings["data_objects"]["split"]
    ref = ws.certify(model, train, test[:12], tokenizer=tok, seq_len=SEQ, batch_size=8, **KW)
    assert _close(_numbers(res), _numbers(ref))
    with pytest.raises(WidthscopeTypeError, match=r"certify\(test=\.\.\.\)"):
        ws.certify(model, dd, test, tokenizer=tok, **KW)
    with pytest.raises(WidthscopeError, match="needs 'train' and 'validation'"):
        ws.certify(model, datasets.DatasetDict({"train": dd["train"]}), tokenizer=tok, **KW)


def test_wrong_types_name_the_argument(gpt2, texts):
    model, tok = gpt2
    train, test = texts
    with pytest.raises(WidthscopeTypeError, match=r"certify\(data=\.\.\.\).*list of texts"):
        ws.certify(model, 3.5, test, tokenizer=tok, **KW)
    with pytest.raises(WidthscopeTypeError, match=r"certify\(test=\.\.\.\).*BatchEncoding"):
        ws.certify(model, train, object(), tokenizer=tok, **KW)
    with pytest.raises(WidthscopeTypeError, match=r"certify\(data=\.\.\.\).*DatasetDict"):
        ws.certify(model, train, tokenizer=tok, **KW)  # one pool only
    with pytest.raises(WidthscopeTypeError, match=r"certify\(tokenizer=\.\.\.\).*AutoTokenizer"):
        ws.certify(model, train, test, tokenizer="gpt2", **KW)
    with pytest.raises(WidthscopeError, match=r"certify\(data=\.\.\.\): texts need a tokenizer"):
        ws.certify(model, train, test, **KW)


def test_task_from_the_model_object(gpt2):
    import transformers as tf

    from widthscope.data.objects import loss_for, task_of
    from widthscope.probe.collect import masked_lm_loss

    assert task_of(gpt2[0]) == "causal-lm"
    bert = tf.BertForMaskedLM(
        tf.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    )
    assert task_of(bert) == "masked-lm" and loss_for("masked-lm") is masked_lm_loss
    assert task_of(torch.nn.Linear(2, 2)) is None


def test_monitor_takes_a_batch_encoding(gpt2, texts):
    model, tok = gpt2
    train, test = texts
    mon = ws.AlignmentMonitor(model, _enc(tok, train), _enc(tok, test), M=4, every=1, draws=50, batch_size=8)
    rows = mon.step(model, 0)
    assert rows and all(r["n_train"] == len(train) for r in rows if r.get("kind", "row") == "row")


def test_monitor_takes_texts_and_a_dataset(gpt2, texts):
    import datasets

    model, tok = gpt2
    train, test = texts
    a = ws.AlignmentMonitor(model, train, test, M=4, every=1, draws=50, batch_size=8, tokenizer=tok)
    whole = tok(test, padding=True, return_tensors="pt")  # the monitor takes no seq_len: nothing truncated
    b = ws.AlignmentMonitor(
        model, datasets.Dataset.from_dict({"text": train}), whole, M=4, every=1, draws=50, batch_size=8, tokenizer=tok
    )
    ra, rb = a.step(model, 0), b.step(model, 0)
    keys = ("point", "n_train", "n_test", "d_par", "b_exact")
    assert [[r.get(k) for k in keys] for r in ra] == [[r.get(k) for k in keys] for r in rb]
    with pytest.raises(WidthscopeTypeError, match=r"AlignmentMonitor\(tokenizer=\.\.\.\)"):
        ws.AlignmentMonitor(model, train, test, M=4, every=1, tokenizer=3)


# ----------------------------------------------------------------------------- objects in an InputSpec
def test_spec_takes_a_tokenized_dataset_like_the_encoding_it_came_from(gpt2, texts):
    """A tokenized ``Dataset`` (ragged rows, right-padded here) and the padded ``BatchEncoding`` of the
    same texts give the same pools; a ``DatasetDict`` of them uses its own splits."""
    import datasets

    model, tok = gpt2
    docs = texts[0] + texts[1]
    enc = tok(docs, truncation=True, max_length=SEQ, padding=True, return_tensors="pt")
    ds = datasets.Dataset.from_dict(dict(tok(docs, truncation=True, max_length=SEQ)))
    kw = dict(n_train=20, n_test=8, seed=4, test_fraction=0.25)
    a = ws.load_inputs(ws.InputSpec(model=model, data=enc, **kw))
    b = ws.load_inputs(ws.InputSpec(model=model, data=ds, **kw))
    T = int(b.train["attention_mask"].sum(1).max())  # the encoding is padded to all 40 texts' longest
    for x, y in ((a.train, b.train), (a.test, b.test)):
        assert torch.equal(x["attention_mask"][:, : y["input_ids"].shape[1]], y["attention_mask"])
        assert torch.equal(x["input_ids"][:, :T], y["input_ids"][:, :T])
    dd = datasets.DatasetDict(train=ds.select(range(30)), validation=ds.select(range(30, 40)))
    c = ws.load_inputs(ws.InputSpec(model=model, data=dd, n_train=20, n_test=8, seed=4))
    assert c.info["split"] == "dataset splits" and c.info["n_test"] == 8
    with pytest.raises(WidthscopeError, match="--n-test 12 but .*gave only 10 held-out examples"):
        ws.load_inputs(ws.InputSpec(model=model, data=dd, n_train=20, n_test=12))


def test_spec_takes_a_labelled_dataset_for_a_sequence_classifier(tmp_path):
    import datasets
    import transformers as tf

    import hf_tiny

    path = hf_tiny.save_model(tmp_path / "cls", "bert-cls")
    model = tf.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = tf.AutoTokenizer.from_pretrained(path)
    docs = corpus(40, seed=2, words=6)
    ds = datasets.Dataset.from_dict({"text": docs, "label": [i % 3 for i in range(40)]})
    got = ws.load_inputs(
        ws.InputSpec(model=model, tokenizer=tok, data=ds, seq_len=16, n_train=24, n_test=4, label_field="label")
    )
    ref = ws.load_inputs(
        ws.InputSpec(
            model=str(path),
            data=str(hf_tiny.write_text_files(tmp_path, docs, "d")["jsonl"]),
            seq_len=16,
            n_train=24,
            n_test=4,
            label_field="label",
        )
    )
    assert got.task == "sequence-classification"
    for x, y in ((got.train, ref.train), (got.test, ref.test)):
        assert torch.equal(x[0]["input_ids"], y[0]["input_ids"]) and torch.equal(x[1], y[1])
