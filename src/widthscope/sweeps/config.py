"""Reading and checking a sweep config: :func:`load_config` turns a TOML file (or a parsed dict)
into a :class:`~widthscope.sweeps.schema.SweepConfig`, every key checked before any cell runs.

A bad key names itself, the valid choices and, for a near miss, the key meant; the checks of the
``train``, ``certify``, ``monitor`` and ``probes`` tables of each ``[[family]]`` are here too, as is
:func:`monitor_steps` (the optimizer steps a monitor probes). Model structure (insertion points,
widths a model cannot take) is checked by :func:`widthscope.sweeps.alignment.check_structure`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .. import data as wdata
from .._io import first_nonfinite, read_toml
from ..errors import WidthscopeError
from ..models import FAMILIES
from ..options import INTERVENTIONS, CertifyOptions
from ..train import LOSSES
from .placement import check_placement
from .schema import (
    CERTIFY_KEYS,
    ESTIMATORS,
    EXAMPLE_FAMILY,
    FAMILY_KEYS,
    LM_DATASETS,
    MONITOR_KEYS,
    OPTIMIZERS,
    POOLS,
    PROBE_KEYS,
    SCHEDULES,
    SHIFTS,
    SWEEP_CERTIFY,
    SWEEP_CERTIFY_KEYS,
    SWEEP_KEYS,
    TRAIN_KEYS,
    FamilySpec,
    SweepConfig,
)

__all__ = ["load_config", "monitor_steps", "certify_options"]


# ----------------------------------------------------------------------------- validation
def config_where(ctx: str) -> str:
    return f"sweep config {ctx}"


def check_keys(table: Mapping[str, Any], valid: Sequence[str], ctx: str) -> None:
    unknown = [k for k in table if k not in valid]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, list(valid), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise WidthscopeError(f"{config_where(ctx)}: unknown key(s) {', '.join(hints)}; valid keys: {', '.join(valid)}")


def config_int(v: Any, what: str, *, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise WidthscopeError(f"{what} must be a whole number >= {minimum} (got {v!r})")
    return int(v)


def _int_list(v: Any, what: str, *, minimum: int = 1) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v:
        raise WidthscopeError(f"{what} must be a non-empty list of whole numbers (got {v!r})")
    return [config_int(x, f"{what} entries", minimum=minimum) for x in v]


def config_table(v: Any, what: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise WidthscopeError(
            f"{what} must be a table (e.g. {what.split()[-1]} = {{ key = value }}), got {type(v).__name__}"
        )
    return dict(v)


def certify_options(base: CertifyOptions, table: Mapping[str, Any], where: str) -> CertifyOptions:
    """``base`` with the certify options of a config table, validated by :class:`CertifyOptions`
    with its own message, the flag named as the config key (``where`` + key: ``--draws 0: ...``
    reads ``sweep config family 'mlp': certify.draws 0: ...``).

    A sweep cell pools per example and probes unprojected samples: ``pool = "token"`` and
    ``project`` are refused here, with the command that computes them on a cell's checkpoint."""
    known = {f.name for f in dataclasses.fields(CertifyOptions)}
    unknown = [k for k in table if k not in known]
    if unknown:  # the callers checked the keys; a programming error otherwise
        raise ValueError(f"not certify options: {unknown}")
    try:
        opts = base.replace(**table)
    except WidthscopeError as exc:
        msg = str(exc)
        for name in sorted(known, key=len, reverse=True):
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
    ctx = f"[[family]] #{index + 1}"
    if not isinstance(raw, Mapping):
        raise WidthscopeError(f"{config_where(ctx)}: each [[family]] must be a table")
    check_keys(raw, list(FAMILY_KEYS), ctx)
    for req in ("name", "widths", "dataset"):
        if req not in raw:
            raise WidthscopeError(f"{config_where(ctx)}: missing required key {req!r} ({FAMILY_KEYS[req]})")
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise WidthscopeError(f"{config_where(ctx)}: name must be a non-empty string")
    ctx = f"family {name!r}"
    widths = raw["widths"]
    if (
        not isinstance(widths, list)
        or not widths
        or any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in widths)
    ):
        raise WidthscopeError(f"{config_where(ctx)}: widths must be a non-empty list of numbers, got {widths!r}")
    if any(not (math.isfinite(w) and w > 0) for w in widths):
        raise WidthscopeError(f"{config_where(ctx)}: widths must be positive finite numbers, got {widths!r}")
    if any(b <= a for a, b in zip(widths, widths[1:])):
        raise WidthscopeError(
            f"{config_where(ctx)}: widths must be strictly increasing (sort them and drop duplicates), got {widths!r}"
        )
    train = config_table(raw.get("train"), f"{ctx} train")
    check_keys(train, TRAIN_KEYS, f"{ctx} [family.train]")
    for req in ("steps", "lr"):
        if req not in train:
            raise WidthscopeError(
                f"{config_where(ctx)}: train.{req} is required, e.g. train = {{ steps = 300, lr = 1e-3 }}"
            )
    _check_train(train, ctx)
    cert = config_table(raw.get("certify"), f"{ctx} certify")
    check_keys(cert, CERTIFY_KEYS, f"{ctx} [family.certify]")
    n_pa = config_int(cert.get("n_probe_train", 128), f"{config_where(ctx)} certify.n_probe_train", minimum=4)
    n_pb = config_int(cert.get("n_probe_test", 128), f"{config_where(ctx)} certify.n_probe_test", minimum=4)
    pbs = config_int(cert.get("batch_size", 32), f"{config_where(ctx)} certify.batch_size")
    points = cert.get("points")
    if points is not None and (not isinstance(points, list) or not all(isinstance(p, str) for p in points)):
        raise WidthscopeError(f"{config_where(ctx)}: certify.points must be a list of insertion-point names")
    options = certify_options(
        sweep_options, {k: v for k, v in cert.items() if k not in SWEEP_CERTIFY_KEYS}, f"{config_where(ctx)}: certify."
    )
    n_train = raw.get("n_train")
    if n_train is None and not sweep_budgets:
        raise WidthscopeError(f"{config_where(ctx)}: missing n_train (training examples), or give [sweep].budgets")
    if n_train is not None:
        n_train = config_int(n_train, f"{config_where(ctx)} n_train")
    for nt in ([n_train] if n_train is not None else []) + list(sweep_budgets or []):
        if nt < n_pa:
            raise WidthscopeError(
                f"{config_where(ctx)}: certify.n_probe_train={n_pa} exceeds the training set "
                f"size {nt}: probe samples are drawn from the fitted examples; lower "
                f"n_probe_train or raise n_train/budgets"
            )
    n_test = config_int(raw.get("n_test", n_pb), f"{config_where(ctx)} n_test")
    if n_test < n_pb:
        raise WidthscopeError(f"{config_where(ctx)}: certify.n_probe_test={n_pb} exceeds n_test={n_test}")
    model = raw.get("model", name)
    if not isinstance(model, str) or model not in FAMILIES:
        raise WidthscopeError(
            f"{config_where(ctx)}: model {model!r} is not a model family; valid: {', '.join(FAMILIES)} "
            f"(set model = ... when the family's name is not one)"
        )
    if not isinstance(raw["dataset"], str) or raw["dataset"] not in wdata.DATASETS:
        raise WidthscopeError(
            f"{config_where(ctx)}: dataset {raw['dataset']!r} unknown; valid: {', '.join(wdata.DATASETS)}"
        )
    if train.get("loss") == "mse" and raw["dataset"] in LM_DATASETS:
        raise WidthscopeError(
            f"{config_where(ctx)}: train.loss = 'mse' is for classification; {raw['dataset']!r} is "
            "language modelling: use 'auto'"
        )
    probes_raw = raw.get("probes")
    single = {k: raw[k] for k in ("probe_data", "probe_test_data", "probe_data_options") if k in raw}
    if single:
        if probes_raw is not None:
            raise WidthscopeError(f"{config_where(ctx)}: give probes = [...] or probe_data/probe_test_data, not both")
        probes_raw = [
            {
                "name": "probe",
                "data": single.get("probe_data", raw["dataset"]),
                **({"test_data": single["probe_test_data"]} if "probe_test_data" in single else {}),
                **({"data_options": single["probe_data_options"]} if "probe_data_options" in single else {}),
            }
        ]
    probes = _probes(probes_raw, raw["dataset"], ctx)
    lens = raw.get("probe_seq_len")
    if lens is not None:
        if (
            not isinstance(lens, list)
            or not lens
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 2 for v in lens)
        ):
            raise WidthscopeError(
                f"{config_where(ctx)}: probe_seq_len must be a non-empty list of whole numbers >= 2, got {lens!r}"
            )
        lens = list(dict.fromkeys(lens))
    return FamilySpec(
        probes=probes,
        probe_seq_len=lens,
        name=name,
        model=model,
        widths=[w if isinstance(w, int) else float(w) for w in widths],
        dataset=raw["dataset"],
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


def _number(train: Mapping[str, Any], key: str, ctx: str, *, low: float, strict: bool, also: str = "") -> None:
    v = train.get(key)
    if v is None:
        return
    ok = (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (v > low if strict else v >= low)
    )
    if not ok:
        raise WidthscopeError(
            f"{config_where(ctx)}: train.{key} must be a finite number {'>' if strict else '>='} {low:g}{also}, "
            f"got {v!r}"
        )


def _check_train(train: Mapping[str, Any], ctx: str) -> None:
    """Every option of ``widthscope.train.train`` a sweep passes, checked before any cell runs."""
    config_int(train["steps"], f"{config_where(ctx)} train.steps")
    _number(train, "lr", ctx, low=0, strict=True)
    _number(train, "warmup", ctx, low=0, strict=False, also=" (a fraction of steps when < 1, else a number of steps)")
    _number(train, "clip", ctx, low=0, strict=False, also=" (the gradient-norm cap; 0 = off)")
    _number(train, "weight_decay", ctx, low=0, strict=False)
    _number(train, "momentum", ctx, low=0, strict=False)
    for key in ("batch_size", "eval_batch_size", "train_eval_examples"):
        if key in train:
            config_int(train[key], f"{config_where(ctx)} train.{key}")
    for key, valid in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("loss", LOSSES)):
        if key in train and train[key] not in valid:
            raise WidthscopeError(f"{config_where(ctx)}: train.{key} {train[key]!r} unknown; valid: {', '.join(valid)}")


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


def _monitor(
    raw: Any, fam: FamilySpec, MK: Sequence[tuple[int, int]], budgets: Sequence[int] | None
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
    where = f"{config_where(ctx)}: monitor"
    mon = config_table(raw, f"{ctx} monitor")
    check_keys(mon, MONITOR_KEYS, f"{ctx} [family.monitor]")
    steps = int(fam.train["steps"])
    every = mon.get("every", "log")
    if "at" in mon and ("every" in mon or "count" in mon):
        raise WidthscopeError(f"{where}: give at = [steps] or every/count, not both")
    if every != "log" and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise WidthscopeError(
            f'{where}.every must be a whole number of optimizer steps >= 1 or "log" (log-spaced), got {every!r}'
        )
    count = config_int(mon.get("count", 6), f"{where}.count (the number of log-spaced probes)", minimum=2)
    if "count" in mon and every != "log":
        raise WidthscopeError(
            f'{where}.count sets the number of log-spaced probes: it goes with every = "log", not every = {every!r}'
        )
    at = mon.get("at")
    if at is not None:
        if (
            not isinstance(at, list)
            or not at
            or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= steps for v in at)
        ):
            raise WidthscopeError(
                f"{where}.at must be a non-empty list of optimizer steps 0..{steps} (train.steps), got {at!r}"
            )
    points = mon.get("points")
    if points is not None and (not isinstance(points, list) or not all(isinstance(p, str) for p in points)):
        raise WidthscopeError(f"{where}.points must be a list of insertion-point names, got {points!r}")
    n_tr = config_int(mon.get("n_train", fam.n_probe_train), f"{where}.n_train (train-pool size)", minimum=4)
    n_te = config_int(mon.get("n_test", fam.n_probe_test), f"{where}.n_test (held-out-pool size)", minimum=4)
    # the training-set sizes of the cells: [sweep].budgets, else n_train (which _family required then)
    sizes = list(budgets) if budgets else [fam.n_train] if fam.n_train is not None else []
    for nt in sizes:
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
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise WidthscopeError(
                f"{where}.seq_len must be a whole number >= 2 (a probe length in tokens), got {seq_len!r}"
            )
        if fam.dataset not in LM_DATASETS:
            raise WidthscopeError(f"{where}.seq_len is a text probe length; {fam.dataset!r} is not text: omit it")
    delta = mon.get("delta", 0.05)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < float(delta) < 1.0:
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
    if not isinstance(raw, list) or not raw or not all(isinstance(c, Mapping) for c in raw):
        raise WidthscopeError(
            f"{config_where(ctx)}: probes must be a list of tables, e.g. "
            "[{name = 'in-domain'}, {name = 'shifted', data = 'prose'}]"
        )
    out, names = [], set()

    for c in raw:
        check_keys(c, list(PROBE_KEYS), f"{ctx} probes")
        name = c.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise WidthscopeError(f"{config_where(ctx)}: every probe condition needs a unique name, got {name!r}")
        names.add(name)
        for key in ("data", "test_data"):
            v = c.get(key)
            if v is not None and (not isinstance(v, str) or v not in wdata.DATASETS):
                raise WidthscopeError(
                    f"{config_where(ctx)}: probes {name!r} {key} must be a dataset name "
                    f"({', '.join(wdata.DATASETS)}), got {v!r}"
                )
        shift = c.get("shift")
        if shift is not None:
            parse_shift(shift, f"{config_where(ctx)}: probes {name!r}")
        lens = c.get("seq_len")
        if isinstance(lens, int) and not isinstance(lens, bool):
            lens = [lens]
        if lens is not None and (
            not isinstance(lens, list)
            or not lens
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 2 for v in lens)
        ):
            raise WidthscopeError(
                f"{config_where(ctx)}: probes {name!r} seq_len must be a whole number >= 2 or a list of them, "
                f"got {lens!r}"
            )
        if (c.get("data") or dataset) == dataset and c.get("data_options"):
            raise WidthscopeError(
                f"{config_where(ctx)}: probes {name!r} reads the training dataset {dataset!r}: it takes "
                "no data_options (another cut of the training corpus would put trained-on text in "
                "the held-out pool); use seq_len for other probe lengths"
            )
        out.append(
            {
                "name": name,
                "data": c.get("data") or dataset,
                "test_data": c.get("test_data"),
                "data_options": config_table(c.get("data_options"), f"{ctx} probes {name!r} data_options"),
                "shift": shift,
                "seq_len": lens,
            }
        )
    return out


def parse_shift(shift: Any, where: str) -> tuple[str, Any]:
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


def _sweep_certify(sw: Mapping[str, Any]) -> CertifyOptions:
    """[sweep]'s statistics keys (M, K, paired, draws, estimator, pool, interventions, etas) as
    :class:`CertifyOptions`: the base of every family's certify options."""
    Ms = _int_list(sw.get("M", [16, 32]), "[sweep] M", minimum=2)
    Ks = _int_list(sw["K"], "[sweep] K", minimum=2) if "K" in sw else list(Ms)
    paired = sw.get("paired", True)
    if not isinstance(paired, bool):
        raise WidthscopeError("[sweep] paired must be true or false")
    if paired:
        if len(Ks) != len(Ms):
            raise WidthscopeError(
                f"[sweep] paired = true needs M and K of equal length (got {len(Ms)} and "
                f"{len(Ks)}); set paired = false for every M with every K"
            )
        MK = list(zip(Ms, Ks))
    else:
        MK = [(m, k) for m in Ms for k in Ks]
    draws = config_int(sw.get("draws", 1000), "[sweep] draws")
    estimator = sw.get("estimator", "unbiased")
    if estimator not in ESTIMATORS:
        raise WidthscopeError(f"[sweep] estimator {estimator!r} unknown; valid: {', '.join(ESTIMATORS)}")
    pool = sw.get("pool", "sum")
    if pool not in POOLS:
        raise WidthscopeError(f"[sweep] pool {pool!r} unknown; valid: {', '.join(POOLS)}")
    interventions = sw.get("interventions", "bias")
    if interventions not in INTERVENTIONS:
        raise WidthscopeError(f"[sweep] interventions {interventions!r} unknown; valid: {', '.join(INTERVENTIONS)}")
    etas = sw.get("etas")
    if etas is not None:
        if (
            not isinstance(etas, list)
            or not etas
            or not all(
                isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e) and e > 0 for e in etas
            )
        ):
            raise WidthscopeError(f"[sweep] etas must be a non-empty list of positive finite numbers, got {etas!r}")
        etas = [float(e) for e in etas]
    Ms_, Ks_ = tuple(m for m, _ in MK), tuple(k for _, k in MK)
    table = {"M": Ms_, "K": None if Ks_ == Ms_ else Ks_, "draws": draws, "estimator": estimator, "pool": pool}
    table.update(interventions=interventions, etas=tuple(etas) if etas is not None else None)
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
    sw = config_table(raw.get("sweep"), "[sweep]")
    check_keys(sw, list(SWEEP_KEYS), "[sweep]")
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
        out_dir=str(out),
        families=families,
        seeds=seeds,
        certify=options,
        budgets=budgets,
        data_seed=data_seed,
        device=device,
        threads=threads,
        placement=placement,
    )
