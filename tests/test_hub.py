"""Models by name: a Hugging Face hub id (with --revision) or a hub cache folder as --model,
resolved offline from a genuine hub-cache layout built here (blobs, snapshots of symlinks, refs),
and recorded in the results (id, revision asked for, commit)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import hf_tiny
import widthscope as ws
from widthscope.cli import _quiet_offline, main
from widthscope.errors import WidthscopeError

REPO = "org/tiny"
MAIN = "1" * 40  # commit of refs/main
STEP = "2" * 40  # commit of refs/step1000 (other weights, same tokenizer)
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    src_main, src_step = hf_tiny.save_model(root / "src-main", "gpt2", seed=0), hf_tiny.save_model(
        root / "src-step", "gpt2", seed=1)
    cache = root / "cache"
    folder = cache / "models--org--tiny"
    hf_tiny.hub_put(cache, "org/tiny", src_main, MAIN, ("main",))
    hf_tiny.hub_put(cache, "org/tiny", src_step, STEP, ("step1000",))
    text = root / "train.txt"
    text.write_text("\n\n".join(hf_tiny.corpus(60, seed=0)) + "\n")
    return {"cache": cache, "folder": folder, "text": text, "main": src_main, "step": src_step}


@pytest.fixture
def offline_cache(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    return hub


def _certify(model, hub, tmp_path, capsys, *extra, name="c.json"):
    out = tmp_path / name
    rc = main(["certify", "--model", str(model), *extra, "--data", str(hub["text"]), "--n-train", "8",
               "--n-test", "8", "--M", "4", "--draws", "10", "--interventions", "none", "--seq-len", "8",
               "--threads", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    return json.loads(out.read_text())


def _numbers(res):
    return [c["one"]["expectation"] for p in res["points"] for c in p["certificates"]]


def test_certify_by_id_records_id_revision_and_commit(offline_cache, tmp_path, capsys):
    hub = offline_cache
    step = _certify(REPO, hub, tmp_path, capsys, "--revision", "step1000", name="step.json")
    main_ = _certify(REPO, hub, tmp_path, capsys, name="main.json")
    s = step["settings"]
    assert s["model"] == REPO and s["input_spec"]["model"] == REPO
    assert s["input_spec"]["revision"] == "step1000" and main_["settings"]["input_spec"]["revision"] is None
    assert s["inputs"]["hub"]["repo_id"] == REPO
    assert s["inputs"]["hub"]["revision"] == "step1000" and s["inputs"]["hub"]["commit"] == STEP
    assert main_["settings"]["inputs"]["hub"]["revision"] == "main"
    assert main_["settings"]["inputs"]["hub"]["commit"] == MAIN
    assert _numbers(step) != _numbers(main_)  # other weights, other certificates
    # a commit hash is a revision too: the same weights as the ref that points to it
    by_commit = _certify(REPO, hub, tmp_path, capsys, "--revision", STEP, name="commit.json")
    assert by_commit["settings"]["inputs"]["hub"]["commit"] == STEP
    assert _numbers(by_commit) == _numbers(step)
    # the recorded spec repeats the run
    again = ws.InputSpec.from_dict(step["settings"]["input_spec"])
    assert again.model == REPO and again.revision == "step1000"


def test_the_cache_folder_is_a_model_too(offline_cache, tmp_path, capsys):
    folder = offline_cache["folder"]
    res = _certify(folder, offline_cache, tmp_path, capsys, name="f.json")
    assert res["settings"]["inputs"]["hub"]["commit"] == MAIN
    res = _certify(folder, offline_cache, tmp_path, capsys, "--revision", "step1000", name="g.json")
    assert res["settings"]["inputs"]["hub"]["commit"] == STEP and res["settings"]["inputs"]["hub"]["repo_id"] == REPO
    rc = main(["certify", "--model", str(folder), "--revision", "nope", "--list-points"])
    line = capsys.readouterr().err.strip()
    assert rc == 2 and len(line.splitlines()) == 1 and "'nope'" in line and "main, step1000" in line


def test_uncached_id_offline_is_one_line_naming_the_fetch_command(offline_cache, tmp_path, capsys):
    out = tmp_path / "never.json"
    rc = main(["certify", "--model", "org/missing", "--revision", "v2", "--data", str(offline_cache["text"]),
               "--out", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "org/missing" in lines[0] and "'v2'" in lines[0] and "`hf download org/missing --revision v2`" in lines[0]
    assert "HF_HUB_OFFLINE" in lines[0] and not out.exists()
    # a revision the cache does not hold, of a cached id: the same line
    rc = main(["certify", "--model", REPO, "--revision", "step2000", "--list-points"])
    err = capsys.readouterr().err
    assert rc == 2 and "`hf download org/tiny --revision step2000`" in err


def test_load_inputs_in_python_and_from_pretrained_agree(offline_cache):
    from transformers import AutoModelForCausalLM

    spec = ws.InputSpec(model=REPO, revision="step1000", data=str(offline_cache["text"]), seq_len=8,
                        n_train=8, n_test=8)
    inputs = ws.load_inputs(spec)
    assert inputs.info["hub"]["commit"] == STEP and inputs.spec.to_dict()["revision"] == "step1000"
    ref = AutoModelForCausalLM.from_pretrained(REPO, revision="step1000", cache_dir=str(offline_cache["cache"]),
                                               local_files_only=True)
    mine, theirs = inputs.model.state_dict(), ref.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    main_ = ws.checkpoint.load(REPO)
    assert main_.widthscope_hub["commit"] == MAIN
    w = "transformer.h.0.mlp.c_fc.weight"
    assert not torch.equal(main_.state_dict()[w], mine[w])
    # a model loaded at another revision than the spec asks for is refused, not probed
    with pytest.raises(WidthscopeError, match="revision 'step1000'.*loaded at revision 'main'"):
        ws.load_inputs(spec, model=main_)


def test_tokenizer_defaults_to_the_same_snapshot_and_takes_an_id(offline_cache):
    from widthscope.data.inputs import load_model, load_tokenizer

    m = load_model(REPO, revision="step1000")
    assert Path(m.widthscope_hf["directory"]).name == STEP
    own = load_tokenizer(None, m, "causal-lm")
    by_id = load_tokenizer(REPO, m, "causal-lm")
    assert Path(own.name_or_path).name == STEP and Path(by_id.name_or_path).name == STEP
    assert own("the of and")["input_ids"] == by_id("the of and")["input_ids"]


def test_input_kind_reads_the_cached_config(offline_cache):
    from widthscope.validate import input_kind

    assert input_kind(REPO) == "hf-causal-lm"
    assert input_kind(REPO, revision="step1000") == "hf-causal-lm"
    assert input_kind(str(offline_cache["folder"])) == "hf-causal-lm"
    assert input_kind("org/missing") is None and input_kind(REPO, revision="nope") is None


def test_revision_is_refused_where_it_means_nothing(offline_cache, capsys):
    rc = main(["certify", "--model", str(offline_cache["main"]), "--revision", "main", "--list-points"])
    line = capsys.readouterr().err.strip()
    assert rc == 2 and len(line.splitlines()) == 1 and "drop --revision" in line
    with pytest.raises(WidthscopeError, match="revision"):
        ws.InputSpec(model="builtin", revision="main")
    with pytest.raises(WidthscopeError, match="revision"):
        ws.InputSpec(model=REPO, revision="")
    # a local snapshot folder is an ordinary checkpoint, still recorded with its id and commit
    m = ws.checkpoint.load(offline_cache["folder"] / "snapshots" / STEP)
    assert m.widthscope_hub["repo_id"] == REPO and m.widthscope_hub["commit"] == STEP


def test_the_command_line_never_sets_the_offline_variables(offline_cache, monkeypatch, capsys):
    for k in OFFLINE_VARS:
        monkeypatch.delenv(k, raising=False)
    _quiet_offline()
    assert not any(k in os.environ for k in OFFLINE_VARS)
    assert main(["certify", "--model", str(offline_cache["main"]), "--list-points"]) == 0
    capsys.readouterr()
    assert not any(k in os.environ for k in OFFLINE_VARS)


def test_online_fetches_configs_tokenizer_and_safetensors_then_bin_only_when_needed(tmp_path, monkeypatch):
    import huggingface_hub

    from widthscope import hub as hubmod

    snap = tmp_path / "models--org--old" / "snapshots" / MAIN
    snap.mkdir(parents=True)
    calls = []

    def fake(repo_id, **kw):
        calls.append((repo_id, kw["revision"], kw.get("local_files_only", False), kw["allow_patterns"]))
        return str(snap)

    for k in OFFLINE_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    where, rec = hubmod.resolve_model("org/old", "v1")
    assert where == snap and rec.commit == MAIN and rec.revision == "v1"
    assert calls == [("org/old", "v1", False, hubmod.ALLOW), ("org/old", "v1", False, hubmod.ALLOW_BIN)]
    (snap / "model.safetensors").write_bytes(b"")
    calls.clear()
    hubmod.resolve_model("org/old")
    assert calls == [("org/old", "main", False, hubmod.ALLOW)]  # safetensors there: no .bin fetched
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls.clear()
    hubmod.resolve_model("org/old")
    assert calls == [("org/old", "main", True, hubmod.ALLOW)]  # offline: the cache only


def test_grow_takes_a_hub_id_and_revision(offline_cache, tmp_path, capsys):
    """grow resolves the id at the revision asked for (the weights of that revision are grown)."""
    out = {}
    for rev in ("step1000", None):
        path = tmp_path / f"g-{rev}.json"
        rc = main(["grow", "--model", REPO, *(["--revision", rev] if rev else []), "--data",
                   str(offline_cache["text"]), "--n-train", "16", "--n-test", "16", "--M", "4", "--K", "4",
                   "--steps", "2", "--seq-len", "8", "--threads", "1", "--out", str(path)])
        assert rc == 0, capsys.readouterr().err
        out[rev] = json.loads(path.read_text())
    spec = out["step1000"]["settings"]["input_spec"]
    assert spec["model"] == REPO and spec["revision"] == "step1000"
    before = [r["growth"][0]["loss_before"] for r in (out["step1000"], out[None])]
    assert before[0] != before[1]  # another revision's weights, another held-out loss
