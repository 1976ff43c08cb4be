"""Depth stacking by any factor (layer order, layer_idx, copies) and the growth callbacks under a real
``transformers.Trainer`` and a real Lightning ``Trainer``: a tiny LLaMA grown 2 → 8 layers mid-run."""

from __future__ import annotations

import math

import pytest
import torch

import widthscope.growth.callback as gcb
from widthscope.errors import WidthscopeError
from widthscope.growth.operators import stack_depth, stack_order

STEPS, GROW_AT = 12, 4


def tiny_llama(depth: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=depth,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    return LlamaForCausalLM(cfg)


def tokens(n: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (n, 12), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- stacking by a factor
@pytest.mark.parametrize(
    ("depth", "layout", "order"),
    [
        (4, "stack", [0, 1, 0, 1]),
        (8, "stack", [0, 1] * 4),
        (5, "stack", [0, 1, 0, 1, 1]),
        (8, "interleave", [0, 0, 0, 0, 1, 1, 1, 1]),
        (6, "interleave", [0, 0, 0, 1, 1, 1]),
    ],
)
def test_stack_to_any_depth_up_to_4x_is_a_valid_model(depth, layout, order):
    small = tiny_llama().eval()
    g = stack_depth(small, depth=depth, layout=layout)
    m = g.model
    assert g.detail["order"] == order == stack_order(2, depth, layout)
    assert m.config.num_hidden_layers == depth == len(m.model.layers)
    assert [layer.self_attn.layer_idx for layer in m.model.layers] == list(range(depth))
    old = dict(small.named_parameters())
    for j, i in enumerate(order):  # every copy's parameters equal its original's
        for n, p in m.model.layers[j].named_parameters():
            assert torch.equal(p, old[f"model.layers.{i}.{n}"]), (j, n)
            assert g.sources[f"model.layers.{j}.{n}"][0] == f"model.layers.{i}.{n}"
    x = tokens(2)
    out = m(x, use_cache=True)  # the key/value cache has one slot per layer
    assert torch.isfinite(out.logits).all()
    assert len(out.past_key_values.layers) == depth
    # not function-preserving (a copy is applied again), except the zeroed variant
    assert not torch.allclose(out.logits, small(x).logits, atol=1e-4)
    z = stack_depth(small, factor=depth // 2, layout=layout, mode="zero").model
    if depth % 2 == 0:
        assert torch.allclose(z(x).logits, small(x).logits, atol=1e-5)


def test_stack_arguments_are_checked():
    small = tiny_llama()
    with pytest.raises(WidthscopeError, match="one of order"):
        stack_depth(small, [0, 1], depth=4)
    with pytest.raises(WidthscopeError, match="at least the old"):
        stack_depth(small, depth=1)
    with pytest.raises(WidthscopeError, match="layout"):
        stack_depth(small, depth=4, layout="spiral")


# ----------------------------------------------------------------------------- transformers.Trainer
def _hf_run(tmp_path, callbacks):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Seen(TrainerCallback):  # the model's depth and the groups' learning rates at every step
        def __init__(self) -> None:
            self.layers: list[int] = []
            self.lrs: list[list[float]] = []

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
            self.layers.append(len(model.model.layers))
            self.lrs.append([g["lr"] for g in optimizer.param_groups])

    model = tiny_llama()
    ds = [{"input_ids": x, "labels": x} for x in tokens()]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
        weight_decay=0.1,
        warmup_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    seen = Seen()
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[seen, *callbacks])
    trainer.train()
    return model, trainer, seen


def test_hf_trainer_grows_a_tiny_llama_from_2_to_8_layers_and_trains_on(tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    cb = gcb.GrowthCallback(grow_at_step=GROW_AT, operator="stack_copy", target_depth=8)
    model, trainer, seen = _hf_run(tmp_path / "grow", [cb])
    plain_model, plain, _ = _hf_run(tmp_path / "plain", [])

    assert seen.layers == [2] * GROW_AT + [8] * (STEPS - GROW_AT)  # steps 5.. run the grown model
    assert trainer.model is model and model.config.num_hidden_layers == 8 == len(model.model.layers)
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(8))
    assert [e["step"] for e in cb.events] == [GROW_AT] and cb.events[0]["layers_after"] == 8

    # the optimizer holds every parameter exactly once; the old ones kept their state
    opt = trainer.optimizer.optimizer  # accelerate's wrapper
    held = [p for g in opt.param_groups for p in g["params"]]
    assert len(held) == len({id(p) for p in held}) == len(list(model.parameters()))
    assert {id(p) for p in held} == {id(p) for p in model.parameters()}
    # the Trainer's decay and no-decay groups, then one new group for the copies of each
    assert len(opt.param_groups) == 4
    old = {id(p) for g in opt.param_groups[:2] for p in g["params"]}
    assert all(int(opt.state[p]["step"]) == STEPS for g in opt.param_groups[:2] for p in g["params"])
    assert all(int(opt.state[p]["step"]) == STEPS - GROW_AT for g in opt.param_groups[2:] for p in g["params"])
    assert {id(p) for p in model.model.layers[:2].parameters()} | {id(model.lm_head.weight)} <= old
    assert old.isdisjoint(id(p) for p in model.model.layers[2:].parameters())  # the copies are new
    norms = {id(layer.input_layernorm.weight) for layer in model.model.layers}
    for k in (0, 1):  # each copy sits in the group settings of its original (no decay for norms)
        gk, new = opt.param_groups[k], opt.param_groups[k + 2]
        assert {key: v for key, v in gk.items() if key != "params"} == {
            key: v for key, v in new.items() if key != "params"
        }
        assert bool(norms & {id(p) for p in gk["params"]}) == bool(norms & {id(p) for p in new["params"]})
    # the new groups follow the schedule (warm-up then linear decay) like the old
    assert len(trainer.lr_scheduler.base_lrs) == len(trainer.lr_scheduler.lr_lambdas) == 4
    assert all(len(set(lrs)) == 1 for lrs in seen.lrs) and len(set(lrs[0] for lrs in seen.lrs)) > 3

    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    assert losses[:GROW_AT] == [e["loss"] for e in plain.state.log_history if "loss" in e][:GROW_AT]
    # logs untouched: the same entries with the same keys
    assert [sorted(e) for e in trainer.state.log_history] == [sorted(e) for e in plain.state.log_history]
    assert len(plain_model.model.layers) == 2


def test_hf_growth_by_a_schedule_and_a_callable_operator(tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    cb = gcb.GrowthCallback(
        when=lambda step: step >= 6, operator=lambda m: stack_depth(m, depth=6, layout="interleave", mode="zero")
    )
    model, trainer, seen = _hf_run(tmp_path, [cb])
    assert seen.layers == [2] * 6 + [6] * (STEPS - 6)
    assert cb.events[0]["operator"] == "stack_zero" and model.config.num_hidden_layers == 6


def test_callback_arguments_are_checked():
    pytest.importorskip("transformers")
    with pytest.raises(WidthscopeError, match="grow_at_step"):
        gcb.GrowthCallback(target_depth=8)
    with pytest.raises(WidthscopeError, match="target_depth"):
        gcb.GrowthCallback(grow_at_step=3, operator="stack_copy", target_width=64)
    with pytest.raises(WidthscopeError, match="unknown growth operator"):
        gcb.GrowthCallback(grow_at_step=3, operator="nope", target_depth=8)


# ----------------------------------------------------------------------------- Lightning
def test_lightning_grows_a_tiny_llama_from_2_to_8_layers_and_trains_on(tmp_path):
    pl = pytest.importorskip("lightning", reason="the Lightning callback needs lightning (extra widthscope[lightning])")

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_llama()
            self.losses: list[float] = []
            self.layers: list[int] = []

        def training_step(self, batch, i):
            self.layers.append(len(self.net.model.layers))
            loss = self.net(input_ids=batch[0], labels=batch[0]).loss
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    pl.seed_everything(0, verbose=False)
    lit = Lit()
    cb = gcb.GrowthLightningCallback(grow_at_step=GROW_AT, operator="stack_copy", target_depth=8, model=lit.net)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens()), batch_size=4)
    trainer = pl.Trainer(
        max_steps=STEPS,
        callbacks=[cb],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(lit, loader)
    assert lit.layers == [2] * GROW_AT + [8] * (STEPS - GROW_AT)
    assert lit.net.config.num_hidden_layers == 8 and all(math.isfinite(v) for v in lit.losses)
    assert [layer.self_attn.layer_idx for layer in lit.net.model.layers] == list(range(8))
    opt = trainer.optimizers[0]
    held = [p for g in opt.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in lit.parameters()} and len(held) == len(set(map(id, held)))
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert len(sched.base_lrs) == len(opt.param_groups) == 2
    assert opt.param_groups[1]["lr"] == pytest.approx(opt.param_groups[0]["lr"])


def test_width_growth_in_place_replaces_the_grown_tensors_in_the_optimizer():
    from widthscope.growth.operators import widen

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = tokens(4)
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
    emb, norm = model.model.embed_tokens.weight, model.model.layers[0].input_layernorm.weight
    g = widen(model, 48, ffn=96)
    origin = gcb.grow_in_place(model, g)
    gcb.add_to_optimizer(model, opt, None, origin)
    assert model.config.hidden_size == 48 and model.model.embed_tokens.weight.shape == (64, 48)
    held = {id(p) for grp in opt.param_groups for p in grp["params"]}
    assert held == {id(p) for p in model.parameters()}
    assert emb not in opt.state and norm not in opt.state  # replaced: gone with their state
    assert model.model.embed_tokens.weight not in opt.state  # the bigger tensor starts fresh
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    assert torch.isfinite(model(input_ids=x).logits).all()
