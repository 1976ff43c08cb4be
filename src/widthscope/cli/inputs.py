"""The input options of ``certify`` and ``grow``, and the one place each command turns them into an
:class:`~widthscope.data.spec.InputSpec` (:func:`spec_from_args`; the namespace is never changed)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..data.spec import ALL, INPUT_DEFAULTS, OPTIONAL_FIELDS, InputSpec
from ..errors import WidthscopeError
from ..growth.options import GROW_POOLS
from ..options import flag_name, given
from .args import add_threads, argument

# --help groups: which input option is listed under "model" and "probe pools" (the rest: "data")
MODEL_OPTIONS = ("revision", "device_map", "max_memory", "offload_folder", "task", "dtype", "tokenizer")
POOL_OPTIONS = ("train_pool", "test_fraction", "n_train", "n_test")


def add_arguments(
    p: argparse.ArgumentParser,
    *,
    model_required: bool = False,
    model_default: str | None = None,
    n_train: int | None = 256,
    n_test: int | None = 256,
    n_train_help: str = "",
    n_test_help: str = "",
) -> None:
    """One argument per field of :class:`~widthscope.data.spec.InputSpec` (default ``None``, but ``--model``'s
    and the pools' are the command's; ``n_*_help``: a default computed later)."""
    fields = {f.name: f for f in dataclasses.fields(InputSpec)}
    meta = {name: f.metadata for name, f in fields.items()}
    groups = {title: p.add_argument_group(title) for title in ("model", "data", "probe pools")}
    groups["model"].add_argument("--model", required=model_required, default=model_default, help=meta["model"]["help"])
    for name, m in meta.items():
        if "kind" not in m or not m["cli"]:
            continue
        g = groups["model" if name in MODEL_OPTIONS else "probe pools" if name in POOL_OPTIONS else "data"]
        g.add_argument(flag_name(name), **argument(fields[name], fields[name].default))
        if name == "text_field":
            g.add_argument("--text-column", dest="text_field", help=argparse.SUPPRESS)
    add_threads(p, "torch CPU threads (default: torch's choice; 1 is best on a busy machine)")
    for name, default, words in (("n_train", n_train, n_train_help), ("n_test", n_test, n_test_help)):
        groups["probe pools"].add_argument(
            flag_name(name),
            type=pool_size,
            default=default,
            help=f"{meta[name]['help']} (default {default if default is not None else words})",
        )


def spec_from_args(
    args: argparse.Namespace, command: str, *, preset: Mapping[str, Any] | None = None, seed: int | None = None
) -> InputSpec:
    """The input spec of ``command`` (``certify``, ``grow``, or ``inputs``: the bare input options).
    ``preset``: the values of options not given (``certify --protocol``); ``seed``: the run's seed,
    else ``args.seed``."""
    fields = {f.name for f in dataclasses.fields(InputSpec)} - {"given", "cap_pools"}
    values: dict[str, Any] = {k: getattr(args, k) for k in fields if hasattr(args, k)}
    given_now = tuple(sorted(d for d in OPTIONAL_FIELDS if given(args, d)))
    for key, value in (preset or {}).items():
        if values.get(key) is None or values.get(key) is False:
            values[key] = value
    values["first"] = bool(values.get("first", False))
    if seed is not None:
        values["seed"] = seed
    elif values.get("seed") is None:
        values.pop("seed", None)
    if values.get("model") is None:
        raise WidthscopeError(
            f"{command}: --model is required (a checkpoint directory, a .safetensors file with "
            "its config, or 'builtin')"
        )
    if command == "grow":
        values["cap_pools"] = values.get("n_train") is None or values.get("n_test") is None
        for key, default in zip(("n_train", "n_test"), GROW_POOLS):
            values[key] = default if values.get(key) is None else values[key]
    values["given"] = given_now
    for k in INPUT_DEFAULTS:  # a default is the spec's (InputSpec.filled): "not given" stays None
        if k not in given_now:
            values[k] = None
    return InputSpec(**values)


def pool_size(text: str) -> int | str:
    """``argparse`` type of ``--n-train`` / ``--n-test``: an integer or ``"all"``."""
    if str(text).strip().lower() == ALL:
        return ALL
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number or 'all' (every sequence there is)") from None
