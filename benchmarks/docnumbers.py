"""Every measured number in README.md and docs/*.md, computed from committed result files.

A number in the Markdown is written inside a marker that names a quantity of this module::

    two-population `d_align` <!--n:reg/range/shifted/all/d_align/2-->0.034–3.9<!--/n--> on prose

(an HTML comment: invisible on the rendered page). Each quantity is a function of files committed
under ``benchmarks/results/`` or ``docs/`` (result rows, recorded benchmark JSON — never typed-in
values) that returns the exact text of the span; a span may hold a whole table. Named quantities
are registered with ``@quantity(key)``, families with ``@pattern(regex)`` (the key's groups are the
arguments). ``tests/test_docnumbers.py`` reruns ``--check``, so a page whose numbers disagree with
the committed rows fails the test suite.

Usage::

    python benchmarks/docnumbers.py --check      # exit 1 and list every span whose text differs
    python benchmarks/docnumbers.py --write      # rewrite the marked spans from the rows
    python benchmarks/docnumbers.py --unmarked   # digits outside markers in the checked sections
    python benchmarks/docnumbers.py --show KEY   # one quantity
    python benchmarks/docnumbers.py --compact SWEEP_DIR benchmarks/results/NAME   # rows to commit

``--unmarked`` lists digit sequences in the sections named in ``SECTIONS`` that are neither inside
a marker, nor inside a code span (formulas, symbols, commands: ``α = −1``, ``M = K``), nor part of
a name (``float64``), nor one of that section's allowed phrases (set-up such as "at step 100").
The file is not ``numbers.py``: run from ``benchmarks/`` that would shadow the stdlib ``numbers``.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import MINUS, fixed, sci  # noqa: E402  (number formatting, shared with iv_series)

# Keys start with a lowercase letter (so prose can show the form as ``<!--n:KEY-->``); a body holds no
# other comment, so an opener without its closer never swallows the text up to a later span.
MARK = re.compile(r"<!--n:([a-z][A-Za-z0-9_.\-/=+]*)-->((?:(?!<!--).)*?)<!--/n-->", re.S)
PAGES = ("README.md", "docs/*.md")

QUANTITIES: dict[str, Callable[[], str]] = {}
PATTERNS: list[tuple[re.Pattern[str], Callable[..., str]]] = []


def pattern(regex: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register ``fn(*groups) -> str`` for every key that fully matches ``regex`` (a family of
    quantities, e.g. ``slope/<run>/<metric>/<alpha>/<step>/<form>``)."""
    def register(fn: Callable[..., str]) -> Callable[..., str]:
        PATTERNS.append((re.compile(regex), fn))
        return fn
    return register


def resolve(key: str) -> Callable[[], str]:
    """The function computing ``key``: a named quantity or the first matching pattern."""
    if key in QUANTITIES:
        return QUANTITIES[key]
    for rx, fn in PATTERNS:
        m = rx.fullmatch(key)
        if m:
            return functools.partial(fn, *m.groups())
    raise KeyError(f"unknown quantity {key!r}: define it in benchmarks/docnumbers.py")


def quantity(key: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register ``fn() -> str`` as the text of the spans marked ``key``."""
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        if key in QUANTITIES:
            raise ValueError(f"quantity {key!r} defined twice")
        QUANTITIES[key] = fn
        return fn
    return register


# --------------------------------------------------------------------------- formatting

def sig(v: float, n: int = 2, minus: str = MINUS) -> str:
    """``v`` to ``n`` significant digits, never in exponent form; integer digits are kept (0.00331, 2.2, 316)."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    digits = max(0, n - 1 - math.floor(math.log10(abs(v))))
    return fixed(round(v, digits), digits, minus)


def span(lo: float, hi: float, fmt: Callable[[float], str]) -> str:
    """``lo–hi`` (en dash), or one value when both print the same."""
    a, b = fmt(lo), fmt(hi)
    return a if a == b else f"{a}–{b}"


def block(lines: Sequence[str]) -> str:
    """A multi-line span (a table): blank lines inside the markers keep it a Markdown block."""
    return "\n\n" + "\n".join(lines) + "\n\n"


def ci(s: Mapping[str, Any], minus: str = "-") -> str:
    """A slope with its interval, as the linearization tables print it: -0.75 [-0.80, -0.71]."""
    return f"{fixed(s['slope'], 2, minus)} [{fixed(s['ci_low'], 2, minus)}, {fixed(s['ci_high'], 2, minus)}]"


# --------------------------------------------------------------------------- committed files

@functools.lru_cache(maxsize=None)
def load_json(rel: str) -> Any:
    """A committed JSON file (path relative to the repository root)."""
    return json.loads((ROOT / rel).read_text())


@functools.lru_cache(maxsize=None)
def load_rows(rel: str) -> tuple[dict[str, Any], ...]:
    """The rows of a committed JSONL file (path relative to the repository root)."""
    return tuple(json.loads(line) for line in (ROOT / rel).read_text().splitlines() if line.strip())


def ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --------------------------------------------------------------------------- check / write

def pages(root: Path = ROOT) -> list[Path]:
    """The Markdown files whose marked spans are checked."""
    out: list[Path] = []
    for pattern in PAGES:
        out += sorted(root.glob(pattern))
    return out


def spans(text: str) -> list[tuple[str, str]]:
    """``(key, text)`` of every marked span, in order."""
    return [(m.group(1), m.group(2)) for m in MARK.finditer(text)]


def rewrite(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every marked span whose key is in ``values`` replaced by that value."""
    return MARK.sub(lambda m: m.group(0) if m.group(1) not in values else
                    f"<!--n:{m.group(1)}-->{values[m.group(1)]}<!--/n-->", text)


def compute(keys: Iterable[str], errors: dict[str, str] | None = None) -> dict[str, str]:
    """The text of each quantity. An unknown key or a failing quantity raises with its name, or,
    when ``errors`` is given, is recorded there (key -> message) and left out."""
    out = {}
    for key in keys:
        try:
            out[key] = resolve(key)()
        except Exception as exc:  # name the quantity, keep the cause
            if errors is None:
                raise RuntimeError(f"quantity {key!r}: {type(exc).__name__}: {exc}") from exc
            errors[key] = f"{type(exc).__name__}: {exc}"
    return out


def lint(text: str) -> list[str]:
    """Marker placements that would change the rendered page. A line that *starts* with ``<!--``
    is an HTML block in CommonMark (it ends the paragraph and shows its Markdown raw), so an inline
    span must not begin a line; a multi-line span (a table) starts and ends with a blank line
    inside its markers, each marker alone on its line."""
    out = []
    for m in MARK.finditer(text):
        key, body = m.group(1), m.group(2)
        line_start = text.rfind("\n", 0, m.start()) + 1
        at_start = not text[line_start:m.start()].strip()
        if "\n" not in body and at_start:
            out.append(f"{key}: inline span begins a line (it would render as raw HTML); move a word before it")
        if "\n" in body and not (at_start and body.startswith("\n\n") and body.endswith("\n\n")):
            out.append(f"{key}: a multi-line span needs its markers on their own lines and blank lines inside")
    return out


def check(files: Sequence[Path] | None = None) -> list[str]:
    """One line per marked span whose text differs from its quantity, or that is badly placed
    (``lint``); empty when every span agrees with the rows."""
    problems = []
    for path in files if files is not None else pages():
        text = path.read_text()
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        problems += [f"{where}: {p}" for p in lint(text)]
        found = spans(text)
        values = compute(dict.fromkeys(k for k, _ in found))
        problems += [f"{where}: {key}: page has {shown!r}, rows give {values[key]!r}"
                     for key, shown in found if shown != values[key]]
    return problems


def write(files: Sequence[Path] | None = None, errors: dict[str, str] | None = None) -> list[Path]:
    """Rewrite the marked spans of every page from the rows; returns the files that changed.
    Spans whose quantity fails keep their text and are listed in ``errors`` (raises without it)."""
    changed = []
    for path in files if files is not None else pages():
        text = path.read_text()
        new = rewrite(text, compute(dict.fromkeys(k for k, _ in spans(text)), errors))
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


# --------------------------------------------------------------------------- unmarked digits

# (file, heading): phrases in that section whose digits are set-up, not measurements.
SECTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("README.md", "## What we measured so far"): (
        "at width 1024 and n = 256",
        "at step 100",
        "widths 32–256, 2 seeds",
    ),
    # set-up (the config, the protocol), not measurements
    ("docs/interventions.md", "### LLaMA-style width series"): (
        "widths 32, 64, 128, 256", "depth 4, seeds 0 and 1", "64-byte chunks, 2048 train / 256 held-out",
        "400 AdamW steps of\nbatch 16 at lr 3e-3", "float32", "the 4 block outputs",
        "(128 train, 128 held-out examples)", "the first 64 of each", "9 half-decades up to 1",
        "256 training chunks\ndrawn at random (seed 123) from the 2048, held-out pool = all 256",
        "1e-3 of the activation RMS", "Width 256: seed 0 only, 100 draws", "2-core machine",
        "at widths 32, 64, 128, 256", "per width 4 points × 2 seeds", "loss near 2", "above 1 where",
        "10^-1.5 rel.", "at 0.1", '"96–99% retained"', "at 1e-3", "at 1e-2",
        "(M, K) = (32, 32)", "η = 1e-3 rel.", "fresh `M = 32`", "at `M = K = 32`", "of §5",
        "5 seeds", "[−0.5, 2]",
    ),
    ("docs/linearization.md", "## Measured slopes to width 1024 (digits: ReLU and tanh; Fashion-MNIST)"): (
        "widths 64–1024", "n_train = n_test = 256", "64 features, 10\nclasses", "2-hidden-layer",
        "for 100 steps", "η = 0.3·n^α", "α ∈ {0, −0.5, −1}", "at step 100", "step 10", "α = −0.5", "α = −1",
        "α = 0", "`2α − 1`", "`α − 1`", "`1/n`", "`n^{−1/2}`", "784 features", "η = 0.1·n^α",
        "α ∈ {0,\n−0.5, −1}", "10 seeds", "width-8192", "α ∈ {0, −0.5}", "float64", "C02", "C12", "C11",
        "fashion-mnist", "Fashion-MNIST", "95% interval", "α < 0", "grid 2001 on [−5, 5]", "k = 1..6",
        "x = 0 (order 1)",
    ),
    # the benchmark sections of these pages quote the committed rows only (docs/benchmarks.json)
    ("docs/certify.md", "## 5. Speed"): (
        "(median of 3 runs)", "4-layer", "vocab 256", "batches of 16", "all 4 block outputs", "1000 misalignment",
        "float32",
    ),
    ("docs/statistics.md", "## 8. Benchmark"): (
        "float64", "medians of 3 repeats", "±20%", "the three pairs",
    ),
}


def section(text: str, heading: str) -> str:
    """The text from ``heading`` to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith(heading)), None)
    if start is None:
        raise ValueError(f"heading {heading!r} not found")
    end = next((j for j in range(start + 1, len(lines))
                if re.match(rf"#{{1,{level}}} ", lines[j])), len(lines))
    return "".join(lines[start + 1:end])


def strip_exempt(text: str, allowed: Sequence[str]) -> str:
    """``text`` without marked spans, code spans, link targets, comments, section references and
    allowed phrases."""
    text = MARK.sub(" ", text)
    # blocks rendered and checked by benchmarks/growth_summary.py (tests/test_growbench.py)
    text = re.sub(r"<!-- (growth-summary:[\w-]+) -->.*?<!-- /\1 -->", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"§\s?\d+", " ", text)  # section references (§5)
    for phrase in allowed:
        text = text.replace(phrase, " ")
    return text


def unmarked(root: Path = ROOT) -> list[str]:
    """``file: ...context...`` for every digit outside markers in the sections of ``SECTIONS``."""
    out = []
    for (rel, heading), allowed in SECTIONS.items():
        body = strip_exempt(section((root / rel).read_text(), heading), allowed)
        for m in re.finditer(r"(?<![A-Za-z_\d])\d+", body):  # not the digits of a name (float64)
            ctx = body[max(0, m.start() - 30):m.end() + 30].replace("\n", " ")
            out.append(f"{rel} {heading!r}: {m.group()!r} in ...{ctx}...")
    return out


def compact(src: Path, dst: Path, drop: Sequence[str] = ("probe_data",)) -> int:
    """Write the rows of a sweep's ``cells/*.json`` (each cell once, in cell order) to
    ``dst/results.jsonl`` without the ``drop`` fields, and copy ``sweep.json``; returns the row
    count. Checkpoints and samples are never copied."""
    rows = []
    for cell in sorted(src.glob("cells/*.json")):
        rows += json.loads(cell.read_text())["rows"]
    rows.sort(key=lambda r: (r.get("cell_index", 0), r.get("row_index", 0)))
    dst.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({k: v for k, v in r.items() if k not in drop}, separators=(",", ":")) for r in rows]
    (dst / "results.jsonl").write_text("\n".join(lines) + "\n")
    if (src / "sweep.json").exists():
        (dst / "sweep.json").write_text((src / "sweep.json").read_text())
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="exit 1 when a marked number disagrees with the rows")
    g.add_argument("--write", action="store_true", help="rewrite the marked spans from the rows")
    g.add_argument("--unmarked", action="store_true", help="list digits outside markers in checked sections")
    g.add_argument("--show", metavar="KEY", help="print one quantity")
    g.add_argument("--compact", nargs=2, metavar=("SWEEP_DIR", "DEST"),
                   help="commit-sized rows of a sweep: DEST/results.jsonl (no probe_data) + sweep.json")
    args = ap.parse_args(argv)
    if args.compact:
        n = compact(Path(args.compact[0]), Path(args.compact[1]))
        print(f"docnumbers: {n} rows -> {Path(args.compact[1]) / 'results.jsonl'}")
        return 0
    if args.show:
        print(compute([args.show])[args.show])
        return 0
    if args.write:
        errors: dict[str, str] = {}
        for path in write(errors=errors):
            print(f"docnumbers: rewrote {path.relative_to(ROOT)}")
        for key, msg in errors.items():
            print(f"docnumbers: {key}: {msg} (span left as it was)", file=sys.stderr)
        return 1 if errors else 0
    problems = check() if args.check else unmarked()
    for p in problems:
        print(p)
    if args.check:
        n = sum(len(spans(p.read_text())) for p in pages())
        print(f"docnumbers: {n} marked spans, {len(problems)} disagree with the rows", file=sys.stderr)
    return 1 if problems else 0


# =========================================================================== quantities
# Grouped by source. Keys: <page or topic>.<name>.

# ---- docs/benchmarks.json (python benchmarks/run_all.py)

def _bench(name: str) -> list[dict[str, Any]]:
    return load_json("docs/benchmarks.json")["results"][name]


@quantity("bench.probe_speedup_llama")
def _probe_speedup_llama() -> str:
    v = [r["speedup_vs_loop"] for r in _bench("probe")]
    return span(min(v), max(v), lambda x: f"{x:.0f}")


@quantity("bench.probe_speedup_mlp")
def _probe_speedup_mlp() -> str:
    v = [r["loop_over_probe"] for r in _bench("persample")]
    return span(min(v), max(v), lambda x: f"{x:.0f}")


@quantity("bench.probe_vs_floor")
def _probe_vs_floor() -> str:
    v = [r["probe_ex_s"] / r["floor_ex_s"] for r in _bench("probe")]
    return span(min(v), max(v), lambda x: sig(x, 2))


@quantity("bench.stats_share_pct")
def _stats_share() -> str:
    v = [100 * r["stats_s"] / r["probe_s"] for r in _bench("probe")]
    return span(min(v), max(v), lambda x: sig(x, 1))


@pattern(r"bench\.interventions\.([a-z0-9_]+)/([a-z0-9_]+)")
def _interventions_ratio(a: str, b: str) -> str:
    """A ratio column of the interventions benchmark over its widths, e.g. ``cached/probe``."""
    v = [r[f"{a}/{b}"] for r in _bench("interventions")]
    return span(min(v), max(v), lambda x: f"{x:.2f}")  # two decimals: 1.02 is not "1.0"


@quantity("bench.interventions_load")
def _interventions_load() -> str:
    v = [x for r in _bench("interventions") for x in (r["load"], r.get("load_end", r["load"]))]
    return span(min(v), max(v), lambda x: sig(x, 2))


@pattern(r"bench\.table/(probe|stats)")
def _bench_table(name: str) -> str:
    """A section's table exactly as docs/benchmarks.md renders it (the bench module's ``markdown``)."""
    return block(_bench_module(f"bench_{name}").markdown(_bench(name)).strip().splitlines())


@quantity("bench.machine")
def _bench_machine() -> str:
    m = load_json("docs/benchmarks.json")["machine"]
    return (f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} threads, "
            f"load average {m['load_average']}, {str(m['date'])[:10]}")


@quantity("bench.probe_speedup_range")
def _probe_speedup_range() -> str:
    v = [r["speedup_vs_loop"] for r in _bench("probe")]
    return span(min(v), max(v), lambda x: sig(x, 2))


def _moments() -> list[dict[str, Any]]:
    return [r for r in _bench("stats") if r["bench"] == "moments"]


@quantity("bench.stats.dual_best")
def _dual_best() -> str:
    r = max((r for r in _moments() if r["method"] == "dual"), key=lambda r: r["speedup_vs_naive"])
    return f"{sig(r['speedup_vs_naive'], 2)}x at n = {r['n']}, d = {r['d']}"


@quantity("bench.stats.dual_worst")
def _dual_worst() -> str:
    r = min((r for r in _moments() if r["method"] == "dual"), key=lambda r: r["speedup_vs_naive"])
    return f"{sig(1 / r['speedup_vs_naive'], 2)}x slower than naive at n = {r['n']}, d = {r['d']}"


@quantity("bench.stats.auto_right")
def _auto_right() -> str:
    """'N of M cells' where auto's pick (dual or primal) is the faster of the two, and the misses."""
    cells: dict[tuple, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in _moments():
        cells[(r["n"], r["d"])][r["method"]] = r
    right, misses = 0, []
    for (n, d), c in cells.items():
        picked = next(m for m in ("dual", "primal") if c[m]["auto_choice"])
        other = "primal" if picked == "dual" else "dual"
        if c[picked]["median_s"] <= c[other]["median_s"]:
            right += 1
        else:
            misses.append(f"n = {n}, d = {d}: {picked} {sig(c[picked]['median_s'] / c[other]['median_s'], 2)}x "
                          f"the time of {other}")
    return f"{right} of {len(cells)} cells" + (f" (missed: {'; '.join(misses)})" if misses else "")


@quantity("bench.stats.precomputed_speedup")
def _precomputed_speedup() -> str:
    v = [r["speedup_vs_means"] for r in _bench("stats") if r["method"] == "cross-Gram, precomputed"]
    return span(min(v), max(v), lambda x: sig(x, 2))


@quantity("bench.stats.all_pairs_speedup")
def _all_pairs_speedup() -> str:
    v = [r["speedup_vs_separate_calls"] for r in _bench("stats") if r.get("speedup_vs_separate_calls") is not None]
    return span(min(v), max(v), lambda x: sig(x, 2))


# ---- benchmarks/results/ntk-auto-cpu.json (python benchmarks/ntk_auto.py)

def _ntk_auto_ratios(row: str) -> dict[str, float]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ntk_auto", ROOT / "benchmarks" / "ntk_auto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ratios(load_json("benchmarks/results/ntk-auto-cpu.json")[row])


@pattern(r"ntkauto/([a-z0-9\-]+)/(speedup|choice)")
def _ntk_auto_field(row: str, form: str) -> str:
    """One row of the NTK ``auto`` benchmark: the plain torch.func reference's time over structured's
    (per-round median), or the time of auto's choice over the fastest method's."""
    q = _ntk_auto_ratios(row)
    return f"{q['vmap_jacrev_over_structured' if form == 'speedup' else 'choice_ratio']:.2f}"


@quantity("ntkauto.choice_max")
def _ntk_auto_choice_max() -> str:
    rows = load_json("benchmarks/results/ntk-auto-cpu.json")
    return f"{max(_ntk_auto_ratios(r)['choice_ratio'] for r in rows):.2f}"


# ---- benchmarks/results/ntk-scaling-cpu.json (python benchmarks/ntk_scaling.py)

def _ntk(method: str, width: int, n: int) -> dict[str, Any]:
    return load_json("benchmarks/results/ntk-scaling-cpu.json")[f"{method}/{width}/{n}"]


def _ntk_best_ref(width: int, n: int) -> dict[str, Any] | None:
    refs = [_ntk(m, width, n) for m in ("vmap_jacrev", "jacrev", "ntk_vp")]
    refs = [r for r in refs if "seconds" in r]
    return min(refs, key=lambda r: r["seconds"]) if refs else None


@quantity("ntk.structured_s_1024_256")
def _ntk_structured() -> str:
    return f"{_ntk('structured', 1024, 256)['seconds']:.2f}"


@quantity("ntk.best_ref_s_1024_256")
def _ntk_ref() -> str:
    return f"{_ntk_best_ref(1024, 256)['seconds']:.0f}"


@quantity("ntk.speedup_1024_256")
def _ntk_speedup() -> str:
    return f"{_ntk_best_ref(1024, 256)['seconds'] / _ntk('structured', 1024, 256)['seconds']:.0f}"


def _ntk_all() -> dict[str, dict[str, Any]]:
    return load_json("benchmarks/results/ntk-scaling-cpu.json")


@pattern(r"ntk/(structured|floor|vmap_jacrev|jacrev|ntk_vp)/(\d+)/(\d+)/(s2|s0|mb|gb|gflop|need_gb)")
def _ntk_field(method: str, width: str, n: str, form: str) -> str:
    """One recorded cell of the NTK scaling benchmark: seconds (2 decimals or whole), peak MB or GB,
    Gram GFLOP, or the GB of Jacobian rows a skipped reference would need."""
    r = _ntk(method, int(width), int(n))
    if form == "need_gb":
        return re.search(r"need (\d+) GB", r["skipped"]).group(1)
    if form == "gflop":
        return f"{r['gram_gflop']:.0f}"
    if form in ("mb", "gb"):
        return f"{r['peak_MB']:.0f}" if form == "mb" else f"{r['peak_MB'] / 1000:.1f}"
    return f"{r['seconds']:.2f}" if form == "s2" else f"{r['seconds']:.0f}"


@pattern(r"ntk/speedup/(\d+)/(\d+)")
def _ntk_speedup_at(width: str, n: str) -> str:
    return f"{_ntk_best_ref(int(width), int(n))['seconds'] / _ntk('structured', int(width), int(n))['seconds']:.0f}"


@pattern(r"ntk/vs_floor/(\d+)/(\d+)")
def _ntk_floor_at(width: str, n: str) -> str:
    return f"{_ntk('structured', int(width), int(n))['seconds'] / _ntk('floor', int(width), int(n))['seconds']:.2f}"


def _ntk_cells() -> list[tuple[int, int]]:
    return sorted({(r["width"], r["n"]) for r in _ntk_all().values() if r["method"] == "structured"})


@quantity("ntk.speedup_range")
def _ntk_speedups() -> str:
    v = [_ntk_best_ref(w, n)["seconds"] / _ntk("structured", w, n)["seconds"] for w, n in _ntk_cells()
         if _ntk_best_ref(w, n)]
    return span(min(v), max(v), lambda x: f"{x:.0f}")


def _floors(select: Callable[[int, int], bool]) -> list[float]:
    return [_ntk("structured", w, n)["seconds"] / _ntk("floor", w, n)["seconds"] for w, n in _ntk_cells()
            if select(w, n) and "seconds" in _ntk("floor", w, n)]


@quantity("ntk.vs_floor_wide")
def _ntk_floor_wide() -> str:
    v = _floors(lambda w, n: w >= 1024)
    return span(min(v), max(v), lambda x: f"{x:.2f}")


@quantity("ntk.vs_floor_4096_max")
def _ntk_floor_4096() -> str:
    return f"{max(_floors(lambda w, n: w == 4096)):.2f}"


@quantity("ntk.vs_floor_256")
def _ntk_floor_256() -> str:
    v = _floors(lambda w, n: w == 256 and n >= 256)
    return span(min(v), max(v), lambda x: f"{x:.1f}")


@quantity("ntk.jacobian_peak_gb_1024_256")
def _ntk_jac_peak() -> str:
    v = [_ntk(m, 1024, 256)["peak_MB"] / 1000 for m in ("vmap_jacrev", "jacrev")]
    return span(min(v), max(v), lambda x: f"{x:.1f}")

# ---- linearization sweeps: benchmarks/results/<run>/{slopes.json,results.jsonl} (widthscope linearize)

LIN_RUNS = {"wide": "linearize-fashion-wide", "wide-f64": "linearize-fashion-wide-f64",
            "digits": "linearize-digits", "digits-tanh": "linearize-digits-tanh", "fashion": "linearize-fashion"}


def _lin_rows(run: str) -> tuple[dict[str, Any], ...]:
    return load_rows(f"benchmarks/results/{LIN_RUNS[run]}/results.jsonl")


def _lin_slope(run: str, metric: str, alpha: str, step: str) -> dict[str, Any]:
    want_a = None if alpha == "_" else float(alpha)
    want_s = None if step == "_" else int(step)
    found = [r for r in load_json(f"benchmarks/results/{LIN_RUNS[run]}/slopes.json")["slopes"]
             if r["metric"] == metric and r["alpha"] == want_a and r["step"] == want_s]
    if len(found) != 1:
        raise LookupError(f"{len(found)} slopes for {metric} alpha={alpha} step={step} in {run}")
    return found[0]


@pattern(r"slope/([\w-]+)/(\w+)/(-?[\d.]+|_)/(\d+|_)/(v|ci|t|tv)")
def _slope_q(run: str, metric: str, alpha: str, step: str, form: str) -> str:
    """A fitted slope: ``v`` / ``ci`` in prose (typographic minus), ``tv`` / ``t`` in tables."""
    s = _lin_slope(run, metric, alpha, step)
    minus = "-" if form.startswith("t") else MINUS
    return fixed(s["slope"], 2, minus) if form in ("v", "tv") else ci(s, minus)


def _geo(run: str, metric: str, alpha: float, step: int) -> dict[int, float]:
    """Seed mean of log ``metric`` per width (the slopes' averaging), as a value."""
    acc: dict[int, list[float]] = defaultdict(list)
    for r in _lin_rows(run):
        if r["kind"] == "linearization" and r["alpha"] == alpha and r["step"] == step and ok(r.get(metric)) \
                and r[metric] > 0:
            acc[int(r["width"])].append(math.log(r[metric]))
    return {w: math.exp(float(np.mean(v))) for w, v in sorted(acc.items())}


def _local_slopes(run: str, metric: str, alpha: float, step: int) -> list[float]:
    g = _geo(run, metric, alpha, step)
    ws = list(g)
    return [math.log(g[b] / g[a]) / math.log(b / a) for a, b in zip(ws, ws[1:])]


@pattern(r"local/([\w-]+)/(\w+)/(-?[\d.]+)/(\d+)")
def _local_q(run: str, metric: str, alpha: str, step: str) -> str:
    """Slopes between neighbouring widths of the seed-geometric-mean metric, comma separated."""
    return ", ".join(fixed(v) for v in _local_slopes(run, metric, float(alpha), int(step)))


@pattern(r"lin/([\w-]+)/slopes_table")
def _lin_slopes_table(run: str) -> str:
    """Every fitted slope of a run (its ``slopes.json``): metric, α, step, slope [95% CI], the
    reference rate, the published slope where there is one, widths × seeds fitted."""
    head = "| metric | α | step | slope [95% CI] | reference | published | widths × seeds |\n|" + "---|" * 7
    lines = [head]
    for r in load_json(f"benchmarks/results/{LIN_RUNS[run]}/slopes.json")["slopes"]:
        alpha = "–" if r["alpha"] is None else fixed(r["alpha"], 1, "-")
        step = "–" if r["step"] is None else str(r["step"])
        ref = "–" if r.get("reference") is None else f"{r['reference']:g}"
        pub = "–" if r.get("published") is None else f"{r['published']:.2f}"
        lines.append(f"| `{r['metric']}` | {alpha} | {step} | {ci(r)} | {ref} | {pub} | "
                     f"{r['n_widths']} × {r['n_seeds']} |")
    return block(lines)


@pattern(r"lin/([\w-]+)/versus/(\w+)/(-?[\d.]+|_)/(\d+|_)/(-?[\d.]+)")
def _lin_versus(run: str, metric: str, alpha: str, step: str, rate: str) -> str:
    """In words, where a slope's 95% interval lies against ``rate``: "contains", or "steeper
    than" / "flatter than" (the whole interval below / above it)."""
    s = _lin_slope(run, metric, alpha, step)
    r = float(rate)
    word = "contains" if s["ci_low"] <= r <= s["ci_high"] else ("steeper than" if s["ci_high"] < r else "flatter than")
    return f"{word} {fixed(r, 2 if r != round(r, 1) else 1)}"


@pattern(r"lin/([\w-]+)/(widths|nwidths|minwidth|maxwidth|seeds|cells|cell_min)")
def _lin_setup(run: str, what: str) -> str:
    """Grid facts of a linearization run, from its rows."""
    rows = [r for r in _lin_rows(run) if r["kind"] == "linearization"]
    widths = sorted({int(r["width"]) for r in rows})
    if what == "widths":
        return ", ".join(map(str, widths))
    if what in ("nwidths", "minwidth", "maxwidth"):
        return str({"nwidths": len(widths), "minwidth": widths[0], "maxwidth": widths[-1]}[what])
    if what == "seeds":
        return str(len({r["seed"] for r in rows}))
    cells = {r["cell_id"]: r["cell_seconds"] for r in rows}
    return str(len(cells)) if what == "cells" else f"{sum(cells.values()) / 60:.0f}"


@pattern(r"lin/([\w-]+)/cell_min_at/(\d+)")
def _lin_cell_minutes(run: str, width: str) -> str:
    """Range of one cell's time (minutes) at ``width``."""
    v = [r["cell_seconds"] / 60 for r in _lin_rows(run) if r["kind"] == "linearization" and r["width"] == int(width)]
    return span(min(v), max(v), lambda x: sig(x, 1))


def _wide_f32_f64(width: int) -> tuple[float, float]:
    a = _geo("wide", "dev_rms", -0.5, 100)[width]
    b = _geo("wide-f64", "dev_rms", -0.5, 100)[width]
    return a, b


@quantity("lin.wide.f32_f64_agree_pct_to_2048")
def _agree_small() -> str:
    worst = max(abs(a / b - 1) for a, b in (_wide_f32_f64(w) for w in _geo("wide-f64", "dev_rms", -0.5, 100)
                                             if w <= 2048))
    return sig(100 * worst, 1)


@quantity("lin.wide.f32_f64_pct_4096")
def _agree_4096() -> str:
    a, b = _wide_f32_f64(4096)
    return f"{100 * abs(a / b - 1):.0f}"


@quantity("lin.wide.f32_over_f64_8192")
def _ratio_8192() -> str:
    a, b = _wide_f32_f64(8192)
    return f"{a / b:.0f}"


@pattern(r"lin/(wide|wide-f64)/dev_rms_8192")
def _dev_8192(run: str) -> str:
    return sci(_geo(run, "dev_rms", -0.5, 100)[8192])


@pattern(r"lin/(wide|wide-f64)/local_last")
def _local_last(run: str) -> str:
    v = _local_slopes(run, "dev_rms", -0.5, 100)[-1]
    return ("+" if v > 0 else "") + fixed(v)


def _param_move(alpha: float, width: int, run: str = "wide") -> float:
    v = [r["param_move"] for r in _lin_rows(run) if r["kind"] == "linearization" and r["alpha"] == alpha
         and r["step"] == 100 and r["width"] == width]
    return float(np.mean(v))


@quantity("lin.wide.param_move_8192")
def _pm() -> str:
    return sci(_param_move(-0.5, 8192), 2)


@quantity("lin.wide.param_move_per_step_8192")
def _pm_step() -> str:
    return sci(_param_move(-0.5, 8192) / 100, 1)


@quantity("lin.wide.param_move_ratio_alpha0_8192")
def _pm_ratio() -> str:
    return f"{_param_move(0.0, 8192) / _param_move(-0.5, 8192):.0f}"


def _sbs(run: str) -> list[dict[str, Any]]:
    from widthscope.report.linearization import side_by_side
    return side_by_side(list(_lin_rows(run)))


@pattern(r"lin/(wide|wide-f64)/net_vs_lin_max/(-?[\d.]+)")
def _sbs_gap(run: str, alpha: str) -> str:
    """Largest |network − linear model| held-out loss over widths at the last step, and where."""
    sel = [r for r in _sbs(run) if r["alpha"] == float(alpha)]
    return sci(max(abs(r["test_loss"] - r["test_loss_lin"]) for r in sel), 2)


@pattern(r"lin/(wide|wide-f64)/sbs/(-?[\d.]+)/(\d+)/(test_loss|test_loss_lin|test_loss_kernel_inf)")
def _sbs_value(run: str, alpha: str, width: str, col: str) -> str:
    r = [r for r in _sbs(run) if r["alpha"] == float(alpha) and r["width"] == int(width)][0]
    return f"{r[col]:.4f}" if col != "test_loss_kernel_inf" else f"{r[col]:.2f}"


@quantity("lin.wide.kernel_inf_range")
def _kinf() -> str:
    v = [r["test_loss_kernel_inf"] for r in _sbs("wide")]
    return span(min(v), max(v), lambda x: f"{x:.2f}")


@pattern(r"lin/(wide|wide-f64)/train_loss/(-?[\d.]+)/(\d+)")
def _train_loss(run: str, alpha: str, width: str) -> str:
    v = [r["train_loss"] for r in _lin_rows(run) if r["kind"] == "linearization" and r["alpha"] == float(alpha)
         and r["step"] == 100 and r["width"] == int(width)]
    return f"{np.mean(v):.2f}"


def _ref(alpha: float, metric: str) -> str:
    r = alpha - 1 if metric != "dev_mse" else 2 * (alpha - 1)
    return f"{r:g}"


@quantity("lin.wide.deviation_table")
def _wide_table() -> str:
    """The deviation-slope table of the width-8192 section: α = 0 float32, α = −0.5 float64 and float32."""
    head = ("| α | step | `dev_rms` | `dev_rel` | reference `α−1` | `dev_mse` | reference `2(α−1)` | "
            "published `dev_mse` (MNIST) |\n|" + "---|" * 8)
    lines = [head]
    for label, run, alpha in (("0", "wide", "0.0"), ("-0.5", "wide-f64", "-0.5"), ("-0.5 (float32)", "wide", "-0.5")):
        for step in ("10", "100"):
            mse = _lin_slope(run, "dev_mse", alpha, step)
            pub = f"{mse['published']:.2f}" if mse.get("published") is not None else "—"
            lines.append(f"| {label} | {step} | {_slope_q(run, 'dev_rms', alpha, step, 't')} | "
                         f"{_slope_q(run, 'dev_rel', alpha, step, 't')} | {_ref(float(alpha), 'dev_rms')} | "
                         f"{_slope_q(run, 'dev_mse', alpha, step, 't')} | {_ref(float(alpha), 'dev_mse')} | {pub} |")
    return block(lines)


@quantity("lin.wide.metric_table")
def _wide_metric_table() -> str:
    lines = ["| metric (step 100) | α = 0 | α = −0.5 | reference |", "|---|---|---|---|",
             f"| `kernel_drift` | {_slope_q('wide', 'kernel_drift', '0.0', '100', 't')} | "
             f"{_slope_q('wide-f64', 'kernel_drift', '-0.5', '100', 't')} | `α − 1/2` (heuristic) |",
             f"| `test_gap` | {_slope_q('wide', 'test_gap', '0.0', '100', 't')} | "
             f"{_slope_q('wide-f64', 'test_gap', '-0.5', '100', 't')} | `α − 1` |",
             f"| `C02` (α = 0 cells, `η = η₀`) | {_slope_q('wide', 'C02', '_', '_', 't')} | | −1/2 |",
             f"| `C11` | {_slope_q('wide', 'C11', '_', '_', 't')} | | −1/2 |"]
    return block(lines)


# ---- alignment sweeps: benchmarks/results/<sweep>/results.jsonl (widthscope sweep CONFIG; rows compacted)

REGIMES = "benchmarks/results/llama-regimes/results.jsonl"
D_FMT = {"d_align": 3, "d_par": 3, "d_2": 3}


def _reg_rows() -> list[dict[str, Any]]:
    return [r for r in load_rows(REGIMES) if r.get("kind", "alignment") == "alignment"]


@functools.lru_cache(maxsize=None)
def _reg_cells() -> dict[tuple[str, int, int], dict[str, Any]]:
    """Per (probe set, probe length, width): seed means per point, then the median over points,
    of ``two_d_align``, ``two_d_par``, ``two_d_2`` at the largest M = K over the non-vacuous
    certificates (a vacuous one records ``d_par = 0``), the most frequent ``two_limit`` among them
    (both, joined by " = ", on a tie),
    the vacuous count (``vacuous``, ``of``), and the misalignment at every M = K (``mis_<M>``)."""
    rows = _reg_rows()
    big = max(int(r["M"]) for r in rows)
    acc: dict[tuple, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    limits: dict[tuple, list[str]] = defaultdict(list)
    vac: dict[tuple, list[bool]] = defaultdict(list)
    for r in rows:
        key = (r["probe_set"], int(r["probe_seq_len"]), int(r["width"]))
        if int(r["M"]) == big:
            vac[key].append(bool(r.get("two_vacuous")))
            if not r.get("two_vacuous"):
                limits[key].append(str(r.get("two_limit")))
                for m in ("d_align", "d_par", "d_2"):
                    if ok(r.get(f"two_{m}")):
                        acc[key][m][r["point"]].append(float(r[f"two_{m}"]))
        if ok(r.get("misalignment")):
            acc[key][f"mis_{int(r['M'])}"][r["point"]].append(float(r["misalignment"]))
    out = {}
    for key, metrics in acc.items():
        c = {m: float(np.median([np.mean(v) for v in per_point.values()])) for m, per_point in metrics.items()}
        for m in ("d_align", "d_par", "d_2"):
            c.setdefault(m, math.nan)
        counts = {v: limits[key].count(v) for v in sorted(set(limits[key]))}
        top = [v for v, n in counts.items() if n == max(counts.values(), default=0)]
        c["limit"] = " = ".join(top) if top else "–"  # a tie shows both, never an arbitrary one
        c["vacuous"], c["of"] = sum(vac[key]), len(vac[key])
        out[key] = c
    return out


def _reg_mk() -> list[int]:
    return sorted({int(r["M"]) for r in _reg_rows()})


def _d(v: float) -> str:
    return "–" if not math.isfinite(v) else sig(v, 3, "-")


@quantity("regimes.table")
def _reg_table() -> str:
    """The per-regime table of docs/sweeps.md."""
    mk = _reg_mk()
    head = ("| probe | length | width | d_align | d_par | d_2 | limit | vacuous | "
            + " | ".join(f"misalignment M=K={m}" for m in (mk[0], mk[-1])) + " |")
    lines = [head, "|" + "---|" * 10]
    order = {"in-domain": 0, "shifted": 1}
    for (ps, L, w), c in sorted(_reg_cells().items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1], kv[0][2])):
        lines.append(f"| {ps} | {L} | {w} | {_d(c['d_align'])} | {_d(c['d_par'])} | {_d(c['d_2'])} | {c['limit']} | "
                     f"{c['vacuous']}/{c['of']} | {c[f'mis_{mk[0]}']:.3f} | {c[f'mis_{mk[-1]}']:.3f} |")
    return block(lines)


def _reg_select(probe_set: str, length: str) -> dict[tuple[str, int, int], dict[str, Any]]:
    return {k: v for k, v in _reg_cells().items() if k[0] == probe_set and (length == "all" or k[1] == int(length))}


@pattern(r"reg/range/(in-domain|shifted)/(all|\d+)/(d_align|d_par|d_2|mis_\d+)/(\d)")
def _reg_range(probe_set: str, length: str, metric: str, digits: str) -> str:
    """Range of a table column over the widths (and lengths) of a probe condition, ``digits``
    significant digits (misalignment: decimals)."""
    v = [c[metric] for c in _reg_select(probe_set, length).values() if math.isfinite(c[metric])]
    f = (lambda x: f"{x:.{digits}f}") if metric.startswith("mis_") else (lambda x: sig(x, int(digits)))
    return span(min(v), max(v), f)


@pattern(r"reg/val/(in-domain|shifted)/(\d+)/(\d+)/(d_align|d_par|d_2|mis_\d+)/(\d)")
def _reg_val(probe_set: str, length: str, width: str, metric: str, digits: str) -> str:
    v = _reg_cells()[(probe_set, int(length), int(width))][metric]
    return f"{v:.{digits}f}" if metric.startswith("mis_") else sig(v, int(digits))


@pattern(r"reg/peak/(in-domain|shifted)/(all|\d+)/(d_align|d_par|d_2)")
def _reg_peak(probe_set: str, length: str, metric: str) -> str:
    """Width(s) where the column peaks, per probe length when ``all`` (distinct values joined)."""
    peaks = defaultdict(list)
    for (ps, L, w), c in _reg_select(probe_set, length).items():
        peaks[L].append((c[metric], w))
    best = sorted({max(v)[1] for v in peaks.values()})
    return " and ".join(map(str, best))


@pattern(r"reg/length_trend/(in-domain|shifted)/(d_align|d_par|d_2)")
def _reg_length_trend(probe_set: str, metric: str) -> str:
    """At how many widths the column increases strictly with the probe length: "3 of 3"."""
    by_w: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (ps, L, w), c in _reg_cells().items():
        if ps == probe_set:
            by_w[w].append((L, c[metric]))
    up = [all(b[1] > a[1] for a, b in zip(v, v[1:])) for v in (sorted(x) for x in by_w.values())]
    return f"{sum(up)} of {len(up)}"


@pattern(r"reg/(seeds|widths|cells|cell_min|limit_d2|rows|vacuous)")
def _reg_setup(what: str) -> str:
    rows = _reg_rows()
    if what == "seeds":
        return str(len({r["seed"] for r in rows}))
    if what == "widths":
        ws = sorted({int(r["width"]) for r in rows})
        return f"{ws[0]}–{ws[-1]}"
    cells = {r["cell_id"]: r["cell_seconds"] for r in rows}
    if what == "cells":
        return str(len(cells))
    if what == "cell_min":
        return f"{sum(cells.values()) / 60:.0f}"
    if what == "rows":
        return str(len(rows))
    if what == "vacuous":
        return _reg_vacuous("all")
    c = _reg_cells().values()
    return f"{sum(x['limit'] == 'd_2' for x in c)}/{len(c)}"


@pattern(r"reg/vacuous/(in-domain|shifted|all)")
def _reg_vacuous(probe_set: str) -> str:
    """Vacuous two-population certificates at the largest M = K: count/total (seed, block, width, length)."""
    c = [x for k, x in _reg_cells().items() if probe_set in ("all", k[0])]
    return f"{sum(x['vacuous'] for x in c)}/{sum(x['of'] for x in c)}"


@functools.lru_cache(maxsize=None)
def _reg_claims() -> tuple[dict[str, Any], ...]:
    from widthscope.report.claims import claims
    return tuple(claims(_reg_rows()))


def _claim_cell(c: Mapping[str, Any]) -> str:
    if c["measured"] is None:
        return "–"
    v = sig(c["measured"], 2, "−") if c.get("unit") != "fraction of rows" else f"{c['measured']:.2f}"
    if c["low"] is None:
        return v
    return f"{v} [{sig(c['low'], 2)}, {sig(c['high'], 2)}]"


@quantity("regimes.claims_table")
def _reg_claims_table() -> str:
    """``widthscope.report.claims.claims`` on the committed rows, one line per claim (with the
    Holm-adjusted p where the claims module gives one)."""
    items = _reg_claims()
    holm = any("p_adjusted" in c for c in items)
    lines = ["| claim | measured [interval] |" + (" p (Holm) |" if holm else "") + " verdict |",
             "|---|---|" + ("---|" if holm else "") + "---|"]
    for c in items:
        p = c.get("p_adjusted")
        cell = (" – |" if p is None else f" {p:.2g} |") if holm else ""
        lines.append(f"| {c['claim']} | {_claim_cell(c)} |{cell} {c['verdict']} |")
    return block(lines)


def _claim(probe_set: str, length: str, what: str) -> dict[str, Any]:
    """The claim for one regime, whichever of the two label forms the claims module writes
    (``· shifted L=1024`` or ``· probe shifted, length 1024``)."""
    labels = (f" · {probe_set} L={length}: ", f" · probe {probe_set}, length {length}: ")
    found = [c for c in _reg_claims() if any(lb in c["claim"] for lb in labels)
             and c["claim"].split(": ", 1)[1].startswith(what)]
    if len(found) != 1:
        raise LookupError(f"{len(found)} claims for {probe_set} length {length} start with {what!r}")
    return found[0]


@pattern(r"reg/claim/(in-domain|shifted)/(\d+)/([\w+]+?)/(value|ci|verdict)")
def _reg_claim(probe_set: str, length: str, what: str, form: str) -> str:
    """A claim of the claims page for one regime (``what``: the start of the claim after the
    label, ``+`` for a space: ``d_align+grows``)."""
    c = _claim(probe_set, length, what.replace("+", " "))
    if form == "verdict":
        return c["verdict"]
    return _claim_cell(c) if form == "ci" else sig(c["measured"], 2)


@pattern(r"reg/verdicts/([\w+]+)")
def _reg_verdicts(what: str) -> str:
    """How the claim starting with ``what`` (``+`` for a space) fares over the regimes, e.g.
    "“does not” in 1 and “not resolved” in 4 of 5"."""
    what = what.replace("+", " ")
    found = [c for c in _reg_claims() if c["claim"].split(": ", 1)[-1].startswith(what)]
    if not found:
        raise LookupError(f"no claim starts with {what!r}")
    counts = {v: sum(c["verdict"] == v for c in found) for v in ("holds", "does not", "not resolved")}
    parts = [f"“{v}” in {n}" for v, n in counts.items() if n]
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] + f" of {len(found)}"


@quantity("regimes.bounds_rows")
def _reg_bounds() -> str:
    rows = [r for r in _reg_rows() if ok(r.get("two_b_exact")) and ok(r.get("misalignment_low"))]
    above = sum(r["two_b_exact"] >= r["misalignment_low"] for r in rows)
    order = sum(r.get("two_b_align", 1.0) >= r["two_b_exact"] - 1e-12 for r in rows)
    return f"{min(above, order)}/{len(rows)}"


# ---- activation audit: benchmarks/results/activations-K6.json (widthscope activations --K 6 --json ...)

@quantity("act.tanh_ratios")
def _tanh_ratios() -> str:
    row = next(r for r in load_json("benchmarks/results/activations-K6.json")["rows"] if r["name"] == "tanh")
    return ", ".join(f"{row[f'ratio_{k}']:.2g}" for k in range(1, 7))



# ---- benchmarks/results/monitor-cpu.json (python benchmarks/bench_monitor.py --out ...)

def _monitor() -> dict[str, Any]:
    return load_json("benchmarks/results/monitor-cpu.json")


@quantity("bench.monitor_table")
def _monitor_table() -> str:
    cols = ("width", "schedule", "probes", "step_s", "probe_s", "probe_in_steps", "overhead", "every_5pct",
            "block_ratio", "identical_weights")

    def cell(v: Any) -> str:
        return "–" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in _monitor()["rows"]:
        lines.append("| " + " | ".join(cell(r[c]) for c in cols) + " |")
    return block(lines)


def _monitor_rows(schedule: str, col: str) -> list[float]:
    return [r[col] for r in _monitor()["rows"] if r["schedule"] == schedule and ok(r[col])]


def _pct_span(v: Sequence[float]) -> str:
    return span(100 * min(v), 100 * max(v), lambda x: sig(x, 2)) + "%"


@quantity("bench.monitor_probe_in_steps")
def _monitor_probe_in_steps() -> str:
    v = _monitor_rows("log", "probe_in_steps")  # the uncapped schedule: the most probes per width
    return span(min(v), max(v), lambda x: sig(x, 2))


@quantity("bench.monitor_log_overhead")
def _monitor_log_overhead() -> str:
    return _pct_span(_monitor_rows("log", "overhead"))


@quantity("bench.monitor_default_overhead")
def _monitor_default_overhead() -> str:
    v = _monitor_rows("default", "overhead")
    n = [r["probes"] for r in _monitor()["rows"] if r["schedule"] == "default"]
    return f"{_pct_span(v)} ({span(min(n), max(n), str)} probe{'s' if max(n) != 1 else ''} per run)"


@quantity("bench.monitor_every_5pct")
def _monitor_every_5pct() -> str:
    v = _monitor_rows("log", "every_5pct")
    return span(min(v), max(v), lambda x: str(int(x)))


@quantity("bench.monitor_load")
def _monitor_load() -> str:
    m = _monitor()["machine"]
    start = f" at the start, {m['load_average']} at the end" if m.get("load_average_start") else ""
    return (f"{m['cpus']} cores, load average {m.get('load_average_start', m['load_average'])}{start}, "
            f"{m['threads']} torch thread")


# ---- benchmarks/results/ntk-vs-nt-cpu.json (make bench-nt: benchmarks/ntk_vs_nt.py, its own quantities)

NTK_NT = "benchmarks/results/ntk-vs-nt-cpu.json"


def _bench_module(name: str) -> Any:
    """A script of ``benchmarks/`` as a module (its own table and quantity functions)."""
    import importlib

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


def _script_quantities(module: str, rows: str, table_key: str, regex: str) -> None:
    """Register a benchmark script's own ``table_lines(data)`` as ``table_key`` and its
    ``quantity(data, what)`` for the keys matching ``regex``, both over the committed ``rows``."""
    quantity(table_key)(lambda: block(_bench_module(module).table_lines(load_json(rows))))
    pattern(regex)(lambda what: _bench_module(module).quantity(load_json(rows), what))


# ntk_nt/...: nt/ws ratios, seconds, peaks, the float64 agreement, the load.
_script_quantities("ntk_vs_nt", NTK_NT, "ntk_nt.table",
                   r"ntk_nt/((?:ratio|s|peak|prev|loadof)/[\w/-]+|agree|load|nt_faster)")


# ---- benchmarks/results/retention-grid.json (benchmarks/retention_grid.py: what each step of the grid says)

# retgrid/...: loss rise and retention at one relative step, over all curves.
_script_quantities("retention_grid", "benchmarks/results/retention-grid.json", "retgrid.table",
                   r"retgrid/((?:rise|up|ret|off)/[0-9.e-]+|curves|widths)")


# ---- benchmarks/results/llama-interventions/ (widthscope sweep configs/llama-interventions.toml, compacted;
# sign.jsonl: benchmarks/sign_agreement.py on its checkpoints; tables and numbers: benchmarks/iv_series.py)

IV = "benchmarks/results/llama-interventions"


def _iv(fn: str, *args: Any) -> Any:
    mod = _bench_module("iv_series")
    rows, sign = load_rows(f"{IV}/results.jsonl"), load_rows(f"{IV}/sign.jsonl")
    if fn == "quantity":
        return mod.quantity(rows, sign, *args)
    return block(getattr(mod, fn)(sign if fn == "sign_table" else rows))


quantity("iv.retention_table")(lambda: _iv("retention_table"))
quantity("iv.sign_table")(lambda: _iv("sign_table"))
pattern(r"iv/([a-z_]+(?:/[0-9.e-]+)?)")(lambda what: _iv("quantity", what))


def _load_topics() -> None:
    """Quantities of other topics live in ``benchmarks/docnumbers_*.py``, each with a
    ``register(dn)`` that declares them on this module (``dn.quantity``, ``dn.pattern``, the helpers):
    one file per topic, so topics are added without editing this one."""
    import importlib.util
    import types

    for path in sorted(Path(__file__).resolve().parent.glob("docnumbers_*.py")):
        spec = importlib.util.spec_from_file_location(f"_dn_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        # loaded by file (tests/test_docnumbers.py) this module may not be in sys.modules
        mod.register(sys.modules.get(__name__) or types.SimpleNamespace(**globals()))


_load_topics()

if __name__ == "__main__":
    sys.exit(main())
