"""The shared checks of every command's parsed options, before any work (:func:`check_args`); the rules are
:mod:`widthscope.validate`'s, this module reads the namespace.

Example::

    >>> import argparse
    >>> from widthscope.cli.checks import check_args
    >>> check_args(argparse.Namespace(seed=-1), "certify")
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --seed -1: must be a whole number in 0..4294967295
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .. import validate
from .._io import check_writable, missing_parents
from ..errors import WidthscopeError
from ..options import SEED_MAX, flag_name, given
from ..validate import (
    INPUT_PATHS,
    KINDS,
    OUT_KIND,
    OUTPUT_PATHS,
    check_dir_writable,
    check_outputs,
    check_path_length,
    group_words,
    input_kind,
)

# Output folders check_args created; widthscope.cli removes those still empty when a command fails.
CREATED: list[Path] = []


def check_applies(args: argparse.Namespace, command: str) -> None:
    """Refuse every option of :data:`~widthscope.validate.APPLIES` given for a kind it does not fit."""
    table = validate.APPLIES.get(command)
    if table is None:
        return
    kind = input_kind(getattr(args, "model", None), getattr(args, "task", None), getattr(args, "revision", None))
    for dest, kinds in table.items():
        if kind is not None and kind not in kinds and given(args, dest):
            raise WidthscopeError(
                f"{flag_name(dest)} applies to {group_words(kinds)} only; --model {args.model} is "
                f"{KINDS[kind]}: drop {flag_name(dest)}"
            )


def paths(args: argparse.Namespace, dests: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(flag, path)`` of every path option among ``dests`` that was given."""
    out = []
    for dest in dests:
        v = getattr(args, dest, None)
        for item in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(item, (str, os.PathLike)) and str(item):
                flag = dest if dest in ("samples", "config", "results") else flag_name(dest)
                out.append((flag, str(item)))
    return out


# Options a command's --plan would ignore (it prints the plan and exits): refused together.
PLAN_EXCLUDES: dict[str, tuple[str, ...]] = {
    "certify": ("list_points", "resume", "save_samples"),
    "sweep": ("dry_run",),
}


def check_args(args: argparse.Namespace, command: str) -> None:
    """The shared checks; raises :class:`WidthscopeError` with one line naming the option."""
    plan = next((flag_name(d) for d in ("plan", "plan_no_time") if given(args, d)), None)
    for dest in PLAN_EXCLUDES.get(command, ()) if plan else ():
        if given(args, dest):
            raise WidthscopeError(
                f"{plan} prints the cost plan and exits, so {flag_name(dest)} would do nothing: drop one of them"
            )
    if isinstance(getattr(args, "shard", None), str):
        from ..sweeps.grid import parse_shard  # noqa: PLC0415  start-up time: torch

        parse_shard(args.shard)
    for flag, path in paths(args, INPUT_PATHS + OUTPUT_PATHS):
        check_path_length(flag, path)
    seed = getattr(args, "seed", None)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX):
        raise WidthscopeError(f"--seed {seed}: must be a whole number in 0..{SEED_MAX}")
    for name, lo, hi, what in validate.RANGES:
        v = getattr(args, name, None)
        if name in ("n_train", "n_test") and v == "all":  # every sequence of the source (data.spec.ALL)
            if command not in ("certify", "inputs"):
                raise WidthscopeError(f"{flag_name(name)} all applies to certify; give {command} a number")
            continue
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise WidthscopeError(f"{flag_name(name)} {v}: must be a whole number >= {lo} ({what})")
        if v is not None and hi is not None and v > hi:
            raise WidthscopeError(f"{flag_name(name)} {v}: must be a whole number in {lo}..{hi} ({what})")
    for name in validate.POSITIVE:
        v = getattr(args, name, None)
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise WidthscopeError(f"{flag_name(name)} {v}: must be a positive finite number")
    for name in ("data", "train_data", "test_data"):
        v = getattr(args, name, None)
        if isinstance(v, str):
            from ..data.spec import check_source  # noqa: PLC0415  start-up time: torch

            check_source(flag_name(name), v)
    device = getattr(args, "device", None)
    if isinstance(device, str):
        from ..train import resolve_device  # noqa: PLC0415  start-up time: torch

        resolve_device(device)
    max_memory = getattr(args, "max_memory", None)
    if isinstance(max_memory, str):  # a GPU this machine does not show: now, not once the model loads
        from ..models.dispatch import check_max_memory, check_visible  # noqa: PLC0415  start-up time: torch

        check_visible(check_max_memory(max_memory, name="--max-memory"), name="--max-memory", text=max_memory)
    check_applies(args, command)
    srcs = [getattr(args, k, None) for k in ("data", "train_data", "test_data", "train_split", "test_split")]
    if srcs[3] is not None or srcs[4] is not None:  # --*-split only for a source with splits, before any work
        from ..data.sources import check_splits_given  # noqa: PLC0415  start-up time: torch

        check_splits_given(*srcs)
    out = getattr(args, "out", None)
    if out and OUT_KIND.get(command) == "file":
        check_writable(out)
    elif out and OUT_KIND.get(command) == "dir":
        made = missing_parents(Path(out) / "x")  # the folder itself and any missing parents
        check_dir_writable(out)
        CREATED.extend(made)  # removed again if the command is refused before it writes anything
    for extra in (getattr(args, "save_samples", None), getattr(args, "json", None)):
        if extra:
            check_writable(extra)
    parts = [(f"{flag_name('out')}'s parts folder", str(out) + ".parts")] if command == "certify" and out else []
    check_outputs(paths(args, INPUT_PATHS), paths(args, OUTPUT_PATHS) + parts, command)
    folder = getattr(args, "offload_folder", None)
    if folder:  # after check_outputs: never probed inside an input; a file or read-only place is one line now
        check_dir_writable(folder, flag_name("offload_folder"))
