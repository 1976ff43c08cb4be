"""The command line generated from the options dataclasses: every argument defaults to ``None``, so
``XOptions.from_args(args, base)`` knows which were given (``base``: a preset or ``--config``'s)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..errors import WidthscopeError
from ..options import Options

T = TypeVar("T", bound=Options)


class ArgumentAdder(Protocol):
    """A parser or one of its argument groups (what ``add_argument`` is called on)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any: ...


def add_options(parser: ArgumentAdder, cls: type[Options], *, skip: Iterable[str] = ()) -> None:
    """One argument per command-line field of ``cls`` (not those in ``skip``); a list field in ``cls.NARGS``
    (``{"range": ("LO", "HI")}``) takes that many values after one flag (``--range -5 5``)."""
    skip = set(skip)
    nargs: dict[str, tuple[str, ...]] = getattr(cls, "NARGS", {})
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "kind" not in meta or not meta.get("cli", True) or f.name in skip:
            continue
        kw = argument(f, None)
        if "default" not in kw["help"] and f.default is not None and meta["kind"] != "bool":
            shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
            kw["help"] += f" (default {shown})"
        if f.name in nargs:  # separate values: read each as a number here
            kw.update(nargs=len(nargs[f.name]), metavar=nargs[f.name], type=int if meta["kind"] == "ints" else float)
        parser.add_argument(cls.flag(f.name), **kw)


def argument(f: dataclasses.Field, default: Any) -> dict[str, Any]:
    """The ``add_argument`` keywords of the field ``f`` (an :func:`widthscope.options.option`)."""
    meta = f.metadata
    kw: dict[str, Any] = {"dest": f.name, "default": default, "help": meta["help"]}
    if meta["kind"] == "bool":
        kw["action"] = "store_true"
    else:
        kw["type"] = {"int": int, "float": float}.get(meta["kind"], str)
        kw.update({key: meta[key] for key in ("choices", "metavar") if meta.get(key)})
    return kw


def add_threads(parser: ArgumentAdder, help: str = "torch CPU threads") -> None:
    parser.add_argument("--threads", type=int, default=None, metavar="N", help=help)


PLAN_HELP = (
    "print what the whole run will cost (parameters and weights, bytes per example, the largest batch that fits; "
    "the predicted wall time and peak memory of the whole process after timing {timed}) and exit: nothing is "
    "{done} and nothing is written (docs/big-models.md)"
)


def add_plan(
    parser: ArgumentAdder,
    timed: str,
    done: str = "trained",
    no_time: str = "--plan without timing: the counts only, no predicted time",
) -> None:
    """``--plan`` (the cost plan after timing ``timed``) and ``--plan-no-time`` (``no_time``)."""
    parser.add_argument("--plan", action="store_true", help=PLAN_HELP.format(timed=timed, done=done))
    parser.add_argument("--plan-no-time", action="store_true", help=no_time)


def load_config(path: str, section: str = "options") -> dict[str, Any]:
    """The ``options`` block of a results JSON (or a JSON file of options) for ``--config FILE``."""
    p = Path(path).expanduser()
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WidthscopeError(f"--config {path!r} not found: pass a results JSON written by this command") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WidthscopeError(
            f"--config {path!r} is not a JSON file ({type(exc).__name__}): pass a results JSON written by this command"
        ) from None
    if not isinstance(obj, dict):
        raise WidthscopeError(f"--config {path!r} holds no options: pass a results JSON written by this command")
    block = obj.get(section, obj)
    if not isinstance(block, dict):
        raise WidthscopeError(f"--config {path!r}: its {section!r} is not a mapping of settings")
    return block


def add_config(parser: argparse.ArgumentParser, command: str, *, dest: str = "config", what: str = "") -> None:
    """``--config FILE``: the run's base options; options given on the command line override them."""
    parser.add_argument(
        "--config",
        dest=dest,
        default=None,
        metavar="FILE",
        help=what
        or f"repeat a run: the options recorded in a results JSON of widthscope {command} (its 'options'), "
        f'or a JSON file {{"{command}": {{...}}}} of options; options given here override them',
    )


def config_options(cls: type[T], path: str | None, command: str) -> T | None:
    """The options of ``command`` recorded in ``path`` (``None``: no ``--config``), validated by ``cls``."""
    if path is None:
        return None
    section = command.replace("-", "_")
    sub = load_config(path).get(section)
    if not isinstance(sub, dict):
        raise WidthscopeError(
            f"--config {path!r} records no {command} options: pass a results JSON written by widthscope "
            f'{command} (its "options" holds "{section}"), or a JSON file {{"{section}": {{...}}}}'
        )
    try:
        return cls.from_dict(sub)
    except WidthscopeError as exc:
        raise type(exc)(f"--config {path!r}: {exc}") from None
