r"""Growth benchmark: grow a block at *every* candidate point and judge the criteria against it.

For each model of a suite and each seed (one resumable cell, :func:`widthscope.sweep.grid.run_grid`):

1. build and briefly train the model (or, for the teacher–student case, build a student that
   lacks exactly one block of its teacher);
2. draw ``n_probe`` train examples and split the held-out part into a *ranking* half and an
   *evaluation* half (a seeded permutation; the evaluation examples are never used to rank);
3. compute every criterion of :func:`widthscope.probe.growth.point_criteria` at every point;
4. grow the same block (hidden width = point width, the same seeded ``W_in``, AdamW, the same
   learning rate and mini-batch order) at every point for ``long`` steps, recording the held-out
   loss on the evaluation half after ``short`` steps on the way and after ``long`` steps: the
   realised gains ``gain_short``/``gain_long`` (loss before − loss after; > 0 is better).

:func:`compare` turns the rows into the table of Spearman correlation, top-1 hit rate and regret
per criterion and baseline (random, last, middle, grow-everywhere), per model and overall, with
seed-bootstrap intervals (:mod:`widthscope.report.growth` draws it).

Command line::

    widthscope grow-bench --quick --out /tmp/gb         # about a minute on one core
    widthscope grow-bench --out widthscope-results/growth   # the documented suite (resumable)
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from ._io import atomic_write_json, format_table, progress
from .errors import WidthscopeError

__all__ = ["SUITES", "cells", "run_cell", "compare", "winner", "benchmark", "teacher_student", "add_arguments",
           "run", "CRITERIA_COLUMNS", "BASELINES"]

# criterion -> row column (higher = grow here); see widthscope.probe.growth
CRITERIA_COLUMNS: dict[str, str] = {
    "bias": "bias_gain", "block": "block_gain", "gradmax": "gradmax", "certified": "certified_gain",
    "line_search": "ls_gain",
    "block_d_align": "block_d_align", "bias_b_exact": "neg_bias_b_exact", "block_b_exact": "neg_block_b_exact",
}
BASELINES = ("random", "last", "middle", "oracle")

_LLAMA = dict(family="llama", data="text", depth=4, seq_len=32, base_steps=120, base_lr=3e-3,
              batch_size=16, block_lr=3e-3, short=20, long=80, n_train=1024, n_test=512, n_probe=128)
_MLP = dict(family="mlp", width=64, data="digits", depth=4, base_steps=300, base_lr=3e-3, batch_size=32,
            block_lr=3e-3, short=40, long=160, n_probe=256)
_RESNET = dict(family="resnet20", width=0.5, data="digits-images", base_steps=200, base_lr=3e-3,
               batch_size=32, block_lr=3e-3, short=20, long=80, n_probe=128)
_TEACHER = dict(family="teacher", width=24, depth=4, missing=2, block_hidden=4, base_steps=0, batch_size=32,
                block_lr=1e-2, short=40, long=160, n_train=512, n_test=256, n_probe=256)
# the planted block is the last one, its W_in unknown to the grower, earlier layers damped
_TEACHER_LAST = {**_TEACHER, "model": "teacher-last", "depth": 3, "missing": 2, "block_hidden": None,
                 "teacher_hidden": 16, "teacher_seed": 5, "damp": 0.3}
SUITES: dict[str, list[dict[str, Any]]] = {
    "full": [*({**_LLAMA, "model": f"llama-{w}", "width": w} for w in (32, 64, 128, 256)),
             {**_MLP, "model": "mlp-64"}, {**_RESNET, "model": "resnet20-0.5"},
             {**_TEACHER, "model": "teacher-student"}, _TEACHER_LAST],
    "quick": [{**_LLAMA, "model": "llama-16", "width": 16, "depth": 3, "seq_len": 16, "base_steps": 30,
               "short": 5, "long": 20, "n_train": 256, "n_test": 128, "n_probe": 64},
              {**_MLP, "model": "mlp-32", "width": 32, "depth": 3, "base_steps": 100, "short": 10, "long": 40,
               "n_probe": 128},
              {**_TEACHER, "model": "teacher-student", "short": 10, "long": 60},
              {**_TEACHER_LAST, "short": 10, "long": 60}],
}
SEEDS = {"full": (0, 1, 2, 3, 4), "quick": (0, 1, 2)}


def cells(suite: str = "full", seeds: Sequence[int] | None = None, *, M: int = 32, K: int = 32) -> list[dict[str, Any]]:
    if suite not in SUITES:
        raise WidthscopeError(f"unknown growth suite {suite!r}; choose one of {', '.join(SUITES)}")
    seeds = SEEDS[suite] if seeds is None else tuple(seeds)
    return [{**spec, "seed": int(s), "M": M, "K": K, "block_seed": 0} for spec in SUITES[suite] for s in seeds]


# ----------------------------------------------------------------------------- models
def teacher_student(seed: int, *, width: int = 24, depth: int = 4, missing: int = 2, hidden: int | None = None,
                    block_seed: int = 0, n_train: int = 512, n_test: int = 256, in_dim: int = 8,
                    out_dim: int = 4, teacher_seed: int | None = None, damp: float | None = None
                    ) -> tuple[nn.Module, tuple[Any, Any], str]:
    """A student MLP that lacks exactly one residual block (at ``blocks.{missing}``) of its teacher.

    Why growing there is the right answer by construction: the teacher *is* the student plus a
    block ``z + W* φ(W_in norm(z))`` at that point, whose ``W_in`` is the one the benchmark's grown
    block gets (same shape, ``block_seed``). Training the grown block's ``W_out`` there can
    reproduce the teacher exactly (zero loss is reachable), while a block at any other point must
    imitate the change through the student's tanh layers, which it cannot do exactly. Targets are
    the teacher's outputs (regression, per-example squared error).

    The second construction (``teacher_seed`` set: the teacher's ``W_in`` is *not* the grown
    block's; ``damp``: the linear maps of ``blocks.1 … blocks.{missing}`` scaled by it) is the one of
    ``tests/test_grow.py``: the planted block is the last one and earlier changes reach the output
    only weakly, so the right answer there is realised by fitting the residual directly.
    """
    from .models import build
    from .probe.intervene import insert

    gen = torch.Generator().manual_seed(1000 + int(seed))
    torch.manual_seed(1000 + int(seed))
    student = build("mlp", width, in_dim=in_dim, out_dim=out_dim, depth=depth, activation="tanh").double().eval()
    if damp is not None:
        with torch.no_grad():
            for i in range(1, missing + 1):
                student.get_submodule(f"blocks.{i}.linear").weight.mul_(damp)
    teacher = build(**student.widthscope_config).double().eval()
    teacher.load_state_dict(student.state_dict())
    point = f"blocks.{missing}"
    insert(teacher, point, "block", hidden=hidden or width, seed=block_seed if teacher_seed is None else teacher_seed)
    with torch.no_grad():
        w = teacher.get_submodule(point).widthscope_insert.w_out
        w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * 0.6)
    x = torch.randn(n_train + n_test, in_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = teacher(x)
    return student, ((x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])), point


def _prepare(cell: Mapping[str, Any], show: bool) -> tuple[nn.Module, Any, Any, str | None]:
    """Trained model, pooled (train, test) examples, and the known answer (teacher–student)."""
    from .data import Split, load
    from .models import build
    from .train import train

    fam, seed = cell["family"], int(cell["seed"])
    if fam == "teacher":
        model, (tr, te), point = teacher_student(seed, width=cell["width"], depth=cell["depth"],
                                                 missing=cell["missing"], block_seed=cell["block_seed"],
                                                 hidden=cell.get("teacher_hidden", cell.get("block_hidden")),
                                                 teacher_seed=cell.get("teacher_seed"), damp=cell.get("damp"),
                                                 n_train=cell["n_train"], n_test=cell["n_test"])
        return model, tr, te, point
    if cell["data"] == "text":
        split = load("text", n_train=cell["n_train"], n_test=cell["n_test"], seed=seed, seq_len=cell["seq_len"],
                     max_bytes=400_000)
        torch.manual_seed(seed)
        model = build("llama", cell["width"], depth=cell["depth"], max_seq_len=cell["seq_len"])
    else:
        split = load("digits", seed=seed)
        if cell["data"] == "digits-images":  # 8×8 grey images for the ResNet
            split = Split((split.train[0].view(-1, 1, 8, 8), split.train[1]),
                          (split.test[0].view(-1, 1, 8, 8), split.test[1]), split.task, split.num_classes,
                          (1, 8, 8), split.name, split.meta)
            torch.manual_seed(seed)
            model = build("resnet20", cell["width"], in_channels=1, num_classes=10)
        else:
            torch.manual_seed(seed)
            model = build("mlp", cell["width"], in_dim=64, out_dim=10, depth=cell["depth"], activation="tanh")
    train(model, split, steps=cell["base_steps"], lr=cell["base_lr"], batch_size=cell["batch_size"], seed=seed,
          train_eval_examples=256, progress=show)
    model.eval()
    tr, te = split.train, split.test
    if split.task == "lm":
        tr, te = tr[0], te[0]  # token ids: the LM loss predicts the sequence itself
    return model, tuple(tr) if isinstance(tr, (tuple, list)) else tr, tuple(te) if isinstance(te, (tuple, list)) else te, None


def run_cell(cell: Mapping[str, Any], _cell_dir: Path | None = None, *, show: bool = False) -> list[dict[str, Any]]:
    """Criteria and realised gains at every point of one (model, seed). One row per point."""
    from .grow import grow_at
    from .probe.growth import point_criteria
    from .probe.intervene import _batch_size, _index, mean_loss, take

    t0 = time.perf_counter()
    model, train, test, answer = _prepare(cell, show)
    seed, M, K = int(cell["seed"]), int(cell["M"]), int(cell["K"])
    n_tr, n_te = _batch_size(train), _batch_size(test)
    n_probe = min(int(cell["n_probe"]), n_tr)
    probe = _index(train, torch.randperm(n_tr, generator=torch.Generator().manual_seed(seed + 1))[:n_probe].sort().values)
    perm = torch.randperm(n_te, generator=torch.Generator().manual_seed(seed))
    n_rank = n_te // 2
    rank_test, evaluate = _index(test, perm[:n_rank].sort().values), _index(test, perm[n_rank:].sort().values)
    points = list(model.widthscope_points)
    bs = 64
    eta = float(cell["block_lr"])
    t_base = time.perf_counter() - t0
    hidden = cell.get("block_hidden")  # None: the point's width
    crit = [point_criteria(model, p, probe, rank_test, M=M, K=K, eta=eta, block_seed=cell["block_seed"],
                           hidden=hidden, batch_size=bs) for p in points]
    t_crit = time.perf_counter() - t0 - t_base
    loss0 = mean_loss(model, evaluate, batch_size=bs)
    rows = []
    for i, (p, c) in enumerate(progress(list(zip(points, crit)), desc=f"grow-bench {cell['model']} s{seed}",
                                        disable=None if show else True)):
        _, res = grow_at(model, p, train, evaluate, probe_train=take(probe, min(M, n_probe)),
                         probe_test=take(rank_test, min(K, n_rank)), steps=int(cell["long"]), lr=eta,
                         block_width=hidden, width=c["width"], batch_size=int(cell["batch_size"]), seed=seed,
                         block_seed=int(cell["block_seed"]), eval_steps=[int(cell["short"])], loss_before=loss0)
        rows.append({**{k: v for k, v in c.items() if k not in ("M", "K", "width")}, "kind": "growth_bench",
                     "point_width": c["width"],
                     "point_index": i, "n_points": len(points), "answer": answer,
                     "neg_bias_b_exact": -c["bias_b_exact"], "neg_block_b_exact": -c["block_b_exact"],
                     "loss_before": loss0, "loss_short": res["loss_at"][str(cell["short"])],
                     "loss_long": res["loss_after"], "gain_short": loss0 - res["loss_at"][str(cell["short"])],
                     "gain_long": loss0 - res["loss_after"], "n_eval": n_te - n_rank,
                     "new_parameters": res["new_parameters"], "block_alignment": res["block_alignment"]})
    for r in rows:
        r.update(seconds_base=t_base, seconds_criteria=t_crit, seconds_cell=time.perf_counter() - t0)
    return rows


# ----------------------------------------------------------------------------- comparison
def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def _unit_scores(rs: list[Mapping[str, Any]], budget: str) -> dict[str, dict[str, float]]:
    """Spearman, top-1 hit and regret of every criterion/baseline on one (model, seed)."""
    rs = sorted(rs, key=lambda r: r["point_index"])
    g = np.array([float(r[f"gain_{budget}"]) for r in rs])
    P, best = len(g), float(g.max())
    out: dict[str, dict[str, float]] = {}
    for name, col in CRITERIA_COLUMNS.items():
        # missing/NaN ranks last (e.g. a line search that found no positive curvature)
        v = np.array([float(r[col]) if r.get(col) is not None and not math.isnan(float(r[col])) else -np.inf
                      for r in rs])
        j = int(np.argmax(v))  # ties: the earliest point
        fin = v[np.isfinite(v)]
        lo, hi = (float(fin.min()), float(fin.max())) if len(fin) else (0.0, 0.0)
        ranked = np.where(v == np.inf, hi + 1, np.where(v == -np.inf, lo - 1, v))
        out[name] = {"spearman": _spearman(ranked, g), "hit": float(g[j] == best), "regret": best - float(g[j])}
    for name, j in (("last", P - 1), ("middle", (P - 1) // 2)):
        out[name] = {"spearman": float("nan"), "hit": float(g[j] == best), "regret": best - float(g[j])}
    out["random"] = {"spearman": 0.0, "hit": float(np.mean(g == best)), "regret": float(np.mean(best - g))}
    out["oracle"] = {"spearman": 1.0, "hit": 1.0, "regret": 0.0}
    # regret as a fraction of the spread (best − worst point): 0 = picks the best, 1 = the worst;
    # comparable across models whose losses differ in scale, and stable when the best gain is ≈ 0
    spread = best - float(g.min())
    for v in out.values():
        v["norm_regret"] = v["regret"] / spread if spread > 0 else 0.0
    return out


def _boot(per_model: Mapping[str, Sequence[float]], draws: int, seed: int) -> tuple[float, float, float]:
    """Mean over models of the mean over seeds, with a seed-bootstrap 95% interval (seeds resampled
    within each model; NaN values, e.g. constant criteria, are dropped)."""
    vals = {m: np.array([v for v in vs if math.isfinite(v)]) for m, vs in per_model.items()}
    vals = {m: v for m, v in vals.items() if len(v)}
    if not vals:
        return (float("nan"),) * 3
    point = float(np.mean([v.mean() for v in vals.values()]))
    rng = np.random.default_rng(seed)
    bs = np.mean([v[rng.integers(0, len(v), (draws, len(v)))].mean(1) for v in vals.values()], axis=0)
    return point, float(np.quantile(bs, 0.025)), float(np.quantile(bs, 0.975))


def compare(rows: Sequence[Mapping[str, Any]], *, draws: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``kind="growth_compare"``: per model (and ``model="overall"``), budget and criterion or
    baseline: ``spearman``, ``hit``, ``regret``, ``norm_regret`` (regret / (best − worst gain)) — means over seeds,
    ``*_lo``/``*_hi`` 95% seed-bootstrap — ``n_seeds`` and ``cost_steps`` (block-training steps the
    decision costs). ``overall`` averages the models with no known answer (the teacher–student case
    is a correctness check, reported on its own); its ``regret`` mixes loss scales, so compare
    ``norm_regret`` there."""
    units: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "growth_bench":
            units.setdefault((str(r["model"]), int(r["seed"])), []).append(r)
    if not units:
        raise WidthscopeError("no growth_bench rows to compare; run `widthscope grow-bench` first")
    out: list[dict[str, Any]] = []
    models = sorted({m for m, _ in units}, key=lambda m: next(r for r in rows if r.get("model") == m).get("cell_index", 0))
    for budget in ("short", "long"):
        scores = {u: _unit_scores(rs, budget) for u, rs in units.items()}
        steps = {m: int(next(r for r in rows if r.get("model") == m)[budget]) for m in models}
        npts = {m: int(next(r for r in rows if r.get("model") == m)["n_points"]) for m in models}
        for name in (*CRITERIA_COLUMNS, *BASELINES):
            natural = [m for m in models if not any(r.get("answer") for r in units[next(u for u in units if u[0] == m)])]
            for scope in (*models, "overall"):
                ms = (natural or models) if scope == "overall" else [scope]
                rec: dict[str, Any] = {"kind": "growth_compare", "model": scope, "budget": budget, "criterion": name,
                                       "baseline": name in BASELINES, "known_answer": scope not in natural
                                       and scope != "overall",
                                       "n_seeds": sum(1 for (m, _) in units if m in ms)}
                for metric in ("spearman", "hit", "regret", "norm_regret"):
                    per = {m: [scores[(m2, s)][name][metric] for (m2, s) in units if m2 == m] for m in ms}
                    rec[metric], rec[f"{metric}_lo"], rec[f"{metric}_hi"] = _boot(per, draws, seed)
                cost = [steps[m] * (npts[m] if name == "oracle" else 1) for m in ms]
                rec["cost_steps"] = float(np.mean(cost))
                out.append(rec)
    return out


def winner(table: Sequence[Mapping[str, Any]], budget: str = "long") -> str:
    """The criterion (not a baseline) that finds the planted block most often (mean top-1 hit over the
    known-answer cases), then the lowest overall normalised regret on the natural models, then the
    higher Spearman. Planted blocks come first because on the natural models the criteria are within
    noise of each other (docs/interventions.md §5), while a planted block has a margin by construction."""
    cand = [r for r in table if r["model"] == "overall" and r["budget"] == budget and not r["baseline"]]
    known = [r for r in table if r.get("known_answer") and r["budget"] == budget and not r["baseline"]]
    hits: dict[str, list[float]] = {}
    for r in known:
        hits.setdefault(r["criterion"], []).append(float(r["hit"]))
    planted = {c: float(np.mean(v)) for c, v in hits.items()}
    return min(cand, key=lambda r: (-planted.get(r["criterion"], 0.0),
                                    r["norm_regret"] if math.isfinite(r["norm_regret"]) else math.inf,
                                    -(r["spearman"] if math.isfinite(r["spearman"]) else -1)))["criterion"]


def benchmark(out_dir: str | Path, *, suite: str = "full", seeds: Sequence[int] | None = None, M: int = 32,
              K: int = 32, show: bool = True, shard: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """Run (or resume) the suite into ``out_dir``; write ``comparison.jsonl`` and ``summary.json``.

    ``shard=(k, n)`` runs every ``n``-th cell from the ``k``-th (processes or machines sharing
    ``out_dir``); the comparison is written once every cell is finished (``complete`` in the result)."""
    import json

    from ._io import atomic_write_text
    from .sweep.grid import cell_id, run_grid

    grid = cells(suite, seeds, M=M, K=K)
    # load_rows reads every cell file in out_dir: cells of another suite/seeds/M/K would be mixed in
    ids = {cell_id(c) for c in grid}
    foreign = [p.stem for p in (Path(out_dir) / "cells").glob("*.json") if p.stem not in ids]
    if foreign:
        raise WidthscopeError(f"{out_dir} holds {len(foreign)} finished cell(s) of another growth benchmark "
                              "(suite, seeds, M or K differ); pass a new --out, or the options of that run")
    t0 = time.perf_counter()
    # one progress line per cell (the grid's bar); the per-point bars inside a cell only with show
    res = run_grid(grid, lambda c, d: run_cell(c, d, show=False), out_dir, desc=f"grow-bench {suite}",
                   shard=shard)
    out_dir = Path(out_dir)
    done = {r["cell_id"] for r in res.rows}
    if not ids <= done:
        return {"rows": res.rows, "table": [], "summary": {}, "complete": False,
                "finished": len(done & ids), "cells": len(ids)}
    table = compare(res.rows)
    atomic_write_text(out_dir / "comparison.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in table))
    summary = {"suite": suite, "M": M, "K": K, "cells": len(grid), "ran": len(res.done), "resumed": len(res.skipped),
               "seconds_this_call": time.perf_counter() - t0,
               "seconds_cells_total": sum({r["cell_id"]: r["seconds_cell"] for r in res.rows}.values()),
               "winner_long": winner(table, "long"), "winner_short": winner(table, "short"),
               "teacher_student": _teacher_picks(res.rows)}
    atomic_write_json(out_dir / "summary.json", summary)
    return {"rows": res.rows, "table": table, "summary": summary, "complete": True}


def _teacher_picks(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per teacher–student seed: the missing point, the realised best and each criterion's pick."""
    out: dict[str, dict[str, Any]] = {}
    for m, s in sorted({(str(r["model"]), int(r["seed"])) for r in rows if r.get("answer")}):
        rs = sorted([r for r in rows if r.get("answer") and r["model"] == m and int(r["seed"]) == s],
                    key=lambda r: r["point_index"])
        pick = {n: max(rs, key=lambda r: float(r[c]))["point"] for n, c in CRITERIA_COLUMNS.items()}
        out[f"{m} seed {s}"] = {"model": m, "seed": s, "answer": rs[0]["answer"], "best_long": max(rs, key=lambda r: r["gain_long"])["point"],
                       "best_short": max(rs, key=lambda r: r["gain_short"])["point"], **pick}
    return out


# ----------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the small suite (about a minute on one core)")
    p.add_argument("--out", default=None, help="results directory (default widthscope-results/growth[-quick]); "
                   "finished cells are kept and a rerun resumes")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--M", type=int, default=32, help="train samples of the certificates (default 32)")
    p.add_argument("--K", type=int, default=32, help="held-out samples of the certificates (default 32)")
    p.add_argument("--no-report", action="store_true", help="skip the table/plot (PNG) of the comparison")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--shard", default=None, help="run shard k of n (k/n) into a shared --out; under torchrun "
                   "one shard per rank. The comparison is written when every cell is finished")


def _seeds(text: str | None) -> tuple[int, ...] | None:
    from .certify import _int_list

    if text is None:
        return None
    seeds = tuple(_int_list(text, "--seeds"))
    if any(s < 0 for s in seeds):
        raise WidthscopeError(f"--seeds {text!r}: give at least one seed >= 0, e.g. 0,1,2")
    return seeds


def run(args: argparse.Namespace) -> int:
    suite = "quick" if args.quick else "full"
    seeds = _seeds(args.seeds)
    for nm in ("M", "K"):
        if getattr(args, nm) < 4:
            raise WidthscopeError(f"--{nm} {getattr(args, nm)}: must be >= 4 (the unbiased estimators need 4)")
    from .sweep.grid import finish_after_ranks, shard_for_run

    shard = shard_for_run(args.shard)
    out = Path(args.out or f"widthscope-results/growth{'-quick' if args.quick else ''}")
    res = benchmark(out, suite=suite, seeds=seeds, M=args.M, K=args.K, shard=shard)
    final: dict[str, Any] = {}
    # under torchrun: wait for every rank's cells, then rank 0 reruns unsharded (all cells done) and reports
    if not finish_after_ranks(args.shard, lambda: final.update(
            benchmark(out, suite=suite, seeds=seeds, M=args.M, K=args.K))):
        if not final:
            return 0  # not rank 0
        res = final
    if not res["complete"]:
        print(f"{res['finished']}/{res['cells']} cells finished in {out}; the comparison is written when every "
              "shard is done (rerun any shard, or without --shard, to finish)")
        return 0
    sel = [r for r in res["table"] if r["model"] == "overall"]
    print(format_table(sel, ["budget", "criterion", "spearman", "spearman_lo", "spearman_hi", "hit", "norm_regret",
                             "norm_regret_lo", "norm_regret_hi", "cost_steps"],
                       title=f"growth benchmark ({suite}): overall, mean over models of the mean over seeds"))
    s = res["summary"]
    print(f"\nwinner (most planted blocks found, then lowest normalised regret; "
          f"long budget): {s['winner_long']}; short budget: {s['winner_short']}")
    for key, t in s["teacher_student"].items():
        print(f"{key}: missing {t['answer']}, realised best {t['best_long']}, {s['winner_long']} picks "
              f"{t[s['winner_long']]}")
    if not args.no_report:
        from .report.growth import write_report

        for f in write_report(res["rows"], res["table"], out):
            print(f"wrote {f}")
    print(f"results: {out / 'results.jsonl'}, {out / 'comparison.jsonl'}, {out / 'summary.json'}")
    return 0
