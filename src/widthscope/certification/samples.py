"""Pooled samples as an artifact, and ``widthscope stats``: certificates without a model.

``certify --save-samples FILE`` writes safetensors ``train/<point>``, ``test/<point>`` (float64) with the
settings as metadata; ``widthscope stats`` recomputes certificates from it or from ``.npy``/``.npz``/``.pt``.

Example::

    >>> import tempfile, torch
    >>> from widthscope.certification.samples import save, load
    >>> d = tempfile.mkdtemp()
    >>> a, b = {"p": torch.randn(8, 3, dtype=torch.float64)}, {"p": torch.randn(8, 3, dtype=torch.float64)}
    >>> _ = save(f"{d}/s.safetensors", a, b, {"settings": {"M": [4]}})
    >>> tr, te, meta = load(f"{d}/s.safetensors")
    >>> bool(torch.equal(tr["p"], a["p"])), meta["settings"]
    (True, {'M': [4]})
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import _io  # _io.check_space looked up at call time (tests replace it)
from .._io import Skipped, atomic_write_json, record_skips, refuse_skips, to_jsonable, warn_skips
from ..errors import WidthscopeError
from ..options import ESTIMATORS, MAX_POOL, Estimator, Options, option
from ..validate import pairs_of
from .per_point import ranking, statistics

__all__ = ["save", "load", "load_matrices", "recompute", "run_stats", "StatsOptions"]

FORMAT = "widthscope-samples-1"


def save(
    path: str | os.PathLike, train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], meta: dict[str, Any]
) -> Path:
    """Write samples and their metadata atomically (temporary file + rename)."""
    from safetensors.torch import save_file

    tensors = {f"train/{k}": v.detach().to("cpu", torch.float64).contiguous() for k, v in train.items()}
    tensors.update({f"test/{k}": v.detach().to("cpu", torch.float64).contiguous() for k, v in test.items()})
    header = {
        "format": FORMAT,
        "points": json.dumps(list(train)),
        **{k: json.dumps(to_jsonable(v)) for k, v in meta.items()},
    }
    try:
        return _io.atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=header))
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":
            raise
        # safetensors reports a full disk as its own error type: one line, as checkpoint.save does
        raise WidthscopeError(
            f"cannot write {str(path)!r}: {exc} (disk full or not writable?); free space or choose another path"
        ) from None


# metadata that decides the numbers: damaged, the file cannot be used (other keys are skipped with a note)
_ESSENTIAL = ("points", "settings", "dims")
_REWRITE = "write it again with certify --save-samples"


def load(
    path: str | os.PathLike, problems: list | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(train, test, meta) of a :func:`save` file; damaged optional metadata is skipped (into ``problems``)."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        raise WidthscopeError(
            f"samples file {str(path)!r} is a directory: give the file certify --save-samples FILE "
            "wrote (or --train/--test matrices)"
        )
    if not path.is_file():
        raise WidthscopeError(f"samples file {str(path)!r} does not exist (certify --save-samples FILE writes one)")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            # clone: torch-allocated (aligned) memory, so BLAS sums in the same order as in certify
            tensors = {k: f.get_tensor(k).clone() for k in f.keys()}
    except Exception as exc:
        raise WidthscopeError(
            f"{path} is not a safetensors samples file ({exc}); for .npy/.npz/.pt matrices use --train and --test"
        ) from None
    if header.get("format") != FORMAT:
        raise WidthscopeError(
            f"{path} is a safetensors file but not widthscope samples (no format "
            f"{FORMAT!r} in its metadata): write one with certify --save-samples"
        )

    def damaged(why: str) -> WidthscopeError:
        return WidthscopeError(f"samples file {path}: {why}; the file is damaged: {_REWRITE}")

    if "points" not in header:
        raise damaged("its metadata has no 'points' (which points the tensors are)")
    meta: dict[str, Any] = {}
    found = []
    for k, v in header.items():
        if k == "format":
            continue
        try:
            meta[k] = json.loads(v)
        except json.JSONDecodeError as exc:
            why = f"metadata {k!r} is not JSON ({exc.msg} at char {exc.pos})"
            if k in _ESSENTIAL:
                raise damaged(why) from None
            found.append(Skipped(str(path), None, why))
    points = meta.pop("points")
    if not (isinstance(points, list) and points and all(isinstance(p, str) for p in points)):
        raise damaged(f"metadata 'points' is not a list of point names (got {str(points)[:60]})")
    for p in points:
        for split in ("train", "test"):
            t = tensors.get(f"{split}/{p}")
            if t is None:
                raise damaged(f"point {p!r} has no {split!r} tensor ('{split}/{p}' is missing)")
            if t.ndim != 2 or not t.is_floating_point():
                raise damaged(f"tensor '{split}/{p}' has shape {tuple(t.shape)} {t.dtype}, not a (B, N) float matrix")
    record_skips(found, problems)
    return ({p: tensors[f"train/{p}"] for p in points}, {p: tensors[f"test/{p}"] for p in points}, meta)


def _read_pt(path: Path) -> Any:
    """``torch.load(weights_only=True)`` with one clear line (and no torch warning) for a pickle."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" (e.g. {found.group(1)})" if found else ""
        raise WidthscopeError(
            f"{path} holds pickled Python objects{what}, which are never loaded (no code from a "
            "file runs): save plain tensors, torch.save({name: tensor}), or .npy/.npz"
        ) from None


def _matrix_file(path: Path, point: str | None) -> dict[str, torch.Tensor]:
    if path.is_dir():
        raise WidthscopeError(f"{path} is a directory: give a .npy, .npz or .pt file of sample matrices")
    if not path.is_file():
        raise WidthscopeError(f"{path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            arrays = {point or path.stem: np.load(path, allow_pickle=False)}
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        elif suffix in (".pt", ".pth"):
            obj = _read_pt(path)
            arrays = {point or path.stem: obj} if isinstance(obj, torch.Tensor) else obj
            if not isinstance(arrays, dict):
                raise WidthscopeError(
                    f"{path} holds a {type(obj).__name__}: expected a (B, N) tensor or a dict of them"
                )
        else:
            raise WidthscopeError(f"{path}: expected .npy, .npz or .pt sample matrices")
    except WidthscopeError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise WidthscopeError(
            f"{path} could not be read as sample matrices ({type(exc).__name__}: {first}); "
            "pickled objects are never loaded"
        ) from None
    out = {}
    for k, v in arrays.items():
        t = torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v)
        if t.ndim != 2 or not (t.is_floating_point()):
            raise WidthscopeError(
                f"{path}: {k!r} has shape {tuple(t.shape)} {t.dtype}; sample matrices are "
                "(B, N) float arrays, one row per example"
            )
        out[str(k)] = t.to(torch.float64)
    return out


def load_matrices(
    train: str, test: str, point: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Train/held-out sample matrices from ``.npy``/``.npz``/``.pt`` files, matched by point name."""
    a, b = _matrix_file(Path(train), point), _matrix_file(Path(test), point)
    if len(a) == 1 and len(b) == 1 and set(a) != set(b):
        b = {next(iter(a)): next(iter(b.values()))}  # one matrix each: the same point
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise WidthscopeError(
            f"train and held-out files hold different points ({', '.join(missing[:5])}): "
            "give matrices for the same layers"
        )
    for k in a:
        if a[k].shape[1] != b[k].shape[1]:
            raise WidthscopeError(f"point {k!r}: train has {a[k].shape[1]} columns, held-out {b[k].shape[1]}")
    return a, b


def recompute(
    train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], meta: dict[str, Any], **overrides: Any
) -> dict[str, Any]:
    """The certify result from samples, with the saved settings updated by ``overrides``."""
    defaults = {"draws": 1000, "seed": 0, "estimator": "unbiased", "pool": "sum", "draw_scheme": "shared"}
    settings = {**defaults, **(meta.get("settings") or {}), **{k: v for k, v in overrides.items() if v is not None}}
    if settings["estimator"] not in ("unbiased", "plugin"):
        raise WidthscopeError(f"--estimator {settings['estimator']!r}: choose unbiased or plugin")
    Ks = settings.get("K")
    pairs = pairs_of(settings.get("M") or [16, 32, 64, 128], Ks)
    settings["M"], settings["K"] = [m for m, _ in pairs], [k for _, k in pairs]
    project = settings.get("project")
    if project and (overrides.get("estimator") or "unbiased") != "unbiased":
        raise WidthscopeError("projected samples support the unbiased estimator only")
    results, _ = statistics(
        train,
        test,
        pairs=pairs,
        draws=int(settings["draws"]),
        seed=int(settings["seed"]),
        estimator=settings["estimator"],
        pool=settings["pool"],
        project=project,
        dims=meta.get("dims"),
        draw_scheme=settings["draw_scheme"],
    )
    recorded = meta.get("interventions") or {}
    for r in results:
        if r["point"] in recorded:
            r["interventions"] = recorded[r["point"]]
    return {
        "settings": settings,
        "points": results,
        "ranking": ranking(results),
        "notes": list(meta.get("notes") or []),
        "timing": {},
    }


def _select(
    train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], meta: dict[str, Any], point: str, source: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Only the points named by ``--point`` (comma list); an unknown name is refused."""
    wanted = [p.strip() for p in point.split(",") if p.strip()]
    for w in wanted:
        if w not in train:
            raise WidthscopeError(
                f"--point {w!r}: {source} holds no such point; it has {', '.join(list(train)[:8])}"
                f"{', ...' if len(train) > 8 else ''}"
            )
    meta = dict(meta)
    meta["settings"] = {**(meta.get("settings") or {}), "points": wanted}
    if meta.get("dims"):
        meta["dims"] = {w: meta["dims"][w] for w in wanted if w in meta["dims"]}
    return {w: train[w] for w in wanted}, {w: test[w] for w in wanted}, meta


@dataclasses.dataclass(frozen=True)
class StatsOptions(Options):
    """The settings of ``widthscope stats`` (:func:`run_stats`); ``None`` keeps what the samples file saved."""

    samples: str | None = option(None, cli=False, help="a samples file written by certify --save-samples")
    train: str | None = option(None, kind="str", help="train sample matrices (.npy/.npz/.pt), with --test")
    test: str | None = option(None, kind="str", help="held-out sample matrices (.npy/.npz/.pt), with --train")
    point: str | None = option(
        None,
        kind="str",
        help="the point(s) to compute, comma list (default: every point of the file); also names the "
        "point of a single .npy/.pt matrix",
    )
    M: tuple[int, ...] | None = option(
        None, kind="ints", lo=1, hi=MAX_POOL, help="train sample sizes, comma list (default: the saved ones)"
    )
    K: tuple[int, ...] | None = option(
        None, kind="ints", lo=1, hi=MAX_POOL, help="held-out sample sizes, comma list (default: K = M)"
    )
    draws: int | None = option(
        None, kind="int", lo=1, hi=10**6, unit="resamples", help="misalignment resamples (default: saved, else 1000)"
    )
    seed: int | None = option(None, kind="int", lo=0, hi=2**32 - 1, help="resampling seed (default: saved, else 0)")
    estimator: Estimator | None = option(
        None, kind="str", choices=ESTIMATORS, help="unbiased or plugin (default: saved, else unbiased)"
    )
    strict: bool = option(
        False,
        help="refuse a samples file with damaged optional metadata "
        "(notes, recorded interventions) instead of skipping it with a note",
    )

    def check(self) -> None:
        if self.samples is not None and (self.train or self.test):
            raise WidthscopeError("give a samples file or --train/--test matrices, not both")

    def sources(self, **given: Any) -> StatsOptions:
        """These options with the sources ``given`` replacing all the recorded ones."""
        if not any(v is not None for v in given.values()):
            return self
        return self.replace(**{"samples": None, "train": None, "test": None, **given})


def run_stats(
    samples: str | os.PathLike | None = None,
    *,
    train: str | None = None,
    test: str | None = None,
    point: str | None = None,
    M: list[int] | None = None,
    K: list[int] | None = None,
    draws: int | None = None,
    seed: int | None = None,
    estimator: str | None = None,
    out: str | None = None,
    strict: bool = False,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``widthscope stats``: the result recomputed from a samples file or matrices, reported and written to ``out``."""
    opts = StatsOptions(
        samples=None if samples is None else str(samples),
        train=train,
        test=test,
        point=point,
        M=tuple(M) if isinstance(M, (list, tuple)) else M,
        K=tuple(K) if isinstance(K, (list, tuple)) else K,
        draws=draws,
        seed=seed,
        estimator=estimator,  # type: ignore[arg-type]  # checked by the dataclass
        strict=strict,
    )
    M = None if opts.M is None else list(opts.M)
    K = None if opts.K is None else list(opts.K)
    if samples is not None:
        skipped: list = []
        a, b, meta = load(samples, skipped)
        if skipped and strict:
            raise refuse_skips(skipped, f"{_REWRITE}, or drop --strict to skip the damaged metadata")
        warn_skips(skipped, "widthscope stats")
        source = {"samples": str(samples)}
    else:
        if not (train and test):
            raise WidthscopeError("give a samples file (certify --save-samples) or --train and --test matrices")
        a, b = load_matrices(train, test, point)
        meta = {"settings": {"points": list(a)}, "dims": {k: int(v.shape[1]) for k, v in a.items()}}
        source = {"train": train, "test": test}
    if point is not None:
        a, b, meta = _select(a, b, meta, point, str(samples or train))
    if M is not None and K is None:
        K = M  # new M without K: pair them, as certify does
    if out:
        n_pairs = len(M or (meta.get("settings") or {}).get("M") or [0] * 4)
        _io.check_space(out, 4000 + len(a) * (5000 + 5000 * n_pairs))
    res = recompute(a, b, meta, M=M, K=K, draws=draws, seed=seed, estimator=estimator)
    res["source"] = source
    res["options"] = {"stats": opts.to_dict()}  # StatsOptions.from_dict repeats the run
    if report is not None:
        report(res)
    if out:
        atomic_write_json(out, res)
    return res
