r"""The growth benchmark's judgement of the rows of :mod:`widthscope.growth.bench`: per criterion and
baseline, with intervals over model seeds (:func:`compare`), and ``grow``'s default (:func:`winner`)."""

from __future__ import annotations

import math
import zlib
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import WidthscopeError

__all__ = ["compare", "winner", "teacher_picks", "t_interval", "pooled_interval", "wilson", "CRITERIA_COLUMNS"]

# criterion -> row column (higher = grow here); "gradmax" is scored on the GradMax block
CRITERIA_COLUMNS: dict[str, str] = {
    "bias": "bias_gain",
    "block": "block_gain",
    "gradmax": "gradmax_k",
    "certified": "certified_gain",
    "line_search": "ls_gain",
    "block_d_align": "block_d_align",
    "bias_b_exact": "neg_bias_b_exact",
    "block_b_exact": "neg_block_b_exact",
}
BASELINES = ("random", "last", "middle", "oracle", "ceiling")
# what each criterion costs beyond the model's backward passes, cheapest first (the default rule)
COST_ORDER = ("bias", "block", "block_d_align", "certified", "gradmax", "line_search")
# benchmark name -> `grow --criterion` name
GROW_NAME = {n: "d_align" if n == "block_d_align" else n for n in COST_ORDER}
BUDGETS = ("long",)  # block-training budgets scored (the cell's `long` steps)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ: Pearson correlation of the average ranks (NaN when either side is constant)."""
    from scipy.stats import rankdata  # noqa: PLC0415  start-up time: scipy

    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


@lru_cache(maxsize=4096)
def _t_quantile(p: float, df: float) -> float:
    from scipy.stats import t  # noqa: PLC0415  start-up time: scipy

    return float(t.ppf(p, df))


def _argmax(v: np.ndarray, *key: Any) -> tuple[int, bool]:
    """Index of the largest value (ties drawn by a generator seeded by ``key``), and whether it tied."""
    top = np.flatnonzero(v == v.max())
    rng = np.random.default_rng([zlib.crc32(str(k).encode()) for k in key])
    return int(rng.choice(top)) if len(top) > 1 else int(top[0]), len(top) > 1


def _column(rs: Sequence[Mapping[str, Any]], col: str) -> np.ndarray:
    return np.array([float(r[col]) if r.get(col) is not None else math.nan for r in rs])


def _gains(rs: Sequence[Mapping[str, Any]], col: str) -> tuple[np.ndarray, int]:
    """The gains of column ``col``, NaN (diverged) set to the worst finite one, and the NaN count."""
    g = _column(rs, col)
    bad = ~np.isfinite(g)
    if bad.any():
        g[bad] = np.min(g[~bad]) if (~bad).any() else 0.0
    return g, int(bad.sum())


def _pick(rs: Sequence[Mapping[str, Any]], name: str, seed: int, budget: str) -> tuple[np.ndarray, int, bool, int]:
    """Criterion ``name`` over the points (NaN last), the point it picks, whether it tied, the NaN count."""
    raw = _column(rs, CRITERIA_COLUMNS[name])
    fin = raw[np.isfinite(raw)]
    v = np.where(np.isfinite(raw), raw, (fin.min() - 1) if len(fin) else 0.0)
    j, tied = _argmax(v, seed, name, budget)
    return v, j, tied, len(raw) - len(fin)


def _unit_scores(rs: list[Mapping[str, Any]], budget: str) -> dict[str, dict[str, float]]:
    """Per criterion and baseline on one (model, seed): Spearman with the realised gain, top-1 hit,
    regret (also normalised), the gains beside the equal-compute baselines, ties/NaN counts."""
    rs = sorted(rs, key=lambda r: r["point_index"])
    seed = int(rs[0]["seed"])
    g, nan_g = _gains(rs, f"gain_{budget}")
    cont, _ = _gains(rs, f"gain_continue_{budget}")
    alls, _ = _gains(rs, f"gain_all_{budget}")
    P = len(g)
    out: dict[str, dict[str, float]] = {}

    def score(j: int, target: np.ndarray) -> dict[str, float]:
        best, spread = float(target.max()), float(target.max() - target.min())
        reg = best - float(target[j])
        return {
            "hit": float(target[j] == best),
            "regret": reg,
            "norm_regret": reg / spread if spread > 0 else 0.0,
            "gain": float(target[j]),
            "continue": float(cont[j]),
            "train_all": float(alls[j]),
            "advantage": float(target[j] - cont[j]),
            "all_vs_continue": float(alls[j] - cont[j]),
        }

    for name in CRITERIA_COLUMNS:
        target = _gains(rs, f"gain_gradmax_{budget}")[0] if name == "gradmax" else g
        v, j, tied, nan_c = _pick(rs, name, seed, budget)
        rho = _spearman(v, target)
        out[name] = {
            **score(j, target),
            "spearman": 0.0 if math.isnan(rho) else rho,
            "undefined_spearman": float(math.isnan(rho)),
            "ties": float(tied),
            "nan": float(nan_c + nan_g),
        }
    for name, j in (("last", P - 1), ("middle", (P - 1) // 2)):
        out[name] = {**score(j, g), "spearman": math.nan}
    per = [score(j, g) for j in range(P)]
    out["random"] = {k: float(np.mean([d[k] for d in per])) for k in per[0]}
    out["random"]["spearman"] = 0.0
    gA, _ = _gains(rs, f"gain_{budget}_A")
    j, tied = _argmax(gA, seed, "oracle", budget)
    out["oracle"] = {**score(j, g), "spearman": _spearman(gA, g), "ties": float(tied)}
    # the ceiling: how well regrowing with another block seed ranks the points
    S = np.array([r[f"gain_{budget}_seeds"] for r in rs]).T  # (block seeds, points)
    pairs = [_spearman(S[a], S[b]) for a in range(len(S)) for b in range(a + 1, len(S))]
    out["ceiling"] = {
        **{k: math.nan for k in per[0]},
        "spearman": float(np.nanmean(pairs)) if pairs and not np.all(np.isnan(pairs)) else math.nan,
    }
    return out


def t_interval(x: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval (any NaN gives NaN; fewer than 2 values give NaN bounds)."""
    a = np.asarray(x, dtype=float)
    if len(a) == 0 or np.isnan(a).any():
        return (math.nan,) * 3
    m = float(a.mean())
    if len(a) < 2:
        return m, math.nan, math.nan
    h = _t_quantile(0.5 + level / 2, len(a) - 1) * float(a.std(ddof=1)) / math.sqrt(len(a))
    return m, m - h, m + h


def pooled_interval(groups: Sequence[Sequence[float]], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the group means with a Welch–Satterthwaite t interval, ``Var = Σ_m s_m²/n_m / G²``."""
    gs = [np.asarray(g, dtype=float) for g in groups]
    if not gs or any(len(g) == 0 or np.isnan(g).any() for g in gs):
        return (math.nan,) * 3
    if len(gs) == 1:
        return t_interval(gs[0], level)
    m = float(np.mean([g.mean() for g in gs]))
    if any(len(g) < 2 for g in gs):
        return m, math.nan, math.nan
    v = np.array([g.var(ddof=1) / len(g) for g in gs])
    if v.sum() == 0:
        return m, m, m
    df = v.sum() ** 2 / np.sum(v**2 / np.array([len(g) - 1 for g in gs]))
    h = _t_quantile(0.5 + level / 2, round(float(df), 6)) * math.sqrt(v.sum()) / len(gs)
    return m, m - h, m + h


def wilson(k: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k/n`` (3 hits of 3 is [0.44, 1], not [1, 1])."""
    from scipy.stats import norm  # noqa: PLC0415  start-up time: scipy

    if n == 0:
        return math.nan, math.nan
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


_RANGE = {"spearman": (-1.0, 1.0), "hit": (0.0, 1.0), "norm_regret": (0.0, 1.0)}
METRICS = ("spearman", "hit", "regret", "norm_regret", "gain", "continue", "train_all", "advantage", "all_vs_continue")


def compare(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows ``kind="growth_compare"`` per model (and ``"overall"``: the natural models), budget and
    criterion or baseline: the metrics' means over seeds with 95% intervals (``hit``: Wilson), counts
    and ``cost_steps``; then the :func:`_paired` rows."""
    units: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    first: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        if r.get("kind") == "growth_bench":
            units.setdefault((str(r["model"]), int(r["seed"])), []).append(r)
            first.setdefault(str(r["model"]), r)
    if not units:
        raise WidthscopeError("no growth_bench rows to compare; run `widthscope grow-bench` first")
    models = sorted(first, key=lambda m: first[m].get("cell_index", 0))
    natural = [m for m in models if not first[m].get("answer")]
    out: list[dict[str, Any]] = []
    for budget in BUDGETS:
        scores = {u: _unit_scores(rs, budget) for u, rs in units.items()}
        for name in (*CRITERIA_COLUMNS, *BASELINES):
            for scope in (*models, "overall"):
                ms = (natural or models) if scope == "overall" else [scope]
                per = {m: [scores[u][name] for u in sorted(units) if u[0] == m] for m in ms}
                rec: dict[str, Any] = {
                    "kind": "growth_compare",
                    "model": scope,
                    "budget": budget,
                    "criterion": name,
                    "baseline": name in BASELINES,
                    "known_answer": scope not in natural and scope != "overall",
                    "n_seeds": sum(len(v) for v in per.values()),
                }
                for metric in METRICS:
                    groups = [[d.get(metric, math.nan) for d in v] for v in per.values()]
                    m_, lo, hi = pooled_interval(groups)
                    if metric in _RANGE:
                        lo, hi = max(lo, _RANGE[metric][0]), min(hi, _RANGE[metric][1])
                    rec[metric], rec[f"{metric}_lo"], rec[f"{metric}_hi"] = m_, lo, hi
                hits = [d["hit"] for v in per.values() for d in v]
                if all(math.isfinite(h) for h in hits):
                    rec["hit_count"] = float(sum(hits))
                    rec["hit_lo"], rec["hit_hi"] = wilson(sum(hits), len(hits))
                for cnt in ("ties", "nan", "undefined_spearman"):
                    rec[cnt] = int(sum(d.get(cnt, 0.0) for v in per.values() for d in v))
                # block-training steps of the decision: the oracle and the ceiling grow every point and seed
                runs = {m: int(first[m]["n_points"]) * len(first[m]["gain_long_seeds"]) for m in ms}
                every = name in ("oracle", "ceiling")
                rec["cost_steps"] = float(np.mean([int(first[m][budget]) * (runs[m] if every else 1) for m in ms]))
                out.append(rec)
        out.extend(_paired(scores, natural, budget))
    return out


def _paired(
    scores: Mapping[tuple[str, int], Mapping[str, Mapping[str, float]]], natural: Sequence[str], budget: str
) -> list[dict[str, Any]]:
    """``kind="growth_paired"``: per criterion, normalised regret of random, last and middle minus
    its own, paired over (model, seed), with the Welch t interval; ``beats``: its lower end > 0."""
    out = []
    for name in CRITERIA_COLUMNS:
        for base in ("random", "last", "middle"):
            groups = [
                [scores[u][base]["norm_regret"] - scores[u][name]["norm_regret"] for u in sorted(scores) if u[0] == m]
                for m in natural
            ]
            d, lo, hi = pooled_interval(groups)
            out.append(
                {
                    "kind": "growth_paired",
                    "budget": budget,
                    "criterion": name,
                    "versus": base,
                    "diff": d,
                    "diff_lo": lo,
                    "diff_hi": hi,
                    "beats": bool(lo > 0) if math.isfinite(lo) else False,
                }
            )
    return out


def winner(table: Sequence[Mapping[str, Any]], budget: str = "long") -> dict[str, Any]:
    """The default criterion and why: the lowest overall normalised regret among the criteria that
    beat random, last and middle (paired); if none does, the cheapest (:data:`COST_ORDER`) of those
    finding the most planted blocks."""
    paired = [r for r in table if r.get("kind") == "growth_paired" and r["budget"] == budget]
    rows = [r for r in table if r.get("kind") == "growth_compare" and r["budget"] == budget]
    cand = {r["criterion"]: r for r in rows if r["model"] == "overall" and r["criterion"] in COST_ORDER}
    beating = [c for c in cand if all(r["beats"] for r in paired if r["criterion"] == c)]
    planted: dict[str, float] = {c: 0.0 for c in cand}
    for r in rows:
        if r.get("known_answer") and r["criterion"] in cand:
            planted[r["criterion"]] += r.get("hit_count", 0.0)
    if beating:
        best = min(beating, key=lambda c: cand[c]["norm_regret"])
        why = (
            "lowest overall normalised regret among the criteria that beat "
            "random, last and middle (paired 95% intervals)"
        )
    else:
        top = max(planted.values()) if planted else 0.0
        best = next(c for c in COST_ORDER if c in cand and planted[c] == top)
        why = (
            "no criterion beats random, last and middle on the natural models; the cheapest of those "
            "that find the most planted blocks"
        )
    return {
        "criterion": best,
        "grow_name": GROW_NAME[best],
        "beats_simple_rules": bool(beating),
        "planted_hits": planted,
        "why": why,
    }


def teacher_picks(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per planted-block (model, seed): the answer, the realised best and each criterion's pick."""
    out: dict[str, dict[str, Any]] = {}
    for m, s in sorted({(str(r["model"]), int(r["seed"])) for r in rows if r.get("answer")}):
        rs = sorted(
            [r for r in rows if r.get("answer") and r["model"] == m and int(r["seed"]) == s],
            key=lambda r: r["point_index"],
        )
        out[f"{m} seed {s}"] = {
            "model": m,
            "seed": s,
            "answer": rs[0]["answer"],
            "best_long": max(rs, key=lambda r: r["gain_long"])["point"],
            **{n: rs[_pick(rs, n, s, "long")[1]]["point"] for n in CRITERIA_COLUMNS},
        }
    return out
