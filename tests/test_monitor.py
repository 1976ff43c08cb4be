"""The alignment monitor (issue 23): exact restore, rows equal certify's, schedule, events, adapters."""
from __future__ import annotations

import copy
import json
import math
import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

from widthscope.certification import certify_dict
from widthscope.errors import WidthscopeError
from widthscope.monitor import AlignmentMonitor, TrainingState, log_steps
from widthscope.monitor.pools import as_batches
from widthscope.stats import CrossMoments, certificate

POINTS = ["2", "5"]
REL = 1e-12  # same code path on the same float64 tensors: agreement to rounding


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Dropout(0.2),
                         nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def make_data(n: int = 384, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g, dtype=torch.float64)
    W = torch.randn(6, 3, generator=g, dtype=torch.float64)
    return X, (X @ W).argmax(1)


def pools() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    X, Y = make_data()
    return (X[:192], Y[:192]), (X[192:], Y[192:])


def train(model: nn.Module, steps: int, monitor: AlignmentMonitor | None = None, extra_draw_at: int | None = None,
          on_step=None) -> None:
    """A loop that uses every global RNG: torch (shuffling, dropout), numpy and python noise."""
    X, Y = make_data(512, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    torch.manual_seed(10)
    np.random.seed(11)
    random.seed(12)
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randperm(512)[:64]
        noise = torch.from_numpy(np.random.normal(0, 0.01, (64, 6))) * random.random()
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(X[idx] + noise), Y[idx])
        loss.backward()
        opt.step()
        if extra_draw_at == step:
            torch.rand(1)
        if monitor is not None:
            monitor.step(model, step)
        if on_step is not None:
            on_step(model, step)


def monitor_for(model: nn.Module, **kw) -> AlignmentMonitor:
    tr, te = pools()
    kw.setdefault("draws", 200)
    kw.setdefault("points", POINTS)
    return AlignmentMonitor(model, tr, te, M=kw.pop("M", 32), **kw)


# ----------------------------------------------------------------------------- exactness
def test_training_with_monitor_is_bit_identical():
    plain, watched, disturbed = make_model(), make_model(), make_model()
    train(plain, 12)
    mon = monitor_for(watched, every=3)
    train(watched, 12, monitor=mon)
    assert [r["step"] for r in mon.rows] == [3, 3, 6, 6, 9, 9, 12, 12]
    for (k, a), b in zip(plain.state_dict().items(), watched.state_dict().values()):
        assert torch.equal(a, b), k
    # The comparison is sensitive: one extra RNG draw mid-training changes the weights.
    train(disturbed, 12, extra_draw_at=3)
    assert not all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), disturbed.state_dict().values()))


def test_rows_equal_certify_on_a_copy_at_that_step():
    model = make_model()
    copies = {}
    mon = monitor_for(model, at=[4, 9], seed=3)
    train(model, 9, monitor=mon, on_step=lambda m, s: copies.__setitem__(s, copy.deepcopy(m)) if s in (4, 9) else None)
    tr, te = pools()
    from widthscope.probe import batched

    for step in (4, 9):
        res = certify_dict(copies[step], batched(*tr, batch_size=64), batched(*te, batch_size=64), points=POINTS,
                      M=[32], draws=200, seed=3, interventions=None, progress=False)
        for pt in res["points"]:
            row = next(r for r in mon.rows if r["step"] == step and r["point"] == pt["point"])
            c = pt["certificates"][0]
            for col, ref in (("d_par", c["two"]["d_par"]), ("d_2", c["two"]["d_2"]),
                             ("d_align", c["two"]["d_align"]), ("b_exact", c["two"]["b_exact"]),
                             ("b_align", c["two"]["b_align"]), ("d_align_one", c["one"]["d_align"]),
                             ("misalignment", c["misalignment"]["probability"])):
                if ref is None:
                    assert row[col] is None, (step, col)
                else:
                    assert math.isclose(row[col], ref, rel_tol=REL, abs_tol=1e-300), (step, col, row[col], ref)
            # The planner's M = K is the smallest size reaching delta.
            cross = CrossMoments(**pt["cross_moments"])
            m = row["plan_M_exact"]
            if m is not None:
                assert certificate(cross, M=m, K=m).b_exact <= row["delta"]
                assert m == 1 or certificate(cross, M=m - 1, K=m - 1).b_exact > row["delta"]
    assert any(not r["vacuous"] for r in mon.rows)  # the comparison covered defined certificates


def test_rows_equal_certify_on_a_checkpoint_saved_at_that_step(tmp_path):
    from widthscope import checkpoint
    from widthscope.models import build
    from widthscope.probe import batched, insertion_points

    torch.manual_seed(0)
    model = build("mlp", 32, in_dim=6, out_dim=3, depth=2, activation="tanh").double()
    points = insertion_points(model)
    tr, te = pools()
    mon = AlignmentMonitor(model, tr, te, points=points, M=32, at=[5], draws=200, seed=1)
    X, Y = make_data(512, seed=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for step in range(1, 8):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[:64 * step][-64:]), Y[:64 * step][-64:]).backward()
        opt.step()
        if mon.step(model, step):
            checkpoint.save(model, tmp_path / "ckpt")
    loaded = checkpoint.load(tmp_path / "ckpt")
    res = certify_dict(loaded, batched(*tr, batch_size=64), batched(*te, batch_size=64), points=points, M=[32],
                  draws=200, seed=1, interventions=None, progress=False)
    assert len(mon.rows) == len(points) == len(res["points"])
    assert any(not r["vacuous"] for r in mon.rows), "a defined certificate is compared"
    for row, pt in zip(mon.rows, res["points"]):
        two = pt["certificates"][0]["two"]
        assert row["point"] == pt["point"] and row["vacuous"] == two["vacuous"]
        for col in ("d_par", "d_2", "d_align", "b_exact", "b_align"):
            assert (row[col] is None) == (two[col] is None), col
            if two[col] is not None:
                assert math.isclose(row[col], two[col], rel_tol=1e-9), (col, row[col], two[col])


def test_restore_state_rng_modes_grads():
    model = make_model()
    mon = monitor_for(model, every=1)
    model.train()
    model[3].eval()  # mixed modes must come back as they were
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = [(p.grad, p.grad.clone()) for p in model.parameters()]
    model[4].weight.grad = None
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(8)
    state = TrainingState(model)
    expect = (torch.rand(3), np.random.rand(3), random.random())
    state.restore()
    modes = [m.training for m in model.modules()]
    rows = mon.probe(model, 1)
    assert len(rows) == len(POINTS)
    assert [m.training for m in model.modules()] == modes
    assert model[4].weight.grad is None
    for p, (g, v) in zip(model.parameters(), grads):
        if p is not model[4].weight:
            assert p.grad is g and torch.equal(p.grad, v)
        assert p.requires_grad
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expect[0]) and np.array_equal(got[1], expect[1]) and got[2] == expect[2]


# ----------------------------------------------------------------------------- schedule, events, files
def test_schedules():
    assert log_steps(40) == [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32]
    model = make_model()
    log = monitor_for(model)
    assert [s for s in range(40) if log.should_probe(s)] == log_steps(39)
    at = monitor_for(model, at=[5, 2, 5])
    assert [s for s in range(10) if at.should_probe(s)] == [2, 5]
    every = monitor_for(model, every=4)
    assert [s for s in range(13) if every.should_probe(s)] == [0, 4, 8, 12]
    assert every.step(model, 3) == []


class _Clock:
    """Fake seconds: each forward of the model costs ``forward_s``; the loop adds ``rest_s`` per step."""

    def __init__(self, model, forward_s):
        self.t = 0.0
        model.register_forward_hook(lambda *a: setattr(self, "t", self.t + forward_s))

    def __call__(self):
        return self.t


def test_budget_keeps_the_monitor_share_under_the_cap():
    model = make_model()
    clock = _Clock(model, forward_s=0.013)  # a probe = 3 + 3 pool batches = 0.078 s, a training step 0.513 s
    mon = monitor_for(model, every=1, budget=0.05, clock=clock)
    assert mon.budget == 0.05 and mon._predict_s == pytest.approx(6 * 0.013)  # one batch x 3, per pool
    X, Y = make_data(512, seed=2)
    spent = train_s = 0.0
    expect = []
    assert mon.step(model, 0) == []  # before training: no training time to spend a share of
    for step in range(1, 41):
        model.train()
        nn.functional.cross_entropy(model(X[:64]), Y[:64])  # one forward: 0.013 s
        clock.t += 0.5
        train_s += 0.513
        if spent + 0.078 <= 0.05 * train_s:  # the rule, by hand: monitor time incl. this probe <= 5%
            expect.append(step)
            spent += 0.078
        mon.step(model, step)
        assert mon.spent_s <= 0.05 * (train_s + 1e-9)
    got = sorted({r["step"] for r in mon.rows})
    assert got == expect and len(got) >= 10 and mon.skipped == [s for s in range(41) if s not in expect]
    assert mon.spent_s == pytest.approx(spent)


def test_budget_defaults():
    import math

    model = make_model()
    assert monitor_for(model).budget == 0.05                         # the log-spaced default is capped
    assert monitor_for(model, every=3).budget is None                # an explicit schedule is followed
    assert monitor_for(model, at=[1], budget=0.2).budget == 0.2
    free = monitor_for(model, budget=math.inf)                       # the default schedule, uncapped
    assert all(free.step(model, s) for s in (0, 1, 2)) and not free.skipped
    capped = monitor_for(model)                                      # step 0: no training time yet
    assert capped.step(model, 0) == [] and capped.skipped == [0]


def test_certified_event_first_time_only():
    model = make_model()
    mon = monitor_for(model, every=1, delta=0.5, M=64)
    train(model, 6, monitor=mon)
    for pt in POINTS:
        ok = [r["step"] for r in mon.rows if r["point"] == pt and not r["vacuous"] and r["b_exact"] <= 0.5]
        ev = [e for e in mon.events if e["point"] == pt]
        assert len(ev) == (1 if ok else 0)
        if ok:
            assert ev[0]["step"] == min(ok) and ev[0]["kind"] == "certified"
    assert mon.events, "the setting was chosen so that some point certifies at delta=0.5"


def test_jsonl_rows_and_resume(tmp_path):
    out = tmp_path / "mon.jsonl"
    model = make_model()
    mon = monitor_for(model, every=2, out=out)
    train(model, 4, monitor=mon)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["kind"] == "settings"
    assert [x for x in lines if x["kind"] == "row"] == json.loads(json.dumps(mon.rows))
    assert [x for x in lines if x["kind"] == "certified"] == json.loads(json.dumps(mon.events))
    again = monitor_for(model, every=2, out=out)  # a resumed run keeps rows, skips recorded steps
    assert len(again.rows) == len(mon.rows) and not again.should_probe(2) and again.should_probe(6)
    with pytest.raises(WidthscopeError, match="other settings"):
        monitor_for(model, every=3, out=out)


def test_pool_forms_give_the_same_rows():
    model = make_model()
    (X, Y), te = pools()
    ref = monitor_for(model, every=1).probe(model, 1)
    g = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=48)
    before = torch.get_rng_state()
    for form in ([(X[i:i + 40], Y[i:i + 40]) for i in range(0, 192, 40)], loader):
        mon = AlignmentMonitor(model, form, te, points=POINTS, M=32, every=1, draws=200)
        for a, b in zip(mon.probe(model, 1), ref):
            assert math.isclose(a["b_exact"], b["b_exact"], rel_tol=1e-9) and a["n_train"] == 192
    shuffled = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=48, shuffle=True)
    AlignmentMonitor(model, shuffled, te, points=POINTS, M=32)  # drawing it used the torch RNG ...
    assert torch.equal(torch.get_rng_state(), before)  # ... and the monitor put the state back
    small = AlignmentMonitor(model, (X[:40], Y[:40]), te, points=POINTS, M=32)  # one batch, not two
    assert len(small.train) == 1 and small.train[0][0].shape == (40, 6)
    ids = torch.randint(0, 10, (20, 5), generator=g)
    batches = as_batches({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "train", 8)
    assert [b["input_ids"].shape[0] for b in batches] == [8, 8, 4]


def test_plot_over_training(tmp_path):
    from widthscope.monitor.plot import plot, series

    model = make_model()
    mon = monitor_for(model, every=2, out=tmp_path / "m.jsonl")
    train(model, 4, monitor=mon)
    s = series(mon.rows)
    assert sorted(s) == sorted(POINTS)
    for pt in POINTS:
        mine = [r for r in mon.rows if r["point"] == pt]
        assert s[pt]["step"] == [float(r["step"]) for r in mine]
        assert all((v != v) if r["d_align"] is None else v == r["d_align"] for v, r in zip(s[pt]["d_align"], mine))
    png = plot(tmp_path / "m.jsonl", tmp_path / "m.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(WidthscopeError, match="no monitor rows"):
        plot([], tmp_path / "x.png")


# ----------------------------------------------------------------------------- bad input
class Counting(nn.Module):
    """Updates a buffer in every forward, eval mode included: a probe would change it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3).double()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


@pytest.mark.parametrize("kw, match", [
    (dict(points=["nope"]), "nope"),
    (dict(M=500), "larger than the train pool"),
    (dict(every=0), "every"),
    (dict(every=2, at=[3]), "either every"),
    (dict(at=[]), "at is empty"),
    (dict(delta=1.5), "delta"),
    (dict(pool="bogus"), "pool"),
    (dict(budget=0), "budget must be"),
    (dict(budget=-0.1), "budget must be"),
    (dict(budget="5%"), "budget must be"),
])
def test_bad_input_at_construction(kw, match):
    with pytest.raises(WidthscopeError, match=match) as exc:
        monitor_for(make_model(), **kw)
    assert "\n" not in str(exc.value)


def test_token_pool_too_small_is_refused_at_construction():
    ids = torch.randint(0, 16, (6, 4), generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    with pytest.raises(WidthscopeError, match="larger than the train pool of 24 positions"):
        AlignmentMonitor(model, ids, ids, points=["0"], M=30, pool="token")
    assert AlignmentMonitor(model, ids, ids, points=["0"], M=24, pool="token").probe(model, 0)[0]["n_train"] == 24


def test_model_that_cannot_be_restored_is_refused():
    model = Counting()
    tr, te = pools()
    with pytest.raises(WidthscopeError, match="cannot restore this model exactly.*calls"):
        AlignmentMonitor(model, tr, te, points=["lin"], M=16)
    assert float(model.calls) == 0  # put back before refusing


@pytest.fixture
def one_rank_group(tmp_path):
    """A real 1-rank gloo process group (a file store: no port), destroyed afterwards."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already running")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _fsdp_models():
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    two = make_model()
    fully_shard(two[4])  # FSDP2: the class of the sharded module becomes an FSDPModule subclass
    fully_shard(two)
    with warnings.catch_warnings():  # one rank: FSDP1 says it switches to NO_SHARD
        warnings.simplefilter("ignore", UserWarning)
        one = FullyShardedDataParallel(make_model(), device_id=torch.device("cpu"))
    return {"FSDP2": two, "FSDP1": one}


class _Forwards:
    """Counts forward calls of every submodule: a refusal must come before any probe."""

    def __init__(self, model):
        self.n = 0
        for m in model.modules():
            m.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))


def test_fsdp_models_are_refused_before_any_probe(one_rank_group):
    tr, te = pools()
    for kind, model in _fsdp_models().items():
        seen = _Forwards(model)
        with pytest.raises(WidthscopeError, match=f"FSDP-sharded model.*{kind}.*DDP") as exc:
            AlignmentMonitor(model, tr, te, points=POINTS, M=32, draws=50)
        assert "\n" not in str(exc.value) and seen.n == 0, kind
        plain = make_model()  # built on an unsharded model, then handed a sharded one at a step
        mon = AlignmentMonitor(plain, tr, te, points=POINTS, M=32, draws=50, every=1)
        with pytest.raises(WidthscopeError, match="FSDP-sharded"):
            mon.step(model, 1)
        assert not mon.rows


def test_hf_callback_refuses_fsdp_at_train_begin(one_rank_group):
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from widthscope.monitor.hf import AlignmentCallback

    cb = AlignmentCallback(monitor_for(make_model(), every=2))
    state, control = TrainerState(), TrainerControl()
    with pytest.raises(WidthscopeError, match="TrainingArguments.fsdp='full_shard'"):
        cb.on_train_begin(SimpleNamespace(fsdp="full_shard"), state, control, model=make_model())
    with pytest.raises(WidthscopeError, match="FSDP-sharded model.*FSDP2"):
        cb.on_train_begin(SimpleNamespace(fsdp=""), state, control, model=_fsdp_models()["FSDP2"])
    assert not cb.monitor.rows


def test_lightning_callback_refuses_fsdp_strategies(one_rank_group):
    pytest.importorskip("lightning")
    from types import SimpleNamespace

    from widthscope.monitor.lightning import AlignmentCallback

    cb = AlignmentCallback(monitor_for(make_model(), every=2))
    FSDPStrategy = type("FSDPStrategy", (), {})  # the strategy's class name is what is checked
    with pytest.raises(WidthscopeError, match="Lightning's FSDPStrategy"):
        cb.setup(SimpleNamespace(strategy=FSDPStrategy()), None, "fit")
    with pytest.raises(WidthscopeError, match="FSDP-sharded model"):
        cb.on_train_start(SimpleNamespace(strategy=object(), global_step=0), _fsdp_models()["FSDP1"])
    assert not cb.monitor.rows


# ----------------------------------------------------------------------------- adapters
def test_hf_callback_logs_through_the_trainer():
    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState

    from widthscope.monitor.hf import AlignmentCallback

    class FakeHandler:  # stands for Trainer.callback_handler.on_log: what every logging integration receives
        def __init__(self) -> None:
            self.logged: list[dict] = []

        def on_log(self, args, state, control, logs):
            control.should_log = False  # as the real handler does
            self.logged.append(dict(logs))
            return control

    class FakeTrainer:
        def __init__(self) -> None:
            self.callback_handler = FakeHandler()

    model = make_model()
    trainer = FakeTrainer()
    cb = AlignmentCallback(monitor_for(model, every=2), trainer=trainer)
    state, control = TrainerState(), TrainerControl()
    for step in range(1, 5):
        state.global_step = step
        control.should_log = True  # the Trainer's own log is due at this step: the callback must keep it so
        assert cb.on_step_end(None, state, control, model=model) is control
        assert control.should_log
    logged = trainer.callback_handler.logged
    assert [len(x) > 0 for x in logged] == [True, True]
    assert "align/2/b_exact" in logged[0] and "loss" not in logged[0]
    row = next(r for r in cb.monitor.rows if r["step"] == 2 and r["point"] == "2")
    assert logged[0]["align/2/b_exact"] == row["b_exact"]
    assert [h["step"] for h in state.log_history] == [2, 4]  # the monitor's own entries
    bare = AlignmentCallback(monitor_for(model, every=2))
    state.global_step = 2
    with pytest.warns(UserWarning, match="no trainer"):
        bare.on_step_end(None, state, control, model=model)
    assert state.log_history[-1]["step"] == 2


def _hf_run(tmp_path, with_monitor: bool):
    from transformers import Trainer, TrainingArguments

    from widthscope.models import build
    from widthscope.monitor.hf import attach

    torch.manual_seed(0)
    model = build("llama", 32, depth=2, vocab_size=64, max_seq_len=16)
    for layer in model.model.layers:  # dropout in training: the run consumes the torch RNG
        layer.self_attn.attention_dropout = 0.2
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (48, 16), generator=g)
    ds = [{"input_ids": x, "labels": x} for x in ids[:32]]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8,
                             logging_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    mon = None
    if with_monitor:
        mon = AlignmentMonitor(model, ids[:16], ids[16:32], points=["model.layers.1"], M=8, every=2, draws=50)
        attach(trainer, mon)
    trainer.train()
    return model, trainer, mon


def test_hf_trainer_tiny_run(tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    model, trainer, mon = _hf_run(tmp_path / "a", True)
    assert sorted({r["step"] for r in mon.rows}) == [0, 2, 4]
    logged = [h for h in trainer.state.log_history if "align/model.layers.1/b_exact" in h]
    assert [h["step"] for h in logged] == [0, 2, 4]
    assert "loss" in str(trainer.state.log_history)  # the Trainer's own logging goes on as before
    plain, _, _ = _hf_run(tmp_path / "b", False)
    for (k, a), b in zip(plain.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k


def _lightning_run(pl, tmp_path, with_monitor: bool):
    from lightning.pytorch.loggers import CSVLogger

    from widthscope.monitor.lightning import AlignmentCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()  # dropout: the run consumes the torch RNG

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, i):
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    pl.seed_everything(0, verbose=False)
    lm = Module()
    tr, te = pools()
    mon = AlignmentMonitor(lm, tr, te, points=["net.2"], M=16, every=2, draws=50) if with_monitor else None
    X, Y = make_data(128, seed=4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=32, shuffle=True)
    trainer = pl.Trainer(max_steps=4, callbacks=[AlignmentCallback(mon)] if mon else [], enable_checkpointing=False,
                         logger=CSVLogger(str(tmp_path)), log_every_n_steps=1, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(lm, loader)
    return lm, trainer, mon


def test_lightning_callback(tmp_path):
    pl = pytest.importorskip("lightning", reason="the Lightning adapter needs lightning (extra widthscope[lightning])")
    lm, trainer, mon = _lightning_run(pl, tmp_path / "a", True)
    assert sorted({r["step"] for r in mon.rows}) == [0, 2, 4]
    trainer.logger.save()
    csv = next((tmp_path / "a").rglob("metrics.csv")).read_text()
    assert "align/net.2/b_exact" in csv.splitlines()[0]  # the logger received the values
    plain, _, _ = _lightning_run(pl, tmp_path / "b", False)
    for (k, a), b in zip(plain.state_dict().items(), lm.state_dict().values()):
        assert torch.equal(a, b), k


def test_docs_example_runs_and_shows_what_the_page_says(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "monitor.md").read_text()
    code = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/monitor.md", "exec"), {})
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    first = [ln for ln in lines if ln[0] == "row" and ln[1] == "0"]
    assert len(first) == 2 and all(float(ln[4]) < 0.05 and 1.5 < float(ln[3]) < 2.0 for ln in first)
    assert sum(ln[0] == "certified" for ln in lines) == 2
    assert all(ln[3] == "None" for ln in lines if ln[0] == "row" and ln[1] == "100")
    assert (tmp_path / "align.jsonl").exists()


# ----------------------------------------------------------------------------- two ranks (gloo)
def _distributed_run(out) -> AlignmentMonitor:
    model = make_model()
    mon = monitor_for(model, at=[0, 3], out=out, batch_size=32)
    mon.step(model, 0)
    train(model, 3, monitor=mon)
    return mon


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", WIDTHSCOPE_PROGRESS="0", PYTHONPATH=str(root / "src"),
               WIDTHSCOPE_DIST_TIMEOUT="120")
    two = tmp_path / "two.jsonl"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        __file__, str(two)], env=env, cwd=root, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run (OMP_NUM_THREADS=1): another thread count sums in another order
    try:
        one = _distributed_run(tmp_path / "one.jsonl")
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in two.read_text().splitlines()]
    assert sum(x["kind"] == "settings" for x in rows) == 1  # rank 0 alone wrote
    got = [x for x in rows if x["kind"] == "row"]
    assert len(got) == len(one.rows) == 2 * len(POINTS)
    for a, b in zip(got, one.rows):
        assert (a["step"], a["point"]) == (b["step"], b["point"])
        for col in ("d_par", "d_2", "d_align", "b_exact", "b_align", "misalignment", "plan_M_exact", "expectation"):
            if b[col] is None:
                assert a[col] is None, col
            else:
                assert math.isclose(a[col], b[col], rel_tol=REL), (col, a[col], b[col])


if __name__ == "__main__":  # the worker of test_two_ranks_equal_one_process, under torchrun
    import sys

    from widthscope import distributed

    distributed.init_from_env("gloo")
    _distributed_run(sys.argv[1])
    distributed.barrier()
