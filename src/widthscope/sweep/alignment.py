"""Alignment width sweeps: train a family of models across widths, certify every insertion point.

For each cell ``family x width x seed (x data budget)`` of the grid the sweep

1. builds the model (``widthscope.models.build``, seeded) and trains it (``widthscope.train.train``),
2. saves the checkpoint (``widthscope.checkpoint.save``: safetensors + config) into the cell folder,
3. collects per-example activation gradients ``q = dl/dz`` pooled to sample vectors ``s`` at every
   insertion point on ``n_probe_train`` fitted examples and ``n_probe_test`` held-out examples
   (``widthscope.probe.collect``),
4. for every point and every ``(M, K)`` writes one tidy row with both population forms of the
   certificate (``widthscope.stats.certificate``), e.g. for the two-population form with train
   mean ``a`` and held-out mean ``b``::

       E[A] = a.b,  Var(A) = b'S_a b/M + a'S_b a/K + tr(S_a S_b)/(MK)
       d_align = min(d_par, d_2),  B_exact = Var/(Var + E^2) <= B_align = 1/(1 + n_eff d_align)

   and the empirical misalignment probability ``Pr(mu_M . g_K <= 0)`` over ``draws`` resamples with
   a 95% Wilson interval (``widthscope.stats.misalignment``).

Cells run through :func:`widthscope.sweep.grid.run_grid`, so a sweep is resumable (a killed run
restarts where it stopped, each cell recorded exactly once) and shardable (``shard=(k, n)``).

Example (a few seconds)::

    from widthscope.sweep.alignment import load_config, run_sweep
    cfg = load_config({
        "sweep": {"name": "tiny", "seeds": [0], "M": [8], "draws": 200},
        "family": [{"name": "mlp", "widths": [16, 32], "dataset": "digits",
                    "n_train": 256, "n_test": 64, "train": {"steps": 50, "lr": 1e-2},
                    "certify": {"n_probe_train": 32, "n_probe_test": 32}}],
    })
    result = run_sweep(cfg, "/tmp/tiny-sweep")
    print(len(result.rows))   # 2 widths x 2 points x 1 (M, K)
"""
from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import atomic_write_json, first_nonfinite, format_table, read_toml, to_jsonable
from ..errors import WidthscopeError
from .grid import GridResult, lock_out_dir, run_grid

__all__ = [
    "SweepConfig", "FamilySpec", "load_config", "check_structure", "plan_cells", "run_sweep", "run_cell",
    "cell_input_spec",
    "summary_rows", "CERT_FIELDS", "TIMING_COLUMNS", "monitor_steps", "MONITOR_SUMMARY", "MONITOR_TIMING_COLUMNS",
    "certified_steps",
]

# Fields of widthscope.stats.Certificate copied into each row, prefixed "one_" / "two_".
CERT_FIELDS = ("expectation", "variance", "d_par", "d_2", "d_align", "n_eff", "b_exact", "b_align",
               "vacuous", "reason")
# Columns that measure time and therefore differ between otherwise identical runs.
TIMING_COLUMNS = ("train_s", "probe_s", "stats_s", "intervene_s", "cell_seconds")
MONITOR_TIMING_COLUMNS = ("monitor_s", "monitor_probe_s", "monitor_stats_s")  # of monitored cells only
# Columns a monitored cell adds to its alignment rows (per point; docs/monitor.md §8).
MONITOR_SUMMARY = ("monitor_point", "monitor_first_cert_step", "monitor_first_cert_b_exact", "monitor_cert_from_step",
                   "monitor_delta",
                   "monitor_M", "monitor_K", "monitor_steps_total", "monitor_steps", "monitor_n_train",
                   "monitor_n_test", "monitor_probe", "monitor_probe_seq_len")

SWEEP_KEYS = {
    "name": "label of the sweep (default: the config file's stem)",
    "out_dir": "results directory (default: widthscope-results/<name>)",
    "seeds": "list of seeds; each seeds model init, batch order and resampling (default [0])",
    "M": "list of training-sample counts M (default [16, 32])",
    "K": "list of held-out-sample counts K (default: K = M)",
    "paired": "true: pairs (M[i], K[i]); false: every M with every K (default true)",
    "draws": "resamples for the empirical misalignment probability (default 1000)",
    "estimator": "'unbiased' (default) or 'plugin'",
    "pool": "pooling of token/spatial gradients: 'sum' (default), 'mean', 'flatten'",
    "budgets": "optional list of training-set sizes n_train; adds a data-budget axis to the grid",
    "data_seed": "seed of the train/test split, shared by all cells (default 0)",
    "device": "torch device (default 'cpu')",
    "threads": "torch CPU threads while the sweep runs (default: torch's choice); 1 avoids "
               "oversubscription when other jobs share the cores",
    "interventions": "'bias' (default), 'block' or 'none': a direct zero-init residual intervention "
                     "at every point (rows of kind 'intervention' + iv_* columns on alignment rows)",
    "etas": "intervention step sizes (default: a log grid scaled to each point)",
}
FAMILY_KEYS = {
    "name": "label of this family in results (required)",
    "model": "model family for widthscope.models.build (default: name): mlp, resnet20, llama, pythia",
    "widths": "positive, strictly increasing list of widths (required)",
    "model_options": "table of extra options for widthscope.models.build (depth, activation, ...)",
    "dataset": "dataset name for widthscope.data.load (required), e.g. digits, text, fashion-mnist",
    "data_options": "table of extra options for widthscope.data.load (root, seq_len, ...)",
    "n_train": "training examples (required unless [sweep].budgets is given)",
    "n_test": "held-out examples (default: n_probe_test)",
    "train": "table: steps, lr, optimizer, batch_size, warmup, clip, weight_decay, schedule, momentum, "
             "loss, eval_batch_size, train_eval_examples (options of widthscope.train.train)",
    "certify": "table: n_probe_train, n_probe_test, batch_size, points",
    "monitor": "table: every, count, at, points, n_train, n_test, M, K, delta, probe, seq_len: alignment over "
               "training (widthscope.monitor at the listed optimizer steps; docs/monitor.md)",
    "probes": "list of probe conditions {name, data, test_data, data_options, shift, seq_len} (default: one "
              "'in-domain' condition, the training data's own train/held-out parts); each is a results column "
              "'probe_set'",
    "probe_seq_len": "list of probe sequence lengths for text (default: the training length); an axis of the rows",
    "probe_data": "dataset name of the train probe pool (one probe condition named 'probe'; see probes)",
    "probe_test_data": "dataset name of the held-out probe pool (default: probe_data's held-out part)",
    "probe_data_options": "table of options for probe_data/probe_test_data (seq_len, max_bytes, ...)",
}
PROBE_KEYS = ("name", "data", "test_data", "data_options", "shift", "seq_len")
SHIFTS = ("noise:SIGMA", "contrast:FACTOR", "blur", "classes:A,B,...")
TRAIN_KEYS = ("steps", "lr", "optimizer", "batch_size", "warmup", "clip", "weight_decay", "schedule",
              "momentum", "loss", "eval_batch_size", "train_eval_examples")
CERTIFY_KEYS = ("n_probe_train", "n_probe_test", "batch_size", "points")
MONITOR_KEYS = ("every", "count", "at", "points", "n_train", "n_test", "M", "K", "delta", "probe", "seq_len")
OPTIMIZERS = ("adamw", "sgd")  # widthscope.train.train
LM_DATASETS = ("text", "prose")  # byte-level language modelling; every other dataset is classification
SCHEDULES = ("cosine", "constant")
EXAMPLE_FAMILY = ('[[family]] name = "mlp", widths = [32, 64], dataset = "digits", n_train = 512, '
                  'train = { steps = 300, lr = 1e-3 }')
ESTIMATORS = ("unbiased", "plugin")
POOLS = ("sum", "mean", "flatten")


@dataclass
class FamilySpec:
    """One ``[[family]]`` entry of a sweep config (validated)."""

    name: str
    model: str
    widths: list[float]
    dataset: str
    n_train: int | None
    n_test: int
    model_options: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    n_probe_train: int = 128
    n_probe_test: int = 128
    probe_batch_size: int = 32
    points: list[str] | None = None
    probes: list[dict[str, Any]] | None = None
    probe_seq_len: list[int] | None = None
    monitor: dict[str, Any] | None = None


@dataclass
class SweepConfig:
    """A validated sweep config: the ``[sweep]`` table and its families."""

    name: str
    out_dir: str
    families: list[FamilySpec]
    seeds: list[int] = field(default_factory=lambda: [0])
    MK: list[tuple[int, int]] = field(default_factory=lambda: [(16, 16), (32, 32)])
    draws: int = 1000
    estimator: str = "unbiased"
    pool: str = "sum"
    budgets: list[int] | None = None
    data_seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    interventions: str = "bias"
    etas: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(asdict(self))

    def fingerprint(self) -> str:
        """Hash of everything that determines results (not where they go)."""
        d = self.to_dict()
        for fam in d.get("families", []):  # options at their defaults leave older fingerprints alone
            for key in ("probes", "probe_seq_len", "monitor"):
                if fam.get(key) is None:
                    fam.pop(key, None)
        d.pop("out_dir", None)
        d.pop("device", None)
        d.pop("threads", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- validation
def _where(ctx: str) -> str:
    return f"sweep config {ctx}"


def _check_keys(table: Mapping[str, Any], valid: Sequence[str], ctx: str) -> None:
    unknown = [k for k in table if k not in valid]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, list(valid), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise WidthscopeError(f"{_where(ctx)}: unknown key(s) {', '.join(hints)}; valid keys: "
                              f"{', '.join(valid)}")


def _int(v: Any, what: str, *, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise WidthscopeError(f"{what} must be a whole number >= {minimum} (got {v!r})")
    return int(v)


def _int_list(v: Any, what: str, *, minimum: int = 1) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v:
        raise WidthscopeError(f"{what} must be a non-empty list of whole numbers (got {v!r})")
    return [_int(x, f"{what} entries", minimum=minimum) for x in v]


def _table(v: Any, what: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise WidthscopeError(f"{what} must be a table (e.g. {what.split()[-1]} = {{ key = value }}), "
                              f"got {type(v).__name__}")
    return dict(v)


def _family(raw: Any, index: int, sweep_budgets: list[int] | None) -> FamilySpec:
    ctx = f"[[family]] #{index + 1}"
    if not isinstance(raw, Mapping):
        raise WidthscopeError(f"{_where(ctx)}: each [[family]] must be a table")
    _check_keys(raw, list(FAMILY_KEYS), ctx)
    for req in ("name", "widths", "dataset"):
        if req not in raw:
            raise WidthscopeError(f"{_where(ctx)}: missing required key {req!r} ({FAMILY_KEYS[req]})")
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise WidthscopeError(f"{_where(ctx)}: name must be a non-empty string")
    ctx = f"family {name!r}"
    widths = raw["widths"]
    if not isinstance(widths, list) or not widths or any(
            isinstance(w, bool) or not isinstance(w, (int, float)) for w in widths):
        raise WidthscopeError(f"{_where(ctx)}: widths must be a non-empty list of numbers, got {widths!r}")
    if any(not (math.isfinite(w) and w > 0) for w in widths):
        raise WidthscopeError(f"{_where(ctx)}: widths must be positive finite numbers, got {widths!r}")
    if any(b <= a for a, b in zip(widths, widths[1:])):
        raise WidthscopeError(f"{_where(ctx)}: widths must be strictly increasing (sort them and drop "
                              f"duplicates), got {widths!r}")
    train = _table(raw.get("train"), f"{ctx} train")
    _check_keys(train, TRAIN_KEYS, f"{ctx} [family.train]")
    for req in ("steps", "lr"):
        if req not in train:
            raise WidthscopeError(f"{_where(ctx)}: train.{req} is required, e.g. "
                                  f"train = {{ steps = 300, lr = 1e-3 }}")
    _check_train(train, ctx)
    cert = _table(raw.get("certify"), f"{ctx} certify")
    _check_keys(cert, CERTIFY_KEYS, f"{ctx} [family.certify]")
    n_pa = _int(cert.get("n_probe_train", 128), f"{_where(ctx)} certify.n_probe_train", minimum=4)
    n_pb = _int(cert.get("n_probe_test", 128), f"{_where(ctx)} certify.n_probe_test", minimum=4)
    pbs = _int(cert.get("batch_size", 32), f"{_where(ctx)} certify.batch_size")
    points = cert.get("points")
    if points is not None and (not isinstance(points, list) or not all(isinstance(p, str) for p in points)):
        raise WidthscopeError(f"{_where(ctx)}: certify.points must be a list of insertion-point names")
    n_train = raw.get("n_train")
    if n_train is None and not sweep_budgets:
        raise WidthscopeError(f"{_where(ctx)}: missing n_train (training examples), or give "
                              f"[sweep].budgets")
    if n_train is not None:
        n_train = _int(n_train, f"{_where(ctx)} n_train")
    for nt in ([n_train] if n_train is not None else []) + list(sweep_budgets or []):
        if nt < n_pa:
            raise WidthscopeError(f"{_where(ctx)}: certify.n_probe_train={n_pa} exceeds the training set "
                                  f"size {nt}: probe samples are drawn from the fitted examples; lower "
                                  f"n_probe_train or raise n_train/budgets")
    n_test = _int(raw.get("n_test", n_pb), f"{_where(ctx)} n_test")
    if n_test < n_pb:
        raise WidthscopeError(f"{_where(ctx)}: certify.n_probe_test={n_pb} exceeds n_test={n_test}")
    model = raw.get("model", name)
    from .. import data as wdata
    from ..models import FAMILIES

    if not isinstance(model, str) or model not in FAMILIES:
        raise WidthscopeError(f"{_where(ctx)}: model {model!r} is not a model family; valid: {', '.join(FAMILIES)} "
                              f"(set model = ... when the family's name is not one)")
    if not isinstance(raw["dataset"], str) or raw["dataset"] not in wdata.DATASETS:
        raise WidthscopeError(f"{_where(ctx)}: dataset {raw['dataset']!r} unknown; valid: {', '.join(wdata.DATASETS)}")
    if train.get("loss") == "mse" and raw["dataset"] in LM_DATASETS:
        raise WidthscopeError(f"{_where(ctx)}: train.loss = 'mse' is for classification; {raw['dataset']!r} is "
                              "language modelling: use 'auto'")
    probes_raw = raw.get("probes")
    single = {k: raw[k] for k in ("probe_data", "probe_test_data", "probe_data_options") if k in raw}
    if single:
        if probes_raw is not None:
            raise WidthscopeError(f"{_where(ctx)}: give probes = [...] or probe_data/probe_test_data, not both")
        probes_raw = [{"name": "probe", "data": single.get("probe_data", raw["dataset"]),
                       **({"test_data": single["probe_test_data"]} if "probe_test_data" in single else {}),
                       **({"data_options": single["probe_data_options"]} if "probe_data_options" in single else {})}]
    probes = _probes(probes_raw, raw["dataset"], ctx)
    lens = raw.get("probe_seq_len")
    if lens is not None:
        if not isinstance(lens, list) or not lens or any(isinstance(v, bool) or not isinstance(v, int) or v < 2
                                                         for v in lens):
            raise WidthscopeError(f"{_where(ctx)}: probe_seq_len must be a non-empty list of whole numbers >= 2, "
                                  f"got {lens!r}")
        lens = list(dict.fromkeys(lens))
    return FamilySpec(
        probes=probes, probe_seq_len=lens,
        name=name, model=model, widths=[w if isinstance(w, int) else float(w) for w in widths],
        dataset=raw["dataset"], n_train=n_train, n_test=n_test,
        model_options=_table(raw.get("model_options"), f"{ctx} model_options"),
        data_options=_table(raw.get("data_options"), f"{ctx} data_options"),
        train=train, n_probe_train=n_pa, n_probe_test=n_pb, probe_batch_size=pbs,
        points=list(points) if points is not None else None)


def _number(train: Mapping[str, Any], key: str, ctx: str, *, low: float, strict: bool, also: str = "") -> None:
    v = train.get(key)
    if v is None:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > low if strict else v >= low)
    if not ok:
        raise WidthscopeError(f"{_where(ctx)}: train.{key} must be a finite number {'>' if strict else '>='} {low:g}"
                              f"{also}, got {v!r}")


def _check_train(train: Mapping[str, Any], ctx: str) -> None:
    """Every option of ``widthscope.train.train`` a sweep passes, checked before any cell runs."""
    from ..train import LOSSES

    _int(train["steps"], f"{_where(ctx)} train.steps")
    _number(train, "lr", ctx, low=0, strict=True)
    _number(train, "warmup", ctx, low=0, strict=False, also=" (a fraction of steps when < 1, else a number of steps)")
    _number(train, "clip", ctx, low=0, strict=False, also=" (the gradient-norm cap; 0 = off)")
    _number(train, "weight_decay", ctx, low=0, strict=False)
    _number(train, "momentum", ctx, low=0, strict=False)
    for key in ("batch_size", "eval_batch_size", "train_eval_examples"):
        if key in train:
            _int(train[key], f"{_where(ctx)} train.{key}")
    for key, valid in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("loss", LOSSES)):
        if key in train and train[key] not in valid:
            raise WidthscopeError(f"{_where(ctx)}: train.{key} {train[key]!r} unknown; valid: {', '.join(valid)}")


def monitor_steps(steps: int, every: int | str = "log", count: int = 6, at: Sequence[int] | None = None) -> list[int]:
    """The optimizer steps a sweep's monitor probes (0 = before the first step; ``steps`` = the trained model).

    ``at``: exactly those. ``every = N``: ``0, N, 2N, ...`` and ``steps``. ``every = "log"``: ``0`` and
    ``count - 1`` log-spaced steps ``round(steps^(k/(count-2)))``, ``k = 0..count-2`` (so ``1`` and
    ``steps`` included; repeats merged, so at most ``count`` steps).

    Example::

        >>> monitor_steps(150, "log", 6), monitor_steps(150, 50)
        ([0, 1, 3, 12, 43, 150], [0, 50, 100, 150])
    """
    if at is not None:
        return sorted(set(int(s) for s in at))
    if every == "log":
        if count <= 2:
            return sorted({0, steps})
        return sorted({0} | {int(round(steps ** (k / (count - 2)))) for k in range(count - 1)})
    return sorted(set(range(0, steps + 1, int(every))) | {steps})


def _monitor(raw: Any, fam: FamilySpec, MK: Sequence[tuple[int, int]], budgets: Sequence[int] | None
             ) -> dict[str, Any] | None:
    """The validated ``monitor`` table of one family (None: no monitor), with every default filled in:
    ``steps`` (the probed optimizer steps), ``points`` (None: the family's certify points), pool sizes
    ``n_train``/``n_test`` (default: certify's), ``M``/``K`` (default: the largest sweep pair that fits the
    pools), ``delta``, ``probe`` (None: the training data in-domain; else the name of one of the family's
    ``probes``) and ``seq_len`` (None: the condition's first probe length, else the training length);
    the keys as given are kept under ``every``/``count``/``at``."""
    if raw is None:
        return None
    ctx = f"family {fam.name!r}"
    where = f"{_where(ctx)}: monitor"
    mon = _table(raw, f"{ctx} monitor")
    _check_keys(mon, MONITOR_KEYS, f"{ctx} [family.monitor]")
    steps = int(fam.train["steps"])
    every = mon.get("every", "log")
    if "at" in mon and ("every" in mon or "count" in mon):
        raise WidthscopeError(f"{where}: give at = [steps] or every/count, not both")
    if every != "log" and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise WidthscopeError(f"{where}.every must be a whole number of optimizer steps >= 1 or \"log\" "
                              f"(log-spaced), got {every!r}")
    count = _int(mon.get("count", 6), f"{where}.count (the number of log-spaced probes)", minimum=2)
    if "count" in mon and every != "log":
        raise WidthscopeError(f"{where}.count sets the number of log-spaced probes: it goes with every = \"log\", "
                              f"not every = {every!r}")
    at = mon.get("at")
    if at is not None:
        if (not isinstance(at, list) or not at or any(isinstance(v, bool) or not isinstance(v, int)
                                                      or not 0 <= v <= steps for v in at)):
            raise WidthscopeError(f"{where}.at must be a non-empty list of optimizer steps 0..{steps} "
                                  f"(train.steps), got {at!r}")
    points = mon.get("points")
    if points is not None and (not isinstance(points, list) or not all(isinstance(p, str) for p in points)):
        raise WidthscopeError(f"{where}.points must be a list of insertion-point names, got {points!r}")
    n_tr = _int(mon.get("n_train", fam.n_probe_train), f"{where}.n_train (train-pool size)", minimum=4)
    n_te = _int(mon.get("n_test", fam.n_probe_test), f"{where}.n_test (held-out-pool size)", minimum=4)
    for nt in list(budgets) if budgets else [fam.n_train]:  # the training-set sizes of the cells
        if n_tr > nt:
            raise WidthscopeError(f"{where}.n_train={n_tr} exceeds the training set size {nt}: the pool is drawn "
                                  "from the fitted examples; lower monitor.n_train")
    if n_te > fam.n_test:
        raise WidthscopeError(f"{where}.n_test={n_te} exceeds n_test={fam.n_test}: lower monitor.n_test")
    if "M" in mon or "K" in mon:
        M = _int(mon.get("M", mon.get("K")), f"{where}.M", minimum=2)
        K = _int(mon.get("K", M), f"{where}.K", minimum=2)
    else:
        fits = [(m, k) for m, k in MK if m <= n_tr and k <= n_te]
        if not fits:
            raise WidthscopeError(f"{where}: the pools ({n_tr} train, {n_te} held-out) are smaller than every "
                                  f"(M, K) of the sweep {list(MK)}; raise monitor.n_train/n_test or set monitor.M")
        M, K = max(fits, key=lambda t: (t[0] * t[1], t))
    if M > n_tr or K > n_te:
        raise WidthscopeError(f"{where}: (M, K) = ({M}, {K}) needs at least {M} train and {K} held-out examples, "
                              f"but the pools have n_train={n_tr}, n_test={n_te}; raise those or lower monitor.M/K")
    cond = mon.get("probe")
    names = [c["name"] for c in fam.probes or []]
    if cond is not None and cond not in names:
        raise WidthscopeError(f"{where}.probe {cond!r} is not one of the family's probes "
                              f"({', '.join(map(repr, names)) or 'it has none: give probes = [...] or omit probe'})")
    seq_len = mon.get("seq_len")
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise WidthscopeError(f"{where}.seq_len must be a whole number >= 2 (a probe length in tokens), "
                                  f"got {seq_len!r}")
        if fam.dataset not in LM_DATASETS:
            raise WidthscopeError(f"{where}.seq_len is a text probe length; {fam.dataset!r} is not text: omit it")
    delta = mon.get("delta", 0.05)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < float(delta) < 1.0:
        raise WidthscopeError(f"{where}.delta must be a probability in (0, 1) (the certified level of B_exact), "
                              f"got {delta!r}")
    return {"every": None if at is not None else every, "count": count if every == "log" and at is None else None,
            "at": at, "steps": monitor_steps(steps, every, count, at), "points": list(points) if points else None,
            "n_train": n_tr, "n_test": n_te, "M": M, "K": K, "delta": float(delta), "probe": cond, "seq_len": seq_len}


def _probes(raw: Any, dataset: str, ctx: str) -> list[dict[str, Any]] | None:
    """Validated probe conditions (None: the default single in-domain condition)."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(c, Mapping) for c in raw):
        raise WidthscopeError(f"{_where(ctx)}: probes must be a list of tables, e.g. "
                              "[{name = 'in-domain'}, {name = 'shifted', data = 'prose'}]")
    out, names = [], set()
    from .. import data as wdata

    for c in raw:
        _check_keys(c, list(PROBE_KEYS), f"{ctx} probes")
        name = c.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise WidthscopeError(f"{_where(ctx)}: every probe condition needs a unique name, got {name!r}")
        names.add(name)
        for key in ("data", "test_data"):
            v = c.get(key)
            if v is not None and (not isinstance(v, str) or v not in wdata.DATASETS):
                raise WidthscopeError(f"{_where(ctx)}: probes {name!r} {key} must be a dataset name "
                                      f"({', '.join(wdata.DATASETS)}), got {v!r}")
        shift = c.get("shift")
        if shift is not None:
            _parse_shift(shift, f"{_where(ctx)}: probes {name!r}")
        lens = c.get("seq_len")
        if isinstance(lens, int) and not isinstance(lens, bool):
            lens = [lens]
        if lens is not None and (not isinstance(lens, list) or not lens or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 2 for v in lens)):
            raise WidthscopeError(f"{_where(ctx)}: probes {name!r} seq_len must be a whole number >= 2 or a list "
                                  f"of them, got {lens!r}")
        if (c.get("data") or dataset) == dataset and c.get("data_options"):
            raise WidthscopeError(f"{_where(ctx)}: probes {name!r} reads the training dataset {dataset!r}: it takes "
                                  "no data_options (another cut of the training corpus would put trained-on text in "
                                  "the held-out pool); use seq_len for other probe lengths")
        out.append({"name": name, "data": c.get("data") or dataset, "test_data": c.get("test_data"),
                    "data_options": _table(c.get("data_options"), f"{ctx} probes {name!r} data_options"),
                    "shift": shift, "seq_len": lens})
    return out


def _parse_shift(shift: Any, where: str) -> tuple[str, Any]:
    if not isinstance(shift, str):
        raise WidthscopeError(f"{where}: shift must be a string: one of {', '.join(SHIFTS)}")
    kind, _, arg = shift.partition(":")
    try:
        if kind == "noise" and math.isfinite(float(arg)) and float(arg) > 0:
            return kind, float(arg)
        if kind == "contrast" and math.isfinite(float(arg)) and 0 < float(arg):
            return kind, float(arg)
        if kind == "blur" and not arg:
            return kind, None
        if kind == "classes" and arg:
            return kind, [int(v) for v in arg.split(",")]
    except ValueError:
        pass
    raise WidthscopeError(f"{where}: unknown shift {shift!r}; choose one of {', '.join(SHIFTS)}")


def apply_shift(pair: tuple[Any, Any], shift: str | None, input_shape: tuple[int, ...], seed: int
                ) -> tuple[Any, Any]:
    """A fixed, documented corruption of image inputs: ``noise:σ`` adds seeded Gaussian noise of
    standard deviation σ (inputs are standardised), ``contrast:c`` scales every input about its
    own mean by ``c``, ``blur`` averages each pixel with its 3×3 neighbourhood, ``classes:a,b``
    keeps only those classes (a class-subset shift)."""
    import torch
    import torch.nn.functional as F

    if shift is None:
        return pair
    kind, arg = _parse_shift(shift, "shift")
    X, y = pair
    if not X.is_floating_point() or y is X:
        raise WidthscopeError(f"shift {shift!r} applies to image/feature inputs with labels, not to token ids")
    if kind == "classes":
        keep = torch.isin(y, torch.tensor(arg))
        return X[keep], y[keep]
    if kind == "noise":
        g = torch.Generator().manual_seed(int(seed) + 7919)
        return X + arg * torch.randn(X.shape, generator=g, dtype=X.dtype), y
    if kind == "contrast":
        mean = X.reshape(len(X), -1).mean(1).view(-1, *([1] * (X.dim() - 1)))
        return mean + arg * (X - mean), y
    shape = X.shape[1:] if X.dim() == 4 else tuple(input_shape)
    if len(shape) != 3:
        side = int(round(math.sqrt(X.shape[1])))
        if X.dim() != 2 or side * side != X.shape[1]:
            raise WidthscopeError("blur needs images (C, H, W) or square flattened images")
        shape = (1, side, side)
    img = X.reshape(len(X), *shape)
    out = F.avg_pool2d(F.pad(img, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    return out.reshape(X.shape), y


def load_config(source: str | os.PathLike | Mapping[str, Any], *, out_dir: str | os.PathLike | None = None
                ) -> SweepConfig:
    """Parse and validate a sweep config from a TOML file path or an already-parsed dict.

    Raises :class:`WidthscopeError` naming the offending key and the valid choices.
    """
    stem, what = "sweep", "sweep config"
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        raw = read_toml(path, "sweep config", "examples in configs/, reference in docs/sweeps.md")
        stem, what = path.stem, f"sweep config {str(path)!r}"
    _check_keys(raw, ["sweep", "family"], "top level")
    sw = _table(raw.get("sweep"), "[sweep]")
    _check_keys(sw, list(SWEEP_KEYS), "[sweep]")
    fams_raw = raw.get("family")
    if isinstance(fams_raw, Mapping):
        fams_raw = [fams_raw]
    if not fams_raw:
        raise WidthscopeError(f"{what} has no [[family]] entries{' (the file sets nothing)' if not raw else ''}; add at "
                              f"least one, e.g. {EXAMPLE_FAMILY} (reference: docs/sweeps.md)")
    name = sw.get("name", stem)
    if not isinstance(name, str) or not name:
        raise WidthscopeError("sweep config [sweep]: name must be a non-empty string")
    seeds = _int_list(sw.get("seeds", [0]), "[sweep] seeds", minimum=0)
    if len(set(seeds)) != len(seeds):
        raise WidthscopeError(f"[sweep] seeds has duplicates: {seeds}")
    Ms = _int_list(sw.get("M", [16, 32]), "[sweep] M", minimum=2)
    Ks = _int_list(sw["K"], "[sweep] K", minimum=2) if "K" in sw else list(Ms)
    paired = sw.get("paired", True)
    if not isinstance(paired, bool):
        raise WidthscopeError("[sweep] paired must be true or false")
    if paired:
        if len(Ks) != len(Ms):
            raise WidthscopeError(f"[sweep] paired = true needs M and K of equal length (got {len(Ms)} and "
                                  f"{len(Ks)}); set paired = false for every M with every K")
        MK = list(zip(Ms, Ks))
    else:
        MK = [(m, k) for m in Ms for k in Ks]
    draws = _int(sw.get("draws", 1000), "[sweep] draws")
    estimator = sw.get("estimator", "unbiased")
    if estimator not in ESTIMATORS:
        raise WidthscopeError(f"[sweep] estimator {estimator!r} unknown; valid: {', '.join(ESTIMATORS)}")
    pool = sw.get("pool", "sum")
    if pool not in POOLS:
        raise WidthscopeError(f"[sweep] pool {pool!r} unknown; valid: {', '.join(POOLS)}")
    budgets = _int_list(sw["budgets"], "[sweep] budgets") if "budgets" in sw else None
    data_seed = _int(sw.get("data_seed", 0), "[sweep] data_seed", minimum=0)
    device = sw.get("device", "cpu")
    if not isinstance(device, str):
        raise WidthscopeError("[sweep] device must be a string such as 'cpu' or 'cuda'")
    import torch

    try:
        meta = torch.device(device).type == "meta"
    except (RuntimeError, ValueError) as exc:
        raise WidthscopeError(f"[sweep] device {device!r} is not a torch device ({exc}); use e.g. cpu, cuda, "
                              "cuda:1, mps") from None
    if meta:
        raise WidthscopeError("[sweep] device 'meta' holds no data and cannot train; use e.g. cpu, cuda")
    threads = _int(sw["threads"], "[sweep] threads") if "threads" in sw else None
    interventions = sw.get("interventions", "bias")
    if interventions not in ("bias", "block", "none"):
        raise WidthscopeError(f"[sweep] interventions {interventions!r} unknown; valid: bias, block, none")
    etas = sw.get("etas")
    if etas is not None:
        if (not isinstance(etas, list) or not etas
                or not all(isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e) and e > 0
                           for e in etas)):
            raise WidthscopeError(f"[sweep] etas must be a non-empty list of positive finite numbers, got {etas!r}")
        etas = [float(e) for e in etas]
    families = [_family(f, i, budgets) for i, f in enumerate(fams_raw)]
    for f, f_raw in zip(families, fams_raw):
        f.monitor = _monitor(f_raw.get("monitor"), f, MK, budgets)
    names = [f.name for f in families]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise WidthscopeError(f"sweep config: family names must be unique; repeated: {', '.join(dup)}")
    for f in families:
        for m, k in MK:
            if m > f.n_probe_train or k > f.n_probe_test:
                raise WidthscopeError(
                    f"sweep config family {f.name!r}: (M, K) = ({m}, {k}) needs at least {m} train and {k} "
                    f"held-out probe samples, but certify has n_probe_train={f.n_probe_train}, "
                    f"n_probe_test={f.n_probe_test}; raise those or lower M/K")
    bad = first_nonfinite(raw)  # a safety net for free-form tables (model_options, data_options)
    if bad:
        raise WidthscopeError(f"sweep config {bad}: must be a finite number (inf and nan are never meaningful here)")
    out = str(out_dir) if out_dir is not None else sw.get("out_dir", f"widthscope-results/{name}")
    if not isinstance(out, str) or not out:
        raise WidthscopeError("[sweep] out_dir must be a non-empty path string")
    return SweepConfig(name=name, out_dir=str(out), families=families, seeds=seeds, MK=MK, draws=draws,
                       estimator=estimator, pool=pool, budgets=budgets, data_seed=data_seed, device=device,
                       threads=threads, interventions=interventions, etas=etas)


# ----------------------------------------------------------------------------- grid
def plan_cells(cfg: SweepConfig) -> list[dict[str, Any]]:
    """The grid, in a fixed order: family, then budget, then width, then seed.

    Each cell carries the config fingerprint, so changing the config never reuses old cells.
    """
    fp = cfg.fingerprint()
    cells = []
    for fam in cfg.families:
        budgets = cfg.budgets or [fam.n_train]
        for budget in budgets:
            for w in fam.widths:
                for s in cfg.seeds:
                    cells.append({"sweep": cfg.name, "family": fam.name, "width": w, "seed": s,
                                  "budget": budget, "config": fp})
    return cells


def check_structure(cfg: SweepConfig, *, device: bool = True) -> dict[str, list[str]]:
    """What only the model can tell, checked before any cell trains or any data loads: every
    family builds with its ``model_options`` (on the ``meta`` device, no memory, no data; the
    data-dependent sizes get placeholders, which change no module names), its ``certify.points``
    exist in that structure, and (``device``) ``[sweep].device`` is available here.

    Returns ``{family name: insertion points}``.
    """
    import types

    import torch

    from .. import models, probe

    if device:
        from ..train import resolve_device

        try:
            resolve_device(cfg.device)
        except WidthscopeError as exc:
            msg = str(exc).replace("; use --device cpu", "")
            raise WidthscopeError(f"[sweep] {msg}; set device = 'cpu' (or a device this machine has) in [sweep]") from None
    out = {}
    for fam in cfg.families:
        lm = fam.dataset in LM_DATASETS
        fake = types.SimpleNamespace(input_shape=(16,) if lm else (3, 8, 8), num_classes=256 if lm else 10)
        opts = _model_options(fam, fake)
        where = _where(f"family {fam.name!r}")
        for width in fam.widths:  # every cell's model: e.g. a width the attention heads do not divide
            try:
                try:
                    with torch.device("meta"):
                        model = models.build(fam.model, width, **opts)
                except (RuntimeError, NotImplementedError):  # an init the meta device cannot run: build it for real
                    model = models.build(fam.model, width, **opts)
            except WidthscopeError as exc:
                raise WidthscopeError(f"{where}: model {fam.model!r} at width {width} with model_options "
                                      f"{fam.model_options}: {exc}") from None
            try:
                out[fam.name] = probe.resolve_points(model, fam.points or None)  # [] means the defaults, as in run_cell
            except WidthscopeError as exc:
                raise WidthscopeError(f"{where} certify.points: {exc}") from None
            if fam.monitor is not None and fam.monitor["points"]:
                try:
                    probe.resolve_points(model, fam.monitor["points"])
                except WidthscopeError as exc:
                    raise WidthscopeError(f"{where} monitor.points: {exc}") from None
    return out


_SPLITS: dict[str, Any] = {}


def _load_split(fam: FamilySpec, budget: int, cfg: SweepConfig):
    """Load (and memoise per process) the dataset; every width and seed sees the same split."""
    from .. import data as wdata

    key = json.dumps([fam.dataset, fam.data_options, budget, fam.n_test, cfg.data_seed], sort_keys=True,
                     default=str)
    if key not in _SPLITS:
        _SPLITS.clear()  # one split at a time keeps memory flat on long multi-family sweeps
        _SPLITS[key] = wdata.load(fam.dataset, n_train=budget, n_test=fam.n_test, seed=cfg.data_seed,
                                  **fam.data_options)
    return _SPLITS[key]


def _model_options(fam: FamilySpec, split: Any) -> dict[str, Any]:
    """Fill the model's data-dependent options (input size, classes, vocabulary) from the split."""
    opts = dict(fam.model_options)
    shape = tuple(getattr(split, "input_shape", ()) or ())
    ncls = getattr(split, "num_classes", None)
    if fam.model == "mlp":
        if shape:
            opts.setdefault("in_dim", int(math.prod(shape)))
        if ncls:
            opts.setdefault("out_dim", int(ncls))
    elif fam.model == "resnet20":
        if shape:
            opts.setdefault("in_channels", int(shape[0]))
        if ncls:
            opts.setdefault("num_classes", int(ncls))
    elif fam.model in ("llama", "pythia"):
        if ncls:
            opts.setdefault("vocab_size", int(ncls))
        if shape:
            opts.setdefault("max_seq_len", int(shape[-1]))
    return opts


def _take(pair: Sequence[Any], n: int, seed: int) -> tuple[Any, ...]:
    """A seeded random subset of ``n`` examples, in their original order.

    Not the first ``n``: splits such as text chunks are ordered by position in the corpus, and
    the probe pools should be samples of the whole part.
    """
    import torch

    total = len(pair[0])
    idx = torch.randperm(total, generator=torch.Generator().manual_seed(int(seed)))[:n].sort().values
    return tuple(t[idx] for t in pair)


def _probe_len(pair: Sequence[Any], split: Any) -> int | None:
    """The probe sequence length of a text pool (None for other data)."""
    X = pair[0]
    return int(X.shape[1]) if split.task == "lm" and hasattr(X, "shape") and X.dim() == 2 else None


def _in_domain(fam: FamilySpec, L: int | None, split: Any, cfg: SweepConfig
               ) -> tuple[tuple[Any, ...], tuple[Any, ...], dict[str, Any] | None, str]:
    """Both pools from the training data: fitted examples and the held-out part. At a text
    length other than the training one, the corpus is re-cut at ``L`` inside the recorded fitted /
    held-out byte ranges, so no held-out probe chunk was trained on."""
    seed = cfg.data_seed
    train_len = int(split.input_shape[-1]) if split.task == "lm" else None
    if L is None or L == train_len:
        return (_take(split.train, fam.n_probe_train, seed), _take(split.test, fam.n_probe_test, seed + 1), None,
                f"{fam.dataset} (in-domain: fitted examples / held-out part)")
    import numpy as np
    import torch

    from .. import data as wdata
    from ..data.text import corpus_chunks, read_corpus, recorded_chunks

    rec = wdata.record(split)
    opts = dict(fam.data_options)
    buf, _, _, _ = read_corpus(opts.get("root"), int(opts.get("max_bytes", 2_000_000)), split.name)
    tr, te = (recorded_chunks(rec, len(buf), L, p) for p in ("fitted", "heldout"))
    for what, idx, n in (("fitted", tr, fam.n_probe_train), ("held-out", te, fam.n_probe_test)):
        if len(idx) < n:
            raise WidthscopeError(f"family {fam.name!r}: at probe_seq_len {L} only {len(idx)} chunks lie wholly "
                                  f"inside the {what} text (trained at {train_len}); lower n_probe or the length")
    g = lambda s_: torch.Generator().manual_seed(int(s_))  # noqa: E731
    a = np.sort(tr[torch.randperm(len(tr), generator=g(seed))[:fam.n_probe_train].numpy()])
    b = np.sort(te[torch.randperm(len(te), generator=g(seed + 1))[:fam.n_probe_test].numpy()])
    A, B = corpus_chunks(buf, L, a), corpus_chunks(buf, L, b)
    return ((A, A), (B, B), {"train": a * L, "test": b * L},
            f"{fam.dataset} (in-domain, re-cut at {L} inside the fitted / held-out byte ranges)")


def _probe_pools(fam: FamilySpec, cond: Mapping[str, Any], L: int | None, split: Any, cfg: SweepConfig
                 ) -> tuple[tuple[Any, ...], tuple[Any, ...], str, dict[str, Any] | None]:
    """(train pool, held-out pool, description, corpus byte offsets of the rows or None) of one
    probe condition at probe length ``L``.

    The training dataset is always read in-domain (:func:`_in_domain`): its train pool is the
    fitted examples and its held-out pool the held-out part. Another dataset gives its own train
    part for the train pool (``data``) and its held-out part for the held-out pool (``test_data``,
    default ``data``). ``shift`` then corrupts both pools (images)."""
    from .. import data as wdata

    seed = cfg.data_seed
    data, test = cond["data"], cond.get("test_data") or cond["data"]
    offsets = None
    inside = _in_domain(fam, L, split, cfg) if fam.dataset in (data, test) else None
    loaded: dict[str, Any] = {}

    def other(name: str) -> Any:
        if name not in loaded:
            opts = dict(cond.get("data_options", {}))
            if L is not None:
                opts["seq_len"] = L
            got = wdata.load(name, seed=seed, **opts)
            if got.task != split.task or (split.task == "lm" and got.num_classes != split.num_classes):
                raise WidthscopeError(f"family {fam.name!r}: probe {cond['name']!r} data {name!r} does not fit the "
                                      f"model trained on {fam.dataset!r}")
            loaded[name] = got
        return loaded[name]

    if data == fam.dataset:
        pa, offsets_a, desc_a = inside[0], inside[2], "fitted examples"
    else:
        o = other(data)
        pa, offsets_a, desc_a = _take(o.train, min(fam.n_probe_train, len(o.train[0])), seed), None, \
            f"{data} train part"
    if test == fam.dataset:
        pb, offsets_b, desc_b = inside[1], inside[2], "held-out part"
    else:
        h = other(test)
        pb, offsets_b, desc_b = _take(h.test, min(fam.n_probe_test, len(h.test[0])), seed + 1), None, \
            f"{test} held-out part"
    if data == test == fam.dataset:
        desc, offsets = inside[3], inside[2]
    else:
        desc = f"{desc_a} / {desc_b}"
        if offsets_a is not None or offsets_b is not None:
            offsets = {k: v for k, v in (("train", (offsets_a or {}).get("train")),
                                         ("test", (offsets_b or {}).get("test"))) if v is not None}
    if cond.get("shift"):
        pa = apply_shift(tuple(pa), cond["shift"], tuple(split.input_shape), seed)
        pb = apply_shift(tuple(pb), cond["shift"], tuple(split.input_shape), seed + 1)
        desc += f", shift {cond['shift']}"
    return tuple(pa), tuple(pb), desc, offsets


def _probe_words(cond: Mapping[str, Any], pa: Sequence[Any], pb: Sequence[Any], split: Any) -> str:
    """The probe pools of one condition in words: corpus, length, pool sizes (for the report)."""
    from .. import data as wdata

    data, test = cond["data"], cond.get("test_data") or cond["data"]
    src = wdata.describe_name(data) + ("" if test == data else f" / held-out pool: {wdata.describe_name(test)}")
    L = _probe_len(pa, split)
    unit = f"{L}-byte chunks" if L is not None else "examples"
    where = ("the training data's fitted / held-out parts" if data == test == split.name
             else "its train / held-out parts")
    return (f"{src}; {len(pa[0])} train-pool / {len(pb[0])} held-out-pool {unit} from {where}"
            + (f", shift {cond['shift']}" if cond.get("shift") else ""))


def _batches(pair: Sequence[Any], task: str, batch_size: int):
    from .. import data as wdata

    # Explicit lm flag: slicing breaks the ``y is X`` identity batches() would infer it from.
    return list(wdata.batches(pair, batch_size, shuffle=False, lm=(task == "lm")))


def cell_input_spec(cfg: SweepConfig, cell: Mapping[str, Any], cell_dir: str | os.PathLike) -> Any:
    """The :class:`~widthscope.data.spec.InputSpec` that probes this cell's saved checkpoint with
    ``widthscope certify`` / :func:`widthscope.load_inputs`: its recorded dataset and data record,
    ``n_probe_train`` / ``n_probe_test`` examples, seeds ``data_seed`` / ``data_seed + 1``.

    Its train pool is the sweep's in-domain train pool (a seeded sample of the fitted examples,
    the same rule); its held-out pool is drawn from the dataset's whole held-out part, where the
    sweep draws from the cell's ``n_test`` subset of it. Written to ``input_spec.json`` beside
    the cell's checkpoint."""
    from ..data.spec import InputSpec

    fam = next(f for f in cfg.families if f.name == cell["family"])
    return InputSpec(model=str(cell_dir), n_train=fam.n_probe_train, n_test=fam.n_probe_test, seed=cfg.data_seed)


def run_cell(cfg: SweepConfig, cell: Mapping[str, Any], cell_dir: Path, *, show_progress: bool = True
             ) -> list[dict[str, Any]]:
    """Train, save, probe and certify one cell; return its rows (see docs/sweeps.md for columns)."""
    import torch

    from .. import checkpoint, models, probe, stats
    from .. import data as wdata
    from ..train import train

    fam = next(f for f in cfg.families if f.name == cell["family"])
    seed, width, budget = int(cell["seed"]), cell["width"], int(cell["budget"])
    split = _load_split(fam, budget, cfg)
    torch.manual_seed(seed)
    model = models.build(fam.model, width, **_model_options(fam, split))
    n_params = int(models.count_parameters(model))

    mon, mon_info = _cell_monitor(cfg, fam, split, model, seed, Path(cell_dir)) if fam.monitor is not None \
        else (None, {})
    monitor_s = 0.0

    def on_step(m: Any, step: int) -> None:
        nonlocal monitor_s
        t = time.perf_counter()
        mon.step(m, step)
        monitor_s += time.perf_counter() - t

    t0 = time.perf_counter()
    tr = train(model, split, seed=seed, progress=show_progress, device=cfg.device,
               on_step=on_step if mon is not None else None, **fam.train)
    train_s = time.perf_counter() - t0 - monitor_s  # the training alone; the probes are monitor_s
    checkpoint.save(model, cell_dir, extra={"sweep": cfg.name, "cell": dict(cell), "dataset": fam.dataset,
                                            "data_options": dict(fam.data_options),
                                            "data_seed": cfg.data_seed,
                                            # held-out byte ranges / fitted examples: any later
                                            # probe draws its pools from them (no leak)
                                            "data_record": wdata.record(split),
                                            "train": {k: v for k, v in tr.items() if k != "history"}})
    atomic_write_json(Path(cell_dir) / "input_spec.json",
                      {"input_spec": cell_input_spec(cfg, cell, cell_dir).to_dict(),
                       "note": "widthscope certify inputs of this checkpoint (InputSpec.from_dict): train pool as "
                               "the sweep's; held-out pool from the whole held-out part"})

    points = fam.points or probe.insertion_points(model)
    data_words = "trained on " + wdata.describe(split)
    conditions = fam.probes or [{"name": "in-domain", "data": fam.dataset, "test_data": None,
                                 "data_options": {}, "shift": None}]
    rows: list[dict[str, Any]] = []
    iv_rows: list[dict[str, Any]] = []
    probe_s = stats_s = intervene_s = 0.0
    npts = len(points)
    for ci, cond in enumerate(conditions):
        for li, L in enumerate(cond.get("seq_len") or fam.probe_seq_len or [None]):
            t0 = time.perf_counter()
            pa, pb, desc, _ = _probe_pools(fam, cond, L, split, cfg)
            Xa = probe.collect(model, _batches(pa, split.task, fam.probe_batch_size), points=points, pool=cfg.pool,
                               progress=show_progress)
            Xb = probe.collect(model, _batches(pb, split.task, fam.probe_batch_size), points=points, pool=cfg.pool,
                               progress=show_progress)
            probe_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            these: list[dict[str, Any]] = []
            for pi, point in enumerate(points):
                a, b = Xa[point], Xb[point]
                # Moments and the cross-Gram once per point; every (M, K) reuses them.
                m_one = stats.moments(a, cfg.estimator)
                m_two = stats.cross_moments(a, b, cfg.estimator)
                mis_all = stats.misalignment(a, b, pairs=list(cfg.MK), draws=cfg.draws, seed=seed)
                for (M, K), mis in zip(cfg.MK, mis_all):
                    one = stats.certificate(m_one, M=M, K=K, populations="one")
                    two = stats.certificate(m_two, M=M, K=K, populations="two")
                    row: dict[str, Any] = {
                        "kind": "alignment", "model": fam.model, "dataset": fam.dataset, "point": point,
                        "point_index": pi, "depth_fraction": (pi + 1) / npts, "n_points": npts,
                        "d": int(a.shape[1]), "n_params": n_params,
                        "train_loss": tr.get("train_loss"), "test_loss": tr.get("test_loss"),
                        "test_accuracy": tr.get("test_accuracy"), "steps": tr.get("steps"),
                        "n_probe_train": int(a.shape[0]), "n_probe_test": int(b.shape[0]),
                        "M": M, "K": K, "estimator": cfg.estimator, "pool": cfg.pool,
                        "probe_notes": "; ".join(getattr(Xa, "notes", [])) or None,
                        "data_description": data_words,
                    }
                    if fam.probes is not None or fam.probe_seq_len is not None:
                        row.update(probe_set=cond["name"], probe_data=desc, probe_seq_len=_probe_len(pa, split),
                                   probe_description=_probe_words(cond, pa, pb, split),
                                   probe_in_domain=(cond["data"] == (cond.get("test_data") or cond["data"])
                                                    == fam.dataset and not cond.get("shift")))
                    for prefix, cert in (("one_", one), ("two_", two)):
                        for f in CERT_FIELDS:
                            row[prefix + f] = getattr(cert, f, None)
                    row["two_limit"] = None
                    for prefix in ("one_", "two_"):  # the one reporting rule (None where undefined)
                        stats.vacuous_rule(row, prefix)
                    row.update(misalignment=mis.probability, misalignment_low=mis.low,
                               misalignment_high=mis.high, misalignment_draws=mis.draws)
                    these.append(row)
            stats_s += time.perf_counter() - t0
            # Direct interventions (spec §5), on the first probe condition and length only: they
            # test the first-order prediction of the model, which the probe condition does not change.
            t0 = time.perf_counter()
            if cfg.interventions != "none" and ci == 0 and li == 0:
                from ..probe.intervene import intervene

                m_max, k_max = max(m for m, _ in cfg.MK), max(k for _, k in cfg.MK)
                for pi, point in enumerate(points):
                    ivs = intervene(model, point, _batches(pa, split.task, fam.probe_batch_size),
                                    _batches(pb, split.task, fam.probe_batch_size), etas=cfg.etas,
                                    kind=cfg.interventions, M=m_max, K=k_max, seed=seed, progress=False)
                    smallest = min(ivs, key=lambda r: r["eta"])
                    for r in these:
                        if r["point"] == point:
                            r.update(iv_eta=smallest["eta"], iv_predicted=smallest["predicted"],
                                     iv_actual=smallest["actual"], iv_retention=smallest["retention"],
                                     iv_sign_agrees=smallest["sign_agrees"])
                    for iv in ivs:
                        iv_rows.append({**iv, "model": fam.model, "dataset": fam.dataset, "point_index": pi,
                                        "n_params": n_params, "data_description": data_words})
            intervene_s += time.perf_counter() - t0
            rows += these
    rows += iv_rows
    if mon is not None:
        rows += _monitor_rows(mon, mon_info, fam, rows, n_params, data_words)
    for r in rows:
        r.update(train_s=train_s, probe_s=probe_s, stats_s=stats_s, intervene_s=intervene_s)
        if mon is not None:
            r["monitor_s"] = monitor_s
    return rows


MONITOR_FILE = "monitor.jsonl"


def _cell_monitor(cfg: SweepConfig, fam: FamilySpec, split: Any, model: Any, seed: int, cell_dir: Path
                  ) -> tuple[Any, dict[str, Any]]:
    """The cell's :class:`~widthscope.monitor.AlignmentMonitor` and its probe condition in words
    (``monitor_probe``, ``monitor_probe_seq_len``, ``monitor_probe_description``): pools of
    ``monitor.n_train`` / ``monitor.n_test`` examples of the condition drawn by the certify rules
    (in-domain: the same seeded draws, so a monitor pool no larger than certify's is a subset of
    it), appending to ``cell_dir/monitor.jsonl``.

    The cell is being (re)trained from step 0, so rows a killed earlier attempt left there are
    removed first: the file then holds this training run's rows only, each step once."""
    from ..monitor import AlignmentMonitor

    import dataclasses

    m = fam.monitor
    path = cell_dir / MONITOR_FILE
    path.unlink(missing_ok=True)
    cond, L = _monitor_condition(fam)
    # The pools of that probe condition, drawn by the certify rules at the monitor's sizes.
    sized = dataclasses.replace(fam, n_probe_train=m["n_train"], n_probe_test=m["n_test"])
    pa, pb, _, _ = _probe_pools(sized, cond, L, split, cfg)
    model.to(cfg.device)  # train() would move it anyway; the monitor's dry probe runs where training will
    mon = AlignmentMonitor(model, _batches(pa, split.task, fam.probe_batch_size),
                           _batches(pb, split.task, fam.probe_batch_size), points=m["points"] or fam.points or None,
                           M=m["M"], K=m["K"], at=m["steps"], delta=m["delta"], draws=cfg.draws, seed=seed,
                           estimator=cfg.estimator, pool=cfg.pool, out=path, progress=False)
    return mon, {"monitor_probe": cond["name"], "monitor_probe_seq_len": _probe_len(pa, split),
                 "monitor_probe_description": _probe_words(cond, pa, pb, split)}


def certified_steps(rows: Sequence[Mapping[str, Any]], delta: float) -> tuple[int | None, int | None]:
    """``(first, from)`` over one point's monitor rows (any order), by
    :func:`widthscope.stats.certified_steps` with :func:`widthscope.stats.certified` at ``delta``.

    Example::

        >>> rows = [{"step": s, "vacuous": False, "b_exact": b} for s, b in ((0, .01), (5, .5), (9, .02))]
        >>> certified_steps(rows, 0.05)
        (0, 9)
    """
    from ..stats import certified, certified_steps as steps

    return steps((int(r["step"]), certified(r.get("b_exact"), r.get("vacuous"), delta)) for r in rows)


def _monitor_condition(fam: FamilySpec) -> tuple[dict[str, Any], int | None]:
    """(probe condition, probe length) of the family's monitor (None length: the training length)."""
    m = fam.monitor
    if m["probe"] is None:
        return {"name": "in-domain", "data": fam.dataset, "test_data": None, "data_options": {}, "shift": None}, \
            m["seq_len"]
    cond = next(c for c in fam.probes if c["name"] == m["probe"])
    return cond, m["seq_len"] or (cond.get("seq_len") or fam.probe_seq_len or [None])[0]


def _monitor_rows(mon: Any, info: Mapping[str, Any], fam: FamilySpec, rows: list[dict[str, Any]], n_params: int, data_words: str
                  ) -> list[dict[str, Any]]:
    """The cell's ``kind="monitor"`` rows (one per probed step and point: the monitor's rows, their
    timings renamed ``monitor_probe_s``/``monitor_stats_s``, ``first_certified`` on the row of a point's
    certified event); and, on every alignment row, the :data:`MONITOR_SUMMARY` columns of its point
    (``monitor_first_cert_step`` None: never certified at ``delta`` within the probed steps, or
    ``monitor_point`` False: not monitored; ``monitor_cert_from_step``: see :func:`certified_steps`)."""
    m = fam.monitor
    first = {e["point"]: e for e in mon.events}
    common = {"monitor_probe": info["monitor_probe"], "monitor_probe_seq_len": info["monitor_probe_seq_len"],"monitor_delta": m["delta"], "monitor_M": m["M"], "monitor_K": m["K"],
              "monitor_steps_total": int(fam.train["steps"]), "monitor_steps": list(m["steps"]),
              "monitor_n_train": m["n_train"], "monitor_n_test": m["n_test"]}
    since = {p: certified_steps([r for r in mon.rows if r["point"] == p], m["delta"])[1] for p in mon.points}
    for r in rows:
        if r.get("kind") == "alignment":
            e = first.get(r["point"])
            r.update(common, monitor_point=r["point"] in mon.points,
                     monitor_first_cert_step=None if e is None else int(e["step"]),
                     monitor_first_cert_b_exact=None if e is None else e["b_exact"],
                     monitor_cert_from_step=since.get(r["point"]))
    out = []
    for r in mon.rows:
        row = {k: v for k, v in r.items() if k not in ("probe_s", "stats_s")}
        e = first.get(r["point"])
        row.update(kind="monitor", model=fam.model, dataset=fam.dataset, n_params=n_params,
                   data_description=data_words, monitor_probe_s=r["probe_s"], monitor_stats_s=r["stats_s"],
                   first_certified=e is not None and int(e["step"]) == int(r["step"]),
                   steps_total=int(fam.train["steps"]), estimator=mon.estimator, pool=mon.pool, **info)
        out.append(row)
    return out


def _guard_out_dir(cfg: SweepConfig, out_dir: Path) -> None:
    """Refuse to mix two different sweeps in one results directory (resume needs the same config)."""
    marker = out_dir / "sweep.json"
    if marker.exists():
        try:
            old = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = {}
        if old.get("fingerprint") not in (None, cfg.fingerprint()):
            raise WidthscopeError(
                f"results directory {str(out_dir)!r} holds a sweep with a different config "
                f"(fingerprint {old.get('fingerprint')} vs {cfg.fingerprint()}): resuming would mix results. "
                f"Use another --out, or delete that directory to start over")
    atomic_write_json(marker, {"fingerprint": cfg.fingerprint(), "config": cfg.to_dict(), "kind": "alignment"})


def run_sweep(config: SweepConfig | Mapping[str, Any] | str | os.PathLike, out_dir: str | os.PathLike | None = None,
              shard: tuple[int, int] = (1, 1), *, show_progress: bool = True) -> GridResult:
    """Run (or resume) the sweep's unfinished cells of this shard; return the grid result.

    ``config`` is a :class:`SweepConfig`, a dict as parsed from TOML, or a TOML path.
    """
    cfg = config if isinstance(config, SweepConfig) else load_config(config)
    check_structure(cfg)  # before the folder exists: a refused config leaves nothing behind
    out = Path(out_dir if out_dir is not None else cfg.out_dir)
    from .._io import _unwritable

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(out, exc) from None
    cells = plan_cells(cfg)
    import torch

    threads = torch.get_num_threads()
    if cfg.threads:
        # Small models gain little from more threads, and spinning OpenMP threads on busy cores
        # can make a step 10-20x slower (measured: docs/sweeps.md), hence the option.
        torch.set_num_threads(cfg.threads)
    try:
        with lock_out_dir(out, shard, "sweep"):
            _guard_out_dir(cfg, out)
            return run_grid(cells, lambda c, d: run_cell(cfg, c, d, show_progress=show_progress), out, shard=shard,
                            desc=f"sweep {cfg.name}")
    finally:
        torch.set_num_threads(threads)


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def _condition(r: Mapping[str, Any]) -> tuple[Any, Any]:
    """The probe condition of a row: (probe_set, probe length); (None, None) without probes."""
    return r.get("probe_set"), r.get("probe_seq_len")


def summary_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per (probe condition, family, width, point), averaged over seeds, at the largest (M, K).

    Probe conditions (``probe_set``, ``probe_seq_len``) are never averaged together: each line
    carries its condition in ``probe_set`` / ``probe_seq_len``. ``d_align`` follows the reporting
    rule of :func:`widthscope.stats.vacuous_rule`: the mean over the seeds whose certificate is not
    vacuous (``None`` when none is), and ``vacuous`` counts the others, e.g. ``"1/2"``.
    """
    from ..stats import vacuous_rule

    rows = [vacuous_rule(vacuous_rule(dict(r), "one_"), "two_") for r in rows if r.get("kind") == "alignment"]
    if not rows:
        return []
    out = []
    key = lambda r: (_condition(r), r["family"], r.get("budget"), r["width"], r["point_index"])  # noqa: E731
    keys = sorted({(*key(r), r["point"]) for r in rows},
                  key=lambda k: (str(k[0][0]), k[0][1] or 0, k[1], k[2] or 0, k[3], k[4]))
    for cond, fam, budget, w, pi, point in keys:
        sel = [r for r in rows if key(r) == (cond, fam, budget, w, pi)]
        mk = max({(r["M"], r["K"]) for r in sel}, key=lambda t: (t[0] * t[1], t))
        at = [r for r in sel if (r["M"], r["K"]) == mk]
        n_vac = sum(bool(r.get("two_vacuous")) for r in at)
        out.append({
            "probe_set": cond[0], "probe_seq_len": cond[1],
            "family": fam, "width": w, "point": point, "seeds": len({r["seed"] for r in at}),
            "d_align": _mean([r.get("two_d_align") for r in at]), "vacuous": f"{n_vac}/{len(at)}",
            "d_align_1pop": _mean([r.get("one_d_align") for r in at]),
            "M,K": f"{mk[0]},{mk[1]}", "misalign": _mean([r.get("misalignment") for r in at]),
            "B_exact": _mean([r.get("two_b_exact") for r in at]),
            "B_align": _mean([r.get("two_b_align") for r in at]),
            "test_loss": _mean([r.get("test_loss") for r in at]),
        })
    return out


def print_summary(rows: Sequence[Mapping[str, Any]], out_dir: Path, file=None) -> None:
    file = file or sys.stdout
    table = summary_rows(rows)
    cols = ["family", "width", "point", "seeds", "d_align", "vacuous", "d_align_1pop", "M,K", "misalign",
            "B_exact", "B_align", "test_loss"]
    conds = list(dict.fromkeys((r["probe_set"], r["probe_seq_len"]) for r in table)) or [(None, None)]
    for i, (name, L) in enumerate(conds):
        sel = [r for r in table if (r["probe_set"], r["probe_seq_len"]) == (name, L)]
        where = "" if name is None and L is None else \
            f", probe {name}" + (f" (length {L})" if L is not None else "")
        print(("\n" if i else "") + format_table(
            sel, cols, title=f"alignment sweep{where}: two-population form, mean over seeds"), file=file)
    if any(not r["vacuous"].startswith("0/") for r in table):
        print("vacuous: seeds whose certificate is vacuous (an estimate <= 0): their d_align = min(d_par, d_2) is "
              "undefined and left out of the mean; '-' when every seed is vacuous", file=file)
    print(f"\nresults: {out_dir / 'results.jsonl'}  (pandas.read_json(path, lines=True))", file=file)
    print(f"report:  widthscope report {out_dir}", file=file)
