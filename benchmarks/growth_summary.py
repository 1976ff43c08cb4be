"""The growth benchmark's numbers in the docs, rendered from the committed rows.

Reads ``benchmarks/results/growth/results.jsonl`` (rows ``kind="growth_bench"``), recomputes the
comparison (:func:`widthscope.growth.compare.compare`) and renders the README growth bullet and the
tables of docs/interventions.md §5 (:mod:`widthscope.report.growth`). Each rendered block sits
between ``<!-- growth-summary:NAME -->`` and ``<!-- /growth-summary:NAME -->`` in its file.

    python benchmarks/growth_summary.py --write    # rewrite the blocks in README.md and the docs page
    python benchmarks/growth_summary.py --check    # exit 1 naming every block that differs

``tests/test_growbench.py`` runs the check, so a number in the docs cannot drift from the rows.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "growth"
TARGETS = {"readme": ROOT / "README.md", "findings": ROOT / "docs" / "interventions.md",
           "practitioner": ROOT / "docs" / "interventions.md",
           "criteria": ROOT / "docs" / "interventions.md", "default": ROOT / "docs" / "interventions.md"}


def load_rows(results: Path = RESULTS) -> list[dict]:
    return [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines() if line.strip()]


def _iv(r: dict, m: str, spec: str) -> str:
    from widthscope.report.growth import iv

    return iv(r, m, spec)


def findings(table: list[dict], rows: list[dict], default: str) -> str:
    """The measured statements of docs/interventions.md §5, one bullet each."""
    by = {(r["model"], r["criterion"]): r for r in table if r.get("kind") == "growth_compare"}
    models = [m for (m, c) in by if c == "last" and m != "overall"]
    nat = [m for m in models if not by[(m, "last")]["known_answer"]]
    planted = [m for m in models if m not in nat]
    crits = ("bias", "block", "gradmax", "certified", "line_search", "block_d_align")
    bench = [r for r in rows if r.get("kind") == "growth_bench"]
    cells = {r["cell_id"]: r for r in bench}
    out = []

    def verdict(r: dict, m: str) -> str:
        return "better" if r[m + "_lo"] > 0 else "worse" if r[m + "_hi"] < 0 else "not distinguishable"

    out.append("- **Growing vs training the original model for the same FLOPs** (gain of the oracle's point "
               "− continue-training gain): " + "; ".join(
                   f"{m} {_iv(by[(m, 'oracle')], 'advantage', '+.4f')} ({verdict(by[(m, 'oracle')], 'advantage')})"
                   for m in models) + ". At the last block: " + "; ".join(
                   f"{m} {_iv(by[(m, 'last')], 'advantage', '+.4f')}" for m in models)
               + ". Grow-then-train-all minus continue, at the last block: " + "; ".join(
                   f"{m} {_iv(by[(m, 'last')], 'all_vs_continue', '+.4f')}" for m in models) + ".")
    out.append("- **Reproducibility ceiling** (Spearman between block seeds over the points): " + "; ".join(
        f"{m} {_iv(by[(m, 'ceiling')], 'spearman', '.2f')}" for m in nat) + ". The oracle chosen on A, scored "
        "on B: regret/spread " + "; ".join(f"{m} {_iv(by[(m, 'oracle')], 'norm_regret', '.2f')}" for m in nat) + ".")
    best = []
    for m in nat:
        c = max(crits, key=lambda c: by[(m, c)]["spearman"])
        r = by[(m, c)]
        best.append(f"{m} `{c}` {_iv(r, 'spearman', '.2f')}{' (interval excludes 0)' if r['spearman_lo'] > 0 else ''}")
    out.append("- **Best criterion per model by Spearman** (out of " + str(len(crits)) + " criteria and "
               f"{len(nat)} models, so an interval excluding 0 somewhere is expected by chance): " + "; ".join(best) + ".")
    out.append("- **Last block vs random** (regret/spread): " + "; ".join(
        f"{m} {_iv(by[(m, 'last')], 'norm_regret', '.2f')} vs {by[(m, 'random')]['norm_regret']:.2f}" for m in nat) + ".")
    out.append("- **Planted blocks found** (top-1 hits over model seeds): " + "; ".join(
        f"{m}: " + ", ".join(f"`{c}` {by[(m, c)].get('hit_count', 0):.0f}/{by[(m, c)]['n_seeds']}" for c in crits)
        + f", last {by[(m, 'last')].get('hit_count', 0):.0f}/{by[(m, 'last')]['n_seeds']}" for m in planted) + ".")
    ties = sum(by[("overall", c)]["ties"] for c in crits)
    nans = sum(by[("overall", c)]["nan"] for c in crits)
    undef = sum(by[("overall", c)]["undefined_spearman"] for c in crits)
    out.append(f"- **Counted, not dropped** (natural models, all criteria): {ties} tied picks, {nans} NaN values, "
               f"{undef} constant rankings.")
    trained = [r for r in cells.values() if r.get("base_plateau") is not None]
    stopped = sum(1 for r in trained if r["base_plateau"])
    steps = sorted(int(r["base_steps"]) for r in trained)
    out.append(f"- **Base models**: {stopped} of {len(trained)} stopped by the plateau rule, {len(trained) - stopped} "
               f"at the step cap; {steps[0]}–{steps[-1]} steps.")
    scr = [r for r in cells.values() if r.get("scratch_loss_B") is not None]
    if scr:
        g = [r["loss_before"] - r["scratch_loss_B"] for r in scr]
        out.append(f"- **From scratch at the grown size** ({', '.join(sorted({r['model'] for r in scr}))}): held-out "
                   f"gain over the base model {min(g):+.4f} to {max(g):+.4f} nats, at "
                   f"{min(r['scratch_flops'] for r in scr) / max(r['flops_block_step'] * r['long'] for r in scr):.0f}× "
                   "or more the growth budget.")
    caps = sorted({r["env_cpu_capability"] for r in bench})
    secs = sum(r["seconds_cell"] for r in cells.values())
    out.append(f"- **Run**: {len(cells)} cells, {secs / 60:.0f} min of cell time in one single-threaded process "
               f"(CPU capability {', '.join(caps)}, torch {bench[0]['env_torch']}).")
    return "\n".join(out) + "\n"


def blocks(rows: list[dict]) -> dict[str, str]:
    """Every rendered block, by name."""
    from widthscope.growth.compare import compare, winner
    from widthscope.report.growth import compact_table, practitioner_table, readme_sentence

    table = compare(rows)
    w = winner(table)
    hits = ", ".join(f"{c} {h:.0f}" for c, h in w["planted_hits"].items())
    return {"readme": readme_sentence(table, w, rows), "findings": findings(table, rows, w["criterion"]),
            "practitioner": practitioner_table(table, rows, w["criterion"]),
            "criteria": compact_table(table),
            "default": (f"Rule result: **`{w['grow_name']}`** ({w['why']}; planted blocks found, summed over the "
                        f"two planted cases: {hits}).\n")}


def _span(text: str, name: str) -> tuple[int, int] | None:
    a, b = f"<!-- growth-summary:{name} -->\n", f"<!-- /growth-summary:{name} -->"
    i = text.find(a)
    j = text.find(b, i + len(a)) if i >= 0 else -1
    return None if i < 0 or j < 0 else (i + len(a), j)


def check(rows: list[dict] | None = None) -> list[str]:
    """Names of the blocks whose text in the docs differs from the rendering (or is missing)."""
    bad = []
    for name, text in blocks(load_rows() if rows is None else rows).items():
        doc = TARGETS[name].read_text()
        sp = _span(doc, name)
        if sp is None or doc[sp[0]:sp[1]] != text:
            bad.append(f"{TARGETS[name].relative_to(ROOT)}: block {name!r} "
                       f"{'is missing' if sp is None else 'differs from the committed rows'}")
    return bad


def write(rows: list[dict] | None = None) -> None:
    for name, text in blocks(load_rows() if rows is None else rows).items():
        path = TARGETS[name]
        doc = path.read_text()
        sp = _span(doc, name)
        if sp is None:
            raise SystemExit(f"{path}: add the markers <!-- growth-summary:{name} --> and "
                             f"<!-- /growth-summary:{name} --> where the block belongs")
        path.write_text(doc[:sp[0]] + text + doc[sp[1]:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true")
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    if a.write:
        write()
    if a.check or not a.write:
        bad = check()
        for b in bad:
            print(b)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
