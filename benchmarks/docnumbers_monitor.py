"""Numbers of docs/monitor.md: the monitor under a real HF ``Trainer`` and a Lightning ``Trainer``.

From the ``trainers`` rows of ``benchmarks/results/monitor-cpu.json``, written by
``OMP_NUM_THREADS=1 nice python benchmarks/bench_monitor.py --trainers --out benchmarks/results/monitor-cpu.json``
(the lockstep rows of that file are quoted through ``bench.monitor_*`` in benchmarks/docnumbers.py).
Keys: ``monitor/trainers_table``, ``monitor/trainers_load``, ``monitor/<hf|lightning>/<column>``.
"""

from __future__ import annotations

from typing import Any

RESULT = "benchmarks/results/monitor-cpu.json"
FRAMEWORKS = {"hf": "transformers.Trainer", "lightning": "lightning.Trainer"}
TABLE = (
    "framework",
    "schedule",
    "steps",
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
    "identical_weights",
)
PERCENT = ("overhead", "overhead_wall", "overhead_cpu")


def register(dn: Any) -> None:
    def trainers() -> dict[str, Any]:
        return dn.load_json(RESULT)["trainers"]

    def row(fw: str) -> dict[str, Any]:
        return next(r for r in trainers()["rows"] if r["framework"] == FRAMEWORKS[fw])

    def fmt(col: str, v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, (bool, int, str)):
            return str(v)
        if col in PERCENT:
            return dn.sig(100 * v, 2) + "%"
        return dn.sig(v, 2)

    @dn.quantity("monitor/trainers_table")
    def _table() -> str:
        lines = ["| " + " | ".join(TABLE) + " |", "|" + "---|" * len(TABLE)]
        lines += ["| " + " | ".join(fmt(c, r[c]) for c in TABLE) + " |" for r in trainers()["rows"]]
        return dn.block(lines)

    @dn.pattern(
        r"monitor/(hf|lightning)/(steps|width|n_pool|probes|skipped|plain_s|monitored_s|step_s|per_probe_s"
        r"|per_probe_in_steps|overhead|overhead_wall|overhead_cpu|probed_steps)"
    )
    def _column(fw: str, col: str) -> str:
        v = row(fw)[col]
        return ", ".join(map(str, v)) if isinstance(v, list) else fmt(col, v)

    @dn.quantity("monitor/trainers_load")
    def _load() -> str:
        m = trainers()["machine"]
        return (
            f"{m['cpus']} cores, load average {m['load_average_start']} at the start, {m['load_average']} at "
            f"the end, {m['threads']} torch thread; transformers {m['transformers']}, Lightning {m['lightning']}"
        )
