"""One validation layer for the options commands share, run before any command starts work.

``widthscope.cli`` calls :func:`check_args` on the parsed arguments of every command, so the same
bad value gets the same one-line message everywhere: seeds, sizes and counts, step sizes,
devices, thread counts, and output paths (writable *before* any work, so a result is never
computed and then lost). Checks that need the model or the data (``M``/``K`` against the pools,
sequence length against the position embeddings, tokens against the vocabulary) live in the
input layer (:mod:`widthscope.data.inputs`) and :func:`check_pools`, which every command calls.

Example::

    >>> import argparse
    >>> from widthscope.validate import check_args
    >>> check_args(argparse.Namespace(seed=-1), "certify")
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --seed -1: must be a whole number in 0..4294967295
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from .errors import WidthscopeError

__all__ = ["check_args", "check_pools", "check_dir_writable", "OUT_KIND"]

# (attribute, smallest allowed value, what it counts)
_COUNTS = (("n_train", 4, "examples; the unbiased estimators need at least 4"),
           ("n_test", 4, "examples; the unbiased estimators need at least 4"),
           ("batch_size", 1, "examples per batch"), ("draws", 1, "resamples"), ("steps", 1, "steps"),
           ("train_steps", 1, "steps"), ("seq_len", 2, "tokens (one input and one predicted token)"),
           ("max_tokens", 1, "tokens"), ("threads", 1, "threads"), ("block_width", 1, "hidden units"),
           ("project", 2, "projected dimensions"), ("n_rank", 4, "examples"))
_POSITIVE = ("lr", "eta")
# Which commands write a file (--out FILE) and which a directory (--out DIR).
OUT_KIND = {"certify": "file", "grow": "file", "grow-bench": "dir", "stats": "file", "sweep": "dir", "report": "dir",
            "demo": "dir", "linearize": "dir"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_dir_writable(path: str | os.PathLike) -> Path:
    """``path`` is (or can be made) a directory we can write into. Leaves nothing behind: folders
    it had to create for the probe are removed again, so a run refused later (a bad config) leaves
    no empty ``--out``; the command creates the folder when it starts writing."""
    from ._io import _unwritable

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise WidthscopeError(f"cannot write into {str(p)!r}: it is a file, not a directory; choose another --out")
    created = [q for q in (p, *p.parents) if not q.exists()]
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".widthscope-", suffix=".probe", dir=p)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise _unwritable(p / "…", exc) from None
    finally:
        for q in created:  # innermost first; only if still empty (another process may have filled it)
            try:
                q.rmdir()
            except OSError:
                break
    return p


def check_args(args: argparse.Namespace, command: str) -> None:
    """The shared checks; raises :class:`WidthscopeError` with one line naming the option."""
    seed = getattr(args, "seed", None)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32):
        raise WidthscopeError(f"--seed {seed}: must be a whole number in 0..{2 ** 32 - 1}")
    for name, lo, what in _COUNTS:
        v = getattr(args, name, None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise WidthscopeError(f"{_flag(name)} {v}: must be a whole number >= {lo} ({what})")
    for name in _POSITIVE:
        v = getattr(args, name, None)
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise WidthscopeError(f"{_flag(name)} {v}: must be a positive finite number")
    for name in ("data", "train_data", "test_data"):
        v = getattr(args, name, None)
        if isinstance(v, str):
            from .data import DATASETS

            if v not in DATASETS and not Path(v).expanduser().exists():
                raise WidthscopeError(f"{_flag(name)} {v!r}: not a dataset name ({', '.join(DATASETS)}) and not an "
                                      "existing file or directory")
            if v not in DATASETS:  # a binary file given as text: refused before any model loads
                from .data.corpus import precheck

                precheck(v, _flag(name))
    device = getattr(args, "device", None)
    if isinstance(device, str):
        from .train import resolve_device

        resolve_device(device)
    out = getattr(args, "out", None)
    if out and OUT_KIND.get(command) == "file":
        from ._io import check_writable

        check_writable(out)
    elif out and OUT_KIND.get(command) == "dir":
        check_dir_writable(out)
    extra = getattr(args, "save_samples", None)
    if extra:
        from ._io import check_writable

        check_writable(extra)


def check_pools(M: int | list[int], K: int | list[int], n_train: int, n_test: int, *,
                train_flag: str = "--n-train", test_flag: str = "--n-test", test_pool: str = "held-out pool") -> None:
    """``M``/``K`` (draws without replacement) must fit the train/held-out pools."""
    m = max(M) if isinstance(M, (list, tuple)) else M
    k = max(K) if isinstance(K, (list, tuple)) else K
    if m > n_train:
        raise WidthscopeError(f"M={m} is larger than the train pool of {n_train} examples: raise {train_flag} "
                              "or lower --M")
    if k > n_test:
        raise WidthscopeError(f"K={k} is larger than the {test_pool} of {n_test} examples: raise {test_flag} "
                              "or lower --K")
