r"""The certify pipeline: :func:`certify_dict` certifies the insertion points of a model on
batches; :func:`run_certify` is a whole ``widthscope certify`` run from a :class:`CertifyJob`.

Under ``torchrun`` each rank probes a shard and rank 0 writes. Maths: docs/certify.md.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.certification import certify_dict
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
    >>> x, y = torch.randn(96, 6), torch.randint(0, 3, (96,))
    >>> tr = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    >>> te = [(x[64:], y[64:])]
    >>> res = certify_dict(net, tr, te, M=[8, 16], draws=200, progress=False)
    >>> [p["point"] for p in res["points"]]
    ['0', '1', '2', '3']
    >>> sorted(res["points"][0]["certificates"][0])
    ['K', 'M', 'misalignment', 'one', 'two']
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from .. import _args, _io, data, distributed, models
from .._io import LOCK, atomic_write_json, hold_lock, human_size, on_interrupt, to_jsonable
from ..data import describe_name
from ..data.inputs import load_model, placement_of, resolve
from ..data.spec import InputSpec, is_all
from ..errors import WidthscopeError
from ..models.hf import model_info
from ..options import ESTIMATORS, INTERVENTION_KINDS, INTERVENTIONS, POOLS, CertifyOptions, CertifyRunOptions
from ..probe import all_points, collect, insertion_points, resolve_points
from ..probe.batches import as_examples, batch_size_of, index_batch, to_batches
from ..probe.collect import EvalMode, float_dtype, to_device
from ..probe.offload import input_device
from ..probe.prefix import keep_prefix
from ..probe.resolution import sample_errors
from ..probe.steps import check_rel_step
from ..stats import vacuous_rule
from ..stats.sketch import Projector
from ..train import resolve_device, train
from ..validate import sizes_list
from .per_point import check_pool, precision_notes, ranking, statistics, tables
from .samples import save

__all__ = [
    "certify_dict",
    "settings_block",
    "data_description",
    "grid_notes",
    "count_examples",
    "gather_rows",
    "CertifyJob",
    "run_certify",
    "list_points",
    "training_record",
]


class _Default:
    """A keyword of :func:`certify_dict` left out: the value comes from ``options``."""

    def __repr__(self) -> str:
        return "<from options>"


_D: Any = _Default()
_FN = "certify"
# the checks of certify_dict's keywords (their values: CertifyOptions), before any work
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "points": lambda v: _args.points(_FN, "points", v),
    "M": lambda v: (_args.sizes(_FN, "M", v), sizes_list(v, "M")),
    "K": lambda v: (_args.sizes(_FN, "K", v, optional=True), v is None or sizes_list(v, "K")),
    "draws": lambda v: _args.integer(_FN, "draws", v, lo=1),
    "seed": lambda v: _args.integer(_FN, "seed", v),
    "estimator": lambda v: _args.choice(_FN, "estimator", v, ESTIMATORS),
    "pool": lambda v: _args.choice(_FN, "pool", v, POOLS),
    "train_mode": lambda v: _args.choice(_FN, "train_mode", v, ("eval", "keep")),
    "interventions": lambda v: _args.choice(_FN, "interventions", v, (None, *INTERVENTIONS)),
    "etas": lambda v: _args.numbers_list(_FN, "etas", v, accepts="a list of positive step sizes or None"),
    "n_etas": lambda v: _args.integer(_FN, "n_etas", v, lo=1),
    "max_rel_step": lambda v: check_rel_step(v, _FN),
    "project": lambda v: _args.integer(
        _FN, "project", v, lo=2, optional=True, accepts="an integer k >= 2 (projected dimension) or None"
    ),
    "draw_scheme": lambda v: _args.choice(_FN, "draw_scheme", v, ("shared", "per-pair")),
}


def certify_dict(
    model: nn.Module,
    train_batches: Iterable[Any],
    test_batches: Iterable[Any],
    *,
    options: CertifyOptions | None = None,
    points: str | Sequence[str] | None = _D,
    M: Sequence[int] | int = _D,
    K: Sequence[int] | int | None = _D,
    draws: int = _D,
    seed: int = _D,
    estimator: str = _D,
    pool: str = _D,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    train_mode: str = _D,
    progress: bool = True,
    interventions: str | None = _D,
    etas: Sequence[float] | None = _D,
    n_etas: int = _D,
    max_rel_step: float = _D,
    project: int | None = _D,
    samples_out: dict[str, Any] | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    draw_scheme: str = _D,
) -> dict[str, Any]:
    """Certify every insertion point of ``model``: the results file's dict (docs/certify.md).

    Keywords override ``options``; ``samples_out`` receives the pooled samples, ``on_point`` each finished row.
    """
    given = {k: v for k, v in locals().items() if k in _CHECKS and v is not _D}  # first: only the parameters
    if options is not None and not isinstance(options, CertifyOptions):
        raise _args.WidthscopeTypeError(
            f"certify(options=...): options must be a CertifyOptions, got {_args.describe(options)}"
        )
    _args.module(_FN, "model", model)
    _args.batches(_FN, "train_batches", train_batches)
    _args.batches(_FN, "test_batches", test_batches)
    for key, value in given.items():
        _CHECKS[key](value)
    _args.function(_FN, "loss_fn", loss_fn)
    _args.boolean(_FN, "progress", progress)
    _args.mapping(_FN, "samples_out", samples_out, mutable=True)
    _args.function(_FN, "on_point", on_point)
    run = _resolve(model, train_batches, test_batches, _options(options, given), loss_fn, progress)
    opts = run.opts
    t0 = time.perf_counter()
    qa, qb, projectors, kept = _probe(run)
    t1 = time.perf_counter()
    results, stat_notes, gathered = _statistics(run, qa, qb, projectors, samples_out)
    t2 = time.perf_counter()
    _interventions(run, qa, qb, kept, gathered, results, on_point)
    notes = list(dict.fromkeys(qa.notes + qb.notes)) + stat_notes
    if opts.etas is None:
        notes += grid_notes(results, opts.max_rel_step)
    return {
        "settings": settings_block(opts, run.names, world_size=run.W),
        "points": results,
        "ranking": ranking(results),
        "notes": notes + precision_notes(results),
        "timing": {"probe_s": t1 - t0, "stats_s": t2 - t1, "intervene_s": time.perf_counter() - t2},
        "options": {"certify": opts.to_dict()},  # what made it: CertifyOptions.from_dict repeats it
    }


@dataclasses.dataclass
class _Run:
    """One :func:`certify_dict` call's settings and batches, checked before any probing."""

    model: nn.Module
    opts: CertifyOptions
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    progress: bool
    names: list[str]
    train_list: list[Any]
    test_list: list[Any]
    W: int
    device: torch.device

    @property
    def m_max(self) -> int:
        return max(m for m, _ in self.opts.pairs)

    @property
    def k_max(self) -> int:
        return max(k for _, k in self.opts.pairs)


def _options(options: CertifyOptions | None, given: dict[str, Any]) -> CertifyOptions:
    """``options`` (default ``CertifyOptions()``) with the keywords given to :func:`certify_dict`."""
    if "interventions" in given and given["interventions"] is None:
        given["interventions"] = "none"
    for key in ("M", "K"):
        if isinstance(given.get(key), int) and not isinstance(given[key], bool):
            given[key] = (given[key],)
    if isinstance(given.get("points"), str):
        given["points"] = (given["points"],)
    base = options or CertifyOptions()
    return dataclasses.replace(base, **given) if given else base


def settings_block(opts: CertifyOptions, names: Sequence[str], *, world_size: int) -> dict[str, Any]:
    """The ``settings`` of a certify result (also of one assembled from resumed parts)."""
    pairs, grid = opts.pairs, opts.etas is None
    return {
        "M": [m for m, _ in pairs],
        "K": [k for _, k in pairs],
        **{k: getattr(opts, k) for k in ("draws", "seed", "estimator", "pool", "train_mode")},
        "points": list(names),
        "world_size": world_size,
        "interventions": opts.kind,
        "project": opts.project,
        "draw_scheme": opts.draw_scheme,
        "etas": None if opts.etas is None else [float(e) for e in opts.etas],
        "n_etas": opts.n_etas if grid else None,
        "max_rel_step": opts.max_rel_step if grid else None,
    }


def count_examples(batches: Sequence[Any]) -> int:
    return sum(int(batch_size_of(b)) for b in batches)


def gather_rows(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return distributed.all_gather_rows(x.to(device)).to("cpu") if distributed.is_distributed() else x


def _resolve(
    model: nn.Module,
    train_batches: Iterable[Any],
    test_batches: Iterable[Any],
    opts: CertifyOptions,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    progress: bool,
) -> _Run:
    """The points, the batch lists, the world size and the input device; the pools checked against them."""
    names = resolve_points(model, list(opts.points) if opts.points else None)
    train_list, test_list = list(train_batches), list(test_batches)
    W = distributed.world_size()
    for what, lst, flag in (("train", train_list, "n_train"), ("held-out", test_list, "n_test")):
        if len(lst) < W:
            raise WidthscopeError(
                f"{len(lst)} {what} batch(es) for {W} ranks: every rank needs one; lower the batch size or raise {flag}"
            )
    run = _Run(model, opts, loss_fn, progress, names, train_list, test_list, W, input_device(model))
    if opts.pool != "token":  # cheap early check, before any probing
        check_pool(count_examples(train_list), run.m_max, "train", "n_train", opts.pool)
        check_pool(count_examples(test_list), run.k_max, "held-out", "n_test", opts.pool)
    return run


def _probe(run: _Run) -> tuple[Any, Any, dict[str, Projector], Any]:
    """This rank's shard probed at every point (projected with ``project``), the projectors and the kept prefix."""
    opts, model = run.opts, run.model
    projectors: dict[str, Projector] = {}

    def project(name: str, x: torch.Tensor) -> torch.Tensor:
        assert opts.project is not None  # only installed with a projection
        if name not in projectors:  # same seed on every rank and for train/held-out
            projectors[name] = Projector(x.shape[1], opts.project, seed=opts.seed)
        return projectors[name](x)

    def probe(batches: list[Any]) -> Any:
        return collect(
            model,
            distributed.shard(batches),
            points=run.names,
            loss_fn=run.loss_fn,
            pool=opts.pool,
            train_mode=opts.train_mode,
            progress=run.progress,
            transform=project if opts.project else None,
        )

    qa = probe(run.train_list)
    first = None
    if opts.kind in INTERVENTION_KINDS and opts.project is None and run.W == 1 and opts.train_mode == "eval":
        with contextlib.suppress(WidthscopeError):  # batches that do not pool: the interventions say so
            first = as_examples(run.test_list[:3])
    if first is None:
        return qa, probe(run.test_list), projectors, None
    dt = float_dtype(model)
    with keep_prefix(model, run.names, first, run.k_max, run.loss_fn, lambda b: to_device(b, run.device, dt)) as kept:
        qb = probe(run.test_list)
    return qa, qb, projectors, kept


def _statistics(
    run: _Run, qa: Any, qb: Any, projectors: dict[str, Projector], samples_out: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], list[str], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Every point's statistics from all ranks' samples: the rows, the notes and the gathered samples."""
    opts, names = run.opts, run.names
    a = {name: gather_rows(qa[name], run.device) for name in names}
    b = {name: gather_rows(qb[name], run.device) for name in names}
    dims = {n: int(projectors[n].d if opts.project else a[n].shape[1]) for n in names}
    low = float_dtype(run.model)
    low = low if low in (torch.bfloat16, torch.float16) else None  # the samples and losses round there
    errors = None
    if low is not None and opts.project is None and run.W == 1:  # measured rounding (4 small probes a point)
        errors = {
            p: e
            for p in names
            if (e := sample_errors(run.model, p, run.train_list, run.test_list, run.loss_fn)) is not None
        }
    same = {k: getattr(opts, k) for k in ("pairs", "draws", "seed", "estimator", "pool", "project", "draw_scheme")}
    results, notes = statistics(a, b, **same, dims=dims, sample_dtype=low, sample_errors=errors or None)
    if samples_out is not None:
        samples_out.update(train=a, test=b, dims=dims)
    return results, notes, (a, b)


def _interventions(
    run: _Run,
    qa: Any,
    qb: Any,
    kept: Any,
    gathered: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    results: list[dict[str, Any]],
    on_point: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Add each point's ``interventions`` (rank 0 computes them) and hand each row to ``on_point``."""
    opts, model = run.opts, run.model
    on_point = on_point or (lambda row: None)
    if opts.kind not in INTERVENTION_KINDS:
        for r in results:
            on_point(r)
        return
    from ..probe.interventions import intervene  # noqa: PLC0415  call-time lookup: tests replace it there

    test_losses = gather_rows(qb.losses[:, None], run.device)[:, 0]  # all ranks' rows, in order
    with EvalMode(model) if opts.train_mode == "eval" else contextlib.nullcontext():
        for r in results:
            p = r["point"]
            reuse = None
            if not opts.project:
                reuse = {
                    "train": gathered[0][p],
                    "test": gathered[1][p],
                    "test_losses": test_losses,
                    "act_sq": gather_rows(qa.act_sq[p], run.device) if p in qa.act_sq else None,
                    "width": qa.widths.get(p),
                    "prefix": kept,
                }
            r["interventions"] = []
            if distributed.is_main():
                rows = intervene(
                    model,
                    p,
                    run.train_list,
                    run.test_list,
                    **{k: getattr(opts, k) for k in ("etas", "n_etas", "max_rel_step", "kind", "seed")},
                    loss_fn=run.loss_fn,
                    M=run.m_max,
                    K=run.k_max,
                    progress=False,
                    reuse=reuse,
                )
                r["interventions"] = to_jsonable(rows)
            on_point(r)


STILL_FIRST_ORDER = 0.5  # share of the predicted decrease that makes the grid's largest step "still first order"


def grid_notes(results: Sequence[dict[str, Any]], max_rel_step: float) -> list[str]:
    """A note naming the points where the default grid's largest step was still first order."""
    held: dict[str, float] = {}
    for r in results:
        rows = [x for x in r.get("interventions") or [] if isinstance(x, dict) and x.get("eta") is not None]
        if rows:
            top = max(rows, key=lambda x: x["eta"])
            pred, act = top.get("predicted"), top.get("actual")
            if pred is not None and act is not None and pred < 0 and act <= STILL_FIRST_ORDER * pred:
                held[r["point"]] = act / pred
    if not held:
        return []
    lo, hi = f"{min(held.values()):.2f}", f"{max(held.values()):.2f}"
    more = (
        "; --max-rel-step 1 (certify(max_rel_step=1)) extends it to a step as large as the activation"
        if max_rel_step < 1
        else ""
    )
    return [
        f"interventions: at {', '.join(held)} the largest step of the grid (rel_step {max_rel_step:g}) still "
        f"gave {lo if lo == hi else f'{lo}-{hi}'} of the predicted loss decrease, so the first-order step has "
        f"not broken down within the grid{more}"
    ]


def data_description(info: dict[str, Any], data: str | None = None) -> str:
    """The probe pools of a certify run in words (corpus, split rule, sizes) from the inputs' info."""

    def src(part: Any) -> str | None:
        return part.get("source") if isinstance(part, dict) else None

    if info.get("dataset"):
        words = describe_name(info["dataset"])
    else:
        tr, te = src(info.get("train")), src(info.get("test"))
        words = tr or info.get("split") or str(data or "the given inputs")
        if te and te != tr:
            words = f"train pool: {words} / held-out pool: {te}"
    if info.get("seq_len"):
        words += f", {info.get('tokenizer', 'token')} sequences of {info['seq_len']}"
    sizes = f"{info.get('n_train', '?')} train-pool / {info.get('n_test', '?')} held-out-pool examples"
    rule = info.get("rule") or info.get("train_pool")
    return f"{words}; {sizes}" + (f" ({rule})" if rule else "")


@dataclasses.dataclass(frozen=True)
class CertifyJob:
    """Everything one certify run needs: inputs, statistics, execution, outputs."""

    spec: InputSpec
    options: CertifyOptions = CertifyOptions()
    run: CertifyRunOptions = CertifyRunOptions()
    out: str = "widthscope-results/certify.json"
    save_samples: str | None = None
    resume: bool = False
    protocol: str = "default"

    def record(self) -> dict[str, Any]:
        """The ``options`` block of the results file: what ``certify --config FILE`` reads back."""
        return {
            "certify": self.options.to_dict(),
            "run": self.run.to_dict(),
            "inputs": self.spec.to_dict(),
            "protocol": self.protocol,
        }


def load_checkpoint(spec: InputSpec, seed: int) -> tuple[nn.Module, Any]:
    """The model as the run loads it, and the built-in (untrained) model's data split or None."""
    if spec.model != "builtin":
        model = load_model(
            spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision, placement=placement_of(spec)
        )
        return model, None
    split = data.load("digits", seed=seed)
    torch.manual_seed(seed)
    model = models.build("mlp", 128, in_dim=int(split.input_shape[-1]), out_dim=split.num_classes, depth=3)
    model.widthscope_extra = {"dataset": "digits"}  # type: ignore[assignment]
    return model, split


def list_points(spec: InputSpec, *, every_module: bool = False) -> list[str]:
    """The insertion points of the spec's model (every module path with ``every_module``)."""
    model, _ = load_checkpoint(spec, spec.seed)
    return all_points(model) if every_module else insertion_points(model)


def run_device(name: str) -> torch.device:
    """The ``--device`` the run probes on (one GPU per rank under torchrun)."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None and distributed.is_distributed():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", distributed.rank())))
    return device


def device_memory(device: torch.device | str) -> tuple[int | None, str]:
    """Free memory of the run's device: CUDA ``mem_get_info``, else ``MemAvailable``."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device}"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    return None, "unknown (no /proc/meminfo)"


def _check_structure(
    job: CertifyJob, names: Sequence[str], inputs: Any, model: nn.Module, n: tuple[int, int]
) -> tuple[dict[str, int], int]:
    """Check ``M``/``K`` and ``--project`` against the pools and dimensions: (dimensions, sample rows per example)."""
    spec, opts = job.spec, job.options
    needs = (
        ("n_train", "M", max(m for m, _ in opts.pairs), "train", n[0]),
        ("n_test", "K", max(k for _, k in opts.pairs), "held-out", n[1]),
    )
    for flag, letter, need, pool, size in needs:
        if is_all(getattr(spec, flag)) and opts.pool != "token" and need > size:
            raise WidthscopeError(
                f"{letter}={need} is larger than the {pool} pool of {size} examples "
                f"(--{flag.replace('_', '-')} all took every one): lower --{letter}"
            )
    one = index_batch(inputs.train, slice(0, 1))
    q = collect(model, [one], points=list(names), loss_fn=inputs.loss_fn, pool=opts.pool, progress=False)
    dims = {p: int(q[p].shape[1]) for p in names}
    if opts.project is not None and dims and opts.project >= max(dims.values()):
        d_max = max(dims.values())
        raise WidthscopeError(
            f"--project {opts.project} is not below any point's dimension (the largest is d={d_max}): "
            f"a projection saves memory only with K < d; use --project < {d_max} or drop it"
        )
    return dims, max(1, max(int(q[p].shape[0]) for p in names))


def _check_room(job: CertifyJob, dims: dict[str, int], rows: int, n: tuple[int, int]) -> None:
    """Check the free space for the outputs and the memory for the float64 samples (over-estimated)."""
    opts = job.options
    per_point = 2500 + 2500 * len(opts.pairs) + (6000 if opts.interventions != "none" else 0)
    _io.check_space(job.out, 2 * (4000 + len(dims) * per_point), "the results (JSON and its per-point parts)")
    d = sum(opts.project or v for v in dims.values())
    if job.save_samples:  # float64 rows, and a header with the settings and each point's intervention rows
        _io.check_space(job.save_samples, 8 * rows * sum(n) * d + 8000 + 6000 * len(dims), "the samples")
    need, free = 8 * rows * sum(n) * d, device_memory("cpu")[0]
    if free is not None and need > free:
        raise WidthscopeError(
            f"the samples need about {human_size(need)} of memory ({n[0]} + {n[1]} "
            f"examples x {rows} row(s) x {d} dimensions over {len(dims)} point(s), float64) but "
            f"only {human_size(free)} is available: lower --n-train/--n-test, choose fewer --points, "
            "or add --project"
        )


def _parts_dir(out: str | os.PathLike) -> Path:
    return Path(str(out) + ".parts")


def _lock(job: CertifyJob) -> contextlib.AbstractContextManager[None]:
    """The lock of ``--out`` (``OUT.parts/.widthscope.lock``): a second run is refused before any work."""
    out = str(job.out)

    def refuse(holder: str) -> WidthscopeError:
        return WidthscopeError(
            f"--out {out!r} is being written by another certify run ({holder}): wait for it to finish or "
            "stop it, or choose another --out"
        )

    return hold_lock(_parts_dir(out) / LOCK, refuse, what="certify run", where=out, tidy=True)


class _Parts:
    """Finished points, one JSON file each in ``OUT.parts/``, keyed by a fingerprint of the settings."""

    def __init__(self, job: CertifyJob, names: Sequence[str], n: tuple[int, int], inputs_info: dict[str, Any]):
        self.dir = _parts_dir(job.out)
        spec = {k: v for k, v in job.spec.to_dict().items() if k not in ("given", "cap_pools")}
        settings = {
            **spec,
            **job.options.to_dict(),
            "batch_size": job.run.batch_size,
            "train_steps": job.run.train_steps,
            "protocol": job.protocol,
            "n_train": n[0],
            "n_test": n[1],
            "inputs": inputs_info,
            "points": list(names),
        }
        self.settings = json.loads(json.dumps(settings, default=str))
        blob = json.dumps(self.settings, sort_keys=True, default=str)
        self.fingerprint = hashlib.sha256(blob.encode()).hexdigest()[:16]
        on_interrupt(self.describe)

    def load(self) -> dict[str, dict[str, Any]]:
        done: dict[str, dict[str, Any]] = {}
        other: dict[str, Any] | None = None
        for f in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                obj = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a torn file: that point runs again
            if obj.get("fingerprint") == self.fingerprint:
                done[obj["row"]["point"]] = obj
            elif other is None:
                other = obj.get("settings") or {}
        if other is not None and not done:  # parts of a run with other settings: say what differs
            diff = [k for k in self.settings if k in other and other[k] != self.settings[k]]
            shown = ", ".join(
                f"{'--' + k.replace('_', '-')} {other[k]} (now {self.settings[k]})"
                if k not in ("inputs", "points")
                else f"the {k}"
                for k in diff[:3]
            )
            raise WidthscopeError(
                f"--resume: {self.dir} holds finished points of a run with other settings "
                f"({shown or 'recorded by an older version'}): rerun with those settings to continue it, or drop "
                "--resume to start over (its parts are then replaced)"
            )
        return done

    def save(self, row: dict[str, Any], notes: list[str]) -> None:
        atomic_write_json(
            self.dir / f"{row['point'].replace('/', '_')}.json",
            {"fingerprint": self.fingerprint, "settings": self.settings, "row": row, "notes": notes},
        )

    def describe(self) -> str | None:
        n = len(list(self.dir.glob("*.json"))) if self.dir.is_dir() else 0
        return f"{n} finished point(s) in {self.dir} (rerun with --resume to continue)" if n else None


_TRAINING_NAMES = {"steps": ("steps",), "train_loss": ("train_loss", "loss"), "test_loss": ("test_loss",)}


def training_record(extra: Any) -> dict[str, Any]:
    """The finite steps / train_loss (or loss) / test_loss of ``extra["train"]``, else of ``extra``."""
    out: dict[str, Any] = {}
    sources = (extra.get("train"), extra) if isinstance(extra, Mapping) else ()
    for where in [w for w in sources if isinstance(w, Mapping)]:
        for key, names in _TRAINING_NAMES.items():
            for v in (where.get(n) for n in names):
                if key not in out and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out[key] = v
    return out


def _merge(
    res: dict[str, Any] | None, done: dict[str, dict[str, Any]], names: Sequence[str], opts: CertifyOptions
) -> dict[str, Any]:
    """This run's points and the resumed ones, in the points' order, with one ranking."""
    rows = {r["point"]: r for r in (res["points"] if res else [])}
    rows.update({p: d["row"] for p, d in done.items() if p not in rows})
    points = [rows[n] for n in names]
    for cert in (c[f] for pt in points for c in pt["certificates"] for f in ("one", "two")):
        vacuous_rule(cert)  # parts finished before the rule read as new ones do
    if res is None:  # every point was already finished
        res = {
            "settings": settings_block(opts, names, world_size=distributed.world_size()),
            "notes": [],
            "timing": {"probe_s": 0.0, "stats_s": 0.0, "intervene_s": 0.0},
        }
    res["settings"]["points"] = list(names)
    res["points"] = points
    res["ranking"] = ranking(points)
    if done:
        res["settings"]["resumed_points"] = sorted(done)
        res["notes"] = list(dict.fromkeys(res["notes"] + [n for d in done.values() for n in d.get("notes", [])]))
    return res


def run_certify(
    job: CertifyJob, *, notes: Sequence[str] = (), say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run ``job``; rank 0 holds the lock of ``job.out`` and writes it (and ``job.save_samples``)."""
    with _lock(job) if distributed.is_main() else contextlib.nullcontext():
        return _run(job, notes, say)


def _run(job: CertifyJob, notes: Sequence[str], say: Callable[[str], None] | None) -> dict[str, Any]:
    main = distributed.is_main()
    say = say or (lambda msg: print(msg, flush=True) if main else None)
    spec, opts = job.spec, job.options
    device = run_device(job.run.device)
    model, split = load_checkpoint(spec, opts.seed)
    names = resolve_points(model, list(opts.points) if opts.points else None)
    inputs = resolve(spec, model=model, show_progress=main)
    n_train = batch_size_of(inputs.train) if is_all(spec.n_train) else int(spec.n_train)
    n_test = batch_size_of(inputs.test) if is_all(spec.n_test) else int(spec.n_test)
    dims, rows = _check_structure(job, names, inputs, model, (n_train, n_test))
    parts = _Parts(job, names, (n_train, n_test), inputs.info)
    done = parts.load() if job.resume else {}
    if done and job.save_samples:
        raise WidthscopeError("--save-samples needs every point probed in this run; drop --resume (or --save-samples)")
    todo = [n for n in names if n not in done]
    _check_room(job, dims, rows, (n_train, n_test))
    if split is not None:
        t0 = time.perf_counter()
        steps = job.run.train_steps
        tr = train(model, split, steps=steps, lr=3e-3, batch_size=64, seed=opts.seed, progress=main)
        acc = tr.get("test_accuracy")
        say(
            f"builtin: MLP width 128, depth 3 trained on digits for {steps} steps "
            f"({time.perf_counter() - t0:.1f}s, held-out accuracy {acc if acc is None else f'{acc:.3f}'})"
        )
        if spec.dtype != "auto":
            model.to(getattr(torch, spec.dtype))
    if done:
        say(f"resume: {len(done)} of {len(names)} point(s) already finished in {parts.dir}; probing {len(todo)}")
    if getattr(model, "hf_device_map", None) is None:  # a dispatched model stays where accelerate put it
        model.to(device)
    elif str(device) != "cpu":
        raise WidthscopeError(
            f"--device {device} with --device-map: the device map places the model; drop --device (or --device-map)"
        )
    samples: dict[str, Any] = {}
    res = None
    if todo:  # guarded: a failing rank stops every rank, and rank 0 writes only a complete result
        bs = job.run.batch_size
        res = distributed.run_rank_guarded(
            certify_dict,
            model,
            to_batches(inputs.train, bs),
            to_batches(inputs.test, bs),
            options=opts.replace(points=tuple(todo)),
            loss_fn=inputs.loss_fn,
            progress=main,
            samples_out=samples,
            on_point=lambda row: parts.save(row, []) if main else None,
            what="certify",
        )
    res = _merge(res, done, names, opts)
    info = model_info(model)
    recorded = spec.to_dict()  # objects in memory are recorded as "<in memory: ...>"
    res["settings"].update(
        **{k: recorded[k] for k in ("model", "train_data", "test_data")},
        data=inputs.info.get("dataset") or inputs.data or recorded["train_data"],
        data_description=data_description(inputs.info, inputs.data or recorded["train_data"]),
        task=inputs.task,
        protocol=job.protocol,
        n_train=n_train,
        n_test=n_test,
        batch_size=job.run.batch_size,
        device=str(device),
        inputs=inputs.info,
        input_spec=(inputs.spec or spec).to_dict(),
        **{k: info.get(k) for k in ("architecture", "width", "depth", "dtype", "parameters", "attn_implementation")},
    )
    res["settings"].update({k: inputs.info[k] for k in ("n_train_examples", "n_test_examples") if k in inputs.info})
    if trained := training_record(getattr(model, "widthscope_extra", None)):
        res["settings"]["training"] = trained
    if "placement" in info:  # a dispatched model: where its layers ran (docs/big-models.md)
        res["settings"]["placement"] = info["placement"]
    res["notes"] = list(notes) + inputs.notes + res["notes"]
    res["options"] = job.record()
    if main:
        path = atomic_write_json(job.out, res)
        shutil.rmtree(parts.dir, ignore_errors=True)  # the complete result is on disk: the parts go
        if job.save_samples:
            ivs = {r["point"]: r.get("interventions", []) for r in res["points"] if "interventions" in r}
            meta = {"settings": res["settings"], "notes": res["notes"], "dims": samples["dims"], "interventions": ivs}
            save(job.save_samples, samples["train"], samples["test"], meta)
            say(f"samples written to {job.save_samples} (widthscope stats {job.save_samples})")
        say(tables(res))
        say(
            f"\nprobe {res['timing']['probe_s']:.2f}s, statistics {res['timing']['stats_s']:.2f}s; "
            f"results written to {path}"
        )
    distributed.barrier()
    return res
