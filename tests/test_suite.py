"""A suite of existing checkpoints as a sweep (issue 31): tiny GPT-NeoX models of three widths, each
at two revisions, written into a genuine hub-cache layout (blobs, snapshots of symlinks, refs) and
read offline; one certify run per (model, revision) through `widthscope sweep`, resumable and atomic;
the report's width-series and over-training pages."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

import hf_tiny
from widthscope.cli import main
from widthscope.sweeps.suite import step_of

WIDTHS = (16, 32, 48)
REVS = ("step1", "step2")


def _commit(width: int, rev: str) -> str:
    return hashlib.sha1(f"{width}-{rev}".encode()).hexdigest()  # 40 hex digits, as the hub's


def _save(directory: Path, width: int, seed: int) -> Path:
    import torch
    import transformers as tf

    tok = hf_tiny.save_tokenizer(directory)
    cfg = tf.GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=width,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * width,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    tf.GPTNeoXForCausalLM(cfg).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite-hub")
    cache = root / "cache"
    for w in WIDTHS:
        for i, rev in enumerate(REVS):
            src = _save(root / f"src-{w}-{rev}", w, seed=10 * w + i)
            # main points at the last revision, as a training run's final checkpoint
            hf_tiny.hub_put(cache, f"org/tiny-{w}", src, _commit(w, rev), (rev, "main") if rev == REVS[-1] else (rev,))
    text = root / "train.txt"
    text.write_text("\n\n".join(hf_tiny.corpus(60, seed=0)) + "\n")
    return {"cache": cache, "text": text, "root": root}


@pytest.fixture
def offline(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    return hub


def _config(hub, tmp: Path, extra: str = "", certify: str = "", name: str = "suite.toml") -> Path:
    models = ", ".join(f'"org/tiny-{w}"' for w in WIDTHS)
    text = hub["text"]
    p = tmp / name
    p.write_text(f"""
[suite]
name = "tiny-suite"
label = "tiny"
models = [{models}]
revisions = ["step1", "step2"]
data = "{text}"
seq_len = 8
n_train = 12
n_test = 12
batch_size = 6
threads = 1
{extra}
[suite.certify]
M = [4, 8]
draws = 50
interventions = "none"
{certify}
""")
    return p


@pytest.fixture(scope="module")
def ran(hub, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_CACHE", str(hub["cache"]))
    tmp = tmp_path_factory.mktemp("suite-run")
    cfg, out = _config(hub, tmp), tmp / "out"
    rc = main(["sweep", str(cfg), "--out", str(out), "--no-progress"])
    yield {"cfg": cfg, "out": out, "rc": rc}
    mp.undo()


def _cells(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]


def test_step_of_reads_training_steps_from_revision_names():
    assert [step_of(r) for r in ("step1000", "global_step20", "checkpoint-7", "main", "v1.0", None)] == [
        1000,
        20,
        7,
        None,
        None,
        None,
    ]


def test_every_cell_records_id_revision_and_the_resolved_commit(ran):
    assert ran["rc"] == 0
    cells = _cells(ran["out"])
    assert len(cells) == len(WIDTHS) * len(REVS)
    seen = set()
    for c in cells:
        hub = c["settings"]["inputs"]["hub"]  # the cell file is the certify result itself
        w = int(c["cell"]["model"].rsplit("-", 1)[1])
        rev = c["cell"]["revision"]
        assert hub["repo_id"] == c["cell"]["model"] and hub["revision"] == rev
        assert hub["commit"] == _commit(w, rev)
        assert c["settings"]["width"] == w and c["options"]["certify"]["draws"] == 50
        al = [r for r in c["rows"] if r["kind"] == "alignment"]
        assert al and {(r["width"], r["revision"], r["commit"], r["step"]) for r in al} == {
            (w, rev, _commit(w, rev), step_of(rev))
        }
        assert {(r["M"], r["K"]) for r in al} == {(4, 4), (8, 8)}
        seen.add((w, rev))
    assert seen == {(w, r) for w in WIDTHS for r in REVS}


def test_results_differ_across_revisions(ran):
    by = {}
    for c in _cells(ran["out"]):
        vals = [r["one_expectation"] for r in c["rows"] if r["kind"] == "alignment"]
        by[(c["cell"]["model"], c["cell"]["revision"])] = vals
    for w in WIDTHS:
        a, b = by[(f"org/tiny-{w}", "step1")], by[(f"org/tiny-{w}", "step2")]
        assert len(a) == len(b)
        # other weights: every certificate differs far beyond rounding
        assert all(abs(x - y) > 1e-6 * max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def test_rerun_resumes_and_a_damaged_cell_runs_again(ran, offline, capsys):
    out, cfg = ran["out"], ran["cfg"]
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")}
    assert main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert f"ran 0 cell(s), {len(stamps)} already finished" in text
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")} == stamps
    # --dry-run lists every cell with its resolved commit, all finished
    assert main(["sweep", str(cfg), "--out", str(out), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    for w in WIDTHS:
        for rev in REVS:
            assert re.search(rf"org/tiny-{w}\s.*{rev}\s.*{_commit(w, rev)[:12]}", plan), plan
    assert re.findall(r"\s(yes|no)\s*$", plan, re.M) == ["yes"] * len(stamps)
    # the estimate counts each checkpoint's parameters from its safetensors header
    from safetensors.torch import load_file

    from widthscope.sweeps.suite import parameters

    snap = offline["cache"] / "models--org--tiny-16" / "snapshots" / _commit(16, "step1")
    n16 = sum(t.numel() for t in load_file(snap / "model.safetensors").values())
    assert parameters(snap) == n16 and f"{n16:,}" in plan
    total = sum(
        6 * parameters(p) * (12 + 12) * 8
        for p in (offline["cache"]).glob("models--*/snapshots/*")
        if p.name in {_commit(w, r) for w in WIDTHS for r in REVS}
    )
    shown = float(re.search(r"estimated compute: (\S+) FLOPs over 6 cached", plan).group(1))
    assert shown == pytest.approx(total, rel=5e-3)  # printed to 3 significant digits
    victim = sorted(stamps)[0]
    before = json.loads((out / "cells" / victim).read_text())
    (out / "cells" / victim).write_text('{"cell": ')  # a torn write
    assert main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"ran 1 cell(s), {len(stamps) - 1} already finished" in captured.out
    assert "damaged cell file" in captured.err
    after = json.loads((out / "cells" / victim).read_text())
    assert after["settings"]["inputs"]["hub"] == before["settings"]["inputs"]["hub"]
    # the same model, revision and seeds: the same numbers (same code path on the same inputs)
    assert [r.get("one_expectation") for r in after["rows"]] == [r.get("one_expectation") for r in before["rows"]]


def test_report_pages_name_every_width_and_revision(ran, offline, capsys):
    out = ran["out"]
    assert main(["report", str(out)]) == 0  # default --out: OUT/report
    printed = capsys.readouterr().out
    assert "width-series: " in printed and "over-training: " in printed
    for page in ("report.html", "width-series.html", "over-training.html"):
        assert (out / "report" / page).is_file(), page
    ws = (out / "report" / "width-series.html").read_text()
    ot = (out / "report" / "over-training.html").read_text()
    assert ws.count('src="data:image/png;base64,') == 1 == ot.count('src="data:image/png;base64,')  # one suite
    for w in WIDTHS:
        for rev in REVS:
            commit = _commit(w, rev)[:12]
            cell = f"<tr><td>{w}</td><td class=l>{rev}</td><td>{step_of(rev)}</td><td class=l>{commit}</td>"
            assert cell in ws and cell in ot, (w, rev)


def test_bad_suite_configs_are_one_line_before_any_work(offline, tmp_path, capsys):
    hub = offline
    cases = [
        (
            _config(hub, tmp_path, certify="drawz = 5", name="a.toml"),
            "[suite.certify]: unknown key(s) 'drawz' (did you mean 'draws'?)",
        ),
        (
            _config(hub, tmp_path, certify="n_etas = 0", name="b.toml"),  # CertifyOptions' own check and words
            "sweep config [suite.certify]: n_etas 0: must be a whole number in 1..100 (step sizes)",
        ),
        (
            _config(hub, tmp_path, certify='estimator = "fancy"', name="d.toml"),
            "sweep config [suite.certify]: estimator 'fancy': choose one of unbiased, plugin",
        ),
        (_config(hub, tmp_path, extra="seq_len_ = 3", name="c.toml"), "unknown key(s) 'seq_len_'"),
        (_config(hub, tmp_path).read_text().replace('"step1", "step2"', '"step1", "step9"'), "step9"),
        (
            _config(hub, tmp_path).read_text().replace('"org/tiny-16", ', '"org/tiny-16", "org/tiny-16", '),
            "models lists 'org/tiny-16' twice",
        ),
    ]
    for i, (cfg, msg) in enumerate(cases):
        if isinstance(cfg, str):
            p = tmp_path / f"edited-{i}.toml"
            p.write_text(cfg)
            cfg = p
        out = tmp_path / "never"
        rc = main(["sweep", str(cfg), "--out", str(out)])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and msg in lines[0], (msg, err)
        assert not (out / "cells").exists() or not list((out / "cells").glob("*.json"))


def test_report_options_are_recorded_and_read_back_with_config(ran, offline, capsys):
    from widthscope.report.options import ReportOptions

    out = ran["out"]
    rec = out / "report" / "report.json"
    if not rec.is_file():
        assert main(["report", str(out)]) == 0
    first = json.loads(rec.read_text())
    assert ReportOptions.from_dict(first["options"]) == ReportOptions(out=str(out / "report"))
    assert first["pages"] == ["report.html", "width-series.html", "over-training.html"]
    # --config starts from the recorded options; a flag given overrides its field only
    assert main(["report", str(out), "--config", str(rec), "--title", "Tiny suite"]) == 0
    capsys.readouterr()
    again = ReportOptions.from_dict(json.loads(rec.read_text())["options"])
    assert again == ReportOptions(out=str(out / "report"), title="Tiny suite")
    assert "<title>Tiny suite</title>" in (out / "report" / "report.html").read_text()
    rc = main(["report", str(out), "--config", str(out / "nope.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--config" in err[0] and "not found" in err[0]


def test_shipped_suite_config_and_docs_example_validate():
    import tomllib

    from widthscope.sweeps.suite import load_suite, plan_suite

    root = Path(__file__).resolve().parents[1]
    cfg = load_suite(tomllib.loads((root / "configs" / "pythia-suite.toml").read_text()), stem="pythia-suite")
    assert len(cfg.models) == 6 and all(m.startswith("EleutherAI/pythia-") for m in cfg.models)
    cells = plan_suite(cfg)
    assert len(cells) == 6 * len(cfg.revisions) and all(step_of(r) for r in cfg.revisions)
    doc = (root / "docs" / "sweeps.md").read_text()
    block = re.search(r"## A public model suite\n.*?```toml\n(.*?)```", doc, re.S).group(1)
    ex = load_suite(tomllib.loads(block))
    assert ex.name == "pythia-suite" and [c["revision"] for c in plan_suite(ex)][:2] == ["step1000", "step143000"]
