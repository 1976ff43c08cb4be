"""What each step of the intervention grid says on trained models: the evidence for certify's grid.

The interventions benchmark's model (widthscope ``llama`` family, depth 4, byte vocabulary, seq 64)
at widths 64 and 128, trained on the stdlib-text corpus (``widthscope.data.load("text")``,
AdamW, ``steps`` steps, lr 3e-3, batch 32), then the bias intervention at every block output with
``intervene``'s 9 half-decade steps up to 1 (step RMS ``1e-4 … 1`` of the activation's), on the
first ``M = K = 128`` train / held-out sequences. One row per (width, point, step): ``rel_step``,
``eta``, ``predicted`` and ``actual`` ΔL, ``retention``, ``loss_before``, ``rise`` = ΔL / L.

The question it answers: does the step as large as the stream (``rel_step = 1``) tell a user
anything the step ten times smaller (``0.1``) does not? If at 0.1 the first-order step has already
broken down at every point (the loss rises, retention far from 1) the largest step repeats that
verdict, and certify's default can stop at 0.1 (4 decades instead of 5: 4/5 of the cost).

Usage::

    OMP_NUM_THREADS=1 nice python benchmarks/retention_grid.py --out benchmarks/results/retention-grid.json
    python benchmarks/retention_grid.py --quick      # a minute: width 32, 60 steps, not for the docs
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

GRID = (1e-4, 10 ** -3.5, 1e-3, 10 ** -2.5, 1e-2, 10 ** -1.5, 0.1, 10 ** -0.5, 1.0)
DECADES = (1e-4, 1e-3, 1e-2, 0.1, 1.0)


def run(widths: Sequence[int] = (64, 128), steps: int = 600, n: int = 128, seed: int = 0) -> dict[str, Any]:
    from widthscope.data import describe, load
    from widthscope.models import build
    from widthscope.probe import insertion_points
    from widthscope.probe.batches import to_batches
    from widthscope.probe.interventions import intervene
    from widthscope.train import train

    split = load("text", n_train=4096, n_test=512, seed=seed, seq_len=64)
    rows, runs = [], []
    for width in widths:
        torch.manual_seed(seed)
        model = build("llama", width, depth=4, max_seq_len=64)
        t0 = time.perf_counter()
        res = train(model, split, steps=steps, lr=3e-3, batch_size=32, seed=seed, progress=False)
        model.eval()
        runs.append({"width": width, "train_loss": res["train_loss"], "test_loss": res["test_loss"],
                     "train_s": time.perf_counter() - t0})
        tr, te = to_batches(split.train[0][:n], 32), to_batches(split.test[0][:n], 32)
        for p in insertion_points(model):
            for r in intervene(model, p, tr, te, M=n, K=n, n_etas=9, max_rel_step=1.0, progress=False):
                rows.append({"width": width, "point": p, "rel_step": r["rel_step"], "eta": r["eta"],
                             "predicted": r["predicted"], "actual": r["actual"], "retention": r["retention"],
                             "loss_before": r["loss_before"], "rise": r["actual"] / r["loss_before"],
                             "alignment": r["alignment"]})
        print(f"width {width}: test loss {res['test_loss']:.3f}", file=sys.stderr, flush=True)
    return {"machine": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                        "torch": torch.__version__, "threads": torch.get_num_threads()},
            "settings": {"widths": list(widths), "depth": 4, "seq_len": 64, "steps": steps, "lr": 3e-3,
                         "batch_size": 32, "M": n, "K": n, "seed": seed, "data": describe(split)},
            "runs": runs, "rows": rows}


# ----------------------------------------------------------------------------- presentation
def _at(rows: list[dict[str, Any]], rel: float) -> list[dict[str, Any]]:
    return [r for r in rows if abs(math.log10(r["rel_step"] / rel)) < 1e-6]


def table_lines(data: dict[str, Any]) -> list[str]:
    """Retention per (width, point) at the decades, and the loss rise ΔL/L at 0.1 and 1."""
    head = ["width", "point", "test loss", "alignment"] + [f"retention at {d:g}" for d in DECADES] + [
        "ΔL/L at 0.1", "ΔL/L at 1"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    loss = {r["width"]: r["test_loss"] for r in data["runs"]}
    keys = list(dict.fromkeys((r["width"], r["point"]) for r in data["rows"]))
    for w, p in keys:
        mine = [r for r in data["rows"] if (r["width"], r["point"]) == (w, p)]
        ret = [f"{_at(mine, d)[0]['retention']:.3g}" for d in DECADES]
        rise = [f"{100 * _at(mine, d)[0]['rise']:+.3g}%" for d in (0.1, 1.0)]
        lines.append("| " + " | ".join([str(w), p, f"{loss[w]:.3g}", f"{mine[0]['alignment']:.3g}", *ret, *rise]) + " |")
    return lines


def _num(x: float) -> str:
    """Two significant digits, whole numbers from 100 up (no exponent in prose)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.2g}"


def _span(v: Sequence[float]) -> str:
    lo, hi = _num(min(v)), _num(max(v))
    return lo if lo == hi else f"{lo}–{hi}"


def quantity(data: dict[str, Any], what: str) -> str:
    """Doc numbers: ``rise/<rel>`` (ΔL/L in %, range over points and widths), ``up/<rel>`` (points
    where the loss rose, of all), ``ret/<rel>`` (retention range), ``off/<rel>`` (|retention − 1|
    range), ``curves``, ``widths``."""
    rows = data["rows"]
    if what == "curves":
        return str(len({(r["width"], r["point"]) for r in rows}))
    if what == "widths":
        return " and ".join(str(w) for w in data["settings"]["widths"])
    kind, rel = what.split("/")
    at = _at(rows, float(rel))
    if kind == "rise":
        return _span([100 * r["rise"] for r in at]) + "%"
    if kind == "up":
        return f"{sum(r['actual'] > 0 for r in at)}/{len(at)}"
    if kind == "ret":
        return _span([r["retention"] for r in at])
    if kind == "off":
        return _span([abs(r["retention"] - 1) for r in at])
    raise KeyError(what)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the rows here (JSON); default: print the table")
    ap.add_argument("--quick", action="store_true", help="width 32, 60 steps (a smoke run, not for the docs)")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = run((32,), steps=60, n=32) if args.quick else run()
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, args.out)
    print("\n".join(table_lines(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
