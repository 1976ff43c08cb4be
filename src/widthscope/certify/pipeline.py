r"""Alignment certificates at the insertion points of a trained model (function + CLI).

Pipeline, per insertion point (maths in ``docs/certify.md`` and the alignment spec):

1. probe: per-example activation gradients :math:`q = \partial\ell/\partial z`, pooled
   (:func:`widthscope.probe.collect`) on ``n_train`` fitted examples (population *a*) and
   ``n_test`` held-out examples (population *b*);
2. moments: unbiased U-statistics of :math:`\|\mu\|^2, \mu^\top\Sigma\mu, \mathrm{tr}\,\Sigma^2`
   (train) and the cross-population :math:`a^\top b, b^\top\Sigma_a b, a^\top\Sigma_b a,
   \mathrm{tr}\,\Sigma_a\Sigma_b`;
3. for each ``(M, K)``: both certificate forms (``populations="one"``/``"two"``:
   :math:`\mathbb E A`, :math:`d_\parallel, d_2, d_\mathrm{align}, B_\mathrm{exact}, B_\mathrm{align}`)
   and the empirical misalignment :math:`\Pr(\mu_M^\top g_K \le 0)` over ``draws`` resamples with a
   95% Wilson interval;
4. rank the points by the two-population :math:`d_\mathrm{align}` (largest first; points
   whose certificate is vacuous come after the certified ones).

Under ``torchrun`` each rank probes a deterministic shard of the batches; pooled samples
are gathered, every rank computes the same statistics, and only rank 0 prints or writes.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.certify import certify
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
    >>> x, y = torch.randn(96, 6), torch.randint(0, 3, (96,))
    >>> tr = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    >>> te = [(x[64:], y[64:])]
    >>> res = certify(net, tr, te, M=[8, 16], draws=200, progress=False)
    >>> [p["point"] for p in res["points"]]
    ['0', '1', '2', '3']
    >>> sorted(res["points"][0]["certificates"][0])
    ['K', 'M', 'misalignment', 'one', 'two']
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn as nn

from .. import distributed
from .._io import atomic_write_json, to_jsonable
from ..errors import WidthscopeError
from .per_point import _check_pool, _v, ranking, statistics, tables  # noqa: F401  (re-exported)
from ..probe import collect, resolve_points
from ..validate import _float_list, _int_list, _num_list, _pairs, _sizes  # noqa: F401  (re-exported)

__all__ = ["certify", "add_arguments", "run", "DEFAULT_M", "DEFAULT_N_ETAS", "DEFAULT_MAX_REL_STEP"]

DEFAULT_M = (16, 32, 64, 128)
# Default intervention grid of a certify run: 4 steps a decade apart (step RMS 1e-4, 1e-3, 1e-2,
# 0.1 of the activation's): the steps the claims read (1e-3 and the smallest) and the onset of the
# breakdown, at 4/9 of the cost of intervene()'s 9 half-decades up to 1. The step as large as the
# stream itself is left out: on trained models its row only repeats 0.1's "the loss rises" (see
# docs/interventions.md, benchmarks/retention_grid.py). n_etas=9, max_rel_step=1 restores that grid.
DEFAULT_N_ETAS = 4
DEFAULT_MAX_REL_STEP = 0.1
ESTIMATORS = ("unbiased", "plugin")


def _count(batches: Sequence[Any]) -> int:
    n = 0
    for b in batches:
        x = b["input_ids"] if isinstance(b, dict) else (b[0] if isinstance(b, (tuple, list)) else b)
        if isinstance(x, dict):
            x = next(iter(x.values()))
        n += int(x.shape[0])
    return n


def _gather(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not distributed.is_distributed():
        return x
    # nccl gathers CUDA tensors only; gloo is happy with CPU ones.
    return distributed.all_gather_rows(x.to(device)).to("cpu")


def certify(model: nn.Module, train_batches: Iterable[Any], test_batches: Iterable[Any], *,
            points: str | Sequence[str] | None = None, M: Sequence[int] | int = DEFAULT_M,
            K: Sequence[int] | int | None = None, draws: int = 1000, seed: int = 0,
            estimator: str = "unbiased", pool: str = "sum",
            loss_fn: Callable[[Any, Any], torch.Tensor] | None = None, train_mode: str = "eval",
            progress: bool = True, interventions: str | None = "bias",
            etas: Sequence[float] | None = None, n_etas: int = DEFAULT_N_ETAS,
            max_rel_step: float = DEFAULT_MAX_REL_STEP, project: int | None = None,
            samples_out: dict[str, Any] | None = None,
            on_point: Callable[[dict[str, Any]], None] | None = None, draw_scheme: str = "shared") -> dict[str, Any]:
    """Certify every insertion point of ``model``; returns a JSON-able dict.

    Args:
        model: trained model (any device; it is not moved).
        train_batches / test_batches: batches as for :func:`widthscope.probe.collect` —
            ``(x, y)`` pairs, LongTensors of token ids, or dicts with ``input_ids``.
        points: insertion points (default: :func:`widthscope.probe.insertion_points`).
        M, K: sample sizes; ``K=None`` pairs ``K = M``.
        draws, seed: resamples for the empirical misalignment probability.
        estimator: ``"unbiased"`` (U-statistics, default) or ``"plugin"`` (published scripts).
        pool: ``"sum"`` | ``"mean"`` | ``"flatten"`` | ``"token"``.
        interventions: ``"bias"`` (default), ``"block"`` or ``None``: a direct zero-init residual
            intervention at every point (:func:`widthscope.probe.intervene`) on the first
            ``max(M)`` train and ``max(K)`` held-out examples: predicted vs actual held-out loss
            change per step size ``etas`` (default: ``n_etas`` log-spaced steps scaled to the point,
            their RMS entry 1e-4…``max_rel_step`` of the activation's; the default 4 are the
            decades 1e-4…0.1: the steps the claims read, 1e-3 and the smallest, and the onset of
            the breakdown, at 4/9 the cost of :func:`~widthscope.probe.intervene`'s 9
            half-decades up to 1; ``n_etas=9, max_rel_step=1`` gives those).
            The held-out probe records what the bias steps' cached prefix needs
            (:func:`widthscope.probe.prefix.keep_prefix`), so they rerun only the network after
            each point.
        project: ``k`` -> project every sample vector to ``k`` dimensions as it streams
            (seeded Gaussian, :mod:`widthscope.stats.sketch`): memory ``O(n·k)`` instead of
            ``O(n·d)``. The one- and two-population moments are bias-corrected (unbiased over
            the projection, :func:`widthscope.stats.sketch.correct_projected_cross`); the
            empirical misalignment uses the projected rows; a note says so.
        samples_out: a dict to receive the pooled samples (``train``/``test``: ``{point: (n, d)}``,
            ``dims``), e.g. for :func:`widthscope.samples.save`.
        on_point: called with each point's finished row (statistics and interventions), e.g. to
            write it to disk at once (``certify --resume``).

    Returns:
        ``{"settings", "points": [{point, n_train, n_test, d, moments_train, moments_test,
        cross_moments, certificates: [{M, K, one, two, misalignment}]}], "ranking", "notes",
        "timing"}``; every number is a plain float/int (``None`` where undefined).
    """
    pairs, names, train_list, test_list, W, device = _resolve(
        model, train_batches, test_batches, points=points, M=M, K=K, draws=draws, estimator=estimator,
        pool=pool, interventions=interventions, project=project)

    if isinstance(n_etas, bool) or not isinstance(n_etas, int) or n_etas < 1:
        raise WidthscopeError(f"n_etas must be a whole number >= 1 (steps of the default grid), got {n_etas!r}")
    from ..probe.intervene import check_rel_step

    max_rel_step = check_rel_step(max_rel_step)
    t0 = time.perf_counter()
    keep = _keep_prefix(model, names, test_list, max(k for _, k in pairs), loss_fn=loss_fn,
                        device=device, wanted=interventions in ("bias", "block") and project is None and W == 1
                        and train_mode == "eval")
    qa, qb, projectors = _probe_pools(model, names, train_list, test_list, loss_fn=loss_fn, pool=pool,
                                      train_mode=train_mode, progress=progress, project=project, seed=seed,
                                      keep=keep)
    probe_s = time.perf_counter() - t0
    notes = list(dict.fromkeys(qa.notes + qb.notes))

    t0 = time.perf_counter()
    gathered_a, gathered_b, dims = _gather_pools(qa, qb, names, device, projectors, project)
    results, more = statistics(gathered_a, gathered_b, pairs=pairs, draws=draws, seed=seed,
                               estimator=estimator, pool=pool, project=project, dims=dims, draw_scheme=draw_scheme)
    notes += more
    if samples_out is not None:
        samples_out.update(train=gathered_a, test=gathered_b, dims=dims)
    stats_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    _interventions(model, results, qa, qb, gathered_a, gathered_b, train_list, test_list, pairs, device,
                   interventions=interventions, etas=etas, n_etas=n_etas, max_rel_step=max_rel_step,
                   loss_fn=loss_fn, seed=seed,
                   project=project, train_mode=train_mode, on_point=on_point, kept=getattr(keep, "kept", None))
    intervene_s = time.perf_counter() - t0
    if etas is None:
        notes += grid_notes(results, max_rel_step)

    return {
        "settings": {"M": [m for m, _ in pairs], "K": [k for _, k in pairs], "draws": draws, "seed": seed,
                     "estimator": estimator, "pool": pool, "train_mode": train_mode, "points": names,
                     "world_size": W, "interventions": interventions, "project": project,
                     "draw_scheme": draw_scheme, "etas": None if etas is None else [float(e) for e in etas],
                     "n_etas": None if etas is not None else n_etas,
                     "max_rel_step": None if etas is not None else max_rel_step},
        "points": results,
        "ranking": ranking(results),
        "notes": notes,
        "timing": {"probe_s": probe_s, "stats_s": stats_s, "intervene_s": intervene_s},
    }


def _resolve(model: nn.Module, train_batches: Iterable[Any], test_batches: Iterable[Any], *,
             points: str | Sequence[str] | None, M: Sequence[int] | int, K: Sequence[int] | int | None,
             draws: int, estimator: str, pool: str, interventions: str | None, project: int | None
             ) -> tuple[list[tuple[int, int]], list[str], list[Any], list[Any], int, torch.device]:
    """Check the arguments and resolve the ``(M, K)`` pairs, the points, the batch lists, the
    world size and the model's device — all before any probing."""
    if estimator not in ESTIMATORS:
        raise WidthscopeError(f"unknown estimator {estimator!r}; choose {' or '.join(ESTIMATORS)}")
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise WidthscopeError(f"draws must be a positive integer, got {draws!r}")
    pairs = _pairs(M, K)
    names = resolve_points(model, points)
    train_list, test_list = list(train_batches), list(test_batches)
    W = distributed.world_size()
    for what, lst, flag in (("train", train_list, "n_train"), ("held-out", test_list, "n_test")):
        if len(lst) < W:
            raise WidthscopeError(f"{len(lst)} {what} batch(es) for {W} ranks: every rank needs one; "
                                  f"lower the batch size or raise {flag}")
    if pool != "token":  # cheap early check, before any probing
        _check_pool(_count(train_list), max(m for m, _ in pairs), "train", "n_train", pool)
        _check_pool(_count(test_list), max(k for _, k in pairs), "held-out", "n_test", pool)
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")

    if interventions not in (None, "none", "bias", "block"):
        raise WidthscopeError(f"interventions must be 'bias', 'block' or None, got {interventions!r}")
    if project is not None and (not isinstance(project, int) or project < 2):
        raise WidthscopeError(f"project must be an integer k >= 2 (projected dimension), got {project!r}")
    if project is not None and estimator != "unbiased":
        raise WidthscopeError("project: the projected moments are bias-corrected for the unbiased estimator only; "
                              "use estimator='unbiased'")
    return pairs, names, train_list, test_list, W, device


class _keep_prefix:
    """Around the held-out probe: :func:`widthscope.probe.prefix.keep_prefix` on the first ``K``
    held-out examples when the bias interventions will use it (``wanted``), else nothing;
    ``.kept`` is the record afterwards (or ``None``)."""

    def __init__(self, model: nn.Module, names: list[str], test_list: list[Any], K: int, *,
                 loss_fn: Callable | None, device: torch.device, wanted: bool):
        self.args = (model, names, test_list, K, loss_fn, device) if wanted else None
        self.kept: Any = None

    def __enter__(self) -> "_keep_prefix":
        if self.args is not None:
            from ..probe.collect import _to, float_dtype
            from ..probe.intervene import as_examples
            from ..probe.prefix import keep_prefix

            model, names, test_list, K, loss_fn, device = self.args
            dt = float_dtype(model)
            try:
                first = as_examples(test_list[:3])
            except WidthscopeError:  # batches that do not pool: the interventions say so themselves
                self.args = None
                return self
            self._cm = keep_prefix(model, names, first, K, loss_fn, lambda b: _to(b, device, dt))
            self.kept = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.args is not None:
            self._cm.__exit__(*exc)


def _probe_pools(model: nn.Module, names: list[str], train_list: list[Any], test_list: list[Any], *,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None, pool: str, train_mode: str,
                 progress: bool, project: int | None, seed: int,
                 keep: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """Probe this rank's shard of the train (*a*) and held-out (*b*) batches; with ``project``,
    each point's samples are projected as they stream (one projector per point); ``keep``: a
    context manager around the held-out probe (:class:`_keep_prefix`)."""
    projectors: dict[str, Any] = {}

    def _project(name: str, x: torch.Tensor) -> torch.Tensor:
        from ..stats.sketch import Projector

        if name not in projectors:  # same seed on every rank and for train/held-out
            projectors[name] = Projector(x.shape[1], project, seed=seed)
        return projectors[name](x)

    common = dict(points=names, loss_fn=loss_fn, pool=pool, train_mode=train_mode, progress=progress,
                  transform=_project if project else None)
    qa = collect(model, distributed.shard(train_list), **common)
    from contextlib import nullcontext

    with keep if keep is not None else nullcontext():
        qb = collect(model, distributed.shard(test_list), **common)
    return qa, qb, projectors


def _gather_pools(qa: Any, qb: Any, names: list[str], device: torch.device, projectors: dict[str, Any],
                  project: int | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, int]]:
    """All ranks' samples per point, and each point's (unprojected) dimension ``d``."""
    gathered_a = {name: _gather(qa[name], device) for name in names}
    gathered_b = {name: _gather(qb[name], device) for name in names}
    dims = {name: int(projectors[name].d if project else gathered_a[name].shape[1]) for name in names}
    return gathered_a, gathered_b, dims


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
    more = ("; --max-rel-step 1 (certify(max_rel_step=1)) extends it to a step as large as the activation"
            if max_rel_step < 1 else "")
    return [f"interventions: at {', '.join(held)} the largest step of the grid (rel_step {max_rel_step:g}) still "
            f"gave {lo if lo == hi else f'{lo}-{hi}'} of the predicted loss decrease, so the first-order step has "
            f"not broken down within the grid{more}"]


def _interventions(model: nn.Module, results: list[dict[str, Any]], qa: Any, qb: Any,
                   gathered_a: dict[str, torch.Tensor], gathered_b: dict[str, torch.Tensor],
                   train_list: list[Any], test_list: list[Any], pairs: list[tuple[int, int]],
                   device: torch.device, *, interventions: str | None, etas: Sequence[float] | None,
                   n_etas: int, max_rel_step: float, loss_fn: Callable[[Any, Any], torch.Tensor] | None, seed: int,
                   project: int | None, train_mode: str, on_point: Callable[[dict[str, Any]], None] | None,
                   kept: Any = None) -> None:
    """Add each point's ``interventions`` to its row (in place), handing each finished row to
    ``on_point``; the model's modes are restored. ``kept``: the held-out probe's record of the
    outputs before each point (the bias steps then run only the network after it)."""
    if interventions in ("bias", "block"):
        from ..probe.intervene import intervene

        m_max, k_max = max(m for m, _ in pairs), max(k for _, k in pairs)
        test_losses = _gather(qb.losses[:, None], device)[:, 0]  # all ranks' rows, in order
        was_training = {m: m.training for m in model.modules()}
        try:
            if train_mode == "eval":
                model.eval()
            for r in results:
                # Rank 0 only: every rank holds the full batch lists, the result is identical.
                # The bias probe reuses what the probe already measured (its samples, the
                # held-out losses, the activation scale): only the loss at each step is new.
                p = r["point"]
                reuse = None if project else {
                    "train": gathered_a[p], "test": gathered_b[p], "test_losses": test_losses,
                    "act_sq": _gather(qa.act_sq[p], device) if p in qa.act_sq else None,
                    "width": qa.widths.get(p), "prefix": kept}
                r["interventions"] = to_jsonable(
                    intervene(model, r["point"], train_list, test_list, etas=etas, n_etas=n_etas,
                              max_rel_step=max_rel_step, kind=interventions, loss_fn=loss_fn, M=m_max, K=k_max, seed=seed,
                              progress=False, reuse=reuse)
                ) if distributed.is_main() else []
                if on_point is not None:
                    on_point(r)
        finally:
            for m, mode in was_training.items():
                m.training = mode
    elif on_point is not None:
        for r in results:
            on_point(r)


def data_description(info: dict[str, Any], data: str | None = None) -> str:
    """The probe pools of a certify run in words (corpus, split rule, sizes) from the inputs' info."""
    from ..data import describe_name

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


# ----------------------------------------------------------------------------- CLI
# The published scripts' protocol: plug-in estimators, the summed (bias-gradient) sample vector,
# concatenated fixed-length chunks, the first chunks of each source, M = K in {16..128}, R = 1000.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "published": {"estimator": "plugin", "pool": "sum", "sequences": "concatenate", "first": True,
                  "M": "16,32,64,128", "K": None, "draws": 1000, "interventions": "none", "n_test": "all",
                  "empty_docs": "skip", "draw_scheme": "per-pair"},
    "default": {"estimator": "unbiased", "pool": "sum", "sequences": None, "first": False,
                "M": ",".join(map(str, DEFAULT_M)), "K": None, "draws": 1000, "interventions": "bias",
                "n_test": 256, "draw_scheme": "shared"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..cli_inputs import add_arguments as add_inputs

    add_inputs(parser, model_default="builtin", n_train=256, n_test=None,
               n_test_help="256; all with --protocol published")
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default="default",
                        help="published: what the published scripts do (plug-in estimator, sum pooling, "
                             "concatenated chunks, empty documents skipped, --first, every held-out chunk "
                             "(--n-test all), M = K in 16,32,64,128, 1000 draws, no interventions); "
                             "options you give explicitly override it")
    parser.add_argument("--batch-size", type=int, default=32, help="probe batch size (default 32)")
    parser.add_argument("--points", default=None,
                        help="comma-separated insertion points (default: every block output)")
    parser.add_argument("--list-points", action="store_true", help="print the insertion points and exit")
    parser.add_argument("--all", action="store_true",
                        help="with --list-points: every module path, not only the block outputs")
    parser.add_argument("--M", default=None, help="train sample sizes, comma list (default 16,32,64,128)")
    parser.add_argument("--K", default=None, help="held-out sample sizes, comma list (default: K = M)")
    parser.add_argument("--draws", type=int, default=None, help="resamples for empirical misalignment (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data subsets and resampling")
    parser.add_argument("--draw-scheme", choices=("shared", "per-pair"), default=None,
                        help="misalignment draws: shared (one subset per draw for every (M, K); default) or per-pair "
                             "(the published flip script's draws: the same --seed gives its subsets)")
    parser.add_argument("--estimator", choices=ESTIMATORS, default=None, help="unbiased (default) or plugin")
    parser.add_argument("--pool", choices=("sum", "mean", "flatten", "token"), default=None,
                        help="pooling of positions into a sample vector (default sum)")
    parser.add_argument("--train-steps", type=int, default=None,
                        help="optimizer steps for --model builtin (default 60, a few seconds)")
    parser.add_argument("--interventions", choices=("bias", "block", "none"), default=None,
                        help="direct zero-init residual intervention at every point: predicted vs "
                             "actual held-out loss change (default bias)")
    parser.add_argument("--etas", default=None,
                        help="intervention step sizes, comma list (default: --n-etas steps scaled to the point)")
    parser.add_argument("--n-etas", type=int, default=None, metavar="E",
                        help=f"steps of the default intervention grid: step RMS 1e-4..--max-rel-step of the "
                             f"activation's, log-spaced (default {DEFAULT_N_ETAS}: the decades up to "
                             f"{DEFAULT_MAX_REL_STEP:g}; --n-etas 9 --max-rel-step 1 gives the half-decades up to 1, "
                             "9/4 the cost)")
    parser.add_argument("--max-rel-step", type=float, default=None, metavar="R",
                        help=f"largest step of the default grid, its RMS entry over the activation's "
                             f"(default {DEFAULT_MAX_REL_STEP:g}; 1 moves the stream by its own size)")
    parser.add_argument("--project", type=int, default=None, metavar="K",
                        help="randomly project sample vectors to K dims while collecting (memory "
                             "O(n*K) instead of O(n*d)); see docs/performance.md")
    parser.add_argument("--out", default="widthscope-results/certify.json", help="JSON output path")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run: points finished by an earlier run with the same settings "
                             "(kept in OUT.parts/) are not probed again")
    parser.add_argument("--save-samples", default=None, metavar="FILE",
                        help="also write the pooled samples of every point (safetensors) for `widthscope stats`")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1")


def apply_protocol(args: argparse.Namespace) -> list[str]:
    """Fill the options the user left unset from ``--protocol``; returns the preset's notes."""
    preset = PROTOCOLS[args.protocol]
    for key, value in preset.items():
        if key == "n_test" and value == "all" and not _two_sources(args):
            value = PROTOCOLS["default"]["n_test"]  # one corpus to split: never read all of it by default
        if key == "first":
            args.first = bool(args.first or value)
        elif getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.protocol == "published":
        seqs = ("concatenated chunks (non-empty documents joined with EOS)" if args.sequences == "concatenate" else
                f"--sequences {args.sequences}")
        return [f"protocol 'published': plug-in estimators, sum pooling, {seqs}, the first sequences of each source, every chunk of a held-out source unless "
                "--n-test is given, M = K in 16,32,64,128, 1000 draws drawn as the flip script draws them; probed "
                "in eval mode (the alignment script probes in train mode: see docs/certify.md)"]
    return []


def _two_sources(args: argparse.Namespace) -> bool:
    """A held-out source of its own (--test-data, or a DatasetDict's validation split)."""
    if getattr(args, "test_data", None) is not None:
        return True
    data = getattr(args, "data", None)
    return isinstance(data, str) and (Path(data).expanduser() / "dataset_dict.json").is_file()


def _builtin_structure(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    """The built-in MLP, untrained (its points and shapes are checked before it trains), and its split."""
    from .. import data, models

    split = data.load("digits", seed=args.seed)
    torch.manual_seed(args.seed)
    model = models.build("mlp", 128, in_dim=int(split.input_shape[-1]), out_dim=split.num_classes, depth=3)
    model.widthscope_extra = {"dataset": "digits"}
    return model, split


def _train_builtin(model: nn.Module, split: Any, args: argparse.Namespace, say: Callable[[str], None]) -> None:
    from ..train import train

    t0 = time.perf_counter()
    res = train(model, split, steps=args.train_steps, lr=3e-3, batch_size=64, seed=args.seed,
                progress=distributed.is_main())
    acc = res.get("test_accuracy")
    say(f"builtin: MLP width 128, depth 3 trained on digits for {args.train_steps} steps "
        f"({time.perf_counter() - t0:.1f}s, held-out accuracy {acc if acc is None else f'{acc:.3f}'})")


def _check_combinations(args: argparse.Namespace, pairs: Sequence[tuple[int, int]], etas: Any) -> None:
    """Options that mean nothing together are refused (after --protocol filled the rest)."""
    preset = " (--protocol published)" if args.protocol == "published" else ""
    n_etas = getattr(args, "n_etas", None)
    if n_etas is not None and etas is not None:
        raise WidthscopeError("--n-etas sets the size of the default step grid, --etas replaces that grid: "
                              "drop one of them")
    top = getattr(args, "max_rel_step", None)
    if top is not None:
        from ..probe.intervene import check_rel_step

        try:
            check_rel_step(top)
        except WidthscopeError:
            raise WidthscopeError(f"--max-rel-step {top:g}: must be a finite number above the smallest step 1e-4 "
                                  "(e.g. 0.1, or 1 for a step as large as the activation)") from None
        if etas is not None:
            raise WidthscopeError("--max-rel-step sets the largest step of the default grid, --etas replaces that "
                                  "grid: drop one of them")
        if args.interventions == "none":
            raise WidthscopeError(f"--max-rel-step sets the largest intervention step, but none run{preset}: add "
                                  "--interventions bias (or block), or drop --max-rel-step")
    if etas is not None and args.interventions == "none":
        raise WidthscopeError(f"--etas sets the step sizes of the interventions, but none run{preset}: add "
                              "--interventions bias (or block), or drop --etas")
    if n_etas is not None and args.interventions == "none":
        raise WidthscopeError(f"--n-etas sets the number of intervention steps, but none run{preset}: add "
                              "--interventions bias (or block), or drop --n-etas")
    if args.project is not None and args.estimator != "unbiased":
        raise WidthscopeError(f"--project corrects the unbiased estimators only, not --estimator "
                              f"{args.estimator}{preset}: add --estimator unbiased, or drop --project")
    if args.all and not args.list_points:
        raise WidthscopeError("--all only changes what --list-points prints (every module path): add --list-points "
                              "or drop --all")
    if args.pool != "token":
        from ..validate import check_pools

        from ..data.published import is_all

        Ms, Ks = [m for m, _ in pairs], [k for _, k in pairs]
        # "all": the pool's size is known once the source is read (certify checks it then)
        check_pools(Ms, Ks, max(Ms) if is_all(args.n_train) else args.n_train,
                    max(Ks) if is_all(args.n_test) else args.n_test)


def _point_dims(model: nn.Module, names: Sequence[str], inputs: Any, args: argparse.Namespace
                ) -> tuple[dict[str, int], int]:
    """Each point's sample dimension and the sample rows per example, from one probed example
    (one forward and backward pass): what --project and the output sizes are checked against."""
    from ..probe.intervene import _index

    one = _index(inputs.train, slice(0, 1))
    q = collect(model, [one], points=list(names), loss_fn=inputs.loss_fn, pool=args.pool, progress=False)
    return {n: int(q[n].shape[1]) for n in names}, max(1, max(int(q[n].shape[0]) for n in names))


def _check_project(project: int | None, dims: dict[str, int]) -> None:
    if project is None or not dims:
        return
    d_max = max(dims.values())
    if project >= d_max:
        raise WidthscopeError(f"--project {project} is not below any point's dimension (the largest is d={d_max}): "
                              f"a projection saves memory only with K < d; use --project < {d_max} or drop it")


def _check_space(args: argparse.Namespace, names: Sequence[str], n_pairs: int, dims: dict[str, int],
                 rows: int) -> None:
    """Free space for what this run writes: the JSON (and its per-point parts, on disk at the same
    time) and the samples file. Over-estimates (about 1.3x the JSON measured on the built-in model)."""
    from .._io import check_space

    per_point = 2500 + 2500 * n_pairs + (6000 if args.interventions != "none" else 0)
    check_space(args.out, 2 * (4000 + len(names) * per_point), "the results (JSON and its per-point parts)")
    if args.save_samples:
        d = sum(args.project or v for v in dims.values())
        # float64 rows, and a header with the settings and each point's intervention rows
        check_space(args.save_samples, 8 * rows * (args.n_train + args.n_test) * d + 8000 + 6000 * len(names),
                    "the samples")


class _Parts:
    """Finished points of a certify run, one atomic JSON file each in ``OUT.parts/``, keyed by
    a fingerprint of everything that determines them (so ``--resume`` never mixes settings)."""

    def __init__(self, args: argparse.Namespace, names: Sequence[str], inputs_info: dict[str, Any]) -> None:
        import hashlib
        import json

        self.dir = Path(str(args.out) + ".parts")
        keys = ("model", "task", "dtype", "data", "train_data", "test_data", "train_split", "test_split",
                "text_field", "label_field", "tokenizer", "seq_len", "sequences", "first", "max_tokens",
                "test_fraction", "train_pool", "n_train", "n_test", "seed", "M", "K", "draws", "estimator",
                "pool", "interventions", "etas", "n_etas", "max_rel_step", "project", "batch_size", "train_steps", "protocol", "draw_scheme")
        self.settings = json.loads(json.dumps({k: getattr(args, k, None) for k in keys}
                                              | {"inputs": inputs_info, "points": list(names)}, default=str))
        blob = json.dumps(self.settings, sort_keys=True, default=str)
        self.fingerprint = hashlib.sha256(blob.encode()).hexdigest()[:16]
        self.written = 0
        from .._io import on_interrupt

        on_interrupt(self.describe)

    def _file(self, point: str) -> Path:
        return self.dir / f"{point.replace('/', '_')}.json"

    def load(self) -> dict[str, dict[str, Any]]:
        import json

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
        if other is not None and not done:
            raise WidthscopeError(self._mismatch(other))
        return done

    def _mismatch(self, other: dict[str, Any]) -> str:
        """--resume over parts of a run with other settings: name what differs, never start over silently."""
        diff = [k for k in self.settings if k in other and other[k] != self.settings[k]]
        shown = ", ".join(f"{'--' + k.replace('_', '-')} {other[k]} (now {self.settings[k]})"
                          if k not in ("inputs", "points") else f"the {k}" for k in diff[:3])
        return (f"--resume: {self.dir} holds finished points of a run with other settings "
                f"({shown or 'recorded by an older version'}): rerun with those settings to continue it, or drop "
                "--resume to start over (its parts are then replaced)")

    def save(self, row: dict[str, Any], notes: list[str]) -> None:
        atomic_write_json(self._file(row["point"]), {"fingerprint": self.fingerprint, "settings": self.settings,
                                                     "row": row, "notes": notes})
        self.written += 1

    def describe(self) -> str | None:
        n = len(list(self.dir.glob("*.json"))) if self.dir.is_dir() else 0
        return f"{n} finished point(s) in {self.dir} (rerun with --resume to continue)" if n else None

    def clear(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _certify_rest(model: nn.Module, inputs: Any, args: argparse.Namespace, todo: list[str], Ms: Any, Ks: Any,
                  etas: Any, samples: dict[str, Any], parts: _Parts, main: bool) -> dict[str, Any]:
    """certify() on the points still to do, writing each finished point as it completes."""
    from ..probe.intervene import to_batches

    notes_box: list[str] = []

    def keep(row: dict[str, Any]) -> None:
        if main:
            parts.save(row, notes_box)

    # Guarded: a failing rank stops every rank, and rank 0 writes only a complete result.
    return distributed.run_rank_guarded(
        certify, model, to_batches(inputs.train, args.batch_size), to_batches(inputs.test, args.batch_size),
        points=todo, M=Ms, K=Ks, draws=args.draws, seed=args.seed, estimator=args.estimator, pool=args.pool,
        loss_fn=inputs.loss_fn, progress=main,
        interventions=None if args.interventions == "none" else args.interventions,
        etas=etas, n_etas=DEFAULT_N_ETAS if getattr(args, "n_etas", None) is None else args.n_etas,
        max_rel_step=(DEFAULT_MAX_REL_STEP if getattr(args, "max_rel_step", None) is None else args.max_rel_step),
        project=args.project, samples_out=samples, on_point=keep, what="certify",
        draw_scheme=args.draw_scheme)


def _merge(res: dict[str, Any] | None, done: dict[str, dict[str, Any]], names: Sequence[str], Ms: Any, Ks: Any,
           args: argparse.Namespace) -> dict[str, Any]:
    """This run's points and the resumed ones, in the points' order, with one ranking."""
    rows = {r["point"]: r for r in (res["points"] if res else [])}
    rows.update({p: d["row"] for p, d in done.items() if p not in rows})
    points = [rows[n] for n in names]
    from ..stats import vacuous_rule

    for cert in (c[f] for pt in points for c in pt["certificates"] for f in ("one", "two")):
        vacuous_rule(cert)  # parts finished before the rule read as new ones do
    if res is None:  # every point was already finished
        pairs = _pairs(Ms, Ks)
        res = {"settings": {"M": [m for m, _ in pairs], "K": [k for _, k in pairs], "draws": args.draws,
                            "seed": args.seed, "estimator": args.estimator, "pool": args.pool, "train_mode": "eval",
                            "points": list(names), "world_size": distributed.world_size(),
                            "interventions": None if args.interventions == "none" else args.interventions,
                            "project": args.project, "draw_scheme": args.draw_scheme},
               "notes": [], "timing": {"probe_s": 0.0, "stats_s": 0.0, "intervene_s": 0.0}}
    res["settings"]["points"] = list(names)
    res["points"] = points
    res["ranking"] = ranking(points)
    if done:
        res["settings"]["resumed_points"] = sorted(done)
        res["notes"] = list(dict.fromkeys(res["notes"] + [n for d in done.values() for n in d.get("notes", [])]))
    return res


def run(args: argparse.Namespace) -> int:
    from ..cli_inputs import spec_from_args
    from ..data.inputs import load_model, resolve
    from ..models.hf import model_info

    main = distributed.is_main()

    def say(msg: str) -> None:
        if main:
            print(msg, flush=True)

    # Seeds, sizes, devices, data paths and outputs were checked by widthscope.validate
    # (cli.main), before this command started.
    protocol_notes = apply_protocol(args)
    Ms, Ks = _int_list(args.M, "--M"), _int_list(args.K, "--K")
    pairs = _pairs(Ms, Ks)  # validate before the (slow) model loading
    etas = _float_list(args.etas, "--etas")
    _check_combinations(args, pairs, etas)
    spec = spec_from_args(args, "certify")  # the inputs, validated before the model loads
    from ..train import resolve_device

    device = resolve_device(args.device)
    if device.type == "cuda" and device.index is None and distributed.is_distributed():
        import os  # torchrun: one GPU per rank
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", distributed.rank())))

    # The model's structure first (the built-in one untrained), so every check that needs it (point
    # names, sequence length, --project, output sizes) runs before training or probing.
    split = None
    if args.model == "builtin":
        model, split = _builtin_structure(args)
    else:
        model = load_model(args.model, dtype=args.dtype, task=args.task)
    if args.list_points:
        from ..probe import all_points, insertion_points
        say("\n".join(all_points(model) if args.all else insertion_points(model)))
        return 0
    names = resolve_points(model, args.points)
    inputs = resolve(spec, model=model, show_progress=main)
    from ..cli_inputs import settle_all
    from ..probe.intervene import _batch_size

    settle_all(args, _batch_size(inputs.train), _batch_size(inputs.test))
    dims, rows = _point_dims(model, names, inputs, args)
    _check_project(args.project, dims)
    parts = _Parts(args, names, inputs.info)
    done = parts.load() if args.resume else {}
    if done and args.save_samples:
        raise WidthscopeError("--save-samples needs every point probed in this run; drop --resume (or --save-samples)")
    todo = [n for n in names if n not in done]
    _check_space(args, names, len(pairs), dims, rows)
    if split is not None:
        _train_builtin(model, split, args, say)
        if args.dtype != "auto":
            model.to(getattr(torch, args.dtype))
    if done:
        say(f"resume: {len(done)} of {len(names)} point(s) already finished in {parts.dir}; probing {len(todo)}")
    model.to(device)
    # Guarded: a failing rank stops every rank, and rank 0 writes only a complete result.
    samples: dict[str, Any] = {}
    res = _certify_rest(model, inputs, args, todo, Ms, Ks, etas, samples, parts, main) if todo else None
    res = _merge(res, done, names, Ms, Ks, args)
    info = model_info(model)
    res["settings"].update(model=args.model, data=inputs.info.get("dataset") or inputs.data or args.train_data,
                           data_description=data_description(inputs.info, inputs.data or args.train_data),
                           train_data=args.train_data, test_data=args.test_data, task=inputs.task,
                           protocol=args.protocol, n_train=args.n_train, n_test=args.n_test,
                           batch_size=args.batch_size, device=str(device), inputs=inputs.info,
                           input_spec=inputs.spec.to_dict(),
                           **{k: info.get(k) for k in ("architecture", "width", "depth", "dtype", "parameters",
                                                      "attn_implementation")})
    for k in ("n_train_examples", "n_test_examples"):
        if k in inputs.info:
            res["settings"][k] = inputs.info[k]
    res["notes"] = protocol_notes + inputs.notes + res["notes"]
    if main:
        path = atomic_write_json(args.out, res)
        parts.clear()  # the complete result is on disk: the per-point parts are no longer needed
        if args.save_samples:
            from .samples import save

            save(args.save_samples, samples["train"], samples["test"],
                 {"settings": res["settings"], "notes": res["notes"], "dims": samples["dims"],
                  "interventions": {r["point"]: r.get("interventions", []) for r in res["points"]
                                    if "interventions" in r}})
            say(f"samples written to {args.save_samples} (widthscope stats {args.save_samples})")
        say(tables(res))
        say(f"\nprobe {res['timing']['probe_s']:.2f}s, statistics {res['timing']['stats_s']:.2f}s; "
            f"results written to {path}")
    distributed.barrier()
    return 0


if __name__ == "__main__":  # pragma: no cover
    from ..cli import main as _main

    sys.exit(_main(["certify", *sys.argv[1:]]))
