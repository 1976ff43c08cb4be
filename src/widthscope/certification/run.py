"""A whole certify run, from typed settings: load the model, check everything that needs its
structure, train the built-in one, probe (resumably, point by point), write the result.

:func:`run_certify` is what ``widthscope certify`` calls once the command line has built a
:class:`CertifyJob` (no ``argparse`` here): the inputs (:class:`~widthscope.data.spec.InputSpec`),
the statistics (:class:`~widthscope.options.CertifyOptions`) and how this run executes
(:class:`~widthscope.options.CertifyRunOptions`, outputs, ``resume``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .. import _io, data, distributed, models
from .._io import LOCK, atomic_write_json, hold_lock, human_size, on_interrupt
from ..data.inputs import load_model, placement_of, resolve
from ..data.spec import InputSpec, is_all
from ..errors import WidthscopeError
from ..models.hf import model_info
from ..options import CertifyOptions, CertifyRunOptions
from ..probe import all_points, collect, insertion_points, resolve_points
from ..probe.batches import batch_size_of, index_batch, to_batches
from ..stats import vacuous_rule
from ..sweeps.certify_rows import training_record
from ..train import resolve_device, train
from .per_point import ranking, tables
from .pipeline import certify_dict, data_description, settings_block
from .samples import save

__all__ = ["CertifyJob", "run_certify", "list_points"]


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


# ----------------------------------------------------------------------------- the model, before any work
def _builtin_structure(seed: int) -> tuple[nn.Module, Any]:
    """The built-in MLP, untrained (its points and shapes are checked before it trains), and its split."""
    split = data.load("digits", seed=seed)
    torch.manual_seed(seed)
    model = models.build("mlp", 128, in_dim=int(split.input_shape[-1]), out_dim=split.num_classes, depth=3)
    model.widthscope_extra = {"dataset": "digits"}  # type: ignore[assignment]
    return model, split


def _train_builtin(model: nn.Module, split: Any, steps: int, seed: int, say: Callable[[str], None]) -> None:
    t0 = time.perf_counter()
    res = train(model, split, steps=steps, lr=3e-3, batch_size=64, seed=seed, progress=distributed.is_main())
    acc = res.get("test_accuracy")
    say(
        f"builtin: MLP width 128, depth 3 trained on digits for {steps} steps "
        f"({time.perf_counter() - t0:.1f}s, held-out accuracy {acc if acc is None else f'{acc:.3f}'})"
    )


def _load(spec: InputSpec, seed: int) -> tuple[nn.Module, Any]:
    if spec.model == "builtin":
        return _builtin_structure(seed)
    return load_model(
        spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision, placement=placement_of(spec)
    ), None


def list_points(spec: InputSpec, *, every_module: bool = False) -> list[str]:
    """The insertion points of the spec's model (every module path with ``every_module``)."""
    model, _ = _load(spec, spec.seed)
    return all_points(model) if every_module else insertion_points(model)


def _point_dims(model: nn.Module, names: Sequence[str], inputs: Any, pool: str) -> tuple[dict[str, int], int]:
    """Each point's sample dimension and the sample rows per example, from one probed example
    (one forward and backward pass): what --project and the output sizes are checked against."""
    one = index_batch(inputs.train, slice(0, 1))
    q = collect(model, [one], points=list(names), loss_fn=inputs.loss_fn, pool=pool, progress=False)
    return {n: int(q[n].shape[1]) for n in names}, max(1, max(int(q[n].shape[0]) for n in names))


def _check_project(project: int | None, dims: dict[str, int]) -> None:
    if project is None or not dims:
        return
    d_max = max(dims.values())
    if project >= d_max:
        raise WidthscopeError(
            f"--project {project} is not below any point's dimension (the largest is d={d_max}): "
            f"a projection saves memory only with K < d; use --project < {d_max} or drop it"
        )


def _check_space(job: CertifyJob, names: Sequence[str], dims: dict[str, int], rows: int, n: int) -> None:
    """Free space for what this run writes: the JSON (and its per-point parts, on disk at the same
    time) and the samples file; an over-estimate."""
    opts = job.options
    per_point = 2500 + 2500 * len(opts.pairs) + (6000 if opts.interventions != "none" else 0)
    _io.check_space(job.out, 2 * (4000 + len(names) * per_point), "the results (JSON and its per-point parts)")
    if job.save_samples:
        d = sum(opts.project or v for v in dims.values())
        # float64 rows, and a header with the settings and each point's intervention rows
        _io.check_space(job.save_samples, 8 * rows * n * d + 8000 + 6000 * len(names), "the samples")


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


def load_checkpoint(spec: InputSpec, seed: int) -> tuple[nn.Module, Any]:
    """The model as the run loads it (``--plan`` loads it the same way)."""
    return _load(spec, seed)


def run_device(name: str) -> torch.device:
    """The device the run probes on (``--device``, as the run resolves it)."""
    return _device()(name)


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    return device_memory("cpu")[0]


def _check_memory(project: int | None, dims: dict[str, int], rows: int, n_train: int, n_test: int) -> None:
    """The pooled samples stay in memory until the statistics are done (float64, train and held-out
    for every point): refuse, before training or probing, pools that cannot fit."""
    d = sum(project or v for v in dims.values())
    need = 8 * rows * (n_train + n_test) * d
    free = _available_memory()
    if free is not None and need > free:
        raise WidthscopeError(
            f"the samples need about {human_size(need)} of memory ({n_train} + {n_test} "
            f"examples x {rows} row(s) x {d} dimensions over {len(dims)} point(s), float64) but "
            f"only {human_size(free)} is available: lower --n-train/--n-test, choose fewer --points, "
            "or add --project"
        )


def _check_all_pools(opts: CertifyOptions, spec: InputSpec, n_train: int, n_test: int) -> None:
    """With ``--n-train all`` / ``--n-test all`` the pools' sizes are known once the source is read:
    check M/K against them then, before any training."""
    needs = (
        ("n_train", "M", max(m for m, _ in opts.pairs), "train", n_train),
        ("n_test", "K", max(k for _, k in opts.pairs), "held-out", n_test),
    )
    for flag, letter, need, pool, size in needs:
        if is_all(getattr(spec, flag)) and opts.pool != "token" and need > size:
            raise WidthscopeError(
                f"{letter}={need} is larger than the {pool} pool of {size} examples "
                f"(--{flag.replace('_', '-')} all took every one): lower --{letter}"
            )


# ----------------------------------------------------------------------------- resumable parts
def _parts_dir(out: str | os.PathLike) -> Path:
    return Path(str(out) + ".parts")


def _lock(job: CertifyJob) -> contextlib.AbstractContextManager[None]:
    """One run at a time writes ``--out`` and its parts: a second one is refused in one line before
    any work. The lock file lives in the run's own parts folder (``OUT.parts/.widthscope.lock``,
    as a sweep's lives in its results folder): a path certify already owns and checks as an output
    (a sibling such as ``OUT.lock`` could be a user's file), invisible to ``--resume`` (it reads
    ``*.json``), removed with the parts when the result is written, and removed (with the folder, if
    it holds nothing else) when the run ends any other way. After a ``kill -9`` it stays, harmless:
    the kernel released the lock."""
    out = str(job.out)

    def refuse(holder: str) -> WidthscopeError:
        return WidthscopeError(
            f"--out {out!r} is being written by another certify run ({holder}): wait for it to finish or "
            "stop it, or choose another --out"
        )

    return hold_lock(_parts_dir(out) / LOCK, refuse, what="certify run", where=out, tidy=True)


class _Parts:
    """Finished points of a certify run, one atomic JSON file each in ``OUT.parts/``, keyed by
    a fingerprint of everything that determines them (so ``--resume`` never mixes settings)."""

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
        self.written = 0
        on_interrupt(self.describe)

    def _file(self, point: str) -> Path:
        return self.dir / f"{point.replace('/', '_')}.json"

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
        if other is not None and not done:
            raise WidthscopeError(self._mismatch(other))
        return done

    def _mismatch(self, other: dict[str, Any]) -> str:
        """--resume over parts of a run with other settings: name what differs, never start over silently."""
        diff = [k for k in self.settings if k in other and other[k] != self.settings[k]]
        shown = ", ".join(
            f"{'--' + k.replace('_', '-')} {other[k]} (now {self.settings[k]})"
            if k not in ("inputs", "points")
            else f"the {k}"
            for k in diff[:3]
        )
        return (
            f"--resume: {self.dir} holds finished points of a run with other settings "
            f"({shown or 'recorded by an older version'}): rerun with those settings to continue it, or drop "
            "--resume to start over (its parts are then replaced)"
        )

    def save(self, row: dict[str, Any], notes: list[str]) -> None:
        atomic_write_json(
            self._file(row["point"]),
            {"fingerprint": self.fingerprint, "settings": self.settings, "row": row, "notes": notes},
        )
        self.written += 1

    def describe(self) -> str | None:
        n = len(list(self.dir.glob("*.json"))) if self.dir.is_dir() else 0
        return f"{n} finished point(s) in {self.dir} (rerun with --resume to continue)" if n else None

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _certify_rest(
    model: nn.Module, inputs: Any, job: CertifyJob, todo: list[str], samples: dict[str, Any], parts: _Parts, main: bool
) -> dict[str, Any]:
    """certify() on the points still to do, writing each finished point as it completes."""
    notes_box: list[str] = []

    def keep(row: dict[str, Any]) -> None:
        if main:
            parts.save(row, notes_box)

    bs = job.run.batch_size
    # Guarded: a failing rank stops every rank, and rank 0 writes only a complete result.
    return distributed.run_rank_guarded(
        certify_dict,
        model,
        to_batches(inputs.train, bs),
        to_batches(inputs.test, bs),
        options=job.options.replace(points=tuple(todo)),
        loss_fn=inputs.loss_fn,
        progress=main,
        samples_out=samples,
        on_point=keep,
        what="certify",
    )


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


# ----------------------------------------------------------------------------- the run
def _device() -> Callable[[str], torch.device]:
    def pick(name: str) -> torch.device:
        device = resolve_device(name)
        if device.type == "cuda" and device.index is None and distributed.is_distributed():
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", distributed.rank())))  # one GPU per rank
        return device

    return pick


def run_certify(
    job: CertifyJob, *, notes: Sequence[str] = (), say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run ``job``; writes ``job.out`` (and ``job.save_samples``) on rank 0 and returns the result.

    Every check that needs the model's structure (point names, sequence length, ``project``,
    output sizes, memory) runs before the built-in model trains or anything is probed. Rank 0,
    which writes, first takes the lock of ``job.out`` (another run writing it: refused, one line);
    under torchrun a refused rank 0 stops the job before its peers write anything."""
    with _lock(job) if distributed.is_main() else contextlib.nullcontext():
        return _run(job, notes, say)


def _run(job: CertifyJob, notes: Sequence[str], say: Callable[[str], None] | None) -> dict[str, Any]:
    main = distributed.is_main()
    say = say or (lambda msg: print(msg, flush=True) if main else None)
    spec, opts = job.spec, job.options
    device = _device()(job.run.device)
    model, split = _load(spec, opts.seed)
    names = resolve_points(model, list(opts.points) if opts.points else None)
    inputs = resolve(spec, model=model, show_progress=main)
    n_train, n_test = batch_size_of(inputs.train), batch_size_of(inputs.test)
    if not is_all(spec.n_train):
        n_train = int(spec.n_train)
    if not is_all(spec.n_test):
        n_test = int(spec.n_test)
    _check_all_pools(opts, spec, n_train, n_test)
    dims, rows = _point_dims(model, names, inputs, opts.pool)
    _check_project(opts.project, dims)
    parts = _Parts(job, names, (n_train, n_test), inputs.info)
    done = parts.load() if job.resume else {}
    if done and job.save_samples:
        raise WidthscopeError("--save-samples needs every point probed in this run; drop --resume (or --save-samples)")
    todo = [n for n in names if n not in done]
    _check_space(job, names, dims, rows, n_train + n_test)
    _check_memory(opts.project, dims, rows, n_train, n_test)
    if split is not None:
        _train_builtin(model, split, job.run.train_steps, opts.seed, say)
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
    res = _certify_rest(model, inputs, job, todo, samples, parts, main) if todo else None
    res = _merge(res, done, names, opts)
    info = model_info(model)
    recorded = spec.to_dict()  # objects in memory are recorded as "<in memory: ...>"
    res["settings"].update(
        model=recorded["model"],
        data=inputs.info.get("dataset") or inputs.data or recorded["train_data"],
        data_description=data_description(inputs.info, inputs.data or recorded["train_data"]),
        train_data=recorded["train_data"],
        test_data=recorded["test_data"],
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
    for k in ("n_train_examples", "n_test_examples"):
        if k in inputs.info:
            res["settings"][k] = inputs.info[k]
    trained = training_record(getattr(model, "widthscope_extra", None))
    if trained:  # the checkpoint's training record (steps, final losses): the report's provenance table
        res["settings"]["training"] = trained
    if "placement" in info:  # a dispatched model: where its layers ran (docs/big-models.md)
        res["settings"]["placement"] = info["placement"]
    res["notes"] = list(notes) + inputs.notes + res["notes"]
    res["options"] = job.record()
    if main:
        path = atomic_write_json(job.out, res)
        parts.clear()  # the complete result is on disk: the per-point parts are no longer needed
        if job.save_samples:
            save(
                job.save_samples,
                samples["train"],
                samples["test"],
                {
                    "settings": res["settings"],
                    "notes": res["notes"],
                    "dims": samples["dims"],
                    "interventions": {
                        r["point"]: r.get("interventions", []) for r in res["points"] if "interventions" in r
                    },
                },
            )
            say(f"samples written to {job.save_samples} (widthscope stats {job.save_samples})")
        say(tables(res))
        say(
            f"\nprobe {res['timing']['probe_s']:.2f}s, statistics {res['timing']['stats_s']:.2f}s; "
            f"results written to {path}"
        )
    distributed.barrier()
    return res
