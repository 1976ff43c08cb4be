"""Numbers of docs/big-models.md, section "Plan before you run": ``certify --plan`` against the run.

From ``benchmarks/results/plan-accuracy-cpu.json``, written by
``OMP_NUM_THREADS=1 python benchmarks/plan_accuracy.py --out benchmarks/results/plan-accuracy-cpu.json``.
Keys: ``plan/table``, ``plan/setting``, ``plan/time_range``, ``plan/memory_range``,
``plan/memory_none_range``, ``plan/memory_default_range``, ``plan/time_verdict``,
``plan/memory_verdict``, ``plan/load``.

The training plans (``grow --plan``, ``linearize --plan``) from
``benchmarks/results/plan-accuracy-train-cpu.json``, written by
``OMP_NUM_THREADS=1 python benchmarks/plan_accuracy_train.py --out benchmarks/results/plan-accuracy-train-cpu.json``.
Keys: ``plan/train_table``, ``plan/train_setting``, ``plan/train_time_range``, ``plan/train_memory_range``,
``plan/train_time_verdict``, ``plan/train_memory_verdict``, ``plan/train_memory_by_kind``, ``plan/train_load``,
``plan/train_runs``.

The growth ranking warmed on itself or at another size, from ``benchmarks/results/ranking-warm-cpu.json``,
written by ``OMP_NUM_THREADS=1 python benchmarks/ranking_warm.py --out benchmarks/results/ranking-warm-cpu.json``.
``demo --plan`` against the demo, from ``benchmarks/results/plan-accuracy-demo-cpu.json``, written by
``OMP_NUM_THREADS=1 python benchmarks/plan_accuracy_demo.py --out benchmarks/results/plan-accuracy-demo-cpu.json``.
Keys: ``plan/demo_table``, ``plan/demo_range``, ``plan/demo_verdict``, ``plan/demo_total``.

Keys: ``plan/rank_pools``, ``plan/rank_on_itself``, ``plan/rank_elsewhere``, ``plan/rank_in_run``,
``plan/rank_plan_terms``.
"""

from __future__ import annotations

from typing import Any

RESULT = "benchmarks/results/plan-accuracy-cpu.json"
TRAIN_RESULT = "benchmarks/results/plan-accuracy-train-cpu.json"
RANK_RESULT = "benchmarks/results/ranking-warm-cpu.json"
DEMO_RESULT = "benchmarks/results/plan-accuracy-demo-cpu.json"
MB = 1e6
TIME_TARGET, MEMORY_TARGET = 1.5, 1.2  # issue 32: predicted within these factors of measured


def _ratios(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _x(dn: Any, v: float) -> str:
    return dn.sig(v, 3) + "×"  # three digits: 1.21× is outside 1.2×


def _verdict(dn: Any, v: list[float], target: float) -> str:
    """How many ratios lie within ``target`` either way."""
    inside = sum(1 for r in v if 1 / target <= r <= target)
    if len(v) == 1:
        return f"{'within' if inside else 'not within'} {_x(dn, target)}"
    if inside == len(v):
        return f"all {len(v)} settings within {_x(dn, target)}"
    return f"{inside} of {len(v)} settings within {_x(dn, target)}"


def _machine(m: dict[str, Any]) -> str:
    load = ", ".join(f"{v:.2f}" for v in m["load"])
    return (
        f"{m['cores']} cores shared with other jobs (load average {load} at the end), {m['torch_threads']} torch thread"
    )


def register(dn: Any) -> None:
    register_train(dn)
    register_rank(dn)
    register_demo(dn)

    def res() -> dict[str, Any]:
        return dn.load_json(RESULT)

    def ratios(key: str) -> list[float]:
        return _ratios(res()["rows"], key)

    def x(v: float) -> str:
        return _x(dn, v)

    def spread(key: str) -> str:
        v = ratios(key)
        return dn.span(min(v), max(v), x)

    def verdict(key: str, target: float) -> str:
        return _verdict(dn, ratios(key), target)

    @dn.quantity("plan/table")
    def _table() -> str:
        lines = [
            "| width | batch | parameters | GFLOP / example | predicted time | measured | ratio "
            "| predicted memory | measured | ratio | no interventions | default malloc |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in res()["rows"]:
            lines.append(
                f"| {r['width']} | {r['batch_size']} | {r['parameters']:,} | {dn.sig(r['flops_per_example'] / 1e9, 3)} "
                f"| {dn.sig(r['predicted_s'], 2)} s | {dn.sig(r['measured_s'], 2)} s | {x(r['time_ratio'])} "
                f"| {dn.sig(r['predicted_bytes'] / MB, 3)} MB | {dn.sig(r['measured_peak_bytes'] / MB, 3)} MB "
                f"| {x(r['memory_ratio'])} | {x(r['memory_ratio_no_interventions'])} "
                f"| {x(r['memory_ratio_default_malloc'])} |"
            )
        return dn.block(lines)

    @dn.quantity("plan/setting")
    def _setting() -> str:
        s = res()["setting"]
        return (
            f"{s['model']}; {s['n_train']} + {s['n_test']} sequences of {s['seq_len']} byte tokens; {s['statistics']}"
        )

    for key, field in (
        ("plan/time_range", "time_ratio"),
        ("plan/memory_range", "memory_ratio"),
        ("plan/memory_none_range", "memory_ratio_no_interventions"),
        ("plan/memory_default_range", "memory_ratio_default_malloc"),
    ):
        dn.quantity(key)(lambda field=field: spread(field))

    @dn.quantity("plan/time_verdict")
    def _time_verdict() -> str:
        return verdict("time_ratio", TIME_TARGET)

    @dn.quantity("plan/memory_verdict")
    def _memory_verdict() -> str:
        return verdict("memory_ratio", MEMORY_TARGET)

    @dn.quantity("plan/load")
    def _load() -> str:
        m = res()["machine"]
        return f"{_machine(m)}; torch {m['torch']}, transformers {m['transformers']}"


def register_train(dn: Any) -> None:
    """The training plans' quantities (``plan/train_*``)."""

    def res() -> dict[str, Any]:
        return dn.load_json(TRAIN_RESULT)

    def ratios(key: str) -> list[float]:
        return _ratios(res()["rows"], key)

    def x(v: float) -> str:
        return _x(dn, v)

    def verdict(key: str, target: float) -> str:
        return _verdict(dn, ratios(key), target)

    @dn.quantity("plan/train_table")
    def _table() -> str:
        lines = [
            "| setting | parameters | training GFLOP | predicted time | measured (runs) | ratio | predicted memory "
            "| measured (runs) | ratio | whole run, warmed on itself | plan took |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in res()["rows"]:
            t, m = r["measured_runs_s"], [v / MB for v in r["measured_peak_runs_bytes"]]
            cells = [
                r["name"],
                f"{r['parameters']:,}",
                dn.sig(r["train_flops"] / 1e9, 3),
                f"{dn.sig(r['predicted_s'], 2)} s",
                f"{dn.sig(r['measured_s'], 2)} s ({dn.span(min(t), max(t), lambda v: dn.sig(v, 2))})",
                x(r["time_ratio"]),
                f"{dn.sig(r['predicted_bytes'] / MB, 3)} MB",
                f"{dn.sig(r['measured_peak_bytes'] / MB, 3)} MB ({dn.span(min(m), max(m), lambda v: dn.sig(v, 3))})",
                x(r["memory_ratio"]),
                f"{dn.sig(r['whole_run_fresh_process_bytes'] / MB, 3)} MB",
                f"{dn.sig(r['plan_s'], 2)} s",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return dn.block(lines)

    @dn.quantity("plan/train_setting")
    def _setting() -> str:
        s = res()["setting"]
        return f"grow: {s['grow']}; linearize: {s['linearize']}"

    for key, field in (("plan/train_time_range", "time_ratio"), ("plan/train_memory_range", "memory_ratio")):
        dn.quantity(key)(lambda field=field: dn.span(min(ratios(field)), max(ratios(field)), x))

    @dn.quantity("plan/train_time_verdict")
    def _time_verdict() -> str:
        return verdict("time_ratio", TIME_TARGET)

    @dn.quantity("plan/train_memory_verdict")
    def _memory_verdict() -> str:
        return verdict("memory_ratio", MEMORY_TARGET)

    @dn.quantity("plan/train_memory_by_kind")
    def _memory_by_kind() -> str:
        groups: dict[str, list[float]] = {}
        for r in res()["rows"]:
            model = r["setting"].get("model")
            kind = (
                "linearize"
                if r["grid"] == "linearize"
                else ("grow, built-in MLP" if model == "builtin" else "grow, LLaMA")
            )
            groups.setdefault(kind, []).append(r["memory_ratio"])
        return "; ".join(
            f"{kind}: {dn.span(min(v), max(v), x)}, {_verdict(dn, v, MEMORY_TARGET)}" for kind, v in groups.items()
        )

    @dn.quantity("plan/train_runs")
    def _runs() -> str:
        return str(len(res()["rows"][0]["measured_runs_s"]))

    @dn.quantity("plan/train_load")
    def _load() -> str:
        return _machine(res()["machine"])


def register_rank(dn: Any) -> None:
    """The growth ranking's memory warmed on itself or at another size (``plan/rank_*``)."""

    def res() -> dict[str, Any]:
        return dn.load_json(RANK_RESULT)

    def mb(v: float) -> str:
        return f"{dn.sig(v / MB, 2)} MB"

    def over_points(key: str) -> str:
        v = [p[key] for p in res()["points"].values()]
        return dn.span(min(v) / MB, max(v) / MB, lambda u: dn.sig(u, 2)) + " MB"

    @dn.quantity("plan/rank_pools")
    def _pools() -> str:
        (a, b), (wa, wb) = res()["pools"], res()["warm_size"]
        return f"{a} train and {b} held-out examples (warmed at {wa} and {wb})"

    dn.quantity("plan/rank_on_itself")(lambda: over_points("on_itself"))
    dn.quantity("plan/rank_elsewhere")(lambda: over_points("elsewhere"))

    @dn.quantity("plan/rank_in_run")
    def _in_run() -> str:
        r = res()["in_run_runs"]
        return (
            f"{mb(res()['in_run'])} ({dn.span(min(r) / MB, max(r) / MB, lambda u: dn.sig(u, 2))} MB over {len(r)} runs)"
        )

    @dn.quantity("plan/rank_plan_terms")
    def _terms() -> str:
        return f"{mb(res()['plan_on_itself'])} warmed on itself, {mb(res()['plan_elsewhere'])} warmed elsewhere"


def register_demo(dn: Any) -> None:
    """``demo --plan`` against the demo (``plan/demo_*``)."""

    def res() -> dict[str, Any]:
        return dn.load_json(DEMO_RESULT)

    def secs(v: float) -> str:
        return f"{dn.sig(v, 2)} s"

    @dn.quantity("plan/demo_table")
    def _table() -> str:
        lines = ["| part | predicted | measured | ratio |", "|---|---|---|---|"]
        for r in res()["rows"]:
            lines.append(
                f"| {r['part']} | {secs(r['predicted_s'])} | {secs(r['measured_s'])} | {_x(dn, r['time_ratio'])} |"
            )
        return dn.block(lines)

    @dn.quantity("plan/demo_range")
    def _range() -> str:
        v = [r["time_ratio"] for r in res()["rows"]]
        return dn.span(min(v), max(v), lambda u: _x(dn, u))

    @dn.quantity("plan/demo_verdict")
    def _verdict_demo() -> str:
        v = [r["time_ratio"] for r in res()["rows"]]
        return _verdict(dn, v, TIME_TARGET).replace("settings", "parts")

    @dn.quantity("plan/demo_total")
    def _total() -> str:
        r = res()
        return (
            f"predicted {secs(r['predicted_s'])}, measured {secs(r['measured_parts_s'])} for the parts and "
            f"{secs(r['run_s'])} with the report; the plan took {secs(r['plan_s'])}"
        )
