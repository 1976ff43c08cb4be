"""Numbers of docs/big-models.md, section "Plan before you run", and docs/performance.md.

``certify --plan`` and ``grow --plan`` against the whole process (``/usr/bin/time -v``), from
``benchmarks/results/plan_whole_process.jsonl``, written by
``python benchmarks/plan_whole_process.py``. Keys: ``plan/whole_table``, ``plan/whole_setting``,
``plan/whole_verdict``.
"""

from __future__ import annotations

from typing import Any

WHOLE_RESULT = "benchmarks/results/plan_whole_process.jsonl"
TIME_TARGET = 1.5  # issue 44: the whole process's wall time and peak RSS within 1.5x of the plan


def _x(dn: Any, v: float) -> str:
    return dn.sig(v, 3) + "×"  # three digits: 1.51× is outside 1.5×


def _verdict(dn: Any, v: list[float], target: float) -> str:
    """How many ratios lie within ``target`` either way."""
    inside = sum(1 for r in v if 1 / target <= r <= target)
    if len(v) == 1:
        return f"{'within' if inside else 'not within'} {_x(dn, target)}"
    if inside == len(v):
        return f"all {len(v)} settings within {_x(dn, target)}"
    return f"{inside} of {len(v)} settings within {_x(dn, target)}"


def register(dn: Any) -> None:
    register_suites(dn)
    def rows() -> tuple[dict[str, Any], ...]:
        return dn.load_rows(WHOLE_RESULT)

    @dn.quantity("plan/whole_table")
    def _table() -> str:
        lines = [
            "| checkpoint | command | predicted time | measured | measured / predicted | predicted peak RSS | measured | measured / predicted |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows():
            lines.append(
                f"| {r['model']} | {r['command']} | {dn.sig(r['predicted_s'], 3)} s | {dn.sig(r['measured_s'], 3)} s "
                f"| {_x(dn, r['time_ratio'])} | {dn.sig(r['predicted_rss_mib'], 3)} MiB "
                f"| {dn.sig(r['measured_rss_mib'], 3)} MiB | {_x(dn, r['rss_ratio'])} |"
            )
        return dn.block(lines)

    @dn.quantity("plan/whole_setting")
    def _setting() -> str:
        return (
            "a GPT-NeoX of hidden 128 and a GPT-2 of n_embd 192, 4 layers each, random init, a byte-level BPE of "
            "1,000 tokens; text: the standard library's source; certify: 128 + 128 sequences of 64 tokens, batch 16; "
            "grow: 256 + 128 sequences, M = K = 32, 30 steps"
        )

    @dn.quantity("plan/whole_verdict")
    def _whole_verdict() -> str:
        t = [r["time_ratio"] for r in rows()]
        m = [r["rss_ratio"] for r in rows()]
        return (
            f"time {dn.span(min(t), max(t), lambda u: _x(dn, u))} ({_verdict(dn, t, TIME_TARGET)}), "
            f"peak RSS {dn.span(min(m), max(m), lambda u: _x(dn, u))} ({_verdict(dn, m, TIME_TARGET)})"
        )



SUITES_RESULT = "benchmarks/results/plan_suites.jsonl"


def register_suites(dn: Any) -> None:
    @dn.quantity("plan/suites_table")
    def _suites() -> str:
        lines = [
            "| command | predicted time | measured | measured / predicted | predicted peak RSS | measured | measured / predicted |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in dn.load_rows(SUITES_RESULT):
            lines.append(
                f"| `{r['command']}` | {dn.sig(r['predicted_s'], 3)} s | {dn.sig(r['measured_s'], 3)} s "
                f"| {_x(dn, r['time_ratio'])} | {dn.sig(r['predicted_rss_mib'], 3)} MiB "
                f"| {dn.sig(r['measured_rss_mib'], 3)} MiB | {_x(dn, r['rss_ratio'])} |"
            )
        return dn.block(lines)
