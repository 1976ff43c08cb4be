"""The ``widthscope`` command line.

Each subcommand is a module with ``add_arguments(parser)`` and ``run(args) -> int`` (only the chosen one is
imported); every user error is one line with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from .._version import __version__
from ..errors import WidthscopeError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "certify": ("widthscope.cli.certify", "alignment certificates at insertion points of a trained model"),
    "sweep": (
        "widthscope.cli.sweep",
        "width sweep from a TOML config, or a [suite] of checkpoints × revisions: certify, record (resumable)",
    ),
    "report": ("widthscope.cli.report", "plots and an HTML report from a results directory"),
    "demo": ("widthscope.cli.demo", "small end-to-end width sweep on built-in data, then the report"),
    "stats": ("widthscope.cli.stats", "certificates, misalignment and tables from saved samples, without a model"),
    "grow": ("widthscope.cli.grow", "rank insertion points, insert a block at the best one, train it"),
    "grow-bench": (
        "widthscope.cli.grow_bench",
        "grow a block at every point of a model suite; compare growth criteria",
    ),
    "grow-target": (
        "widthscope.cli.grow_target",
        "does small -> grow -> train reach the from-scratch loss with less compute? (growth operators x schedules)",
    ),
    "linearize": ("widthscope.cli.linearize", "linearization width sweep from a TOML config (resumable)"),
    "activations": ("widthscope.cli.activations", "audit activation derivatives max|phi^(k)|/(k+1)!"),
    "repair": (
        "widthscope.cli.repair",
        "rebuild results.jsonl of a results folder from its readable cells, with a backup",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one error line (no usage block), exit status 2, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Terminated(BaseException):
    """SIGTERM, turned into an exception so the run ends like a Ctrl-C: cleanly, with a message."""


def _terminate(signum: int, _frame: object) -> None:
    raise _Terminated(signum)


STOPPED: list[int] = []  # the exit status of a run a signal stopped (read by widthscope.__main__)


def _stopped(command: str | None, exc: BaseException) -> int:
    """The one line for SIGINT/SIGTERM, and the exit status (130 / 143)."""
    from .._io import kept_work  # noqa: PLC0415  start-up time: `widthscope --help` skips it (_io + checks: +40 ms)

    _remove_created()
    kept = kept_work()
    what = "terminated (SIGTERM)" if isinstance(exc, _Terminated) else "interrupted"
    tail = f"kept: {'; '.join(kept)}" if kept else "no finished results were written"
    print(f"widthscope{' ' + command if command else ''}: {what}; {tail}", file=sys.stderr)
    STOPPED.append(143 if isinstance(exc, _Terminated) else 130)
    return STOPPED[-1]


def _remove_created() -> None:
    """A refused or interrupted command leaves no empty output folder that its checks created."""
    from .._io import remove_empty  # noqa: PLC0415  start-up time: `widthscope --help` skips it (_io + checks: +40 ms)
    from .checks import CREATED  # noqa: PLC0415  start-up time: `widthscope --help` skips it (_io + checks: +40 ms)

    remove_empty(CREATED)
    CREATED.clear()


# Signals that arrived while modules imported (a library's `try: import` could swallow them), acted on after.
PENDING_SIGNALS: list[int] = []


def defer_signal(signum: int, _frame: object) -> None:
    PENDING_SIGNALS.append(signum)


def main(argv: list[str] | None = None) -> int:
    STOPPED.clear()
    on_main = threading.current_thread() is threading.main_thread()
    previous = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) if on_main else None
    if on_main:  # first thing: a signal while torch/transformers import (seconds) ends like one during work
        signal.signal(signal.SIGTERM, defer_signal)
        signal.signal(signal.SIGINT, defer_signal)
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if not a.startswith("-")), None)
    try:
        return _main(argv, name, on_main)
    except (KeyboardInterrupt, _Terminated) as exc:  # before the command started (imports, parsing)
        return _stopped(name if name in COMMANDS else None, exc)
    finally:
        PENDING_SIGNALS.clear()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])


def _quiet_offline() -> None:
    """Library chatter stays off the terminal (``HF_HUB_OFFLINE`` is never set here)."""
    for key, value in (
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
    ):
        os.environ.setdefault(key, value)


def _main(argv: list[str], name: str | None, on_main: bool) -> int:
    from .._io import KEPT_WORK, kept_work  # noqa: PLC0415  start-up time: `widthscope --help` skips it (_io + checks: +40 ms)

    KEPT_WORK.clear()  # what this run keeps, not what an earlier call in this process kept
    _quiet_offline()
    parser = _Parser(prog="widthscope", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"widthscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers = {cmd: sub.add_parser(cmd, help=help_, description=help_) for cmd, (_, help_) in COMMANDS.items()}
    # Only the chosen command's module is imported (and only it adds its arguments).
    if name in COMMANDS:
        module = importlib.import_module(COMMANDS[name][0])
        module.add_arguments(subparsers[name])
    # The imports are done: act on a signal that came meanwhile; from now on SIGINT/SIGTERM raise at once.
    if PENDING_SIGNALS:
        raise _Terminated(signal.SIGTERM) if signal.SIGTERM in PENDING_SIGNALS else KeyboardInterrupt()
    if on_main:
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from . import checks  # noqa: PLC0415  start-up time: `widthscope --help` skips it (_io + checks: +40 ms)

    checks.CREATED.clear()
    try:
        checks.check_args(args, args.command)  # the shared checks, before the command does any work
        from .._env import torch_threads  # noqa: PLC0415  start-up time: `widthscope --help` skips it
        from ..models.dispatch import releasing_memory  # noqa: PLC0415  start-up time: it imports torch

        # the process is widthscope's: offloaded weights go back to the system
        with torch_threads(getattr(args, "threads", None)), releasing_memory():
            return int(module.run(args) or 0)
    except WidthscopeError as exc:
        _remove_created()
        kept = kept_work()
        write_failure = "cannot write" in str(exc) or "disk" in str(exc).lower()
        extra = f"; kept: {'; '.join(kept)}" if kept and write_failure else ""
        print(f"widthscope {args.command}: error: {exc}{extra}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated) as exc:
        return _stopped(args.command, exc)


def console() -> None:
    """The ``widthscope`` command (and ``python -m widthscope``): :func:`main`, then exit with its status."""
    code = main()
    if STOPPED:
        # a KeyboardInterrupt caught here after C code ran it (pybind11's exec in torch) makes CPython
        # kill itself with SIGINT at exit: the line is written, leave with the status it names
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
