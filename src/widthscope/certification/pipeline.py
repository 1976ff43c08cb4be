r"""Alignment certificates at the insertion points of a trained model (function + CLI).

Per point: probe the per-example activation gradients on train and held-out pools, estimate the
moments, and for each ``(M, K)`` give both certificate forms and the resampled misalignment; points
are ranked by the two-population ``d_align``. Under ``torchrun`` each rank probes a shard and rank 0
writes. Maths: docs/certify.md, docs/maths-alignment.md.

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

import dataclasses
import time
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn as nn

from .. import _args, distributed
from .._io import to_jsonable
from ..data import describe_name
from ..errors import WidthscopeError
from ..options import (
    DEFAULT_M,
    DEFAULT_MAX_REL_STEP,
    DEFAULT_N_ETAS,
    ESTIMATORS,
    INTERVENTION_KINDS,
    INTERVENTIONS,
    CertifyOptions,
)
from ..probe import POOLS, resolve_points
from ..probe.offload import input_device
from ..probe.resolution import sample_errors
from ..probe.steps import check_rel_step
from ..validate import sizes_list
from .per_point import check_pool, precision_notes, rank_value, ranking, statistics, tables  # noqa: F401  (re-exported)
from .probing import KeepPrefix, count_examples, gather_pools, gather_rows, low_precision, probe_pools

__all__ = [
    "certify_dict",
    "settings_block",
    "data_description",
    "grid_notes",
    "count_examples",
    "gather_rows",
    "DEFAULT_M",
    "DEFAULT_N_ETAS",
    "DEFAULT_MAX_REL_STEP",
    "ESTIMATORS",
]


class _Default:
    """The keyword conveniences of :func:`certify` left out: the value comes from ``options``."""

    def __repr__(self) -> str:
        return "<from options>"


_D: Any = _Default()


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
    """Certify every insertion point of ``model``; returns a JSON-able dict.

    The settings are a :class:`~widthscope.options.CertifyOptions` (``options``; each field's help says
    what it means); keywords override its fields. ``train_batches`` / ``test_batches`` are as for
    :func:`widthscope.probe.collect`; ``samples_out`` receives the pooled samples, ``on_point`` each
    finished point's row. Steps: :func:`_resolve`, :func:`_probe`, :func:`_statistics`,
    :func:`_interventions`, :func:`_result`. Returns ``{"settings", "points", "ranking", "notes",
    "timing"}`` (docs/certify.md).
    """
    fn = "certify"  # the types, before any work (values: the options dataclass and _resolve)
    if options is not None and not isinstance(options, CertifyOptions):
        raise _args.WidthscopeTypeError(
            f"certify(options=...): options must be a CertifyOptions, got {_args.describe(options)}"
        )
    given = {
        k: v
        for k, v in dict(
            points=points,
            M=M,
            K=K,
            draws=draws,
            seed=seed,
            estimator=estimator,
            pool=pool,
            train_mode=train_mode,
            interventions=interventions,
            etas=etas,
            n_etas=n_etas,
            max_rel_step=max_rel_step,
            project=project,
            draw_scheme=draw_scheme,
        ).items()
        if v is not _D
    }
    _args.module(fn, "model", model)
    _args.batches(fn, "train_batches", train_batches)
    _args.batches(fn, "test_batches", test_batches)
    checks: dict[str, Callable[[Any], Any]] = {
        "points": lambda v: _args.points(fn, "points", v),
        "M": lambda v: (_args.sizes(fn, "M", v), sizes_list(v, "M")),
        "K": lambda v: (_args.sizes(fn, "K", v, optional=True), v is None or sizes_list(v, "K")),
        "draws": lambda v: _args.integer(fn, "draws", v, lo=1),
        "seed": lambda v: _args.integer(fn, "seed", v),
        "estimator": lambda v: _args.choice(fn, "estimator", v, ESTIMATORS),
        "pool": lambda v: _args.choice(fn, "pool", v, POOLS),
        "train_mode": lambda v: _args.choice(fn, "train_mode", v, ("eval", "keep")),
        "interventions": lambda v: _args.choice(fn, "interventions", v, (None, *INTERVENTIONS)),
        "etas": lambda v: _args.numbers_list(fn, "etas", v, accepts="a list of positive step sizes or None"),
        "n_etas": lambda v: _args.integer(fn, "n_etas", v, lo=1),
        "max_rel_step": lambda v: _args.number(
            fn,
            "max_rel_step",
            v,
            1e-4,
            lo_open=True,
            accepts="a finite number above the smallest step 1e-4 (the largest step's RMS entry over the activation's)",
        ),
        "project": lambda v: _args.integer(
            fn, "project", v, lo=2, optional=True, accepts="an integer k >= 2 (projected dimension) or None"
        ),
        "draw_scheme": lambda v: _args.choice(fn, "draw_scheme", v, ("shared", "per-pair")),
    }
    for key, value in given.items():
        checks[key](value)
    _args.function(fn, "loss_fn", loss_fn)
    _args.boolean(fn, "progress", progress)
    _args.mapping(fn, "samples_out", samples_out, mutable=True)
    _args.function(fn, "on_point", on_point)
    opts = _options(options, given)
    run = _resolve(model, train_batches, test_batches, opts, loss_fn=loss_fn, progress=progress)
    probed = _probe(run)
    per_point = _statistics(run, probed, samples_out)
    intervene_s = _interventions(run, probed, per_point, on_point)
    return _result(run, probed, per_point, intervene_s)


@dataclasses.dataclass
class CertifyInputs:
    """:func:`certify_dict`'s resolved inputs (:func:`_resolve`): the settings, the ``(M, K)``
    pairs, the points, the batch lists, the world size and the device the inputs go to."""

    model: nn.Module
    opts: CertifyOptions
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    progress: bool
    pairs: list[tuple[int, int]]
    names: list[str]
    train_list: list[Any]
    test_list: list[Any]
    W: int
    device: torch.device
    max_rel_step: float

    @property
    def m_max(self) -> int:
        return max(m for m, _ in self.pairs)

    @property
    def k_max(self) -> int:
        return max(k for _, k in self.pairs)


@dataclasses.dataclass
class Probed:
    """The probe step's pools (:func:`_probe`): each rank's samples ``qa``/``qb`` (train, held-out),
    their projectors, the kept prefix the bias steps reuse, the probe's notes and its seconds."""

    qa: Any
    qb: Any
    projectors: Any
    keep: KeepPrefix
    notes: list[str]
    seconds: float


@dataclasses.dataclass
class PerPoint:
    """The statistics step (:func:`_statistics`): one row per point (``results``, the interventions
    are added to them), the samples gathered across ranks, the notes and the seconds."""

    results: list[dict[str, Any]]
    gathered_a: dict[str, torch.Tensor]
    gathered_b: dict[str, torch.Tensor]
    notes: list[str]
    seconds: float


def _options(options: CertifyOptions | None, given: dict[str, Any]) -> CertifyOptions:
    """``options`` (default ``CertifyOptions()``) with the keywords given to :func:`certify`."""
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
    """The ``settings`` of a certify result: written once, here, so a result assembled from resumed
    parts records exactly what an uninterrupted run records."""
    pairs = opts.pairs
    return {
        "M": [m for m, _ in pairs],
        "K": [k for _, k in pairs],
        "draws": opts.draws,
        "seed": opts.seed,
        "estimator": opts.estimator,
        "pool": opts.pool,
        "train_mode": opts.train_mode,
        "points": list(names),
        "world_size": world_size,
        "interventions": opts.kind,
        "project": opts.project,
        "draw_scheme": opts.draw_scheme,
        "etas": None if opts.etas is None else [float(e) for e in opts.etas],
        "n_etas": None if opts.etas is not None else opts.n_etas,
        "max_rel_step": None if opts.etas is not None else opts.max_rel_step,
    }


def _resolve(
    model: nn.Module,
    train_batches: Iterable[Any],
    test_batches: Iterable[Any],
    opts: CertifyOptions,
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    progress: bool = True,
) -> CertifyInputs:
    """Resolve the inputs: the ``(M, K)`` pairs, the points, the batch lists, the world size and
    the model's device, and check the pools against them — all before any probing (the settings
    themselves were validated when ``opts`` was made)."""
    pairs = opts.pairs
    names = resolve_points(model, list(opts.points) if opts.points else None)
    train_list, test_list = list(train_batches), list(test_batches)
    W = distributed.world_size()
    for what, lst, flag in (("train", train_list, "n_train"), ("held-out", test_list, "n_test")):
        if len(lst) < W:
            raise WidthscopeError(
                f"{len(lst)} {what} batch(es) for {W} ranks: every rank needs one; lower the batch size or raise {flag}"
            )
    if opts.pool != "token":  # cheap early check, before any probing
        check_pool(count_examples(train_list), max(m for m, _ in pairs), "train", "n_train", opts.pool)
        check_pool(count_examples(test_list), max(k for _, k in pairs), "held-out", "n_test", opts.pool)
    device = input_device(model)  # a dispatched model's inputs go where its first block runs
    max_rel_step = check_rel_step(opts.max_rel_step)
    return CertifyInputs(model, opts, loss_fn, progress, pairs, names, train_list, test_list, W, device, max_rel_step)


def _probe(run: CertifyInputs) -> Probed:
    """The probe pools: every point's pooled samples on the train and held-out batches, keeping
    the prefix the interventions reuse where they will run (:mod:`.probing`)."""
    opts = run.opts
    t0 = time.perf_counter()
    keep = KeepPrefix(
        run.model,
        run.names,
        run.test_list,
        run.k_max,
        loss_fn=run.loss_fn,
        device=run.device,
        wanted=opts.kind in INTERVENTION_KINDS and opts.project is None and run.W == 1 and opts.train_mode == "eval",
    )
    qa, qb, projectors = probe_pools(
        run.model,
        run.names,
        run.train_list,
        run.test_list,
        loss_fn=run.loss_fn,
        pool=opts.pool,
        train_mode=opts.train_mode,
        progress=run.progress,
        project=opts.project,
        seed=opts.seed,
        keep=keep,
    )
    notes = list(dict.fromkeys(qa.notes + qb.notes))
    return Probed(qa, qb, projectors, keep, notes, time.perf_counter() - t0)


def _statistics(run: CertifyInputs, probed: Probed, samples_out: dict[str, Any] | None) -> PerPoint:
    """The statistics per point: the samples gathered across ranks, for a bfloat16/float16 model
    their measured rounding, then every point's moments, certificates and misalignment
    (:func:`~.per_point.statistics`); ``samples_out`` receives the samples."""
    opts, model = run.opts, run.model
    t0 = time.perf_counter()
    gathered_a, gathered_b, dims = gather_pools(
        probed.qa, probed.qb, run.names, run.device, probed.projectors, opts.project
    )
    low = low_precision(model)
    errors = None
    if (
        low is not None and opts.project is None and run.W == 1
    ):  # measured rounding of the samples (4 small probes a point)
        errors = {
            p: e
            for p in run.names
            if (e := sample_errors(model, p, run.train_list, run.test_list, run.loss_fn)) is not None
        }
    results, notes = statistics(
        gathered_a,
        gathered_b,
        pairs=run.pairs,
        draws=opts.draws,
        seed=opts.seed,
        estimator=opts.estimator,
        pool=opts.pool,
        project=opts.project,
        dims=dims,
        draw_scheme=opts.draw_scheme,
        sample_dtype=low,
        sample_errors=errors or None,
    )
    if samples_out is not None:
        samples_out.update(train=gathered_a, test=gathered_b, dims=dims)
    return PerPoint(results, gathered_a, gathered_b, notes, time.perf_counter() - t0)


def _result(run: CertifyInputs, probed: Probed, per_point: PerPoint, intervene_s: float) -> dict[str, Any]:
    """Assemble the result: settings, the rows, the ranking, the notes, the timing and the options."""
    opts, results = run.opts, per_point.results
    notes = probed.notes + per_point.notes
    if opts.etas is None:
        notes += grid_notes(results, run.max_rel_step)
    notes += precision_notes(results)
    return {
        "settings": settings_block(opts, run.names, world_size=run.W),
        "points": results,
        "ranking": ranking(results),
        "notes": notes,
        "timing": {"probe_s": probed.seconds, "stats_s": per_point.seconds, "intervene_s": intervene_s},
        "options": {"certify": opts.to_dict()},  # what made it: CertifyOptions.from_dict repeats it
    }


# The largest default step "still first order": it gave at least this share of the predicted decrease.
STILL_FIRST_ORDER = 0.5


def grid_notes(results: Sequence[dict[str, Any]], max_rel_step: float) -> list[str]:
    """One note naming the points where the default grid's largest step still gave at least
    :data:`STILL_FIRST_ORDER` of the predicted loss decrease: there the breakdown of the
    first-order step lies beyond the grid, which then does not show where it ends."""
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


def _interventions(
    run: CertifyInputs,
    probed: Probed,
    per_point: PerPoint,
    on_point: Callable[[dict[str, Any]], None] | None,
) -> float:
    """The interventions: add each point's ``interventions`` to its row (in place), handing each
    finished row to ``on_point``; the model's modes are restored. The bias steps reuse the probe's
    samples, held-out losses, activation scale and kept prefix (then only the network after each
    point runs). Returns the seconds taken."""
    t0 = time.perf_counter()
    opts, model, results = run.opts, run.model, per_point.results
    if opts.kind in INTERVENTION_KINDS:
        from ..probe.interventions import intervene  # noqa: PLC0415  call-time lookup: tests replace it there

        qa, qb = probed.qa, probed.qb
        test_losses = gather_rows(qb.losses[:, None], run.device)[:, 0]  # all ranks' rows, in order
        was_training = {m: m.training for m in model.modules()}
        try:
            if opts.train_mode == "eval":
                model.eval()
            for r in results:
                # Rank 0 only: every rank holds the full batch lists, the result is identical.
                # The bias probe reuses what the probe already measured (its samples, the
                # held-out losses, the activation scale): only the loss at each step is new.
                p = r["point"]
                reuse = (
                    None
                    if opts.project
                    else {
                        "train": per_point.gathered_a[p],
                        "test": per_point.gathered_b[p],
                        "test_losses": test_losses,
                        "act_sq": gather_rows(qa.act_sq[p], run.device) if p in qa.act_sq else None,
                        "width": qa.widths.get(p),
                        "prefix": getattr(probed.keep, "kept", None),
                    }
                )
                r["interventions"] = (
                    to_jsonable(
                        intervene(
                            model,
                            r["point"],
                            run.train_list,
                            run.test_list,
                            etas=opts.etas,
                            n_etas=opts.n_etas,
                            max_rel_step=run.max_rel_step,
                            kind=opts.kind,
                            loss_fn=run.loss_fn,
                            M=run.m_max,
                            K=run.k_max,
                            seed=opts.seed,
                            progress=False,
                            reuse=reuse,
                        )
                    )
                    if distributed.is_main()
                    else []
                )
                if on_point is not None:
                    on_point(r)
        finally:
            for m, mode in was_training.items():
                m.training = mode
    elif on_point is not None:
        for r in results:
            on_point(r)
    return time.perf_counter() - t0


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
