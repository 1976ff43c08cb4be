"""Training plans (``grow --plan``, ``linearize --plan``; widthscope.probe.cost / cost_plan) and the
attention kernel of the memory counts.

FLOPs of a training step are checked against a count by hand on a tiny MLP (a Linear layer costs
``2 * in * out`` per example forward; backward, its weight gradient as much again and, where a
gradient flows further back, its input gradient as much again); the batch-that-fits arithmetic
against the stage's numbers; the commands print a plan, exit 0, train nothing and write nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from widthscope.probe import insertion_points
from widthscope.probe.cost import count_pass, count_step, optimizer_bytes
from widthscope.probe.cost_plan import TrainPlan, TrainStage

sys.path.insert(0, str(Path(__file__).parent))
import hf_tiny  # noqa: E402
from cli_run import run_cli  # noqa: E402

IN, HID, OUT = 7, 11, 5


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT)).double()


def _batches(n1: int = 1, n2: int = 2):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n2, IN, generator=g, dtype=torch.float64), torch.randint(0, OUT, (n2,), generator=g)
    return (x[:n1], y[:n1]), (x, y)


def test_count_step_flops_by_hand():
    model = _mlp()
    c = count_step(model, _batches())
    first, second = 2 * IN * HID, 2 * HID * OUT  # per example, forward
    assert c["flops_forward"] == first + second
    # backward: both weight gradients, and the input gradient of the second layer (the data needs none)
    assert c["flops_backward"] == first + second + second
    assert c["trainable"] == sum(p.numel() for p in model.parameters())
    assert c["trainable_bytes"] == 8 * c["trainable"]
    # only the last layer trainable: its weight gradient alone, nothing flows further back
    last = count_step(model, _batches(), params=list(model[2].parameters()))
    assert last["flops_forward"] == first + second and last["flops_backward"] == second
    assert last["trainable"] == HID * OUT + OUT
    assert all(p.requires_grad for p in model.parameters())  # restored


def test_count_step_memory_chord_and_meta_equals_real():
    model = _mlp()
    a = count_step(model, _batches(1, 2))
    b = count_step(model, _batches(1, 9))
    # the peak is a chord through the two sizes: exact at both (up to the floor of the division); the
    # weight gradients set the peak of small batches, the activations that of large ones, so the
    # chord through the run's own batch is what the plans use
    assert a["activation_bytes_per_example"] > 0 and b["activation_bytes_per_example"] > 0
    assert a["fixed_bytes"] + a["activation_bytes_per_example"] == b["fixed_bytes"] + b["activation_bytes_per_example"]
    meta = _mlp().to("meta")
    (x1, y1), (x2, y2) = _batches()
    m = count_step(meta, ((x1.to("meta"), y1.to("meta")), (x2.to("meta"), y2.to("meta"))))
    assert m == a  # the same operations on the same shapes: sizes and counts agree exactly


def test_optimizer_state_bytes():
    assert optimizer_bytes("adamw", 100) == 200 and optimizer_bytes("adam", 100) == 200
    assert optimizer_bytes("sgd-momentum", 100) == 100 and optimizer_bytes("sgd", 100) == 0
    with pytest.raises(ValueError, match="optimizer 'lbfgs'"):
        optimizer_bytes("lbfgs", 1)


def _stage(**kw) -> TrainStage:
    base = dict(
        name="s",
        runs=2,
        steps=10,
        batch_size=8,
        optimizer="adamw",
        parameters=1000,
        trainable=100,
        weight_bytes=4000,
        trainable_bytes=400,
        flops_forward=30,
        flops_backward=50,
        activation_bytes_per_example=1000,
        fixed_bytes=500,
        step_s=0.5,
    )
    return TrainStage(**{**base, **kw})


def test_batch_that_fits_arithmetic():
    s = _stage()
    assert s.optimizer_bytes == 800 and s.batch_bytes == 8 * 1000 + 500
    assert s.step_bytes == 4000 + 800 + 8500
    assert s.flops == 2 * 10 * 8 * 80 and s.train_s == pytest.approx(2 * 10 * 0.5, rel=1e-12)
    free = 1_000_000
    fits = s.max_batch(free)
    assert fits == (free - 4000 - 800 - 500) // 1000
    assert fits * 1000 + 5300 <= free < (fits + 1) * 1000 + 5300
    other = _stage(name="t", activation_bytes_per_example=3000, optimizer="sgd")
    plan = TrainPlan(
        command="x",
        model="m",
        dtype="float32",
        dtype_source="t",
        counted_on="loaded",
        parameters=1000,
        weight_bytes=4000,
        stages=(s, other),
        device="cpu",
        memory_bytes=free,
        memory_source="given",
        other_bytes=(("data", 10_000),),
        phases=(("probe", 50_000),),
        predicted_s=None,
    )
    assert plan.max_batch == min(s.max_batch(free - 10_000), other.max_batch(free - 10_000))
    assert plan.max_batch == (free - 10_000 - 4000 - 500) // 3000
    assert plan.peak_bytes == max(s.step_bytes, other.step_bytes, 50_000) + 10_000
    d = plan.to_dict()
    assert d["stages"][1]["optimizer_bytes"] == 0 and d["max_batch"] == plan.max_batch
    assert "largest batch that fits" in plan.table()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("accelerate")
    root = tmp_path_factory.mktemp("plan-train")
    hf_tiny.save_model(root / "llama", "llama")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(hf_tiny.corpus(200)))
    return root / "llama", corpus


def test_attention_counted_as_the_run_takes_it(llama):
    """On meta, SDPA is counted as the fused CPU kernel the run takes: the meta count of the probe pass
    matches the real pass on the loaded model (its own kernel); eager attention keeps its matrices."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from widthscope.models.hf import load_hf

    real = load_hf(llama[0])
    names = insertion_points(real)
    cfg = AutoConfig.from_pretrained(str(llama[0]))

    def meta_count(impl: str, ids: torch.Tensor) -> dict:
        with init_empty_weights(include_buffers=True):
            meta = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
        return count_pass(meta.eval(), ids.to("meta"), names, device="cpu")

    ids = torch.randint(0, 50, (1, 64))
    got = count_pass(real, ids, names)
    # the loss's small tensors differ (the surrogate skips the data checks): 5%
    assert meta_count("sdpa", ids)["peak_bytes"] == pytest.approx(got["peak_bytes"], rel=0.05)
    # eager keeps each head's (L x L) float32 probabilities for the backward; the fused kernel keeps a
    # log-sum-exp per row; at least a third of the matrices' bytes apart (eager saves the scores' inputs
    # and its grouped heads' repeats differently)
    L = 256  # long enough that the matrices outweigh q, k, v of the tiny model's heads
    long = torch.randint(0, 50, (1, L))
    eager, sdpa = meta_count("eager", long), meta_count("sdpa", long)
    heads = cfg.num_attention_heads * cfg.num_hidden_layers
    assert eager["saved_bytes"] - sdpa["saved_bytes"] >= heads * L * L * 4 / 3
    assert eager["flops_forward"] == sdpa["flops_forward"]  # FLOPs: the math kernel's matmuls either way


def test_cli_linearize_plan_writes_nothing(tmp_path, capsys, monkeypatch):
    toml = tmp_path / "lin.toml"
    toml.write_text(
        'name = "tiny"\nwidths = [8, 12, 16, 20, 24]\nseeds = [0]\n[data]\nname = "digits"\nn_train = 32\nn_test = 32\n'
        "[train]\nsteps = 5\nalphas = [0.0]\nlog_steps = [0, 5]\n[correlations]\nmeasure = []\n"
    )
    monkeypatch.chdir(tmp_path)
    rc, lines, cap = run_cli(["linearize", str(toml), "--out", str(tmp_path / "runs"), "--plan"], capsys)
    assert rc == 0, cap.err
    assert "training stages: linearize" in cap.out and "width 16 (network + linearization)" in cap.out
    predicted = next(ln for ln in cap.out.splitlines() if "predicted wall time" in ln).split()[-2]
    assert float(predicted) > 0
    assert not (tmp_path / "runs").exists()
