"""Numbers of docs/growth.md: the compute-to-target growth benchmark and its scale plan.

From ``benchmarks/results/grow-target/`` (``comparison.jsonl``, ``summary.json``: written by
``OMP_NUM_THREADS=1 python benchmarks/grow_target.py --out benchmarks/results/grow-target``;
``paper-plan.json``: ``python benchmarks/grow_target.py --paper-plan configs/grow-target-paper.toml``).
Keys: ``growth_target/table``, ``growth_target/verdict``, ``growth_target/best``,
``growth_target/holds``, ``growth_target/continue/<depth|width>``, ``growth_target/<summary field>``,
``growth_target/plan_table``, ``growth_target/sustained``.
"""

from __future__ import annotations

from typing import Any

DIR = "benchmarks/results/grow-target"
TABLE = (
    "run",
    "reached",
    "speed-up vs scratch",
    "95% interval",
    "verdict (≥ 1.3×)",
    "vs continue-small",
    "95% interval",
    "grown at",
    "final loss",
)


def _x(dn: Any, v: Any) -> str:
    return "–" if v is None else dn.sig(v, 2) + "×"


def _interval(dn: Any, r: dict[str, Any], key: str = "speedup") -> str:
    if r.get(f"{key}_lo") is None:
        return "–"
    return f"{dn.sig(r[f'{key}_lo'], 2)}–{dn.sig(r[f'{key}_hi'], 2)}"


def _label_cells(dn: Any, r: dict[str, Any]) -> list[str]:
    """The columns every comparison table starts with: run, reached, speed-up and vs continue-small."""
    return [
        f"`{r['run']}`",
        f"{r['reached']}/{r['seeds']}",
        _x(dn, r["speedup"]),
        _interval(dn, r),
        r["verdict"],
        _x(dn, r["vs_continue"]),
        _interval(dn, r, "vs_continue"),
    ]


def register(dn: Any) -> None:
    def table() -> list[dict[str, Any]]:
        return list(dn.load_rows(f"{DIR}/comparison.jsonl"))

    def summary() -> dict[str, Any]:
        return dn.load_json(f"{DIR}/summary.json")

    def x(v: Any) -> str:
        return _x(dn, v)

    def interval(r: dict[str, Any], key: str = "speedup") -> str:
        return _interval(dn, r, key)

    @dn.quantity("growth_target/table")
    def _table() -> str:
        lines = ["| " + " | ".join(TABLE) + " |", "|" + "---|" * len(TABLE)]
        for r in table():
            grown = "–" if r["grown_at"] is None else dn.sig(r["grown_at"], 2) + " B"
            if r["forced"]:
                grown += f" ({r['forced']} forced)"
            if r["reached_before_growth"]:
                grown += f"; {r['reached_before_growth']} reached before growing"
            cells = [*_label_cells(dn, r), grown, dn.sig(r["final_loss"], 3)]
            lines.append("| " + " | ".join(cells) + " |")
        return dn.block(lines)

    @dn.quantity("growth_target/verdict")
    def _verdict() -> str:
        return summary()["answer"]["verdict"]

    @dn.quantity("growth_target/best")
    def _best() -> str:
        a = summary()["answer"]
        best = next(r for r in table() if r["run"] == a["best"])
        return f"`{a['best']}`: {x(best['speedup'])} (95% interval {interval(best)})"

    @dn.quantity("growth_target/holds")
    def _holds() -> str:
        h = summary()["answer"]["holds"]
        return ", ".join(f"`{v}`" for v in h) if h else "none"

    @dn.quantity("growth_target/lower_bound_above")
    def _uncorrected() -> str:
        h = summary()["answer"]["lower_bound_above"]
        return ", ".join(f"`{v}`" for v in h) if h else "none"

    @dn.quantity("growth_target/vs_continue_max")
    def _vs_max() -> str:
        rs = [r for r in table() if r["vs_continue_hi"] is not None and r["verdict"] != "reached before growing"]
        top = max(rs, key=lambda r: r["vs_continue_hi"])
        return f"{dn.sig(top['vs_continue_hi'], 2)} (`{top['run']}`)"

    @dn.quantity("growth_target/labels_tested")
    def _tested() -> str:
        return str(sum(1 for r in table() if r["p_holm"] is not None))

    @dn.pattern(r"growth_target/continue/(depth|width)")
    def _continue(kind: str) -> str:
        r = next(r for r in table() if r["run"] == f"continue-{kind}")
        return f"{x(r['speedup'])} ({interval(r)}; reached {r['reached']}/{r['seeds']})"

    @dn.pattern(r"growth_target/(seeds|budget_gflops|minutes|target_loss|steps|does_not)")
    def _field(key: str) -> str:
        s = summary()
        if key == "seeds":
            return str(len(s["seeds"]))
        if key == "budget_gflops":
            return dn.sig(sum(s["budget_flops"]) / len(s["budget_flops"]) / 1e9, 3)
        if key == "minutes":
            return dn.sig(s["seconds_cells_total"] / 60, 2)
        if key == "steps":
            return str(s["settings"][0]["steps"])
        if key == "does_not":
            return str(len(s["answer"]["does_not"]))
        return dn.sig(next(r for r in table() if r["run"] == "scratch")["target_loss"], 3)

    def plan() -> dict[str, Any]:
        return dn.load_json(f"{DIR}/paper-plan.json")

    @dn.quantity("growth_target/plan_table")
    def _plan_table() -> str:
        head = (
            "width",
            "parameters",
            "tokens",
            "budget B (FLOPs)",
            "runs × seeds",
            "GPU-hours expected",
            "GPU-hours at most",
        )
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in plan()["rows"]:
            lines.append(
                f"| {r['width']} | {dn.sig(r['parameters'] / 1e6, 3)} M | {dn.sig(r['tokens'] / 1e9, 2)} B "
                f"| {r['budget_flops']:.2e} | {r['runs_per_seed']} × {r['seeds']} "
                f"| {dn.sig(r['gpu_hours_predicted'], 2)} | {dn.sig(r['gpu_hours_upper'], 2)} |"
            )
        return dn.block(lines)

    @dn.quantity("growth_target/sustained")
    def _sustained() -> str:
        return f"{plan()['sustained_flops']:.1e}".replace("e+", "e")

    @dn.quantity("growth_target/crossover")
    def _short_crossover() -> str:
        c = next(r for r in table() if r["run"] == "continue-depth")
        w = next(r for r in table() if r["run"] == "continue-width")
        return f"{c['crossover_beyond']} of {len(c['crossover_seeds'])} (depth) and {w['crossover_beyond']} of {len(w['crossover_seeds'])} (width)"

    register_budgets(dn)
    register_summary(dn)
    register_words(dn)


# ---- the budget study: benchmarks/results/grow-target-<tag>/ (tag t20, t60: tokens per parameter)
BUDGET_TABLE = (*TABLE[:7], "verdict (> 1×)", TABLE[-1])


def register_budgets(dn: Any) -> None:
    def table(tag: str) -> list[dict[str, Any]]:
        return list(dn.load_rows(f"benchmarks/results/grow-target-{tag}/comparison.jsonl"))

    def summary(tag: str) -> dict[str, Any]:
        return dn.load_json(f"benchmarks/results/grow-target-{tag}/summary.json")

    def rows(tag: str) -> list[dict[str, Any]]:
        return list(dn.load_rows(f"benchmarks/results/grow-target-{tag}/results.jsonl"))

    def x(v: Any) -> str:
        return _x(dn, v)

    def interval(r: dict[str, Any], key: str = "speedup") -> str:
        return _interval(dn, r, key)

    @dn.pattern(r"growth_budget/(t\d+)/table")
    def _table(tag: str) -> str:
        lines = ["| " + " | ".join(BUDGET_TABLE) + " |", "|" + "---|" * len(BUDGET_TABLE)]
        for r in table(tag):
            cells = [*_label_cells(dn, r), r.get("verdict_continue") or "–", dn.sig(r["final_loss"], 3)]
            lines.append("| " + " | ".join(cells) + " |")
        return dn.block(lines)

    @dn.pattern(r"growth_budget/(t\d+)/(verdict|crossover|target|tokens|seeds|steps|minutes|params|best)")
    def _field(tag: str, key: str) -> str:
        s, t = summary(tag), table(tag)
        scratch = next(r for r in t if r["run"] == "scratch")
        if key == "verdict":
            return s["answer"]["verdict"]
        if key == "crossover":
            c = next(r for r in t if r["run"] == "continue-depth")
            n = len(c["crossover_seeds"])
            if c["crossover"] is None:
                return f"beyond B in {c['crossover_beyond']} of {n} seeds"
            beyond = f"; beyond B in {c['crossover_beyond']} of {n}" if c["crossover_beyond"] else ""
            return f"{dn.sig(c['crossover'], 2)} B ({interval(c, 'crossover')}{beyond})"
        if key == "target":
            return f"{dn.sig(scratch['target_loss'], 3)} ± {dn.sig(scratch['target_se'], 1)}"
        if key == "tokens":
            return dn.sig(scratch["tokens_per_param"], 2)
        if key == "seeds":
            return str(len(s["seeds"]))
        if key == "steps":
            return str(scratch["budget_steps"])
        if key == "minutes":
            return dn.sig(s["seconds_cells_total"] / 60, 2)
        if key == "params":
            return f"{rows(tag)[0]['target_parameters']:,}"
        a = s["answer"]
        best = next(r for r in t if r["run"] == a["best"])
        return f"`{a['best']}`: {x(best['speedup'])} ({interval(best)}), vs continue-small {x(best['vs_continue'])} ({interval(best, 'vs_continue')})"

    @dn.pattern(r"growth_budget/(t\d+)/planner")
    def _planner(tag: str) -> str:
        from widthscope.growth.schedule import growth_pays

        by = {(r["run"], r["seed"]): r for r in rows(tag)}
        right = n = 0
        for (run, seed), r in by.items():
            if run != "continue-depth":
                continue
            target = by[("scratch", seed)]["target_loss"]
            budget = r["budget_flops"]
            early = [p for p in r["curve"] if p[0] <= 0.25 * budget * (1 + 1e-9)]
            said = growth_pays(early, budget, target)["decision"]
            right += said == ("continue" if r["reached"] else "grow")
            n += 1
        return f"{right} of {n}"

    @dn.quantity("growth_power/table")
    def _power() -> str:
        head = ("seed sd (log)", "true speed-up", "true vs continue", "says holds (≥ 1.3×)", "says holds (> 1×)")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in dn.load_rows("benchmarks/results/grow_target_power.jsonl"):
            lines.append(
                f"| {r['seed_sd_log']} | {r['speedup']}× | {r['vs_continue']}× "
                f"| {round(100 * r['holds'])}% | {round(100 * r['holds_continue'])}% |"
            )
        return dn.block(lines)


# ---- the three budgets side by side: the short suite (grow-target/) and the budget study
BUDGETS = (("grow-target", "short suite, constant rate"), ("grow-target-t20", "cosine decay"),
           ("grow-target-t60", "cosine decay"))


def register_summary(dn: Any) -> None:
    def x(v: Any) -> str:
        return _x(dn, v)

    def lo(r: dict[str, Any], key: str) -> str:
        return "" if r.get(f"{key}_lo") is None else f" ({_interval(dn, r, key)})"

    @dn.quantity("growth_budget/summary")
    def _summary() -> str:
        head = (
            "rows",
            "tokens per target parameter",
            "target loss ± SE",
            "target model ahead of the small one (depth) from",
            "best growth label",
            "vs scratch (95%)",
            "verdict (≥ 1.3×)",
            "vs continue-small (95%)",
            "verdict (> 1×)",
            "answer",
        )
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for d, what in BUDGETS:
            table = list(dn.load_rows(f"benchmarks/results/{d}/comparison.jsonl"))
            rows = list(dn.load_rows(f"benchmarks/results/{d}/results.jsonl"))
            a = dn.load_json(f"benchmarks/results/{d}/summary.json")["answer"]
            scratch = [r for r in rows if r["run"] == "scratch"]
            cell_tokens = [r.get("tokens_per_param") for r in scratch]
            if cell_tokens[0] is None:  # rows from before the budget was recorded: count it
                from widthscope.growth.target import TARGET_SUITES

                c = TARGET_SUITES["short"]
                cell_tokens = [r["steps"] * c["batch_size"] * c["seq_len"] / r["parameters"] for r in scratch]
            tpp = sum(cell_tokens) / len(cell_tokens)
            ses = [r.get("target_se") for r in scratch]
            target = sum(r["target_loss"] for r in scratch) / len(scratch)
            se = "" if ses[0] is None else f" ± {dn.sig(sum(ses) / len(ses), 1)}"
            cont = next(r for r in table if r["run"] == "continue-depth")
            n = len(cont["crossover_seeds"])
            if cont["crossover"] is None:
                cross = f"beyond B ({cont['crossover_beyond']}/{n} seeds)"
            else:
                cross = f"{dn.sig(cont['crossover'], 2)} B" + (
                    f" (beyond B in {cont['crossover_beyond']}/{n})" if cont["crossover_beyond"] else ""
                )
            best = next(r for r in table if r["run"] == a["best"])
            lines.append(
                f"| `{d}/` ({what}) | {dn.sig(tpp, 2)} | {dn.sig(target, 3)}{se} | {cross} | `{a['best']}` "
                f"| {x(best['speedup'])}{lo(best, 'speedup')} | {best['verdict']} "
                f"| {x(best['vs_continue'])}{lo(best, 'vs_continue')} | {best.get('verdict_continue') or '–'} "
                f"| {a['verdict']} |"
            )
        return dn.block(lines)


def register_words(dn: Any) -> None:
    @dn.pattern(r"growth_budget/(t\d+)/tpp")
    def _tpp(tag: str) -> str:
        rows = [r for r in dn.load_rows(f"benchmarks/results/grow-target-{tag}/results.jsonl") if r["run"] == "scratch"]
        return dn.sig(sum(r["tokens_per_param"] for r in rows) / len(rows), 2)

    @dn.quantity("growth_budget/goal")
    def _goal() -> str:
        return dn.sig(dn.load_json("benchmarks/results/grow-target-t60/summary.json")["answer"]["threshold"], 2)
