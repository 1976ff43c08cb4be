"""A newcomer's five first attempts (docs/huggingface.md, issue 31), one test each, and the page
itself: every ``python`` block of docs/huggingface.md runs unchanged, offline, against tiny
stand-ins written here under the page's names into a hub cache (``EleutherAI/pythia-160m``,
branches main and step1000) and a datasets cache (``Salesforce/wikitext``, configuration
``wikitext-2-raw-v1``, laid out as ``datasets.load_dataset`` leaves it)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_tiny
import widthscope as ws
from widthscope.errors import WidthscopeError, WidthscopeTypeError
from widthscope.probe.batches import to_batches

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "huggingface.md"
MODEL, DATASET, CONFIG = "EleutherAI/pythia-160m", "Salesforce/wikitext", "wikitext-2-raw-v1"
MAIN, STEP = "1" * 40, "2" * 40  # commits of refs/main and refs/step1000 (other weights)
KW = dict(M=4, K=4, draws=50, interventions="none", progress=False)


def _splits() -> dict[str, list[str]]:
    """Documents that say which split they belong to (the first word), with some empty rows as
    WikiText has."""
    out = {}
    for i, part in enumerate(("train", "validation", "test")):
        docs = [f"{part} " + d for d in hf_tiny.corpus({"train": 300, "validation": 200, "test": 60}[part], seed=i)]
        out[part] = [d if j % 7 else "" for j, d in enumerate(docs)]
    return out


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    src_main = hf_tiny.save_model(root / "src-main", "gpt_neox", seed=0)
    src_step = hf_tiny.save_model(root / "src-step", "gpt_neox", seed=1)
    hf_tiny.hub_put(root / "hub", MODEL, src_main, MAIN, ("main",))
    hf_tiny.hub_put(root / "hub", MODEL, src_step, STEP, ("step1000",))
    splits = _splits()
    hf_tiny.cache_dataset(root / "datasets", DATASET, splits, config=CONFIG)
    return {"root": root, "hub": root / "hub", "datasets": root / "datasets", "step": src_step, "splits": splits}


@pytest.fixture
def offline(caches, monkeypatch):
    """The caches above as the user's (the hub path is read per call; ``datasets`` reads its
    cache folder from its config module, set here)."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(caches["hub"]))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(caches["datasets"]))
    return caches


def _loaded(caches):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(caches["step"]).eval()
    return model, AutoTokenizer.from_pretrained(caches["step"])


def _close(a, b, rel=1e-6):
    """Equal structure, floats within ``rel``: other batch shapes sum in another order."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)
    return a == b


def _numbers(res):
    return [
        (
            p.point,
            p.n_train,
            p.n_test,
            dict(p.moments_train),
            dict(p.moments_test),
            [(c.d_par, c.d_2, c.b_exact) for c in p.certificates],
        )
        for p in res.points
    ]


# ----------------------------------------------------------------------------- 1. hub id + revision
def test_attempt_1_hub_id_with_a_revision_from_the_cache(offline, tmp_path):
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in offline["splits"]["train"]))
    spec = ws.InputSpec(model=MODEL, revision="step1000", data=str(text), seq_len=16, n_train=16, n_test=8)
    inputs = ws.load_inputs(spec)
    assert inputs.info["hub"]["commit"] == STEP and inputs.info["hub"]["revision"] == "step1000"
    step_weights = ws.checkpoint.load(str(offline["step"])).state_dict()
    assert all(torch.equal(v, step_weights[k]) for k, v in inputs.model.state_dict().items())
    res = ws.certify(inputs.model, spec, **KW)
    assert [p.n_train for p in res.points] == [16] * len(res.points)
    with pytest.raises(WidthscopeError, match=r"hf download EleutherAI/pythia-160m --revision step9"):
        ws.load_inputs(ws.InputSpec(model=MODEL, revision="step9", data=str(text)))


# ----------------------------------------------------------------------------- 2. objects + list[str]
def test_attempt_2_same_numbers_from_files_from_objects_and_from_batches(offline, tmp_path):
    """A checkpoint on disk with a .jsonl file, the same model, tokenizer and texts as objects in
    an InputSpec, and ``ws.certify(model, batches)`` on the pools: the same pools and numbers."""
    model, tok = _loaded(offline)
    texts = [t for t in offline["splits"]["train"] if t][:80]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    kw = dict(seq_len=16, n_train=24, n_test=12, seed=3, test_fraction=0.25)
    files = ws.InputSpec(model=str(offline["step"]), data=str(tmp_path / "docs.jsonl"), **kw)
    objects = ws.InputSpec(model=model, tokenizer=tok, data=texts, **kw)
    a, b = ws.load_inputs(files), ws.load_inputs(objects)
    assert a.task == b.task == "causal-lm"
    assert torch.equal(a.train, b.train) and torch.equal(a.test, b.test)  # integer ids: one code path
    by_file = ws.certify(a.model, files, batch_size=8, **KW)
    by_objects = ws.certify(model, objects, batch_size=8, **KW)
    by_batches = ws.certify(model, to_batches(b.train, 6), to_batches(b.test, 6), batch_size=6, **KW)
    # the same examples through other batch shapes: sums in another order, so a tolerance
    assert _close(_numbers(by_file), _numbers(by_objects)) and _close(_numbers(by_objects), _numbers(by_batches))
    # the list[str] route of ws.certify: each text one sequence; the spec records the objects
    res = ws.certify(model, texts[:24], texts[24:36], tokenizer=tok, seq_len=16, **KW)
    assert res.settings["data_objects"]["train"] == "24 texts"
    d = objects.to_dict()
    assert d["model"] == "<in memory: GPTNeoXForCausalLM>" and d["data"] == "<in memory: list of 80 texts>"
    json.dumps(d)
    assert ws.InputSpec.from_dict(d, model=model, tokenizer=tok, data=texts) == objects
    with pytest.raises(WidthscopeError, match=r"recorded from an object in memory.*from_dict\(d, model=\.\.\.\)"):
        ws.InputSpec.from_dict(d)


def test_objects_in_the_spec_wrong_types_name_the_field(offline):
    model, tok = _loaded(offline)
    for kw, field in (
        (dict(model=3), "model"),
        (dict(model=model, data=3.5), "data"),
        (dict(model=model, tokenizer=torch.zeros(2)), "tokenizer"),
        (dict(model=model, train_data=[1, 2]), "train_data"),
    ):
        with pytest.raises(WidthscopeTypeError, match=rf"input spec field {field}\).*InputSpec\({field}=\.\.\.\)"):
            ws.InputSpec(**kw)
    with pytest.raises(WidthscopeError, match="model object is already loaded: drop it"):
        ws.InputSpec(model=model, revision="step1000")
    with pytest.raises(WidthscopeError, match=r"carries no tokenizer.*tokenizer=AutoTokenizer"):
        ws.load_inputs(ws.InputSpec(model=model, data=["a b c"] * 40))
    with pytest.raises(WidthscopeError, match=r"its task is unknown.*task="):
        ws.load_inputs(ws.InputSpec(model=torch.nn.Linear(2, 2), data={"input_ids": torch.zeros(8, 4).long()}))
    with pytest.raises(WidthscopeError, match=r"InputSpec\(seq_len=\.\.\.\) applies to text"):
        ws.load_inputs(ws.InputSpec(model=model, seq_len=8, data=tok(["the cat"] * 40, return_tensors="pt")))


# ----------------------------------------------------------------------------- 3. BatchEncoding
def test_attempt_3_a_batch_encoding(offline):
    from torch.utils.data import DataLoader

    model, tok = _loaded(offline)
    texts = [t for t in offline["splits"]["train"] if t][:48]
    enc = tok(texts, truncation=True, max_length=16, padding=True, return_tensors="pt")
    a = ws.certify(model, texts[:32], texts[32:], tokenizer=tok, seq_len=16, batch_size=8, **KW)
    b = ws.certify(model, {k: v[:32] for k, v in enc.items()}, {k: v[32:] for k, v in enc.items()}, batch_size=8, **KW)
    # padded to the longest of all 48 here, of each pool there: other shapes, so a tolerance
    assert _close(_numbers(a), _numbers(b), rel=1e-5)
    # in a spec: rows of the encoding, a seeded split and seeded pools; a DataLoader over the same rows agrees
    spec = dict(n_train=24, n_test=8, seed=2, test_fraction=0.25)
    x = ws.load_inputs(ws.InputSpec(model=model, data=enc, **spec))
    rows = [{k: v[i] for k, v in enc.items()} for i in range(len(texts))]
    y = ws.load_inputs(ws.InputSpec(model=model, data=DataLoader(rows, batch_size=5), **spec))
    assert x.info["split"] == "one corpus" and x.info["n_train"] == 24 and x.info["n_test"] == 8
    assert all(torch.equal(x.train[k], y.train[k]) and torch.equal(x.test[k], y.test[k]) for k in x.train)
    held = {tuple(r.tolist()) for r in x.test["input_ids"]}
    assert not held & {tuple(r.tolist()) for r in x.train["input_ids"]}  # disjoint rows
    assert held <= {tuple(r.tolist()) for r in enc["input_ids"]}


# ----------------------------------------------------------------------------- 4. DatasetDict
def test_attempt_4_dataset_dict_validation_is_the_held_out_pool(offline, tmp_path):
    import datasets

    model, tok = _loaded(offline)
    sp = offline["splits"]
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in sp.items()})
    kw = dict(seq_len=16, n_train=24, n_test=12, seed=1)
    got = ws.load_inputs(ws.InputSpec(model=model, tokenizer=tok, data=dd, **kw))
    assert got.info["split"] == "dataset splits" and "'validation'" in got.info["heldout_integrity"]
    # the same pools as the two splits given as two sources (never pooled, never re-split)
    two = ws.load_inputs(
        ws.InputSpec(model=model, tokenizer=tok, train_data=sp["train"], test_data=sp["validation"], **kw)
    )
    assert torch.equal(got.train, two.train) and torch.equal(got.test, two.test)
    held, trained = (set(tok.decode(p.flatten()).split()) for p in (got.test, got.train))
    assert not held & {"train", "test"} and not trained & {"validation", "test"}
    # by name from the datasets cache, and as a save_to_disk folder: the same pools again
    by_name = ws.load_inputs(ws.InputSpec(model=str(offline["step"]), data=f"hf:{DATASET}:{CONFIG}", **kw))
    dd.save_to_disk(tmp_path / "dd")
    on_disk = ws.load_inputs(ws.InputSpec(model=str(offline["step"]), data=str(tmp_path / "dd"), **kw))
    for other in (by_name, on_disk):
        assert torch.equal(got.train, other.train) and torch.equal(got.test, other.test)
    rec = by_name.info["hf_dataset"]
    assert rec["train"]["split"] == "train" and rec["test"]["split"] == "validation"
    assert rec["test"]["name"] == DATASET and rec["test"]["config"] == CONFIG and rec["test"]["offline"] is True
    assert "streamed" in by_name.info["train"]["source"]
    # a re-split only on request, and reported
    re_split = ws.load_inputs(ws.InputSpec(model=model, tokenizer=tok, data=dd, test_fraction=0.2, **kw))
    assert re_split.info["split"] == "re-split on request"
    assert any("re-split into the train and held-out pools on request" in n for n in re_split.notes)


def test_datasets_by_name_offline_errors_are_one_line(offline, tmp_path, capsys):
    from widthscope.cli import main

    with pytest.raises(WidthscopeError, match=r"not in the datasets cache .*datasets.load_dataset\('me/none'\)"):
        ws.load_inputs(ws.InputSpec(model=str(offline["step"]), data="hf:me/none"))
    with pytest.raises(WidthscopeError, match=r"not that configuration \(cached: \['wikitext-2-raw-v1'\]\)"):
        ws.load_inputs(ws.InputSpec(model=str(offline["step"]), data=f"hf:{DATASET}:other"))
    with pytest.raises(WidthscopeError, match=r"hf:NAME\[:CONFIG\]\[@REVISION\]"):
        ws.InputSpec(model=str(offline["step"]), data="hf:two words")
    # the command line: exit 2, one line, before any model loads (the model path does not exist)
    rc = main(["certify", "--model", str(offline["step"]), "--data", "hf:me/none", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "hf:me/none" in err[0] and "load_dataset('me/none')" in err[0]


def test_a_named_dataset_on_the_command_line_is_recorded(offline, tmp_path):
    from widthscope.cli import main

    out = tmp_path / "r.json"
    assert (
        main(
            [
                "certify",
                "--model",
                str(offline["step"]),
                "--data",
                f"hf:{DATASET}:{CONFIG}",
                "--seq-len",
                "16",
                "--n-train",
                "16",
                "--n-test",
                "8",
                "--M",
                "4",
                "--draws",
                "50",
                "--interventions",
                "none",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["settings"]["input_spec"]["data"] == f"hf:{DATASET}:{CONFIG}"
    rec = res["settings"]["inputs"]["hf_dataset"]
    assert rec["train"]["split"] == "train" and rec["test"]["split"] == "validation" and rec["test"]["hash"]


# ----------------------------------------------------------------------------- 5. Trainer
def test_attempt_5_trainer_loss_curve_identical_with_and_without_the_monitor(offline, tmp_path):
    """The page's Trainer attempt, small (the full check, every log entry and the weights, is
    tests/test_monitor_trainers.py)."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from widthscope.monitor.hf import attach

    def run(monitor: bool):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(offline["step"])
        ids = torch.randint(0, 100, (48, 16), generator=torch.Generator().manual_seed(0))
        args = TrainingArguments(
            output_dir=str(tmp_path / str(monitor)),
            max_steps=8,
            per_device_train_batch_size=8,
            logging_steps=2,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": x, "labels": x} for x in ids[:32]])
        mon = None
        if monitor:
            mon = ws.AlignmentMonitor(model, ids[32:40], ids[40:], M=4, every=4, draws=20)
            attach(trainer, mon)
        trainer.train()
        return [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h], mon

    plain, _ = run(False)
    watched, mon = run(True)
    assert plain == watched and len(plain) == 4  # float for float: the same code path and seeds
    assert sorted({r["step"] for r in mon.rows}) == [0, 4, 8]


# ----------------------------------------------------------------------------- the page
RUNNER = r"""
import json, os, sys, time, traceback
blocks = json.load(open(sys.argv[1]))
t0 = time.perf_counter()
for i, code in enumerate(blocks):
    env = dict(os.environ)
    print(f"=== block {i} ({time.perf_counter() - t0:.1f}s)", flush=True)
    try:
        exec(compile(code, f"docs/huggingface.md block {i}", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    os.environ.clear(); os.environ.update(env)
"""


def page_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def test_the_page_runs_as_written(caches, tmp_path):
    blocks = page_blocks()
    assert len(blocks) >= 6  # the five attempts and the hand-made hub cache
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "run.py").write_text(RUNNER)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_CACHE": str(caches["hub"]),
        "HF_DATASETS_CACHE": str(caches["datasets"]),
        "OMP_NUM_THREADS": "1",
        "WIDTHSCOPE_PROGRESS": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), str(tmp_path / "blocks.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"=== block {len(blocks) - 1} (" in out
    assert f"'commit': '{STEP}'" in out  # attempt 1 resolved the step1000 branch
    assert (
        "dataset splits | the dataset's own splits: train pool only from split 'train', held-out pool only "
        "from split 'validation'" in out
    )
