"""The rules of the checks every command shares (applied by :func:`widthscope.cli.checks.check_args`):
ranges and fit read off the options' fields (:data:`RANGES`, :data:`APPLIES`), paths, ``M``/``K`` vs the pools.

Example::

    >>> from widthscope.validate import check_pools
    >>> check_pools([16, 64], 8, n_train=32, n_test=32)
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: M=64 is larger than the train pool of 32 examples: raise --n-train or lower --M
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ._io import check_writable
from .errors import WidthscopeError
from .hub import local_directory
from .options import MAX_POOL, SHARED

_THREADS = ("threads", 1, 4096, "threads")  # a setting of the process, declared here


def _int_rows(fields: Any, kinds: tuple[str, ...], skip: set[str]) -> list[tuple[str, int, int | None, str]]:
    """(name, smallest, largest, unit) of every whole-number field with a lower bound, first one first."""
    rows: dict[str, tuple[str, int, int | None, str]] = {}
    for f in fields:
        m = f.metadata
        if m.get("kind") in kinds and m.get("lo") is not None and f.name not in skip and f.name not in rows:
            rows[f.name] = (f.name, int(m["lo"]), None if m.get("hi") is None else int(m["hi"]), m.get("unit") or "")
    return list(rows.values())


def __getattr__(name: str) -> Any:
    """``RANGES``, ``POSITIVE``, ``INPUT_OPTIONS`` and ``APPLIES`` (per command), read off the fields of
    :class:`~widthscope.data.spec.InputSpec` and of the options classes with ``SHARED_RANGES`` imported so far."""
    if name == "INPUT_OPTIONS":
        return _input_options()
    if name == "APPLIES":
        return {command: {**_input_options(), **own} for command, own in _COMMAND_APPLIES.items()}
    fields = [f for cls in SHARED for f in dataclasses.fields(cls)]
    if name == "RANGES":
        from .data.spec import InputSpec  # noqa: PLC0415  start-up time: torch

        lists = {f.name for f in fields if f.metadata.get("kind") in ("ints", "floats")}
        inputs = _int_rows(dataclasses.fields(InputSpec), ("int", "pool"), set())
        return (*inputs, _THREADS, *_int_rows(fields, ("int",), lists | {"seed"}))  # the seed: its own check
    if name == "POSITIVE":
        return tuple(dict.fromkeys(f.name for f in fields if f.metadata.get("positive")))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Which commands write a file (--out FILE) and which a directory (--out DIR).
OUT_KIND = dict.fromkeys(("certify", "grow", "stats"), "file") | dict.fromkeys(
    ("grow-bench", "grow-target", "sweep", "report", "demo", "linearize"), "dir"
)


# ----------------------------------------------------------------------------- which option fits which model
# The input kinds of `certify` and `grow` (``--model``): what each is, and its name in a list.
_NAMES = {
    "builtin": ("the built-in MLP (trained on its own digits split)", "--model builtin"),
    "widthscope-classifier": ("a widthscope classifier checkpoint (named datasets)", "widthscope classifiers"),
    "widthscope-lm": ("a widthscope byte-level LM checkpoint", "widthscope byte LMs"),
    "hf-causal-lm": ("a Hugging Face causal LM", "HF causal LMs"),
    "hf-masked-lm": ("a Hugging Face masked LM", "HF masked LMs"),
    "hf-sequence-classification": ("a Hugging Face sequence classifier", "HF sequence classifiers"),
    "hf-image-classification": ("a Hugging Face image classifier", "HF image classifiers"),
}
KINDS = {kind: what for kind, (what, _) in _NAMES.items()}
_ALL = frozenset(KINDS)
_CKPT = _ALL - {"builtin"}
_HF = frozenset(k for k in KINDS if k.startswith("hf-"))
_HF_TEXT = _HF - {"hf-image-classification"}
_TEXT = _HF_TEXT | {"widthscope-lm"}
_WS = frozenset({"widthscope-classifier", "widthscope-lm"})
# The groups of input kinds an InputSpec field may apply to (``applies=``); refused for any other kind.
GROUPS: dict[str, frozenset[str]] = {
    "all": _ALL,
    "checkpoints": _CKPT,
    "hf": _HF,
    "text": _TEXT,
    "widthscope": _WS,
    "two_sources": _CKPT - {"widthscope-classifier"},
    "hf_sequence_classifiers": frozenset({"hf-sequence-classification"}),
    "splittable": _TEXT | {"hf-image-classification"},
}
# A command's own changes to the input options' groups.
_COMMAND_APPLIES: dict[str, dict[str, frozenset[str]]] = {
    "certify": {"first": _ALL, "train_steps": frozenset({"builtin"})},
    "grow": {},
}


def _input_options() -> dict[str, frozenset[str]]:
    """option (argparse dest) -> the input kinds where it means something: the InputSpec fields' groups."""
    from .data.spec import InputSpec  # noqa: PLC0415  start-up time: torch

    return {f.name: GROUPS[f.metadata["applies"]] for f in dataclasses.fields(InputSpec) if f.metadata.get("applies")}


def input_kind(model: str | None, task: str | None = None, revision: str | None = None) -> str | None:
    """The :data:`KINDS` entry of ``--model`` from its ``config.json`` alone (a hub id: its cached
    snapshot, never downloaded); None when it cannot tell."""
    if model is None or model == "builtin":
        return model
    p = local_directory(model, revision)
    if p is None:
        return None
    cfg_path = p / "config.json" if p.is_dir() else p.parent / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    if "widthscope_format" in cfg:
        fam = (cfg.get("model") or {}).get("family")
        return "widthscope-lm" if fam in ("llama", "pythia") else "widthscope-classifier"
    try:
        from .models.hf import hf_task  # noqa: PLC0415  start-up time: torch

        return f"hf-{hf_task(cfg, str(cfg_path))}"
    except WidthscopeError:  # no architecture named: --task decides (the loader checks it)
        return f"hf-{task}" if task else None


def group_words(kinds: frozenset[str]) -> str:
    names = ", ".join(short for k, (_, short) in _NAMES.items() if k in kinds)
    for group, word in (
        (_HF, "Hugging Face checkpoints"),
        (_TEXT, "text models"),
        (_CKPT, "checkpoints"),
        (_WS, "widthscope checkpoints"),
    ):
        if kinds == group:
            return f"{word} ({names})"
    return names


def check_dir_writable(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` is (or can be made) a directory we can write into; ``flag`` names its option."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise WidthscopeError(f"cannot write into {str(p)!r}: it is a file, not a directory; choose another {flag}")
    try:
        check_writable(p / "…")
    except WidthscopeError as err:
        raise WidthscopeError(err if flag == "--out" else f"{flag}: {err}") from None
    return p


# ----------------------------------------------------------------------------- paths: length, collisions
# The options that name files a command reads, and those it writes (argparse dests).
INPUT_PATHS = (
    "model",
    "tokenizer",
    "data",
    "train_data",
    "test_data",
    "data_root",
    "samples",
    "train",
    "test",
    "config",
    "results",
)
OUTPUT_PATHS = ("out", "save_samples", "json", "offload_folder")
_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's limits: bytes per path component, bytes per path


def check_path_length(flag: str, value: str | os.PathLike) -> None:
    """A path the OS would refuse (``File name too long``) is one line, before any work."""
    raw = os.fsencode(value)
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if len(raw) >= _PATH_MAX or longest > _NAME_MAX:
        short = os.fsdecode(raw[:40]) + "…"
        raise WidthscopeError(
            f"{flag} {short!r} is too long ({len(raw)} bytes, longest part {longest}): a path may "
            f"have at most {_PATH_MAX - 1} bytes and each part of it {_NAME_MAX}; choose a shorter path"
        )


def _real(path: str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(path)))


def check_outputs(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]], command: str) -> None:
    """Refuse two outputs that are the same file, an output that is an input, and an output inside an
    input folder; ``inputs``/``outputs``: ``(flag, path)`` pairs (inputs that do not exist are skipped)."""
    ins = [(f, p, _real(p)) for f, p in inputs if os.path.exists(os.path.expanduser(p))]
    outs = [(f, p, _real(p)) for f, p in outputs]
    for i, (fa, pa, ra) in enumerate(outs):
        for fb, pb, rb in outs[i + 1 :]:
            if ra == rb:
                change = fa if fb.endswith("parts folder") else fb
                raise WidthscopeError(
                    f"{fa} {pa!r} and {fb} {pb!r} are the same file: one would overwrite the "
                    f"other; give {change} another path"
                )
    for fo, po, ro in outs:
        for fi, pi, ri in ins:
            if ro == ri:
                raise WidthscopeError(
                    f"{fo} {po!r} is the input {fi} {pi!r}: widthscope never writes into its "
                    f"inputs; give {fo} another path"
                )
            inside = ro == ri or ri in ro.parents
            if ri.is_dir() and inside and not (command == "report" and ro == ri / "report"):
                raise WidthscopeError(
                    f"{fo} {po!r} lies inside the input {fi} {pi!r}: widthscope never writes "
                    f"into its inputs; give {fo} a path outside it"
                )


def check_pools(
    M: int | list[int], K: int | list[int], n_train: int, n_test: int, *, test_pool: str = "held-out pool"
) -> None:
    """``M``/``K`` (draws without replacement) must fit the train/held-out pools."""
    for name, size, pool, n, flag in (
        ("M", M, "train pool", n_train, "--n-train"),
        ("K", K, test_pool, n_test, "--n-test"),
    ):
        v = max(size) if isinstance(size, (list, tuple)) else size
        if v > n:
            raise WidthscopeError(
                f"{name}={v} is larger than the {pool} of {n} examples: raise {flag} or lower --{name}"
            )


# ----------------------------------------------------------------------------- list options
# The (M, K) pairs of the pipelines' sample sizes.
def sizes_list(values: Any, name: str) -> list[int]:
    if isinstance(values, (int,)) and not isinstance(values, bool):
        values = [values]
    try:
        out = [int(v) for v in values]
        ok = all(float(v) == int(v) for v in values)
    except (TypeError, ValueError):
        ok, out = False, []
    if not ok or not out or any(v < 1 for v in out):
        raise WidthscopeError(
            f"{name} must be a non-empty list of positive whole numbers, got {values!r} (e.g. {name}=[16, 32, 64, 128])"
        )
    if max(out) > MAX_POOL:
        raise WidthscopeError(f"{name}={max(out)}: at most {MAX_POOL} (a draw cannot be larger than its pool)")
    return out


def pairs_of(M: Any, K: Any) -> list[tuple[int, int]]:
    """``K=None``: ``K = M`` (paired); a single K applies to every M; else paired lists."""
    Ms = sizes_list(M, "M")
    if K is None:
        return [(m, m) for m in Ms]
    Ks = sizes_list(K, "K")
    if len(Ks) == 1:
        return [(m, Ks[0]) for m in Ms]
    if len(Ks) != len(Ms):
        raise WidthscopeError(
            f"K has {len(Ks)} values but M has {len(Ms)}: give one K, or one per M "
            "(pairs (M[i], K[i])), or none for K = M"
        )
    return list(zip(Ms, Ks))
