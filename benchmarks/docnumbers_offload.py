"""Numbers of docs/big-models.md: certify through disk offload against the plain run.

From ``benchmarks/results/offload-memory-cpu.json``, written by
``OMP_NUM_THREADS=1 python benchmarks/offload_memory.py --out benchmarks/results/offload-memory-cpu.json``.
Keys: ``offload/table``, ``offload/weights``, ``offload/budget``, ``offload/ratio``, ``offload/blocks``,
``offload/pools``, ``offload/load``, ``offload/<run>/<field>`` (run ``plain``, ``plain-mmap``, ``offload``,
``offload-no-recompute``, ``offload-adaptive-malloc``; field ``peak``, ``after_load``, ``load_peak``,
``certify_peak``, ``peak_over_budget``, ``load_s``, ``certify_s``, ``slowdown``, ``max_abs``, ``max_rel``,
``numbers``); grow on the same model: ``offload/grow_table``, ``offload/grow_setting``,
``offload/grow/<run>/<field>`` (run ``grow-plain``, ``grow-plain-mmap``, ``grow-offload``; the same fields,
``certify_s`` being grow's time).
"""

from __future__ import annotations

from typing import Any

RESULT = "benchmarks/results/offload-memory-cpu.json"
MB = 1e6


def register(dn: Any) -> None:
    def res() -> dict[str, Any]:
        return dn.load_json(RESULT)

    def row(run: str) -> dict[str, Any]:
        rows = res()["grow"]["rows"] if run.startswith("grow-") else res()["rows"]
        return next(r for r in rows if r["run"] == run)

    def diff(v: float) -> str:
        return "0 (bit-equal)" if v == 0 else f"{v:.1e}"

    def field(run: str, name: str) -> str:
        r = row(run)
        if name in ("peak", "after_load", "load_peak", "certify_peak"):
            key = "peak_above_baseline_bytes" if name == "peak" else f"{name}_above_baseline_bytes"
            return dn.sig(r[key] / MB, 3) + " MB"
        if name == "peak_over_budget":
            return dn.sig(r["peak_over_budget"], 2) + "×"
        if name in ("certify_s", "load_s"):
            return dn.sig(r[name], 2) + " s"
        if name == "slowdown":
            return dn.sig(r["slowdown"], 2) + "×"
        if name in ("max_abs", "max_rel"):
            return diff(r["vs_plain"]["all"][name])
        if name == "numbers":
            return str(r["vs_plain"]["all"]["numbers"])
        raise KeyError(name)

    @dn.pattern(
        r"offload/(plain|plain-mmap|offload|offload-no-recompute|offload-adaptive-malloc)"
        r"/(peak|after_load|load_peak|certify_peak|peak_over_budget|certify_s|load_s|slowdown|max_abs|max_rel|numbers)"
    )
    def _field(run: str, name: str) -> str:
        return field(run, name)

    @dn.pattern(
        r"offload/grow/(grow-plain|grow-plain-mmap|grow-offload)"
        r"/(peak|after_load|load_peak|certify_peak|peak_over_budget|certify_s|load_s|slowdown|max_abs|max_rel|numbers)"
    )
    def _grow_field(run: str, name: str) -> str:
        return field(run, name)

    @dn.quantity("offload/grow_setting")
    def _grow_setting() -> str:
        g = res()["grow"]
        return f"M = K = {g['M']}, {g['steps']} training steps of the new block"

    @dn.quantity("offload/grow_table")
    def _grow_table() -> str:
        head = (
            "run",
            "peak (load + grow)",
            "peak / budget",
            "grow",
            "vs plain",
            "point grown",
            "largest difference from plain (abs / rel)",
        )
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in res()["grow"]["rows"]:
            m = r["run"]
            if m == "grow-plain":
                vs = "–"
            elif r["vs_plain"]["all"]["max_abs"] == 0:
                vs = "0 / 0 (bit-equal)"
            else:
                vs = f"{field(m, 'max_abs')} / {field(m, 'max_rel')}"
            cells = [f"`{m}`"] + [field(m, k) for k in ("peak", "peak_over_budget", "certify_s")]
            cells += [field(m, "slowdown") if m != "grow-plain" else "1×", f"`{r['chosen']}`", vs]
            lines.append("| " + " | ".join(cells) + " |")
        return dn.block(lines)

    @dn.quantity("offload/weights")
    def _weights() -> str:
        return dn.sig(res()["model"]["weights_bytes"] / MB, 3) + " MB"

    @dn.quantity("offload/budget")
    def _budget() -> str:
        return dn.sig(res()["budget_bytes"] / MB, 3) + " MB"

    @dn.quantity("offload/ratio")
    def _ratio() -> str:
        return dn.sig(res()["weights_over_budget"], 2) + "×"

    @dn.quantity("offload/blocks")
    def _blocks() -> str:
        r = row("offload")
        return f"{r['blocks_offloaded']} of its {r['blocks']} blocks"

    @dn.quantity("offload/pools")
    def _pools() -> str:
        p, m = res()["pools"], res()["model"]
        return (
            f"{m['layers']} blocks of width {m['width']} (FFN {m['ffn']}, vocabulary {m['vocab']}, float32); "
            f"{p['n_train']} + {p['n_test']} sequences of {p['seq_len']} tokens, batches of {p['batch_size']}"
        )

    @dn.quantity("offload/load")
    def _load() -> str:
        m = res()["machine"]
        return (
            f"{m['cpus']} cores shared with other jobs (load average {', '.join(map(str, m['load_average']))} "
            f"at the end), {m['threads']} torch thread; torch {m['torch']}, transformers {m['transformers']}, "
            f"accelerate {m['accelerate']}"
        )

    @dn.quantity("offload/table")
    def _table() -> str:
        head = (
            "run",
            "RSS after the load",
            "peak (load + certify)",
            "peak / budget",
            "certify",
            "vs plain",
            "largest difference from plain (abs / rel)",
        )
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in res()["rows"]:
            m = r["run"]
            if m == "plain":
                vs = "–"
            elif r["vs_plain"]["all"]["max_abs"] == 0:
                vs = "0 / 0 (bit-equal)"
            else:
                vs = f"{field(m, 'max_abs')} / {field(m, 'max_rel')}"
            cells = [f"`{m}`"] + [field(m, k) for k in ("after_load", "peak", "peak_over_budget", "certify_s")]
            cells += [field(m, "slowdown") if m != "plain" else "1×", vs]
            lines.append("| " + " | ".join(cells) + " |")
        return dn.block(lines)
