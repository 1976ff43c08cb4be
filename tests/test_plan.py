"""``--plan`` (widthscope.planning): the counted pieces against a brute-force oracle on the real model,
the whole-process totals, and what the user sees (the table, --plan-no-time, nothing written)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

from widthscope.data.inputs import resolve
from widthscope.data.spec import InputSpec
from widthscope.models.hf import load_hf
from widthscope.options import CertifyOptions, CertifyRunOptions
from widthscope.planning import Plan, RssPeak, peak_so_far, plan_certify, plan_grow, saved_bytes, since_start
from widthscope.probe import collect
from widthscope.probe.batches import index_batch

sys.path.insert(0, str(Path(__file__).parent))
import hf_tiny  # noqa: E402
from cli_run import run_cli  # noqa: E402

pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    hf_tiny.save_model(root / "llama", "llama")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(hf_tiny.corpus(200)))
    return root / "llama", corpus


def _spec(llama, **kw):
    d, corpus = llama
    return InputSpec(model=str(d), data=str(corpus), seq_len=16, n_train=32, n_test=32, **kw)


def _direct_saved(model, batch):
    """Autograd's saved tensors of one collect() pass, measured directly: every real storage once,
    the weights' storages left out."""
    seen: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        collect(model, [batch], progress=False)
    return sum(v for k, v in seen.items() if k not in weights)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


OPTS = CertifyOptions(M=(8, 16), draws=50, interventions="none")


def test_certify_plan_against_the_real_model(llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path), _files(llama[0])
    spec = _spec(llama)
    plan = plan_certify(spec, OPTS, CertifyRunOptions(batch_size=8))
    assert _files(tmp_path) == before[0] and _files(llama[0]) == before[1]  # nothing written
    model = load_hf(str(llama[0]))
    assert plan.parameters == sum(p.numel() for p in model.parameters())
    assert plan.weight_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    inputs = resolve(spec, model=model, show_progress=False)
    one, two = (index_batch(inputs.train, slice(0, n)) for n in (1, 2))
    direct = _direct_saved(model, two) - _direct_saved(model, one)
    assert plan.bytes_per_example is not None and abs(plan.bytes_per_example - direct) <= 0.1 * direct
    # the whole process: at least what this process has spent and holds so far
    assert plan.timed and plan.predicted_s is not None and plan.predicted_s > plan.parts[0][1] > 0
    assert plan.parts[0][0].startswith("process start") and plan.parts[0][1] <= since_start()
    assert plan.peak_bytes is not None and plan.peak_bytes >= plan.weight_bytes
    assert plan.max_batch is not None and plan.max_batch > 8
    d = plan.to_dict()
    assert d["predicted_s"] == plan.predicted_s and d["parts"][0]["part"].startswith("process start")
    assert "predicted wall time (whole process)" in plan.table()


def test_meta_count_equals_the_loaded_model(llama):
    meta = plan_certify(_spec(llama), OPTS, CertifyRunOptions(batch_size=8), time_run=False)
    real = plan_certify(_spec(llama), OPTS, CertifyRunOptions(batch_size=8))
    assert (meta.parameters, meta.weight_bytes) == (real.parameters, real.weight_bytes)
    assert not meta.timed and meta.predicted_s is None and "no time predicted" in meta.table()
    assert meta.dtype == "float32"
    assert plan_certify(_spec(llama, dtype="bfloat16"), OPTS, time_run=False).weight_bytes * 2 == meta.weight_bytes


def test_saved_bytes_counts_each_storage_once_and_no_weight():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    # tanh saves its output; linear saves its input (the weight is a parameter: left out)
    got = saved_bytes(lambda: torch.tanh(lin(x)).sum(), lin)
    assert got == 2 * 4 * 8 * 4


def test_pieces_measure_this_process():
    assert 0 < since_start() < 24 * 3600
    with RssPeak() as p:
        big = torch.ones(32 * 2**20 // 4)  # 32 MiB, touched
    assert p.peak >= big.numel() * 4 and peak_so_far() >= p.peak * 0.5
    a = Plan("x", "a", 1, 4, 4, 1, None, parts=(("process start, imports", 1.0), ("work", 2.0)), peak_bytes=10)
    assert a.timed and a.predicted_s == 3.0 and a.to_dict()["parts"][1] == {"part": "work", "seconds": 2.0}
    untimed = Plan("x", "a", 1, 4, 4, 1, None, parts=(("work", None),))
    assert not untimed.timed and untimed.predicted_s is None and "not predicted" in untimed.table()


def test_grow_plan_builtin_times_every_part():
    plan = plan_grow(None, steps=5, compare=True, M=8, K=8, n_train=64, n_test=32)
    names = [n for n, _ in plan.parts]
    assert names[0].startswith("process start") and "base training" in names[1]
    assert any(n.startswith("growing: 3 x 5") for n in names)  # best, worst, random
    assert any(n.startswith("continue") for n in names)
    assert plan.timed and plan.predicted_s > 0 and plan.peak_bytes >= peak_so_far() * 0.5
    assert plan.parameters == plan.parameters and plan.bytes_per_example > 0


def test_cli_certify_plan_prints_and_runs_nothing(llama, tmp_path, capsys, monkeypatch):
    import widthscope.cli.certify as cli_certify

    def refuse(*a, **k):
        raise AssertionError("--plan ran the certify run")

    monkeypatch.setattr(cli_certify, "run_certify", refuse)
    out = tmp_path / "res" / "certify.json"
    d, corpus = llama
    argv = ["certify", "--model", str(d), "--data", str(corpus), "--seq-len", "16", "--n-train", "32"]
    argv += ["--n-test", "32", "--M", "8,16", "--batch-size", "8", "--out", str(out)]
    rc, lines, cap = run_cli(argv + ["--plan"], capsys)
    assert rc == 0, cap.err
    assert "cost plan: certify" in cap.out
    line = next(ln for ln in cap.out.splitlines() if "predicted wall time" in ln)
    assert float(re.search(r"\)\s+([0-9.]+(?:e[+-]?[0-9]+)?) s", line).group(1)) > 0  # "3.2 s" or "385 s (6.4 min)"
    assert "predicted peak memory (whole process, RSS)" in cap.out
    assert not out.exists() and not Path(str(out) + ".parts").exists() and not out.parent.exists()
    rc, lines, cap = run_cli(argv + ["--plan-no-time"], capsys)
    assert rc == 0 and "no time predicted" in cap.out and "not predicted" in cap.out
    assert not out.parent.exists()


def test_cli_grow_plan_trains_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import widthscope.cli.grow as cli_grow

    def refuse(*a, **k):
        raise AssertionError("--plan ran the growth")

    monkeypatch.setattr(cli_grow, "run_grow", refuse)
    out = tmp_path / "res" / "grow.json"
    argv = ["grow", "--model", "builtin", "--steps", "5", "--M", "8", "--K", "8", "--out", str(out)]
    rc, lines, cap = run_cli(argv + ["--plan-no-time"], capsys)
    assert rc == 0, cap.err
    assert "cost plan: grow" in cap.out and "blocks grown" in cap.out and "no time predicted" in cap.out
    assert "largest batch that fits" in cap.out
    assert not out.parent.exists()
    assert os.listdir(tmp_path) == []
