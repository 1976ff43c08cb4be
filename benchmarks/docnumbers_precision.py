"""Numbers of docs/performance.md, section "## 3. Low precision": bfloat16/float16 (and float32)
certify runs against their reference on two trained checkpoints.

From ``benchmarks/results/precision-cpu.json``, written by
``OMP_NUM_THREADS=1 python benchmarks/precision_table.py --out benchmarks/results/precision-cpu.json``.
Keys: ``precision/setting``, ``precision/table``, ``precision/verdicts``, ``precision/plan``,
``precision/tolerance``, ``precision/runtime``.
"""

from __future__ import annotations

from typing import Any

RESULT = "benchmarks/results/precision-cpu.json"
NAMES = {"llama": "widthscope LLaMA", "gpt2": "GPT-2 (transformers)"}
TABLE_NAMES = {"llama": "LLaMA", "gpt2": "GPT-2"}
INTERVENTION = ("ΔL predicted", "ΔL actual", "retention")
SHORT = {"float32": "f32 vs f64", "bfloat16": "bf16", "float16": "fp16"}


def _e(v: float | None) -> str:
    """A relative difference or ratio in a table cell: two significant digits, exponent form."""
    if v is None:
        return "—"
    return "0" if v == 0 else f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e")


def register(dn: Any) -> None:
    def res() -> dict[str, Any]:
        return dn.load_json(RESULT)

    def summary(ck: str, dt: str, q: str) -> dict[str, Any]:
        return next(s for s in res()["summary"] if s["checkpoint"] == ck and s["dtype"] == dt and s["quantity"] == q)

    @dn.quantity("precision/setting")
    def _setting() -> str:
        r = res()
        s = r["setting"]
        parts = []
        for c in r["checkpoints"]:
            t = c["trained"]
            parts.append(
                f"{NAMES[c['checkpoint']]} ({c['architecture']}, width {s['width']}, {s['depth']} blocks, "
                f"{t['parameters']:,} parameters; {t['steps']} AdamW steps, held-out loss {t['test_loss']:.2f})"
            )
        return (
            " and ".join(parts) + f"; probed on {', '.join(s['corpus_files'])} of the standard library "
            f"(not in the training bytes), {s['seq_len']}-byte sequences, {s['n']} train + {s['n']} held-out, "
            f"M = K in {', '.join(str(m) for m in s['M'])}, {s['draws']} draws, the bias intervention at "
            f"M = K = {max(s['M'])}; standard errors: jackknife over {s['groups']} groups"
        )

    @dn.quantity("precision/table")
    def _table() -> str:
        r = res()
        head = ["quantity", "checkpoint"] + [SHORT[d] for d in SHORT] + ["SE at float32, relative"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for q in dict.fromkeys(s["quantity"] for s in r["summary"]):
            for c in (c["checkpoint"] for c in r["checkpoints"]):
                cells = []
                for d in SHORT:
                    s = summary(c, d, q)
                    cell = f"{_e(s['max_rel_diff'])} ({_e(s['max_diff_over_se'])})"
                    cells.append(cell + (f" [{s['below_resolution']} flagged]" if s["below_resolution"] else ""))
                cells.append(_e(summary(c, "float32", q)["median_rel_se"]))
                lines.append(f"| {q} | {TABLE_NAMES[c]} | " + " | ".join(cells) + " |")
        return dn.block(lines)

    @dn.quantity("precision/verdicts")
    def _verdicts() -> str:
        head = [
            "checkpoint",
            "compared",
            "sign of E[A]",
            "vacuous or not",
            "grow signal (B_exact ≥ 0.5)",
            "ranking of points",
            "intervention sign (resolved steps)",
            "steps below resolution",
            "within rounding of zero",
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in res()["checkpoints"]:
            for d, v in c["verdicts"].items():
                rank = "same" if v["ranking_agrees"] else ("top point same" if v["top_point_agrees"] else "differs")
                lines.append(
                    f"| {NAMES[c['checkpoint']]} | {SHORT[d]} | {v['sign_agrees']}/{v['certificates']} "
                    f"| {v['vacuous_agrees']}/{v['certificates']} | {v['grow_agrees']}/{v['grow_signals']} | {rank} "
                    f"| {v['intervention_sign_agrees']}/{v['intervention_sign_compared']} "
                    f"| {v['below_resolution']}/{v['intervention_steps']} | {len(v['within_rounding'])} |"
                )
        return dn.block(lines)

    @dn.quantity("precision/plan")
    def _plan() -> str:
        seen = {(dt, p["dtype"], p["source"]) for c in res()["checkpoints"] for dt, p in c["plan"].items()}
        if all(dt == got for dt, got, _ in seen):
            sources = sorted({src for _, _, src in seen})
            return f"the dtype of every run ({', '.join(sources)})"
        return "; ".join(f"{dt} run: {got} ({src})" for dt, got, src in sorted(seen))

    @dn.quantity("precision/tolerance")
    def _tolerance() -> str:
        r = res()
        bad = r["tolerance_failures"]
        n = sum(
            1
            for x in r["rows"]
            if x["dtype"] in ("bfloat16", "float16")
            and x["rel_diff"] is not None
            and x["key"].rsplit("|", 1)[1] in r["setting"]["tolerance_u"]
            and not ("|one|" in x["key"] and x["key"].rsplit("|", 1)[1] in ("d_align", "b_exact"))
        )
        return f"{n - len(bad)} of {n}"

    @dn.quantity("precision/runtime")
    def _runtime() -> str:
        r = res()
        return f"{r['total_s'] / 60:.1f} min on {r['machine']['torch_threads']} thread"

    @dn.pattern(r"precision/max/(rel|se)/(bfloat16|float16|float32|low)/(stats|actual)/(llama|gpt2|all)")
    def _max(field: str, dtype: str, group: str, ck: str) -> str:
        """The largest relative difference (``rel``, two digits) or difference in standard errors
        (``se``) over the statistical numbers (``stats``) or the resolved actual loss changes."""
        dts = ("bfloat16", "float16") if dtype == "low" else (dtype,)
        key = "max_rel_diff" if field == "rel" else "max_diff_over_se"
        vals = [
            s[key]
            for s in res()["summary"]
            if s["dtype"] in dts
            and (ck == "all" or s["checkpoint"] == ck)
            and s[key] is not None
            and ((s["quantity"] == "ΔL actual") if group == "actual" else (s["quantity"] not in INTERVENTION))
        ]
        return dn.sig(max(vals), 2)

    @dn.quantity("precision/tolerance_failures")
    def _failures() -> str:
        r = res()
        tol = r["setting"]["tolerance_u"]
        part = {"moments_train": "train ", "moments_test": "held-out ", "cross": ""}
        bad = [
            f"{TABLE_NAMES[x['checkpoint']]} {x['dtype']} {x['point']} {part.get(x['where'], x['where'] + ' ')}"
            f"`{x['key'].rsplit('|', 1)[1]}` at {x['rel_diff_u']:.1f}u (tolerance {tol[x['key'].rsplit('|', 1)[1]]:g}u)"
            for x in r["rows"]
            if any(f"{x['checkpoint']} {x['dtype']} {x['key']}:" in b for b in r["tolerance_failures"])
        ]
        return "; ".join(bad) or "none"
