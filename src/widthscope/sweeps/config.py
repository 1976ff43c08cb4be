"""A sweep config: its keys, :func:`load_config` (TOML or parsed dict -> :class:`SweepConfig`, every
bad key named with the valid choices) and the row columns other code reads."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .. import data as wdata
from .._io import first_nonfinite, read_toml, to_jsonable
from ..errors import WidthscopeError
from ..models import FAMILIES
from ..options import ESTIMATORS, INTERVENTIONS, CertifyOptions
from ..train import LOSSES
from .placement import PLACEMENT_KEYS, check_placement

__all__ = [
    "CERT_FIELDS",
    "TIMING_COLUMNS",
    "MONITOR_TIMING_COLUMNS",
    "MONITOR_SUMMARY",
    "LM_DATASETS",
    "FamilySpec",
    "SweepConfig",
    "load_config",
    "monitor_steps",
    "certify_options",
]

# Fields of widthscope.stats.Certificate copied into each row, prefixed "one_" / "two_".
CERT_FIELDS = ("expectation", "variance", "d_par", "d_2", "d_align", "n_eff", "b_exact", "b_align", "vacuous", "reason")
# Columns that measure time and therefore differ between otherwise identical runs.
TIMING_COLUMNS = ("train_s", "probe_s", "stats_s", "intervene_s", "cell_seconds")
MONITOR_TIMING_COLUMNS = ("monitor_s", "monitor_probe_s", "monitor_stats_s")  # of monitored cells only
# Columns a monitored cell adds to its alignment rows (per point; docs/monitor.md §8).
MONITOR_SUMMARY = tuple(
    f"monitor_{k}"
    for k in "point first_cert_step first_cert_b_exact cert_from_step delta M K steps_total steps n_train n_test "
    "probe probe_seq_len".split()
)

SWEEP_KEYS = (
    *"name out_dir seeds M K paired draws estimator pool budgets data_seed device threads interventions etas".split(),
    *PLACEMENT_KEYS,
)
FAMILY_KEYS = (
    *"name model widths model_options dataset data_options n_train n_test train certify monitor probes".split(),
    *"probe_seq_len probe_data probe_test_data probe_data_options".split(),
    *PLACEMENT_KEYS,
)
# The required [[family]] keys, as their missing-key message describes them.
_REQUIRED = {
    "name": "label of this family in results (required)",
    "widths": "positive, strictly increasing list of widths (required)",
    "dataset": "dataset name for widthscope.data.load (required), e.g. digits, text, fashion-mnist",
}
PROBE_KEYS = ("name", "data", "test_data", "data_options", "shift", "seq_len")
SHIFTS = ("noise:SIGMA", "contrast:FACTOR", "blur", "classes:A,B,...")
TRAIN_KEYS = (
    *"steps lr optimizer batch_size warmup clip weight_decay schedule momentum loss".split(),
    *"eval_batch_size train_eval_examples".split(),
)
# The [family.certify] keys: the sweep's own (probe pool sizes and batch) and every CertifyOptions field.
SWEEP_CERTIFY_KEYS = ("n_probe_train", "n_probe_test", "batch_size")
CERTIFY_KEYS = SWEEP_CERTIFY_KEYS + tuple(f.name for f in dataclasses.fields(CertifyOptions))
MONITOR_KEYS = ("every", "count", "at", "points", "n_train", "n_test", "M", "K", "delta", "probe", "seq_len")
OPTIMIZERS = ("adamw", "sgd")  # widthscope.train.train
LM_DATASETS = ("text", "prose")  # byte-level language modelling; every other dataset is classification
SCHEDULES = ("cosine", "constant")
EXAMPLE_FAMILY = (
    '[[family]] name = "mlp", widths = [32, 64], dataset = "digits", n_train = 512, train = { steps = 300, lr = 1e-3 }'
)
POOLS = ("sum", "mean", "flatten")  # CertifyOptions' pools but "token": a sweep cell pools per example
# CertifyOptions' defaults but M = (16, 32) and the sweeps' intervention grid (nine half-decades up to
# the activation's own size).
SWEEP_CERTIFY = CertifyOptions(M=(16, 32), n_etas=9, max_rel_step=1.0)
SWEEP_DICT = SWEEP_CERTIFY.to_dict()
# CertifyOptions fields the recorded layout of a sweep holds already (M, K as its MK pairs)
_LEGACY_SWEEP = ("M", "K", "draws", "estimator", "pool", "interventions", "etas", "points")


@dataclass
class FamilySpec:
    """One validated ``[[family]]`` entry of a sweep config."""

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
    certify: CertifyOptions = SWEEP_CERTIFY  # the family's statistics (frozen, so a shared default is safe)
    probes: list[dict[str, Any]] | None = None
    probe_seq_len: list[int] | None = None
    monitor: dict[str, Any] | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # [sweep]'s device_map/max_memory/offload_folder + its own

    @property
    def points(self) -> list[str] | None:
        """``certify.points`` as the config gave them (None: not given; ``[]`` means the defaults too)."""
        return None if self.certify.points is None else list(self.certify.points)

    def to_dict(self) -> dict[str, Any]:
        """The family as ``sweep.json`` records it (``points`` for the certify options; ``placement`` where set)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "certify"}
        d["points"] = self.points
        if not self.placement:
            d.pop("placement")
        return to_jsonable(d)


@dataclass
class SweepConfig:
    """A validated sweep config: the ``[sweep]`` table and its families."""

    name: str
    out_dir: str
    families: list[FamilySpec]
    seeds: list[int] = field(default_factory=lambda: [0])
    certify: CertifyOptions = SWEEP_CERTIFY  # [sweep]'s statistics: the base of every family's
    budgets: list[int] | None = None
    data_seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # [sweep]'s device_map/max_memory/offload_folder

    @property
    def MK(self) -> list[tuple[int, int]]:
        return self.certify.pairs

    @property
    def draws(self) -> int:
        return self.certify.draws

    def family(self, name: str) -> FamilySpec:
        return next(f for f in self.families if f.name == name)

    def to_dict(self) -> dict[str, Any]:
        """The config as ``sweep.json`` records it (the families' certify options: :meth:`options_record`)."""
        c = self.certify
        return to_jsonable(
            ({"placement": dict(self.placement)} if self.placement else {})
            | {k: getattr(self, k) for k in ("name", "out_dir", "seeds", "budgets", "data_seed", "device", "threads")}
            | {k: getattr(c, k) for k in ("draws", "estimator", "pool", "interventions", "etas")}
            | {"families": [f.to_dict() for f in self.families], "MK": [list(mk) for mk in self.MK]}
        )

    def certify_changes(self, fam: FamilySpec) -> dict[str, Any]:
        """The certify options of ``fam`` that differ from what [sweep]'s keys and its ``points`` give."""
        implied = self.certify.replace(points=fam.certify.points).to_dict()
        return {k: v for k, v in fam.certify.to_dict().items() if implied[k] != v}

    def options_record(self) -> dict[str, Any]:
        """``sweep.json``'s ``options``: the certify options of [sweep] and of each family."""
        return {"sweep": self.certify.to_dict(), "families": {f.name: f.certify.to_dict() for f in self.families}}

    def fingerprint(self) -> str:
        """Hash of everything that determines results (not where they go, nor the placement); certify
        options enter only where they differ from the defaults (``certify_changes``)."""
        d = self.to_dict()
        for key in ("placement", "out_dir", "device", "threads"):
            d.pop(key, None)
        for fam, fd in zip(self.families, d["families"]):
            fd.pop("placement", None)
            for key in ("probes", "probe_seq_len", "monitor"):
                if fd[key] is None:
                    del fd[key]
            if changes := self.certify_changes(fam):
                fd["certify_changes"] = changes
        if extra := {k: v for k, v in self.certify.to_dict().items() if k not in _LEGACY_SWEEP and SWEEP_DICT[k] != v}:
            d["certify_changes"] = extra
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- validation
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any, lo: float = -math.inf) -> bool:
    """``v`` is a finite number (not a bool) of at least ``lo``."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= lo


def _ints(v: Any, lo: int, hi: int | None = None) -> bool:
    """``v`` is a non-empty list of whole numbers in ``lo..hi``."""
    return isinstance(v, list) and bool(v) and all(_is_int(x) and lo <= x <= (x if hi is None else hi) for x in v)


def check_keys(table: Mapping[str, Any], valid: Sequence[str], ctx: str) -> None:
    if unknown := [k for k in table if k not in valid]:
        close = {k: difflib.get_close_matches(k, list(valid), n=1) for k in unknown}
        hints = [f"{k!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items()]
        raise WidthscopeError(f"sweep config {ctx}: unknown key(s) {', '.join(hints)}; valid keys: {', '.join(valid)}")


def config_int(v: Any, what: str, *, minimum: int = 1) -> int:
    if not _is_int(v) or v < minimum:
        raise WidthscopeError(f"{what} must be a whole number >= {minimum} (got {v!r})")
    return int(v)


def _int_list(v: Any, what: str, *, minimum: int = 1) -> list[int]:
    if _is_int(v):
        v = [v]
    if not isinstance(v, list) or not v:
        raise WidthscopeError(f"{what} must be a non-empty list of whole numbers (got {v!r})")
    return [config_int(x, f"{what} entries", minimum=minimum) for x in v]


def config_table(v: Any, what: str, valid: Sequence[str] | None = None, ctx: str | None = None) -> dict[str, Any]:
    """A config table (None: empty), its keys checked against ``valid`` when given (named as ``ctx``)."""
    if v is not None and not isinstance(v, Mapping):
        raise WidthscopeError(
            f"{what} must be a table (e.g. {what.split()[-1]} = {{ key = value }}), got {type(v).__name__}"
        )
    if v is not None and valid is not None:
        check_keys(v, valid, ctx or what)
    return dict(v or {})


def certify_options(base: CertifyOptions, table: Mapping[str, Any], where: str) -> CertifyOptions:
    """``base`` with a config table's certify options, checked, messages naming ``where`` + key; refuses
    ``pool = "token"`` and ``project`` (a sweep cell pools per example and keeps samples whole)."""
    try:
        opts = base.replace(**table)
    except WidthscopeError as exc:
        msg = str(exc)
        for name in sorted((f.name for f in dataclasses.fields(CertifyOptions)), key=len, reverse=True):
            msg = msg.replace(CertifyOptions.flag(name), name)
        raise (type(exc))(f"{where}{msg}") from None
    except TypeError as exc:  # a TOML value of a type the dataclass cannot take at all
        raise WidthscopeError(f"{where} {exc}") from None
    if opts.pool == "token":
        raise WidthscopeError(
            f"{where}pool 'token': a sweep cell pools each example to one sample vector (sum, mean, flatten); "
            "certify a cell's checkpoint with `widthscope certify --pool token` (its inputs: "
            "artifacts/<cell>/input_spec.json)"
        )
    if opts.project is not None:
        raise WidthscopeError(
            f"{where}project: a sweep cell keeps its probe samples whole; drop project, or certify a cell's "
            "checkpoint with `widthscope certify --project K`"
        )
    return opts


def _family(raw: Any, index: int, sweep_budgets: list[int] | None, sweep_options: CertifyOptions) -> FamilySpec:
    where = f"sweep config [[family]] #{index + 1}"
    if not isinstance(raw, Mapping):
        raise WidthscopeError(f"{where}: each [[family]] must be a table")
    check_keys(raw, FAMILY_KEYS, f"[[family]] #{index + 1}")
    for req, what in _REQUIRED.items():
        if req not in raw:
            raise WidthscopeError(f"{where}: missing required key {req!r} ({what})")
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise WidthscopeError(f"{where}: name must be a non-empty string")
    ctx = f"family {name!r}"
    where = f"sweep config {ctx}"
    widths = raw["widths"]
    if not isinstance(widths, list) or not widths or not all(_number(w) or isinstance(w, float) for w in widths):
        raise WidthscopeError(f"{where}: widths must be a non-empty list of numbers, got {widths!r}")
    if any(not (math.isfinite(w) and w > 0) for w in widths):
        raise WidthscopeError(f"{where}: widths must be positive finite numbers, got {widths!r}")
    if any(b <= a for a, b in zip(widths, widths[1:])):
        raise WidthscopeError(
            f"{where}: widths must be strictly increasing (sort them and drop duplicates), got {widths!r}"
        )
    train = config_table(raw.get("train"), f"{ctx} train", TRAIN_KEYS, f"{ctx} [family.train]")
    _check_train(train, where)
    cert = config_table(raw.get("certify"), f"{ctx} certify", CERTIFY_KEYS, f"{ctx} [family.certify]")
    n_pa = config_int(cert.get("n_probe_train", 128), f"{where} certify.n_probe_train", minimum=4)
    n_pb = config_int(cert.get("n_probe_test", 128), f"{where} certify.n_probe_test", minimum=4)
    pbs = config_int(cert.get("batch_size", 32), f"{where} certify.batch_size")
    points = cert.get("points")
    if points is not None and (not isinstance(points, list) or not all(isinstance(p, str) for p in points)):
        raise WidthscopeError(f"{where}: certify.points must be a list of insertion-point names")
    options = certify_options(
        sweep_options, {k: v for k, v in cert.items() if k not in SWEEP_CERTIFY_KEYS}, f"{where}: certify."
    )
    n_train = raw.get("n_train")
    if n_train is None and not sweep_budgets:
        raise WidthscopeError(f"{where}: missing n_train (training examples), or give [sweep].budgets")
    n_train = None if n_train is None else config_int(n_train, f"{where} n_train")
    for nt in [n for n in (n_train, *(sweep_budgets or ())) if n is not None]:
        if nt < n_pa:
            raise WidthscopeError(
                f"{where}: certify.n_probe_train={n_pa} exceeds the training set "
                f"size {nt}: probe samples are drawn from the fitted examples; lower "
                f"n_probe_train or raise n_train/budgets"
            )
    n_test = config_int(raw.get("n_test", n_pb), f"{where} n_test")
    if n_test < n_pb:
        raise WidthscopeError(f"{where}: certify.n_probe_test={n_pb} exceeds n_test={n_test}")
    model = raw.get("model", name)
    if not isinstance(model, str) or model not in FAMILIES:
        raise WidthscopeError(
            f"{where}: model {model!r} is not a model family; valid: {', '.join(FAMILIES)} "
            f"(set model = ... when the family's name is not one)"
        )
    dataset = raw["dataset"]
    if not isinstance(dataset, str) or dataset not in wdata.DATASETS:
        raise WidthscopeError(f"{where}: dataset {dataset!r} unknown; valid: {', '.join(wdata.DATASETS)}")
    if train.get("loss") == "mse" and dataset in LM_DATASETS:
        raise WidthscopeError(
            f"{where}: train.loss = 'mse' is for classification; {dataset!r} is language modelling: use 'auto'"
        )
    probes_raw = raw.get("probes")
    if any(k in raw for k in ("probe_data", "probe_test_data", "probe_data_options")):
        if probes_raw is not None:
            raise WidthscopeError(f"{where}: give probes = [...] or probe_data/probe_test_data, not both")
        one = {"name": "probe", "data": raw.get("probe_data", dataset)}
        for key, to in (("probe_test_data", "test_data"), ("probe_data_options", "data_options")):
            if key in raw:
                one[to] = raw[key]
        probes_raw = [one]
    probes = _probes(probes_raw, dataset, ctx)
    lens = raw.get("probe_seq_len")
    if lens is not None and not _ints(lens, 2):
        raise WidthscopeError(f"{where}: probe_seq_len must be a non-empty list of whole numbers >= 2, got {lens!r}")
    return FamilySpec(
        probes=probes,
        probe_seq_len=None if lens is None else list(dict.fromkeys(lens)),
        name=name,
        model=model,
        widths=[w if isinstance(w, int) else float(w) for w in widths],
        dataset=dataset,
        n_train=n_train,
        n_test=n_test,
        model_options=config_table(raw.get("model_options"), f"{ctx} model_options"),
        data_options=config_table(raw.get("data_options"), f"{ctx} data_options"),
        train=train,
        n_probe_train=n_pa,
        n_probe_test=n_pb,
        probe_batch_size=pbs,
        certify=options,
    )


def _check_train(train: Mapping[str, Any], where: str) -> None:
    """Every option of ``widthscope.train.train`` a sweep passes, checked before any cell runs."""
    for req in ("steps", "lr"):
        if req not in train:
            raise WidthscopeError(f"{where}: train.{req} is required, e.g. train = {{ steps = 300, lr = 1e-3 }}")
    config_int(train["steps"], f"{where} train.steps")
    numbers = (
        ("lr", True, ""),
        ("warmup", False, " (a fraction of steps when < 1, else a number of steps)"),
        ("clip", False, " (the gradient-norm cap; 0 = off)"),
        ("weight_decay", False, ""),
        ("momentum", False, ""),
    )
    for key, strict, also in numbers:
        v = train.get(key)
        if v is not None and not (_number(v, 0) and (v > 0 or not strict)):
            raise WidthscopeError(
                f"{where}: train.{key} must be a finite number {'>' if strict else '>='} 0{also}, got {v!r}"
            )
    for key in ("batch_size", "eval_batch_size", "train_eval_examples"):
        if key in train:
            config_int(train[key], f"{where} train.{key}")
    for key, valid in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("loss", LOSSES)):
        if key in train and train[key] not in valid:
            raise WidthscopeError(f"{where}: train.{key} {train[key]!r} unknown; valid: {', '.join(valid)}")


def monitor_steps(steps: int, every: int | str = "log", count: int = 6, at: Sequence[int] | None = None) -> list[int]:
    """The optimizer steps a sweep's monitor probes (0 = before the first step; ``steps`` = the trained model).

    ``at``: exactly those. ``every = N``: ``0, N, 2N, ...`` and ``steps``. ``every = "log"``: ``0`` and
    ``count - 1`` log-spaced steps ``round(steps^(k/(count-2)))``, ``k = 0..count-2`` (repeats merged).

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


def _monitor(
    raw: Any, fam: FamilySpec, MK: Sequence[tuple[int, int]], budgets: Sequence[int] | None
) -> dict[str, Any] | None:
    """The validated ``monitor`` table of one family (None: no monitor) with every default filled
    in: ``steps`` (the probed optimizer steps), ``points``, pool sizes ``n_train``/``n_test``
    (default: certify's), ``M``/``K`` (default: the largest sweep pair that fits the pools),
    ``delta``, ``probe`` (a name of the family's ``probes``; None: in-domain) and ``seq_len``."""
    if raw is None:
        return None
    ctx = f"family {fam.name!r}"
    where = f"sweep config {ctx}: monitor"
    mon = config_table(raw, f"{ctx} monitor", MONITOR_KEYS, f"{ctx} [family.monitor]")
    steps = int(fam.train["steps"])
    every = mon.get("every", "log")
    if "at" in mon and ("every" in mon or "count" in mon):
        raise WidthscopeError(f"{where}: give at = [steps] or every/count, not both")
    if every != "log" and (not _is_int(every) or every < 1):
        raise WidthscopeError(
            f'{where}.every must be a whole number of optimizer steps >= 1 or "log" (log-spaced), got {every!r}'
        )
    count = config_int(mon.get("count", 6), f"{where}.count (the number of log-spaced probes)", minimum=2)
    if "count" in mon and every != "log":
        raise WidthscopeError(
            f'{where}.count sets the number of log-spaced probes: it goes with every = "log", not every = {every!r}'
        )
    at = mon.get("at")
    if at is not None and not _ints(at, 0, steps):
        raise WidthscopeError(
            f"{where}.at must be a non-empty list of optimizer steps 0..{steps} (train.steps), got {at!r}"
        )
    points = mon.get("points")
    if points is not None and (not isinstance(points, list) or not all(isinstance(p, str) for p in points)):
        raise WidthscopeError(f"{where}.points must be a list of insertion-point names, got {points!r}")
    n_tr = config_int(mon.get("n_train", fam.n_probe_train), f"{where}.n_train (train-pool size)", minimum=4)
    n_te = config_int(mon.get("n_test", fam.n_probe_test), f"{where}.n_test (held-out-pool size)", minimum=4)
    # the training-set sizes of the cells: [sweep].budgets, else n_train (which _family required then)
    for nt in list(budgets) if budgets else [fam.n_train] if fam.n_train is not None else []:
        if n_tr > nt:
            raise WidthscopeError(
                f"{where}.n_train={n_tr} exceeds the training set size {nt}: the pool is drawn "
                "from the fitted examples; lower monitor.n_train"
            )
    if n_te > fam.n_test:
        raise WidthscopeError(f"{where}.n_test={n_te} exceeds n_test={fam.n_test}: lower monitor.n_test")
    if "M" in mon or "K" in mon:
        M = config_int(mon.get("M", mon.get("K")), f"{where}.M", minimum=2)
        K = config_int(mon.get("K", M), f"{where}.K", minimum=2)
    else:
        fits = [(m, k) for m, k in MK if m <= n_tr and k <= n_te]
        if not fits:
            raise WidthscopeError(
                f"{where}: the pools ({n_tr} train, {n_te} held-out) are smaller than every "
                f"(M, K) of the sweep {list(MK)}; raise monitor.n_train/n_test or set monitor.M"
            )
        M, K = max(fits, key=lambda t: (t[0] * t[1], t))
    if M > n_tr or K > n_te:
        raise WidthscopeError(
            f"{where}: (M, K) = ({M}, {K}) needs at least {M} train and {K} held-out examples, "
            f"but the pools have n_train={n_tr}, n_test={n_te}; raise those or lower monitor.M/K"
        )
    cond = mon.get("probe")
    names = [c["name"] for c in fam.probes or []]
    if cond is not None and cond not in names:
        raise WidthscopeError(
            f"{where}.probe {cond!r} is not one of the family's probes "
            f"({', '.join(map(repr, names)) or 'it has none: give probes = [...] or omit probe'})"
        )
    seq_len = mon.get("seq_len")
    if seq_len is not None and (not _is_int(seq_len) or seq_len < 2):
        raise WidthscopeError(
            f"{where}.seq_len must be a whole number >= 2 (a probe length in tokens), got {seq_len!r}"
        )
    if seq_len is not None and fam.dataset not in LM_DATASETS:
        raise WidthscopeError(f"{where}.seq_len is a text probe length; {fam.dataset!r} is not text: omit it")
    delta = mon.get("delta", 0.05)
    if not (_number(delta) and 0.0 < delta < 1.0):
        raise WidthscopeError(
            f"{where}.delta must be a probability in (0, 1) (the certified level of B_exact), got {delta!r}"
        )
    return {
        "every": None if at is not None else every,
        "count": count if every == "log" and at is None else None,
        "at": at,
        "steps": monitor_steps(steps, every, count, at),
        "points": list(points) if points else None,
        "n_train": n_tr,
        "n_test": n_te,
        "M": M,
        "K": K,
        "delta": float(delta),
        "probe": cond,
        "seq_len": seq_len,
    }


def _probes(raw: Any, dataset: str, ctx: str) -> list[dict[str, Any]] | None:
    """Validated probe conditions (None: the default single in-domain condition)."""
    if raw is None:
        return None
    where = f"sweep config {ctx}"
    if not isinstance(raw, list) or not raw or not all(isinstance(c, Mapping) for c in raw):
        raise WidthscopeError(
            f"{where}: probes must be a list of tables, e.g. "
            "[{name = 'in-domain'}, {name = 'shifted', data = 'prose'}]"
        )
    out: list[dict[str, Any]] = []
    for c in raw:
        check_keys(c, PROBE_KEYS, f"{ctx} probes")
        name = c.get("name")
        if not isinstance(name, str) or not name or name in [o["name"] for o in out]:
            raise WidthscopeError(f"{where}: every probe condition needs a unique name, got {name!r}")
        for key in ("data", "test_data"):
            v = c.get(key)
            if v is not None and (not isinstance(v, str) or v not in wdata.DATASETS):
                raise WidthscopeError(
                    f"{where}: probes {name!r} {key} must be a dataset name ({', '.join(wdata.DATASETS)}), got {v!r}"
                )
        shift = c.get("shift")
        if shift is not None:
            parse_shift(shift, f"{where}: probes {name!r}")
        lens = c.get("seq_len")
        if _is_int(lens):
            lens = [lens]
        if lens is not None and not _ints(lens, 2):
            raise WidthscopeError(
                f"{where}: probes {name!r} seq_len must be a whole number >= 2 or a list of them, got {lens!r}"
            )
        if (c.get("data") or dataset) == dataset and c.get("data_options"):
            raise WidthscopeError(
                f"{where}: probes {name!r} reads the training dataset {dataset!r}: it takes "
                "no data_options (another cut of the training corpus would put trained-on text in "
                "the held-out pool); use seq_len for other probe lengths"
            )
        out.append(dict({k: c.get(k) for k in PROBE_KEYS}, data=c.get("data") or dataset, seq_len=lens))
        out[-1]["data_options"] = config_table(c.get("data_options"), f"{ctx} probes {name!r} data_options")
    return out


def parse_shift(shift: Any, where: str) -> tuple[str, Any]:
    if not isinstance(shift, str):
        raise WidthscopeError(f"{where}: shift must be a string: one of {', '.join(SHIFTS)}")
    kind, _, arg = shift.partition(":")
    try:
        if kind in ("noise", "contrast") and math.isfinite(float(arg)) and float(arg) > 0:
            return kind, float(arg)
        if kind == "blur" and not arg:
            return kind, None
        if kind == "classes" and arg:
            return kind, [int(v) for v in arg.split(",")]
    except ValueError:
        pass
    raise WidthscopeError(f"{where}: unknown shift {shift!r}; choose one of {', '.join(SHIFTS)}")


def _sweep_certify(sw: Mapping[str, Any]) -> CertifyOptions:
    """[sweep]'s statistics keys as :class:`CertifyOptions`: the base of every family's."""
    Ms = _int_list(sw.get("M", [16, 32]), "[sweep] M", minimum=2)
    Ks = _int_list(sw["K"], "[sweep] K", minimum=2) if "K" in sw else list(Ms)
    paired = sw.get("paired", True)
    if not isinstance(paired, bool):
        raise WidthscopeError("[sweep] paired must be true or false")
    if paired and len(Ks) != len(Ms):
        raise WidthscopeError(
            f"[sweep] paired = true needs M and K of equal length (got {len(Ms)} and "
            f"{len(Ks)}); set paired = false for every M with every K"
        )
    MK = list(zip(Ms, Ks)) if paired else [(m, k) for m in Ms for k in Ks]
    draws = config_int(sw.get("draws", 1000), "[sweep] draws")
    table: dict[str, Any] = {}
    for key, default, valid in (
        ("estimator", "unbiased", ESTIMATORS),
        ("pool", "sum", POOLS),
        ("interventions", "bias", INTERVENTIONS),
    ):
        table[key] = sw.get(key, default)
        if table[key] not in valid:
            raise WidthscopeError(f"[sweep] {key} {table[key]!r} unknown; valid: {', '.join(valid)}")
    etas = sw.get("etas")
    if etas is not None:
        if not isinstance(etas, list) or not etas or not all(_number(e, 0) and e > 0 for e in etas):
            raise WidthscopeError(f"[sweep] etas must be a non-empty list of positive finite numbers, got {etas!r}")
        etas = tuple(float(e) for e in etas)
    Ms_, Ks_ = tuple(m for m, _ in MK), tuple(k for _, k in MK)
    table.update(M=Ms_, K=None if Ks_ == Ms_ else Ks_, draws=draws, etas=etas)
    return certify_options(SWEEP_CERTIFY, table, "sweep config [sweep]: ")


def load_config(
    source: str | os.PathLike | Mapping[str, Any], *, out_dir: str | os.PathLike | None = None
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
    check_keys(raw, ["sweep", "family"], "top level")
    sw = config_table(raw.get("sweep"), "[sweep]", SWEEP_KEYS)
    fams_raw = raw.get("family")
    if isinstance(fams_raw, Mapping):
        fams_raw = [fams_raw]
    if not fams_raw:
        raise WidthscopeError(
            f"{what} has no [[family]] entries{' (the file sets nothing)' if not raw else ''}; "
            f"add at least one, e.g. {EXAMPLE_FAMILY} (reference: docs/sweeps.md)"
        )
    name = sw.get("name", stem)
    if not isinstance(name, str) or not name:
        raise WidthscopeError("sweep config [sweep]: name must be a non-empty string")
    seeds = _int_list(sw.get("seeds", [0]), "[sweep] seeds", minimum=0)
    if len(set(seeds)) != len(seeds):
        raise WidthscopeError(f"[sweep] seeds has duplicates: {seeds}")
    budgets = _int_list(sw["budgets"], "[sweep] budgets") if "budgets" in sw else None
    data_seed = config_int(sw.get("data_seed", 0), "[sweep] data_seed", minimum=0)
    device = sw.get("device", "cpu")
    if not isinstance(device, str):
        raise WidthscopeError("[sweep] device must be a string such as 'cpu' or 'cuda'")
    try:
        meta = torch.device(device).type == "meta"
    except (RuntimeError, ValueError) as exc:
        raise WidthscopeError(
            f"[sweep] device {device!r} is not a torch device ({exc}); use e.g. cpu, cuda, cuda:1, mps"
        ) from None
    if meta:
        raise WidthscopeError("[sweep] device 'meta' holds no data and cannot train; use e.g. cpu, cuda")
    threads = config_int(sw["threads"], "[sweep] threads") if "threads" in sw else None
    options = _sweep_certify(sw)
    families = [_family(f, i, budgets, options) for i, f in enumerate(fams_raw)]
    placement = check_placement(sw, "sweep config [sweep]")
    for f, f_raw in zip(families, fams_raw):
        f.monitor = _monitor(f_raw.get("monitor"), f, f.certify.pairs, budgets)
        f.placement = check_placement(f_raw, f"sweep config family {f.name!r}", base=placement)
    names = [f.name for f in families]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise WidthscopeError(f"sweep config: family names must be unique; repeated: {', '.join(dup)}")
    for f in families:
        for m, k in f.certify.pairs:
            if m > f.n_probe_train or k > f.n_probe_test:
                raise WidthscopeError(
                    f"sweep config family {f.name!r}: (M, K) = ({m}, {k}) needs at least {m} train and {k} "
                    f"held-out probe samples, but certify has n_probe_train={f.n_probe_train}, "
                    f"n_probe_test={f.n_probe_test}; raise those or lower M/K"
                )
    bad = first_nonfinite(raw)  # a safety net for free-form tables (model_options, data_options)
    if bad:
        raise WidthscopeError(f"sweep config {bad}: must be a finite number (inf and nan are never meaningful here)")
    out = str(out_dir) if out_dir is not None else sw.get("out_dir", f"widthscope-results/{name}")
    if not isinstance(out, str) or not out:
        raise WidthscopeError("[sweep] out_dir must be a non-empty path string")
    return SweepConfig(
        name=name,
        out_dir=out,
        families=families,
        seeds=seeds,
        certify=options,
        budgets=budgets,
        data_seed=data_seed,
        device=device,
        threads=threads,
        placement=placement,
    )
