"""Run every ``benchmarks/bench_*.py`` and write ``docs/benchmarks.md``.

Each benchmark module exposes ``run(quick: bool) -> list[dict]`` (rows of measurements, every
ratio taken within the same run) and optionally ``markdown(rows) -> str``. This runner imports
them in name order, runs each (one failure does not stop the others; it is reported in the page
and in the exit status), and writes one markdown page with the machine it ran on (CPU model from
``/proc/cpuinfo``, cores, torch version, date) plus ``docs/benchmarks.json`` with the raw rows.

Usage::

    python benchmarks/run_all.py            # full suite (< 10 minutes on 2 CPU cores)
    python benchmarks/run_all.py --quick    # smoke run (< 2 minutes)
    python benchmarks/run_all.py --only linear,persample
    python benchmarks/run_all.py --only interventions --splice   # rerun one section in place
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import markdown_table, median_time  # noqa: E402


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        info["load_average"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        pass
    return info


def _generic_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    return markdown_table(rows, list(dict.fromkeys(c for r in rows for c in r)))


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run in under 2 minutes")
    ap.add_argument("--only", default=None, help="comma list of benchmark names (e.g. linear,stats)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown page to write")
    ap.add_argument("--splice", action="store_true",
                    help="with --only: replace just those sections (and their rows in the .json) of the existing page")
    args = ap.parse_args(argv)
    if args.splice and not args.only:
        print("run_all: --splice reruns the sections named by --only; add --only NAME", file=sys.stderr)
        return 2

    from widthscope._io import atomic_write_json, atomic_write_text

    files = sorted(HERE.glob("bench_*.py"))
    if args.only:
        want = {w.strip().removeprefix("bench_") for w in args.only.split(",") if w.strip()}
        unknown = want - {f.stem.removeprefix("bench_") for f in files}
        if unknown:
            print(f"run_all: unknown benchmark(s) {sorted(unknown)}; have "
                  f"{', '.join(f.stem.removeprefix('bench_') for f in files)}", file=sys.stderr)
            return 2
        files = [f for f in files if f.stem.removeprefix("bench_") in want]
    info = machine()
    sections, raw, failed = [], {}, []
    t_all = time.perf_counter()
    for f in files:
        name = f.stem.removeprefix("bench_")
        print(f"[run_all] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            mod = _load(f)
            rows = mod.run(quick=args.quick)
            table = mod.markdown(rows) if hasattr(mod, "markdown") else _generic_table(rows)
            doc = (mod.__doc__ or "").strip().split("\n\n")[0]
            sections.append(f"## {name}\n\n{doc}\n\n{table}\n\n_{time.perf_counter() - t0:.1f} s_\n")
            raw[name] = rows
        except Exception:
            failed.append(name)
            tb = traceback.format_exc()
            print(tb, file=sys.stderr)
            sections.append(f"## {name}\n\n**FAILED**\n\n```\n{tb[-2000:]}\n```\n")
        print(f"[run_all] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - t_all
    if args.splice:
        return _splice(Path(args.out), sections, raw, failed, info, total)
    head = ["# Benchmarks", "",
            f"Generated by `python benchmarks/run_all.py{' --quick' if args.quick else ''}` in {total:.0f} s. "
            "Every time is a median of repeats; every ratio compares times measured in the same run "
            "on this machine:", ""]
    head += [f"- **{k}**: {v}" for k, v in info.items()]
    import large_memory  # separate, slow runs: their recorded results are listed, not re-run
    import ntk_auto
    import ntk_scaling
    import ntk_vs_nt

    text = ("\n".join(head) + "\n\n" + "\n".join(sections) + large_memory.section() + ntk_scaling.section()
            + ntk_auto.section() + ntk_vs_nt.section())
    out = Path(args.out)
    atomic_write_text(out, text)
    atomic_write_json(out.with_suffix(".json"), {"machine": info, "quick": args.quick, "total_s": total,
                                                 "results": raw, "failed": failed})
    print(f"[run_all] wrote {out} ({total:.0f} s){'; FAILED: ' + ', '.join(failed) if failed else ''}",
          file=sys.stderr)
    return 1 if failed else 0


def _splice(out: Path, sections: list[str], raw: dict[str, Any], failed: list[str], info: dict[str, Any],
            total: float) -> int:
    """Replace the rerun sections of an existing page (and their rows and a ``reruns`` entry in the
    .json), saying under each that it was rerun alone and on what load; the rest is kept."""
    import json
    import re

    from widthscope._io import atomic_write_json, atomic_write_text

    text = out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    for sec in sections:
        name = sec.split("\n", 1)[0].removeprefix("## ").strip()
        if name in failed:
            continue
        sec = re.sub(r"\n_[0-9.]+ s_\n$", f"\n_Rerun alone ({total:.1f} s, {info['date']}, {info['torch_threads']} "
                     f"thread(s), load average {info.get('load_average', '?')}; the machine header above is "
                     "the full run's)_\n", sec)
        m = re.search(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", text, re.S | re.M)
        if m is None:
            print(f"run_all: no section '## {name}' in {out} to replace", file=sys.stderr)
            return 2
        text = text[:m.start()] + sec + "\n" + text[m.end():]
        data["results"][name] = raw[name]
        data.setdefault("reruns", {})[name] = {"machine": info, "total_s": total}
    atomic_write_text(out, text)
    atomic_write_json(out.with_suffix(".json"), data)
    print(f"[run_all] spliced {', '.join(raw)} into {out}{'; FAILED: ' + ', '.join(failed) if failed else ''}",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
