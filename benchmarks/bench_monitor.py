"""Cost of the alignment monitor on the demo's LLaMA training, measured side by side in one process.

The demo's training (``configs/demo-llama.toml``: LLaMA-style, depth 4, seq 64, batch 16, 150
AdamW steps; widths 32–256; random token ids here, the cost does not depend on the text) is run
by several identical models in lockstep: a plain one and one per monitor schedule, trained in
**interleaved blocks** of ``block`` steps (plain block, then each monitored block, then the next
plain block, ...), so a change of machine load hits all of them alike. Each monitor gets a clock
that runs only during its own model's blocks, so its ``budget`` sees its own training time.

Schedules (pools of ``n_pool`` + ``n_pool`` sequences, all 4 block outputs, ``M = K = 16``,
1000 draws): ``default`` (the log-spaced default under its 5% budget), ``log`` (the same steps,
no cap) and, when ``--every`` is given, ``every=N``.

Reported per (width, schedule): ``probes`` made; ``step_s`` (median plain step); ``probe_s``
(median probe); ``probe_in_steps = probe_s / step_s``; ``overhead`` = Σ monitor time / Σ plain
training time over the same blocks (what the monitor adds, in the demo's 150 steps); the
interval ``every_5pct = ⌈probe_in_steps / 0.05⌉`` that keeps an ``every=N`` schedule at ≤ 5%;
``block_ratio`` = median over blocks of monitored / plain block time (load-robust; probes fall
in few blocks, so it shows the training itself is not slowed); ``identical_weights`` (final
weights bit-identical to the plain model's).

**Under the frameworks** (``--trainers``): the same model (width 64, ``steps = 400``) trained by a
real ``transformers.Trainer`` (``logging_steps=10``) and a real Lightning ``Trainer`` (a module
without ``forward()``, the monitor on its network), each with and without the monitor's callback at
the **default schedule** (log-spaced under the default 5% budget; the callbacks probe the first and
last step; ``--every N``: ``every=N`` instead), ``reps`` times alternately. The callbacks build the
monitor from a ``MonitorOptions`` (``attach(trainer, train=, test=, options=)``). Reported per
framework: ``probes`` and ``skipped`` (planned probes the budget skipped); ``plain_s`` /
``monitored_s`` (run time, train start to train end, median over reps); ``step_s`` (plain run time /
steps); ``per_probe_s`` (the monitor's own time per probe, ``monitor.spent_s / probes``: both pools,
the statistics, the file; median over reps); ``per_probe_in_steps``; ``overhead`` (the monitor's own
time / plain run time: what the budget bounds); ``overhead_wall`` (monitored / plain run time − 1,
end to end, callback and logging included; noisy on a loaded machine); ``overhead_cpu`` (the same
ratio in this process's CPU time, ``time.process_time``: with one torch thread, what the monitor adds
to the training's own work, insensitive to other processes' load); ``identical_log_history``
(HF: the Trainer's own entries equal, float for float) and ``identical_weights``; ``summary`` (the
monitor's own line). Written under the key ``trainers`` of the ``--out`` file, leaving its other
rows as they are.

Usage::

    OMP_NUM_THREADS=1 nice python benchmarks/bench_monitor.py --out benchmarks/results/monitor-cpu.json
    OMP_NUM_THREADS=1 python benchmarks/bench_monitor.py --trainers --out benchmarks/results/monitor-cpu.json
    python benchmarks/bench_monitor.py --quick      # seconds (with --trainers: the framework runs, small)
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _common import markdown_table  # noqa: E402

SHARE = 0.05  # the cost target of issue 23


class OwnClock:
    """A clock that advances only between :meth:`start` and :meth:`stop` (one model's blocks)."""

    def __init__(self) -> None:
        self.total, self.since = 0.0, None

    def start(self) -> None:
        self.since = time.perf_counter()

    def stop(self) -> None:
        self.total += time.perf_counter() - self.since
        self.since = None

    def __call__(self) -> float:
        return self.total + (0.0 if self.since is None else time.perf_counter() - self.since)


def _setup(width: int, steps: int, n_pool: int, seq_len: int, batch: int, schedules: dict[str, dict]):
    from widthscope.models import build
    from widthscope.monitor import AlignmentMonitor

    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (steps * batch, seq_len), generator=g)
    pools = torch.randint(0, 256, (2 * n_pool, seq_len), generator=g)
    runs = {}
    for name, kw in {"plain": None, **schedules}.items():
        torch.manual_seed(0)
        model = build("llama", width, depth=4, vocab_size=256, max_seq_len=seq_len)
        clock = OwnClock()
        clock.start()  # the dry probe at construction times one batch: the budget's first prediction
        mon = (
            None
            if kw is None
            else AlignmentMonitor(
                model, pools[:n_pool], pools[n_pool:], M=16, draws=1000, batch_size=32, clock=clock, **kw
            )
        )
        clock.stop()
        runs[name] = {
            "model": model,
            "opt": torch.optim.AdamW(model.parameters(), lr=1e-3),
            "mon": mon,
            "clock": clock,
            "step_s": [],
            "probe_s": [],
            "blocks": [],
            "monitor_s": 0.0,
        }
    return data, runs


def _block(run: dict, data: torch.Tensor, first: int, last: int, batch: int, step_fn: Callable) -> None:
    model, opt, mon, clock = run["model"], run["opt"], run["mon"], run["clock"]
    model.train()
    clock.start()
    t_block = time.perf_counter()
    for step in range(first, last + 1):
        if mon is not None and step == first == 1:  # step 0: before any update
            t0 = time.perf_counter()
            if mon.step(model, 0):
                run["probe_s"].append(time.perf_counter() - t0)
            run["monitor_s"] += time.perf_counter() - t0
        ids = data[(step - 1) * batch : step * batch]
        t0 = time.perf_counter()
        step_fn(model, opt, ids)
        t1 = time.perf_counter()
        run["step_s"].append(t1 - t0)
        if mon is not None:
            if mon.step(model, step):
                run["probe_s"].append(time.perf_counter() - t1)
            run["monitor_s"] += time.perf_counter() - t1
    run["blocks"].append(time.perf_counter() - t_block)
    clock.stop()


def _train_step(model, opt, ids) -> None:
    from widthscope.probe import causal_lm_loss

    opt.zero_grad(set_to_none=True)
    causal_lm_loss(model(ids).logits, ids).mean().backward()
    opt.step()


def run(quick: bool = False, every: int | None = None) -> list[dict[str, Any]]:
    widths = [32] if quick else [32, 64, 128, 256]
    steps, block = (12, 4) if quick else (150, 10)
    n_pool, seq_len, batch = (32, 32, 8) if quick else (64, 64, 16)
    schedules: dict[str, dict] = {"default": {}, "log": {"budget": math.inf}}
    if every is not None:
        schedules[f"every={every}"] = {"every": every}
    rows = []
    for width in widths:
        data, runs = _setup(width, steps, n_pool, seq_len, batch, schedules)
        for first in range(1, steps + 1, block):  # interleaved: plain, then each monitored, block by block
            for r in runs.values():
                _block(r, data, first, min(steps, first + block - 1), batch, _train_step)
        plain = runs["plain"]
        step_s = statistics.median(plain["step_s"])
        train_s = sum(plain["step_s"])
        ref = plain["model"].state_dict()
        for name in schedules:
            r = runs[name]
            probe_s = statistics.median(r["probe_s"]) if r["probe_s"] else None
            pis = None if probe_s is None else probe_s / step_s
            rows.append(
                {
                    "width": width,
                    "schedule": name,
                    "steps": steps,
                    "block": block,
                    "n_pool": n_pool,
                    "probes": len(r["probe_s"]),
                    "probed_steps": sorted({int(x["step"]) for x in r["mon"].rows}),
                    "skipped": len(r["mon"].skipped),
                    "step_s": step_s,
                    "probe_s": probe_s,
                    "probe_in_steps": pis,
                    "overhead": r["monitor_s"] / train_s,
                    "every_5pct": None if pis is None else math.ceil(pis / SHARE),
                    "block_ratio": statistics.median(m / p for m, p in zip(r["blocks"], plain["blocks"])),
                    "identical_weights": all(torch.equal(v, r["model"].state_dict()[k]) for k, v in ref.items()),
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = (
        "width",
        "schedule",
        "probes",
        "step_s",
        "probe_s",
        "probe_in_steps",
        "overhead",
        "every_5pct",
        "block_ratio",
        "identical_weights",
    )
    return markdown_table(
        [{c: r[c] for c in cols} for r in rows],
        note=(
            "The demo's LLaMA training (depth 4, seq 64, batch 16, 150 AdamW steps) with and without the "
            "monitor, interleaved in blocks of 10 steps in one process. `overhead`: monitor time / plain "
            "training time; `every_5pct`: the interval keeping an every=N schedule at <= 5%."
        ),
    )


TIMING = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


def _pools(steps: int, n_pool: int, seq_len: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (steps * batch, seq_len), generator=g)
    return data, torch.randint(0, 256, (2 * n_pool, seq_len), generator=g)


def _options(points: Any, schedule: dict[str, Any]):
    from widthscope.monitor import MonitorOptions

    return MonitorOptions(points=points, M=16, draws=1000, batch_size=32, **schedule)


def _hf_trainer_run(
    width: int, steps: int, n_pool: int, seq_len: int, batch: int, schedule: dict | None, tmp: str
) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from widthscope.models import build
    from widthscope.monitor.hf import attach

    data, pools = _pools(steps, n_pool, seq_len, batch)
    torch.manual_seed(0)
    model = build("llama", width, depth=4, vocab_size=256, max_seq_len=seq_len)
    args = TrainingArguments(
        output_dir=tmp,
        max_steps=steps,
        per_device_train_batch_size=batch,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        learning_rate=1e-3,
        dataloader_num_workers=0,
    )
    clock: dict[str, float] = {}

    class Timer(TrainerCallback):  # registered before the monitor's: its step-0 probe is inside
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            clock["begin"], clock["cpu_begin"] = time.perf_counter(), time.process_time()

        def on_train_end(self, *a: Any, **k: Any) -> None:
            clock["end"], clock["cpu_end"] = time.perf_counter(), time.process_time()

    trainer = Trainer(
        model=model, args=args, train_dataset=[{"input_ids": x, "labels": x} for x in data], callbacks=[Timer()]
    )
    mon = None
    if schedule is not None:  # the monitor built by the callback from its options
        mon = attach(trainer, train=pools[:n_pool], test=pools[n_pool:], options=_options(None, schedule)).monitor
    trainer.train()
    wall = clock["end"] - clock["begin"]
    own = [
        {k: v for k, v in h.items() if k not in TIMING}
        for h in trainer.state.log_history
        if not any(k.startswith("align/") for k in h)
    ]
    return {
        "wall_s": wall,
        "cpu_s": clock["cpu_end"] - clock["cpu_begin"],
        "mon": mon,
        "log": own,
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
    }


def _lightning_run(
    width: int, steps: int, n_pool: int, seq_len: int, batch: int, schedule: dict | None, tmp: str
) -> dict[str, Any]:
    import lightning as pl

    from widthscope.models import build
    from widthscope.monitor.lightning import AlignmentCallback
    from widthscope.probe import causal_lm_loss

    class LM(pl.LightningModule):  # no forward(): the monitor probes self.net
        def __init__(self) -> None:
            super().__init__()
            self.net = build("llama", width, depth=4, vocab_size=256, max_seq_len=seq_len)

        def training_step(self, ids, i):
            return causal_lm_loss(self.net(ids).logits, ids).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data, pools = _pools(steps, n_pool, seq_len, batch)
    pl.seed_everything(0, verbose=False)
    lm = LM()
    cb = None
    if schedule is not None:  # the monitor built by the callback from its options, on the network
        cb = AlignmentCallback(
            model=lm.net, train=pools[:n_pool], test=pools[n_pool:], options=_options(None, schedule)
        )
    clock: dict[str, float] = {}

    class Timer(pl.Callback):  # before the monitor's callback: its step-0 probe is inside
        def on_train_start(self, *a: Any) -> None:
            clock["begin"], clock["cpu_begin"] = time.perf_counter(), time.process_time()

        def on_train_end(self, *a: Any) -> None:
            clock["end"], clock["cpu_end"] = time.perf_counter(), time.process_time()

    trainer = pl.Trainer(
        max_steps=steps,
        callbacks=[Timer()] + ([cb] if cb else []),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp,
    )
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
    trainer.fit(lm, loader)
    wall = clock["end"] - clock["begin"]
    return {
        "wall_s": wall,
        "cpu_s": clock["cpu_end"] - clock["cpu_begin"],
        "mon": None if cb is None else cb.monitor,
        "log": None,
        "weights": {k: v.clone() for k, v in lm.state_dict().items()},
    }


def run_trainers(quick: bool = False, reps: int = 2, every: int | None = None) -> list[dict[str, Any]]:
    """Training time with and without the monitor's callback at the default schedule (``every``:
    ``every=N`` instead), under a real HF Trainer and a real Lightning Trainer."""
    import tempfile
    import warnings

    width, steps = (32, 8) if quick else (64, 400)
    n_pool, seq_len, batch = (32, 32, 8) if quick else (64, 64, 16)
    schedule: dict[str, Any] = {} if every is None else {"every": every}
    rows = []
    for name, fn in (("transformers.Trainer", _hf_trainer_run), ("lightning.Trainer", _lightning_run)):
        plain, mon = [], []
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(1 if quick else reps):  # alternately, so load changes hit both alike
                plain.append(fn(width, steps, n_pool, seq_len, batch, None, tmp))
                mon.append(fn(width, steps, n_pool, seq_len, batch, schedule, tmp))
        m0 = mon[0]["mon"]
        probes = [len({r["step"] for r in m["mon"].rows}) for m in mon]
        plain_s = statistics.median(r["wall_s"] for r in plain)
        rows.append(
            {
                "framework": name,
                "schedule": "default" if every is None else f"every={every}",
                "options": m0.options.to_dict(),
                "budget": m0.budget,
                "width": width,
                "steps": steps,
                "n_pool": n_pool,
                "reps": len(mon),
                "probed_steps": sorted({int(r["step"]) for r in m0.rows}),
                "probes": probes[0],
                "skipped": len(m0.skipped),
                "summary": m0.summary(),
                # seconds of each probe of the first monitored run (both pools + statistics), by step
                "probe_s_by_step": {str(r["step"]): r["probe_s"] + r["stats_s"] for r in m0.rows},
                "plain_s": plain_s,
                "monitored_s": statistics.median(r["wall_s"] for r in mon),
                "step_s": plain_s / steps,
                "per_probe_s": statistics.median(m["mon"].spent_s / p for m, p in zip(mon, probes)),
                "overhead": statistics.median(m["mon"].spent_s / p["wall_s"] for m, p in zip(mon, plain)),
                "overhead_wall": statistics.median(m["wall_s"] / p["wall_s"] - 1 for m, p in zip(mon, plain)),
                "plain_cpu_s": statistics.median(r["cpu_s"] for r in plain),
                "monitored_cpu_s": statistics.median(r["cpu_s"] for r in mon),
                "overhead_cpu": statistics.median(m["cpu_s"] / p["cpu_s"] - 1 for m, p in zip(mon, plain)),
                "identical_log_history": None
                if plain[0]["log"] is None
                else all(m["log"] == plain[0]["log"] for m in mon + plain),
                "identical_weights": all(
                    torch.equal(v, m["weights"][k]) for m in mon + plain[1:] for k, v in plain[0]["weights"].items()
                ),
            }
        )
        rows[-1]["per_probe_in_steps"] = rows[-1]["per_probe_s"] / rows[-1]["step_s"]
    return rows


TRAINER_COLS = (
    "framework",
    "schedule",
    "probes",
    "skipped",
    "plain_s",
    "monitored_s",
    "step_s",
    "per_probe_s",
    "per_probe_in_steps",
    "overhead",
    "overhead_wall",
    "overhead_cpu",
    "identical_log_history",
    "identical_weights",
)


def markdown_trainers(rows: list[dict[str, Any]]) -> str:
    r = rows[0]
    return markdown_table(
        [{c: r[c] for c in TRAINER_COLS} for r in rows],
        note=(
            f"LLaMA-style width {r['width']}, depth 4, {r['steps']} steps, monitor at the {r['schedule']} schedule "
            f"(probes of {r['n_pool']} + {r['n_pool']} sequences at the 4 block outputs); run time = from train "
            "start to train end; per_probe_s: the monitor's time per probe; overhead: monitor time / plain run "
            "time; overhead_wall: monitored / plain run time - 1; overhead_cpu: the same in CPU time of this process."
        ),
    )


def main(argv: list[str]) -> None:
    import json

    ev = int(argv[argv.index("--every") + 1]) if "--every" in argv else None
    quick, trainers = "--quick" in argv, "--trainers" in argv
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows = run_trainers(quick=quick, every=ev) if trainers else run(quick=quick, every=ev)
    print(markdown_trainers(rows) if trainers else markdown(rows))
    if "--out" in argv:  # the committed rows docs/benchmarks.md and docs/monitor.md quote
        path = Path(argv[argv.index("--out") + 1])
        meta = {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "load_average_start": " ".join(f"{v:.2f}" for v in load0),
            "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
            "wall_s": time.perf_counter() - t0,
        }
        if trainers:  # beside the lockstep rows, which stay as they are
            import lightning
            import transformers

            meta.update(transformers=transformers.__version__, lightning=lightning.__version__)
            data = json.loads(path.read_text()) if path.exists() else {}
            data["trainers"] = {"machine": meta, "rows": rows}
        else:
            old = json.loads(path.read_text()) if path.exists() else {}
            data = {"machine": meta, "rows": rows, **({"trainers": old["trainers"]} if "trainers" in old else {})}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    torch.set_num_threads(1)  # one thread, as the committed results were measured
    main(sys.argv[1:])
