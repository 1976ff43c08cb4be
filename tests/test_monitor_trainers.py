"""The monitor's Trainer integrations leave the Trainer alone (issue "Meet Hugging Face users where they are").

``transformers.Trainer``: the Trainer's own ``log_history`` (loss, grad_norm, learning_rate, epoch,
step) is identical, float for float, with and without the callback, and the monitor's values are
extra entries; every schedule probes the first and last step; a probe the budget skips is said in
the log. Lightning: a module without ``forward()`` is monitored through its network, and the loggers
receive values at probed steps only.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from test_monitor import _Clock, make_data, make_model, pools
from widthscope.errors import WidthscopeError
from widthscope.monitor import AlignmentMonitor, log_steps

TIMING = ("train_runtime", "train_samples_per_second", "train_steps_per_second")  # wall-clock: differ run to run
STEPS = 60


# ----------------------------------------------------------------------------- transformers.Trainer
def _is_align(entry: dict) -> bool:
    return any(k.startswith("align/") for k in entry)


def _trainer_entries(history: list[dict]) -> list[dict]:
    """The Trainer's own entries (the monitor's left out), without the wall-clock speed metrics."""
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history if not _is_align(h)]


def _hf_run(
    tmp_path, monitor_kw: dict | None, steps: int = STEPS, stop_at: int | None = None, stop_after_monitor: bool = False
):
    """A tiny Llama (built from a config, attention dropout on) trained ``steps`` steps by a real Trainer,
    logging every 10 steps; a recording callback registered before the monitor stands for the
    TensorBoard/W&B integrations."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from widthscope.monitor.hf import attach

    class Recorder(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append({**logs, "step": state.global_step})

    class Stop(TrainerCallback):  # early stopping, decided in on_step_end
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == stop_at:
                control.should_training_stop = True

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=16,
        attention_dropout=0.2,
    )
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 64, (96, 16), generator=torch.Generator().manual_seed(0))
    ds = [{"input_ids": x, "labels": x} for x in ids[:64]]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    rec = Recorder()
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[rec])
    if stop_at is not None and not stop_after_monitor:
        trainer.add_callback(Stop())
    mon = None
    if monitor_kw is not None:
        mon = AlignmentMonitor(model, ids[64:80], ids[80:96], points=["model.layers.1"], M=8, draws=50, **monitor_kw)
        attach(trainer, mon)
    if stop_at is not None and stop_after_monitor:  # a stop the monitor's on_step_end does not see
        trainer.add_callback(Stop())
    trainer.train()
    return model, trainer, mon, rec


@pytest.fixture(scope="module")
def plain_hf(tmp_path_factory):
    model, trainer, _, rec = _hf_run(tmp_path_factory.mktemp("plain"), None)
    return model, trainer.state.log_history, rec.logs


def test_hf_trainer_log_history_identical_with_and_without_the_monitor(tmp_path, plain_hf):
    plain_model, plain_history, plain_rec = plain_hf
    model, trainer, mon, rec = _hf_run(tmp_path, {"every": 20})
    history = trainer.state.log_history
    # The Trainer's own entries: the same, float for float (loss, grad_norm, learning_rate, epoch, step) ...
    ours = _trainer_entries(history)
    assert ours == _trainer_entries(plain_history)
    assert [h["step"] for h in ours if "loss" in h] == [10, 20, 30, 40, 50, 60]  # none deleted, none merged
    # ... and what the integrations received from them too.
    assert _trainer_entries(rec.logs) == _trainer_entries(plain_rec)
    # The monitor's values: separate entries at its steps, first and last included, nothing of the Trainer's.
    align = [h for h in history if _is_align(h)]
    assert [h["step"] for h in align] == [0, 20, 40, 60] == sorted({r["step"] for r in mon.rows})
    assert all(set(h) <= {"epoch", "step"} | {k for k in h if k.startswith("align/")} for h in align)
    assert [h["step"] for h in rec.logs if _is_align(h)] == [0, 20, 40, 60]  # the integrations got them
    row = next(r for r in mon.rows if r["step"] == 40)
    assert align[2]["align/model.layers.1/b_exact"] == row["b_exact"]
    for (k, a), b in zip(plain_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k


def test_hf_default_schedule_probes_first_and_last_and_says_what_it_skips(tmp_path, plain_hf, caplog):
    caplog.set_level(logging.INFO, logger="widthscope.monitor")
    _, trainer, mon, _ = _hf_run(tmp_path, {})  # the log-spaced default, under its 5% budget
    probed = sorted({r["step"] for r in mon.rows})
    assert probed[0] == 0 and probed[-1] == STEPS  # whatever the budget allowed in between
    assert sorted(set(probed) | set(mon.skipped)) == sorted(set(log_steps(STEPS)) | {STEPS})
    said = [r.getMessage() for r in caplog.records if r.name == "widthscope.monitor"]
    for s in mon.skipped:  # every skipped planned probe is said in the log
        assert any(f"skipped the probe planned at step {s}:" in m for m in said), s
    if mon.skipped:
        assert "budget of 5% of training time" in said[0]
    assert said[-1].startswith("alignment monitor: probed step(s) 0, ") and f"{STEPS};" in said[-1]
    assert _trainer_entries(trainer.state.log_history) == _trainer_entries(plain_hf[1])


@pytest.mark.parametrize("after", [False, True], ids=["stop-seen-at-step-end", "stop-decided-after"])
def test_hf_at_schedule_gets_first_and_last_and_an_early_stop(tmp_path, after):
    _, trainer, mon, _ = _hf_run(tmp_path, {"at": [5]}, steps=40, stop_at=23, stop_after_monitor=after)
    assert trainer.state.global_step == 23
    assert sorted({r["step"] for r in mon.rows}) == [0, 5, 23]  # first, planned, the step the run stopped at
    assert [h["step"] for h in trainer.state.log_history if _is_align(h)] == [0, 5, 23]
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [10, 20]


# ----------------------------------------------------------------------------- the plain monitor
def test_bounds_force_first_and_last_whatever_the_budget(caplog):
    caplog.set_level(logging.WARNING, logger="widthscope.monitor")
    model = make_model()
    clock = _Clock(model, forward_s=0.01)  # only the probes' forwards take (fake) time: no training time at all
    tr, te = pools()
    mon = AlignmentMonitor(model, tr, te, points=["2"], M=32, draws=50, budget=0.05, clock=clock)
    mon.bounds(0, 9)
    for step in range(10):
        mon.step(model, step)
    assert sorted({r["step"] for r in mon.rows}) == [0, 9]  # every planned probe is over budget but these
    assert mon.skipped == [1, 2, 3, 4, 6, 8]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 6 and said[0].startswith("alignment monitor: skipped the probe planned at step 1: ")
    assert said[0].endswith("to probe every planned step")
    assert all(f"planned at step {s}:" in m for s, m in zip(mon.skipped, said))
    assert "probed step(s) 0, 9; skipped planned step(s) 1, 2, 3, 4, 6, 8 (budget 5%)" in mon.summary()
    stopped = AlignmentMonitor(model, tr, te, points=["2"], M=32, draws=50, every=4, clock=clock)
    assert stopped.step(model, 5, final=True) and stopped.step(model, 5, final=True) == []  # stopped at 5: once
    # at= is exactly its steps unless bounds are given
    at = AlignmentMonitor(model, tr, te, points=["2"], M=32, draws=50, at=[3])
    assert [s for s in range(10) if at.should_probe(s)] == [3]
    at.bounds(0, 9)
    assert [s for s in range(10) if at.should_probe(s)] == [0, 3, 9]


def test_skipped_probes_are_written_to_the_out_file(tmp_path):
    import json
    import math

    model = make_model()
    tr, te = pools()
    mon = AlignmentMonitor(model, tr, te, points=["2"], M=32, draws=50, out=tmp_path / "m.jsonl", clock=lambda: 0.0)
    mon._predict_s = math.inf
    for step in range(3):
        mon.step(model, step)
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["step"]) for x in lines[1:]] == [("skipped", 0), ("skipped", 1), ("skipped", 2)]
    again = AlignmentMonitor(model, tr, te, points=["2"], M=32, draws=50, out=tmp_path / "m.jsonl")
    assert not again.rows and again.should_probe(1)  # a resumed run reads skipped lines as nothing done


# ----------------------------------------------------------------------------- Lightning
def _lightning_run(
    pl,
    tmp_path,
    with_monitor: bool,
    max_steps: int = 8,
    every: int = 3,
    accumulate: int = 1,
    stop_at: int | None = None,
):
    from lightning.pytorch.loggers import CSVLogger

    from widthscope.monitor.lightning import AlignmentCallback

    class NoForward(pl.LightningModule):  # no forward(): the network is called in training_step
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()  # dropout: the run consumes the torch RNG

        def training_step(self, batch, i):
            loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Stop(pl.Callback):
        def on_train_batch_end(self, trainer, *a):
            if trainer.global_step == stop_at:
                trainer.should_stop = True

    pl.seed_everything(0, verbose=False)
    lm = NoForward()
    tr, te = pools()
    mon = AlignmentMonitor(lm.net, tr, te, points=["2"], M=16, every=every, draws=50) if with_monitor else None
    X, Y = make_data(128, seed=4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16, shuffle=True)
    callbacks = ([AlignmentCallback(mon)] if mon else []) + ([Stop()] if stop_at is not None else [])
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        enable_checkpointing=False,
        logger=CSVLogger(str(tmp_path)),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        accumulate_grad_batches=accumulate,
    )
    trainer.fit(lm, loader)
    trainer.logger.save()
    return lm, trainer, mon


def _csv(tmp_path) -> list[dict]:
    import csv

    with next(tmp_path.rglob("metrics.csv")).open() as f:
        return list(csv.DictReader(f))


def test_lightning_module_without_forward_logs_at_probed_steps_only(tmp_path):
    pl = pytest.importorskip("lightning", reason="the Lightning adapter needs lightning (extra widthscope[lightning])")
    lm, trainer, mon = _lightning_run(pl, tmp_path / "a", True)
    assert sorted({r["step"] for r in mon.rows}) == [0, 3, 6, 8]  # first, every=3, last
    rows = _csv(tmp_path / "a")
    key = "align/2/b_exact"
    logged = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
    expect = [(r["step"], r["b_exact"]) for r in mon.rows]
    assert logged == expect  # once per probed step, step 0 included, exact values; never a stale repeat
    assert {int(r["step"]) for r in rows if r.get("train_loss")} == set(range(8))  # Lightning's own logging goes on
    plain, _, _ = _lightning_run(pl, tmp_path / "b", False)
    for (k, a), b in zip(plain.state_dict().items(), lm.state_dict().values()):
        assert torch.equal(a, b), k


def test_lightning_accumulation_and_early_stop(tmp_path):
    pl = pytest.importorskip("lightning", reason="the Lightning adapter needs lightning (extra widthscope[lightning])")
    _, _, mon = _lightning_run(pl, tmp_path / "acc", True, max_steps=4, every=2, accumulate=2)
    assert [r["step"] for r in mon.rows] == [0, 2, 4]  # after optimizer steps, each once
    _, trainer, mon = _lightning_run(pl, tmp_path / "stop", True, max_steps=8, every=4, stop_at=5)
    assert trainer.global_step == 5 and [r["step"] for r in mon.rows] == [0, 4, 5]
    assert [int(r["step"]) for r in _csv(tmp_path / "stop") if r.get("align/2/b_exact")] == [0, 4, 5]


def test_lightning_monitor_on_the_wrong_module_is_refused(tmp_path):
    pl = pytest.importorskip("lightning", reason="the Lightning adapter needs lightning (extra widthscope[lightning])")
    import copy
    from types import SimpleNamespace

    from widthscope.monitor.lightning import AlignmentCallback

    class NoForward(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

    lm = NoForward()
    tr, te = pools()
    with pytest.raises(WidthscopeError, match=r"NoForward has no forward\(\).*AlignmentMonitor\(module.net"):
        AlignmentMonitor(lm, tr, te, points=["net.2"], M=16, draws=50)
    mon = AlignmentMonitor(copy.deepcopy(lm.net), tr, te, points=["2"], M=16, draws=50, every=2)
    with pytest.raises(WidthscopeError, match="not part of the NoForward being trained"):
        AlignmentCallback(mon).on_train_start(SimpleNamespace(strategy=object(), global_step=0), lm)
    assert not mon.rows


# ----------------------------------------------------------------------------- the budget over a whole run
def test_the_budget_keeps_room_for_the_last_probe(caplog):
    """With bounds, a planned probe is made only when the monitor's time, this probe and the last
    step's included, stays within the budget: the run's total share ends within the budget."""
    caplog.set_level(logging.WARNING, logger="widthscope.monitor")
    model = make_model()
    clock = _Clock(model, forward_s=0.013)  # a probe = 3 + 3 pool batches = 0.078 s, a training step 0.513 s
    tr, te = pools()
    mon = AlignmentMonitor(model, tr, te, points=["2"], M=32, draws=50, every=1, budget=0.05, clock=clock)
    last = 60
    mon.bounds(0, last)
    X, Y = make_data(512, seed=2)
    spent = train_s = 0.0
    expect, without_reserve = [], []
    for step in range(last + 1):
        if step:
            model.train()
            nn.functional.cross_entropy(model(X[:64]), Y[:64])  # one forward: 0.013 s
            clock.t += 0.5
            train_s += 0.513
        if step in (0, last) or spent + 2 * 0.078 <= 0.05 * train_s:  # the rule, by hand
            expect.append(step)
            spent += 0.078
        elif spent + 0.078 <= 0.05 * train_s:
            without_reserve.append(step)  # what the rule without the last step's room would have added
        mon.step(model, step)
    got = sorted({r["step"] for r in mon.rows})
    assert got == expect and len(got) >= 8 and without_reserve  # the reserve mattered on this run
    assert mon.spent_s == pytest.approx(spent) and mon.spent_s <= 0.05 * (train_s + 1e-9)
    assert mon.skipped == [s for s in range(last + 1) if s not in expect]
    said = [r.getMessage() for r in caplog.records if r.name == "widthscope.monitor"]
    assert len(said) == len(mon.skipped) and all("+ the last step's ~0.078 s" in m for m in said)
    share = mon.summary().split(" s in probes = ")[1]
    assert float(share.split("%")[0]) == pytest.approx(100 * spent / train_s, rel=2e-3)  # printed to 3 digits


def test_bench_monitor_trainers_quick_writes_its_rows(tmp_path):
    """benchmarks/bench_monitor.py --trainers --quick runs both frameworks at the default schedule and
    writes its rows under "trainers", leaving the file's other rows alone (no timing is checked)."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (extra widthscope[hf])")
    pytest.importorskip("lightning", reason="the Lightning adapter needs lightning (extra widthscope[lightning])")
    import importlib
    import json
    import sys
    from pathlib import Path

    from widthscope.monitor import MonitorOptions

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = importlib.import_module("bench_monitor")
    out = tmp_path / "monitor.json"
    out.write_text(json.dumps({"machine": {"cpus": 1}, "rows": [{"width": 1}]}))
    bench.main(["--trainers", "--quick", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["rows"] == [{"width": 1}] and data["machine"] == {"cpus": 1}
    rows = data["trainers"]["rows"]
    assert [r["framework"] for r in rows] == ["transformers.Trainer", "lightning.Trainer"]
    for r in rows:
        assert set(bench.TRAINER_COLS) <= set(r) and r["schedule"] == "default"
        assert r["probed_steps"][0] == 0 and r["probed_steps"][-1] == r["steps"]  # first and last, always
        assert r["probes"] + r["skipped"] == len(set(log_steps(r["steps"])) | {r["steps"]})
        assert MonitorOptions.from_dict(r["options"]) == MonitorOptions(M=16, draws=1000, batch_size=32)
        assert r["identical_weights"] is True and r["per_probe_s"] > 0 and r["plain_s"] > 0
    assert rows[0]["identical_log_history"] is True
