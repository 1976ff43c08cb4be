"""One cell of an alignment sweep: train, save, probe, certify, intervene and (optionally) monitor.

:func:`run_cell` returns the cell's rows (``kind`` ``alignment``, ``intervention`` and, for a
monitored family, ``monitor``; the columns are in docs/sweeps.md).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .. import checkpoint, models, probe, stats
from .. import data as wdata
from .._io import atomic_write_json
from ..monitor import AlignmentMonitor
from ..options import CertifyOptions
from ..stats import certified
from ..stats import certified_steps as steps
from ..train import train
from .config import FamilySpec, SweepConfig
from .grid import cell_id
from .placement import place_model, placement_text, release
from .pools import (
    cell_input_spec,
    fill_model_options,
    in_domain_condition,
    load_split,
    pool_batches,
    probe_conditions,
    probe_len,
    probe_lengths,
    probe_pools,
    probe_words,
)
from .results import cert_columns, smallest_step

__all__ = ["run_cell", "cell_options", "certified_steps", "MONITOR_FILE"]


def cell_options(cfg: SweepConfig, cell: Mapping[str, Any]) -> CertifyOptions:
    """The family's certify options, resampling seed = the cell's seed + ``certify.seed``."""
    fam = cfg.family(cell["family"])
    return fam.certify.replace(seed=int(cell["seed"]) + fam.certify.seed)


def run_cell(
    cfg: SweepConfig, cell: Mapping[str, Any], cell_dir: Path, *, show_progress: bool = True
) -> list[dict[str, Any]]:
    """Train, save, probe and certify one cell; return its rows (see docs/sweeps.md for columns)."""
    fam = cfg.family(cell["family"])
    seed, width, budget = int(cell["seed"]), cell["width"], int(cell["budget"])
    opts = cell_options(cfg, cell)
    split = load_split(fam, budget, cfg)
    torch.manual_seed(seed)
    model = models.build(fam.model, width, **fill_model_options(fam, split))
    mon, mon_info = cell_monitor(cfg, fam, split, model, opts, cell_dir) if fam.monitor is not None else (None, {})
    tr, train_s, monitor_s = _train(cfg, fam, cell, cell_dir, split, model, mon, show_progress)
    common: dict[str, Any] = {
        "model": fam.model,
        "dataset": fam.dataset,
        "n_params": int(models.count_parameters(model)),
        "data_description": "trained on " + wdata.describe(split),
    }
    trained = {k: tr.get(k) for k in ("train_loss", "test_loss", "test_accuracy", "steps")}
    key, placed = cell_id(cell), None
    try:
        if fam.placement:  # the trained model dispatched for the probe (docs/sweeps.md, Placement)
            placed = place_model(model, fam.placement, key)
        rows, seconds = _probe_rows(cfg, fam, split, model, opts, common, trained, show_progress)
    finally:
        release(fam.placement, key)
    if mon is not None:
        rows += _monitor_rows(mon, mon_info, fam, rows, common)
    text = placement_text(fam.placement, placed)
    for r in rows:
        r.update(train_s=train_s, **seconds)
        if text is not None:
            r["placement"] = text
        if mon is not None:
            r["monitor_s"] = monitor_s
    return rows


def _probe_rows(
    cfg: SweepConfig,
    fam: FamilySpec,
    split: Any,
    model: Any,
    opts: CertifyOptions,
    common: Mapping[str, Any],
    trained: Mapping[str, Any],
    show_progress: bool,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The alignment and intervention rows of a trained cell model; the seconds of probe, statistics, interventions."""
    points = list(opts.points or ()) or probe.insertion_points(model)
    rows: list[dict[str, Any]] = []
    iv_rows: list[dict[str, Any]] = []
    secs = dict.fromkeys(("probe_s", "stats_s", "intervene_s"), 0.0)
    for ci, cond in enumerate(probe_conditions(fam)):
        for li, L in enumerate(probe_lengths(fam, cond)):
            t0 = time.perf_counter()
            pa, pb, desc, _ = probe_pools(fam, cond, L, split, cfg)
            batches = tuple(pool_batches(pool, split.task, fam.probe_batch_size) for pool in (pa, pb))
            kw: dict[str, Any] = dict(points=points, pool=opts.pool, train_mode=opts.train_mode, progress=show_progress)
            Xa, Xb = (probe.collect(model, b, **kw) for b in batches)
            secs["probe_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            words: dict[str, Any] = {}
            if fam.probes is not None or fam.probe_seq_len is not None:
                in_domain = cond["data"] == (cond.get("test_data") or cond["data"]) == fam.dataset
                words = {"probe_set": cond["name"], "probe_data": desc, "probe_seq_len": probe_len(pa, split)}
                words |= {"probe_description": probe_words(cond, pa, pb, split)}
                words |= {"probe_in_domain": in_domain and not cond.get("shift")}
            these = _alignment_rows(opts, points, Xa, Xb, {**common, **trained}, words)
            secs["stats_s"] += time.perf_counter() - t0
            # interventions test the model's first-order prediction: on the first condition and length only
            t0 = time.perf_counter()
            if opts.kind is not None and ci == 0 and li == 0:
                iv_rows += _intervention_rows(model, opts, points, batches, these, common)
            secs["intervene_s"] += time.perf_counter() - t0
            rows += these
    rows += iv_rows
    return rows, secs


def _train(
    cfg: SweepConfig,
    fam: FamilySpec,
    cell: Mapping[str, Any],
    cell_dir: Path,
    split: Any,
    model: Any,
    mon: AlignmentMonitor | None,
    show_progress: bool,
) -> tuple[dict[str, Any], float, float]:
    """Train the cell's model (the monitor probing at its steps), save the checkpoint and its
    certify inputs; returns (training record, training seconds, monitor seconds)."""
    monitor_s = 0.0

    def on_step(m: Any, step: int) -> None:
        nonlocal monitor_s
        t = time.perf_counter()
        mon.step(m, step)  # type: ignore[union-attr]  # given to train() only with a monitor
        monitor_s += time.perf_counter() - t

    t0 = time.perf_counter()
    tr = train(
        model,
        split,
        seed=int(cell["seed"]),
        progress=show_progress,
        device=cfg.device,
        on_step=on_step if mon is not None else None,
        **fam.train,
    )
    train_s = time.perf_counter() - t0 - monitor_s  # the training alone; the probes are monitor_s
    checkpoint.save(
        model,
        cell_dir,
        extra={
            "sweep": cfg.name,
            "cell": dict(cell),
            "dataset": fam.dataset,
            "data_options": dict(fam.data_options),
            "data_seed": cfg.data_seed,
            "data_record": wdata.record(split),  # fitted / held-out parts: later probes draw from them
            "train": {k: v for k, v in tr.items() if k != "history"},
        },
    )
    atomic_write_json(
        cell_dir / "input_spec.json",
        {
            "input_spec": cell_input_spec(cfg, cell, cell_dir).to_dict(),
            "note": "widthscope certify inputs of this checkpoint (InputSpec.from_dict): train pool as "
            "the sweep's; held-out pool from the whole held-out part",
        },
    )
    return tr, train_s, monitor_s


def _alignment_rows(
    opts: CertifyOptions,
    points: Sequence[str],
    Xa: Mapping[str, Any],
    Xb: Mapping[str, Any],
    common: Mapping[str, Any],
    probe_columns: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """One ``kind="alignment"`` row per point and (M, K): both certificate forms and the empirical
    misalignment; ``probe_columns`` describe the probe condition."""
    npts = len(points)
    rows: list[dict[str, Any]] = []
    for pi, point in enumerate(points):
        a, b = Xa[point], Xb[point]
        m_one = stats.moments(a, opts.estimator)
        m_two = stats.cross_moments(a, b, opts.estimator)
        mis_all = stats.misalignment(a, b, pairs=opts.pairs, draws=opts.draws, seed=opts.seed, scheme=opts.draw_scheme)
        assert isinstance(mis_all, list)  # pairs given: one result per pair
        for (M, K), mis in zip(opts.pairs, mis_all):
            one = stats.certificate(m_one, M=M, K=K, populations="one")
            two = stats.certificate(m_two, M=M, K=K, populations="two")
            row: dict[str, Any] = {
                "kind": "alignment",
                **common,
                "point": point,
                "point_index": pi,
                "depth_fraction": (pi + 1) / npts,
                "n_points": npts,
                "d": int(a.shape[1]),
                "n_probe_train": int(a.shape[0]),
                "n_probe_test": int(b.shape[0]),
                "M": M,
                "K": K,
                "estimator": opts.estimator,
                "pool": opts.pool,
                "probe_notes": "; ".join(getattr(Xa, "notes", [])) or None,
                **probe_columns,
                "two_limit": None,  # named by the reporting rule
            }
            rows.append(cert_columns(row, vars(one), vars(two), vars(mis)))
    return rows


def _intervention_rows(
    model: Any,
    opts: CertifyOptions,
    points: Sequence[str],
    batches: tuple[list[Any], ...],
    these: list[dict[str, Any]],
    common: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The ``kind="intervention"`` rows of every point (at the largest M and K), and the ``iv_*`` columns of
    the smallest resolved step on ``these`` rows."""
    from ..probe.interventions import intervene  # noqa: PLC0415  call-time lookup: tests replace it there

    kw = {k: getattr(opts, k) for k in ("n_etas", "max_rel_step", "seed")}
    kw |= {"M": max(m for m, _ in opts.pairs), "K": max(k for _, k in opts.pairs), "kind": opts.kind or "bias"}
    out: list[dict[str, Any]] = []
    for pi, point in enumerate(points):
        etas = None if opts.etas is None else list(opts.etas)
        ivs = intervene(model, point, batches[0], batches[1], etas=etas, progress=False, **kw)
        iv_cols = smallest_step(ivs)
        for r in these:
            if r["point"] == point:
                r.update(iv_cols)
        out += [{**iv, **common, "point_index": pi} for iv in ivs]
    return out


MONITOR_FILE = "monitor.jsonl"  # in the cell's folder


def cell_monitor(
    cfg: SweepConfig, fam: FamilySpec, split: Any, model: Any, opts: CertifyOptions, cell_dir: Path
) -> tuple[AlignmentMonitor, dict[str, Any]]:
    """The cell's :class:`~widthscope.monitor.AlignmentMonitor` (pools of the monitor's sizes drawn by the
    certify rules, rows in ``cell_dir/monitor.jsonl``, emptied first: the cell trains from step 0) and its
    probe condition in words (``monitor_probe``, ``monitor_probe_seq_len``, ``monitor_probe_description``)."""
    m = fam.monitor
    assert m is not None
    path = cell_dir / MONITOR_FILE
    path.unlink(missing_ok=True)
    if m["probe"] is None:
        cond, L = in_domain_condition(fam), m["seq_len"]
    else:
        cond = next(c for c in fam.probes or [] if c["name"] == m["probe"])
        L = m["seq_len"] or probe_lengths(fam, cond)[0]
    sized = dataclasses.replace(fam, n_probe_train=m["n_train"], n_probe_test=m["n_test"])
    pa, pb, _, _ = probe_pools(sized, cond, L, split, cfg)
    model.to(cfg.device)  # train() would move it anyway; the monitor's dry probe runs where training will
    settings = {k: getattr(opts, k) for k in ("draws", "seed", "estimator", "pool")} | {
        "points": m["points"] or fam.points or None,
        "at": m["steps"],
        **{k: m[k] for k in ("M", "K", "delta")},
    }
    a, b = (pool_batches(pool, split.task, fam.probe_batch_size) for pool in (pa, pb))
    mon = AlignmentMonitor(model, a, b, out=path, progress=False, **settings)
    return mon, {
        "monitor_probe": cond["name"],
        "monitor_probe_seq_len": probe_len(pa, split),
        "monitor_probe_description": probe_words(cond, pa, pb, split),
    }


def certified_steps(rows: Sequence[Mapping[str, Any]], delta: float) -> tuple[int | None, int | None]:
    """``(first, from)`` over one point's monitor rows (any order), by
    :func:`widthscope.stats.certified_steps` with :func:`widthscope.stats.certified` at ``delta``.

    Example::

        >>> rows = [{"step": s, "vacuous": False, "b_exact": b} for s, b in ((0, .01), (5, .5), (9, .02))]
        >>> certified_steps(rows, 0.05)
        (0, 9)
    """
    return steps((int(r["step"]), certified(r.get("b_exact"), r.get("vacuous"), delta)) for r in rows)


def _monitor_rows(
    mon: AlignmentMonitor,
    info: Mapping[str, Any],
    fam: FamilySpec,
    rows: list[dict[str, Any]],
    common: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The cell's ``kind="monitor"`` rows (the monitor's, timings renamed ``monitor_probe_s`` /
    ``monitor_stats_s``, ``first_certified`` on a point's certified step); adds the
    :data:`MONITOR_SUMMARY` columns of its point to every alignment row."""
    m = fam.monitor
    assert m is not None
    first = {e["point"]: e for e in mon.events}
    summary = {k: info[k] for k in ("monitor_probe", "monitor_probe_seq_len")}
    summary |= {f"monitor_{k}": m[k] for k in ("delta", "M", "K", "n_train", "n_test")}
    summary |= {"monitor_steps_total": int(fam.train["steps"]), "monitor_steps": list(m["steps"])}
    since = {p: certified_steps([r for r in mon.rows if r["point"] == p], m["delta"])[1] for p in mon.points}
    for r in rows:
        if r.get("kind") == "alignment":
            e = first.get(r["point"])
            r.update(
                summary,
                monitor_point=r["point"] in mon.points,
                monitor_first_cert_step=None if e is None else int(e["step"]),
                monitor_first_cert_b_exact=None if e is None else e["b_exact"],
                monitor_cert_from_step=since.get(r["point"]),
            )
    out: list[dict[str, Any]] = []
    for r in mon.rows:
        row = {k: v for k, v in r.items() if k not in ("probe_s", "stats_s")}
        e = first.get(r["point"])
        row.update(
            kind="monitor",
            **common,
            monitor_probe_s=r["probe_s"],
            monitor_stats_s=r["stats_s"],
            first_certified=e is not None and int(e["step"]) == int(r["step"]),
            steps_total=int(fam.train["steps"]),
            estimator=mon.estimator,
            pool=mon.pool,
            **info,
        )
        out.append(row)
    return out
