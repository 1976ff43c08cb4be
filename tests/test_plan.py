"""``certify --plan``: the cost plan (widthscope.certification.plan) against direct counts on the loaded model.

A tiny LLaMA saved with ``save_pretrained`` is planned on the meta device (no weights read) and
compared with the model ``load_hf`` loads: parameters, weight bytes at the dtype, FLOPs of one
probed example (FlopCounterMode around ``collect`` itself), autograd's saved bytes (measured on
real storages). The built-in model is planned for real. The command prints and writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from widthscope.certification.plan import CostPlan, count_pass, plan_run
from widthscope.data.inputs import resolve
from widthscope.data.spec import InputSpec
from widthscope.models.hf import load_hf
from widthscope.options import CertifyOptions, CertifyRunOptions
from widthscope.probe import collect, insertion_points
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


def _saved_bytes(model, batch):
    """Autograd's saved tensors of one collect() pass, each real storage once, weights excluded."""
    seen: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), sdpa_kernel(SDPBackend.MATH):
        collect(model, [batch], progress=False)
    return sum(v for k, v in seen.items() if k not in weights)


def test_hf_plan_on_meta_matches_the_loaded_model(llama):
    spec = _spec(llama)
    plan = plan_run(spec, CertifyOptions(M=(8, 16)), CertifyRunOptions(batch_size=8), time_batch=False)
    assert isinstance(plan, CostPlan) and plan.counted_on == "meta"
    model = load_hf(llama[0])
    assert plan.parameters == sum(p.numel() for p in model.parameters())
    assert plan.dtype == "float32" and plan.weight_bytes == plan.parameters * 4
    assert plan.points == len(insertion_points(model))
    inputs = resolve(spec, model=model, show_progress=False)
    one = index_batch(inputs.train, slice(0, 1))
    # the same pass on real weights, counted by FlopCounterMode (attention through its matmuls: the
    # fused CPU kernel is not counted by FlopCounterMode; the plan counts the math kernel's)
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
        collect(model, [one], progress=False)
    assert plan.flops_per_example == fc.get_total_flops()
    assert 0 < plan.flops_forward < plan.flops_per_example
    # saved bytes: the plan's meta count against real storages; the loss's small tensors differ
    # (the plan's surrogate skips the attention-mask bookkeeping), so 15%
    assert plan.saved_bytes_per_example == pytest.approx(_saved_bytes(model, one), rel=0.15)
    eight = index_batch(inputs.train, slice(0, 8))
    assert plan.saved_bytes_per_example * 8 == pytest.approx(_saved_bytes(model, eight), rel=0.15)
    # the activation gradients at the points: one (seq_len, hidden) float32 tensor each
    assert plan.gradient_bytes_per_example == plan.points * 16 * 32 * 4
    assert plan.predicted_s is None and plan.batch_s is None


def test_plan_assumes_the_dtype_given(llama):
    plan = plan_run(_spec(llama, dtype="bfloat16"), CertifyOptions(M=(8,)), time_batch=False)
    assert plan.dtype == "bfloat16" and plan.dtype_source == "--dtype"
    assert plan.weight_bytes == plan.parameters * 2
    assert "bfloat16 (--dtype)" in plan.table()


def test_count_pass_meta_equals_real_for_a_built_model():
    from widthscope.models import build

    torch.manual_seed(0)
    model = build("mlp", 16, in_dim=8, out_dim=3, depth=2).eval()
    x, y = torch.randn(1, 8), torch.randint(0, 3, (1,))
    names = insertion_points(model)
    real = count_pass(model, (x, y), names)
    with FlopCounterMode(display=False) as fc:
        collect(model, [(x, y)], progress=False)
    assert real["flops_forward"] + real["flops_backward"] == fc.get_total_flops()
    meta_model = build("mlp", 16, in_dim=8, out_dim=3, depth=2).to("meta").eval()
    meta = count_pass(meta_model, (x.to("meta"), y.to("meta")), names)
    # the same operations on the same shapes: counts and sizes agree exactly
    keys = ("flops_forward", "flops_backward", "gradient_bytes", "peak_bytes", "forward_peak_bytes", "flops_after")
    assert {k: meta[k] for k in keys} == {k: real[k] for k in keys}
    assert real["peak_bytes"] > real["forward_peak_bytes"] > 0


def test_builtin_plan_times_one_batch():
    spec = InputSpec(model="builtin", n_train=64, n_test=64)
    plan = plan_run(spec, CertifyOptions(M=(8, 16), draws=50), CertifyRunOptions(batch_size=16))
    assert plan.counted_on == "loaded" and plan.parameters > 0
    assert plan.weight_bytes == plan.parameters * 4
    assert plan.probe_batches == 8 and plan.intervention_forwards == plan.points * 4 * 16
    assert plan.batch_s is not None and plan.batch_s > 0
    assert plan.predicted_s is not None and plan.predicted_s > plan.batch_s
    # bias interventions keep the K held-out outputs before each point (shaped as the point gradients)
    assert plan.prefix_bytes == 16 * plan.gradient_bytes_per_example
    assert 0 < plan.intervention_share < 1
    # the largest batch: what the memory holds after the weights, the samples and the prefix, per example
    per = plan.probe_peak_bytes_per_example
    assert per >= plan.saved_bytes_per_example + plan.gradient_bytes_per_example  # both are alive at the backward
    assert plan.memory_bytes is not None and plan.max_batch is not None
    left = plan.memory_bytes - plan.weight_bytes - plan.sample_bytes - plan.prefix_bytes
    assert plan.max_batch * per <= left < (plan.max_batch + 1) * per
    assert plan.intervention_rows == 64 and plan.intervention_bytes == 64 * plan.forward_peak_bytes_per_example
    larger = max(plan.batch_bytes, plan.intervention_bytes)
    assert plan.peak_bytes == plan.weight_bytes + plan.sample_bytes + plan.prefix_bytes + larger
    d = plan.to_dict()
    assert d["flops_per_example"] == plan.flops_forward + plan.flops_backward and d["dtype"] == "float32"


def test_cli_plan_prints_and_runs_nothing(llama, tmp_path, capsys, monkeypatch):
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
    text = cap.out
    assert "cost plan" in text and "float32 (the checkpoint's config)" in text
    predicted = next(ln for ln in text.splitlines() if "predicted wall time" in ln).split()[-2]
    assert float(predicted) > 0
    assert not out.exists() and not Path(str(out) + ".parts").exists() and not out.parent.exists()
    rc, lines, cap = run_cli(argv + ["--plan-no-time"], capsys)
    assert rc == 0 and "the meta device" in cap.out and "no time predicted" in cap.out
    assert not out.parent.exists()
