"""Numbers of the NTK ``auto`` grid in docs/performance.md: every method at every grid point.

From ``benchmarks/results/ntk-auto-grid-cpu.json``, written by
``OMP_NUM_THREADS=1 python benchmarks/ntk_auto_grid.py --small-reps 9`` (then ``--rerun-misses``), the run
before the fitted cost terms (``ntk-auto-grid-rev2-cpu.json``) and the fit's measurements
``benchmarks/results/ntk-auto-fit-cpu.json`` (``benchmarks/ntk_auto_fit.py``). Keys: ``ntkgrid/table``,
``ntkgrid/points``, ``ntkgrid/within``, ``ntkgrid/choice_within``, ``ntkgrid/misses``, ``ntkgrid/load``,
``ntkgrid/worst``, ``ntkgrid/worst_choice``, ``ntkgrid/picks/<method>``, ``ntkgrid/rev2/within``,
``ntkgrid/rev2/points``, ``ntkgrid/fit/shapes``, ``ntkgrid/fit/grid_shapes``, ``ntkgrid/fit/regret``,
``ntkgrid/fit/<method>/<term>``, ``ntkgrid/fit/recount/(recorded|now)/<row>`` (the probe's saved bytes of a fit
row as measured and as recounted: ``ntk_auto_fit.py --recount``), ``ntkgrid/rechosen/changed``,
``ntkgrid/rechosen/rev``.

The pick (``auto picks``, ``choice/fastest``, ``choice_within``, ``worst_choice``, ``picks``) is the current
code's where a row records it (``rechosen``: ``ntk_auto_grid.py --choice-only``, issue 32), marked ``²`` where
it differs from the timed run's; ``auto``'s own time and ``auto/fastest`` are always the timed run's.
"""

from __future__ import annotations

from typing import Any

RESULT = "benchmarks/results/ntk-auto-grid-cpu.json"
REV2 = "benchmarks/results/ntk-auto-grid-rev2-cpu.json"
FIT = "benchmarks/results/ntk-auto-fit-cpu.json"
PATHS = ("structured", "per_example", "jacobian", "products", "vmap_jacrev")
MISS = 1.25
ARCHS = ("mlp", "llama", "gpt2", "encoder")


def register(dn: Any) -> None:
    def rows() -> list[dict[str, Any]]:  # in grid order: architecture, width, outputs, n
        return sorted(
            dn.load_json(RESULT).values(), key=lambda r: (ARCHS.index(r["arch"]), r["width"], r["outputs"], r["n"])
        )

    def pick(r: dict[str, Any]) -> str:  # the current code's choice where recomputed, else the timed run's
        return r["rechosen"]["auto_choice"] if "rechosen" in r else r["auto_choice"]

    def pick_ratio(r: dict[str, Any]) -> float | None:
        return r["rechosen"]["choice_ratio"] if "rechosen" in r else r.get("choice_ratio")

    def cell(r: dict[str, Any], m: str) -> str:
        if m in r["seconds"]:
            s = dn.sig(r["seconds"][m], 2)
            return s + "¹" if m in r.get("dropped", {}) else s
        if m in r.get("failed", {}):
            return "failed"
        return "–"

    def out(r: dict[str, Any]) -> str:
        return "vocab" if r["arch"] in ("llama", "gpt2") and r["outputs"] == 64 else str(r["outputs"])

    @dn.quantity("ntkgrid/table")
    def _table() -> str:
        head = [
            "model",
            "width",
            "outputs",
            "n",
            "params",
            "auto picks",
            *PATHS,
            "auto",
            "fastest",
            "auto/fastest",
            "choice/fastest",
            "load",
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows():
            load = dn.span(r["loadavg_start"][0], r["loadavg_end"][0], lambda v: dn.sig(v, 2))
            ratio = f"{r['auto_ratio']:.2f}" + (" (rerun)" if "first_run" in r else "")
            choice = f"{pick_ratio(r):.2f}" if pick_ratio(r) is not None else "–"
            picked = pick(r) + ("²" if pick(r) != r["auto_choice"] else "")
            lines.append(
                "| "
                + " | ".join(
                    [
                        r["arch"],
                        str(r["width"]),
                        out(r),
                        str(r["n"]),
                        str(r["params"]),
                        picked,
                        *(cell(r, m) for m in PATHS),
                        dn.sig(r["seconds"]["auto"], 2),
                        r["fastest"],
                        ratio,
                        choice,
                        load,
                    ]
                )
                + " |"
            )
        return dn.block(lines)

    @dn.quantity("ntkgrid/points")
    def _points() -> str:
        return str(len(rows()))

    @dn.quantity("ntkgrid/within")
    def _within() -> str:
        return str(sum(r["auto_ratio"] <= MISS for r in rows()))

    @dn.quantity("ntkgrid/choice_within")
    def _choice_within() -> str:
        return str(sum((pick_ratio(r) or 99.0) <= MISS for r in rows()))

    @dn.quantity("ntkgrid/worst")
    def _worst() -> str:
        return f"{max(r['auto_ratio'] for r in rows()):.2f}"

    @dn.quantity("ntkgrid/worst_choice")
    def _worst_choice() -> str:
        return f"{max(pick_ratio(r) or 0.0 for r in rows()):.2f}"

    @dn.quantity("ntkgrid/misses")
    def _misses() -> str:
        bad = [r for r in rows() if r["auto_ratio"] > MISS]
        if not bad:
            return "none"
        return ", ".join(
            f"{r['arch']}-{r['width']} {out(r)} out n={r['n']} ({r['auto_ratio']:.2f}×, "
            f"{dn.sig(r['seconds'][r['fastest']] * 1e3, 2)} ms {r['fastest']})"
            for r in bad
        )

    @dn.quantity("ntkgrid/load")
    def _load() -> str:
        v = [x for r in rows() for x in (r["loadavg_start"][0], r["loadavg_end"][0])]
        return dn.span(min(v), max(v), lambda x: dn.sig(x, 2))

    @dn.pattern(r"ntkgrid/picks/(structured|per_example|jacobian|products)")
    def _picks(m: str) -> str:
        return str(sum(pick(r) == m for r in rows()))

    @dn.quantity("ntkgrid/rechosen/changed")
    def _changed() -> str:
        moved = [r for r in rows() if pick(r) != r["auto_choice"]]
        return (
            ", ".join(
                f"{r['arch']}-{r['width']} {out(r)} out n={r['n']} ({r['auto_choice']} → {pick(r)}: "
                f"{r['choice_ratio']:.2f}× → {pick_ratio(r):.2f}× the fastest)"
                for r in moved
            )
            or "none"
        )

    @dn.quantity("ntkgrid/rechosen/rev")
    def _rechosen_rev() -> str:
        revs = {r["rechosen"]["code_rev"] for r in rows() if "rechosen" in r}
        return ", ".join(map(str, sorted(revs))) or "none"

    @dn.quantity("ntkgrid/rev2/within")
    def _rev2_within() -> str:
        return str(sum(r["auto_ratio"] <= MISS for r in dn.load_json(REV2).values()))

    @dn.quantity("ntkgrid/rev2/points")
    def _rev2_points() -> str:
        return str(len(dn.load_json(REV2)))

    @dn.quantity("ntkgrid/fit/shapes")
    def _fit_shapes() -> str:
        return str(len(dn.load_json(FIT)["rows"]))

    @dn.quantity("ntkgrid/fit/grid_shapes")
    def _fit_grid_shapes() -> str:
        grid = {(r["arch"], r["width"], r["outputs"], r["n"]) for r in rows()}
        return str(
            sum((r["arch"], r["width"], r["outputs"], r["n"]) in grid for r in dn.load_json(FIT)["rows"].values())
        )

    @dn.quantity("ntkgrid/fit/regret")
    def _fit_regret() -> str:
        return f"{max(dn.load_json(FIT)['fit_regret'].values()):.2f}"

    @dn.pattern(r"ntkgrid/fit/recount/(recorded|now)/([a-z0-9]+/[0-9]+/[a-z0-9]+/[0-9]+)")
    def _recount(which: str, row: str) -> str:  # the probe's saved bytes of a fit row before/after issue 32's fix
        return str(dn.load_json(FIT)["recounted"]["saved_bytes"][row][0 if which == "recorded" else 1])

    @dn.pattern(r"ntkgrid/fit/(per_example|jacobian|structured)/([a-z]+)")
    def _fit(method: str, term: str) -> str:
        return dn.sig(dn.load_json(FIT)["fit"][method][term], 2)
