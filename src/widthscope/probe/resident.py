"""The resident memory a piece of work adds, measured as the benchmarks measure a run.

A plan's step (one growth, one linearize cell, loading the data) is run once more and its peak
resident set read, so that what a tensor counter does not see (the allocator's fragmentation, the
temporaries inside an operation, a parser's buffers) is in the plan. The measurement matches
``benchmarks/plan_accuracy*.py``, whose run is a process started with glibc's
``MALLOC_MMAP_THRESHOLD_=65536`` (each freed block of 64 KiB or more goes back to the system, so the
resident set is what the run holds at once, not what the allocator keeps):

- **a fresh process** (the default): the work, pickled (a :func:`functools.partial` of a module-level
  function over the model and data), is sent to ``python -m widthscope.probe.resident``, a server
  started once with that variable and one thread, which forks a child per work from its clean
  heap (the libraries imported, nothing else); the model and data the child unpickles are
  resident before the baseline, as they are in the run.
- **a forked child** where the work does not pickle (a lambda, a class defined in ``__main__``) or
  would not fit in memory twice: the child sets the threshold with ``mallopt``, but it inherits this
  process's heap; a heap the planner left in pieces makes the step fault in more pages than a fresh
  run's does (the widest linearize cell of the former ``plan_accuracy_train.py``: 122 MB from a fresh process,
  190-219 MB from a fork; the run's peak 143 MB).

In both, the work runs once first (the libraries' code is mapped lazily, page by page, as it
runs: megabytes a warmed-up run does not add), the free memory is trimmed, then ``VmHWM`` is reset
(``/proc/self/clear_refs``) and the work run again. On CUDA the peak is
``torch.cuda.max_memory_allocated`` in this process.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import functools
import gc
import importlib
import os
import pickle
import platform
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from .cost_plan import device_memory

__all__ = ["Resident", "resident_peak", "larger", "MMAP_THRESHOLD"]

MMAP_THRESHOLD = 65536  # the benchmarks' MALLOC_MMAP_THRESHOLD_: each freed large block goes back to the system
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
TRIM_THRESHOLD = 128 * 1024  # glibc's default, which a process's dynamic mmap threshold raises as it runs
TIMEOUT_S = 3600.0  # one step of a plan; a child that runs longer is stopped and nothing is measured


@dataclasses.dataclass(frozen=True)
class Resident:
    """What :func:`resident_peak` measured: ``peak`` bytes above the memory before ``fn`` (resident
    set on CPU, allocated on CUDA) and ``left`` bytes still above it when ``fn`` returned (its result
    alive); both ``None`` where not measured, ``why`` says why. ``where``: "fresh process", "forked
    child", "cuda" or "" (not measured)."""

    peak: int | None
    left: int | None
    why: str = ""
    where: str = ""


def _status(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _measure_here(fn: Callable[[], Any], warm: Callable[[], Any] | None = None) -> tuple[int, int]:
    """In the measuring process: glibc told to give each freed block of 64 KiB or more back
    (``mallopt``; a fresh process has it from ``MALLOC_MMAP_THRESHOLD_`` already) and its free
    memory trimmed; ``warm`` (default ``fn``) run once first; then ``VmHWM`` (reset through
    ``/proc/self/clear_refs``) and ``VmRSS`` above ``VmRSS`` before."""
    torch.set_num_threads(1)  # OpenMP's workers do not survive a fork; the run's benchmark is one thread
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)  # as a process started with the variable has it
    warmed = (warm or fn)()
    del warmed
    gc.collect()
    libc.malloc_trim(0)
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    out = fn()
    peak, left = _status("VmHWM"), _status("VmRSS")
    del out
    if before is None or peak is None or left is None:
        raise OSError("no VmRSS/VmHWM in /proc/self/status")
    return max(0, peak - before), max(0, left - before)


def _cannot_measure() -> str:
    """Why the resident peak cannot be measured here ("" where it can)."""
    if platform.libc_ver()[0] != "glibc":
        return "not glibc (the allocator cannot be told to give freed memory back)"
    if _status("VmHWM") is None:
        return "no VmHWM in /proc/self/status"
    if not os.access("/proc/self/clear_refs", os.W_OK):
        return "/proc/self/clear_refs not writable"
    return ""


def _held_bytes(fn: Any) -> int:
    """The tensor bytes a pickled ``fn`` carries: a partial's modules (parameters and buffers) and
    tensors (nested containers and dataclass-like objects one level down), each storage once."""
    seen: dict[int, int] = {}
    stack: list[Any] = [fn]
    depth = {id(fn): 0}
    while stack:
        x = stack.pop()
        d = depth.get(id(x), 0)
        if isinstance(x, torch.Tensor):
            seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            continue
        if isinstance(x, nn.Module):
            kids: list[Any] = [*x.parameters(), *x.buffers()]
        elif isinstance(x, functools.partial):
            kids = [*x.args, *x.keywords.values()]
        elif isinstance(x, dict):
            kids = list(x.values())
        elif isinstance(x, (tuple, list)):
            kids = list(x)
        elif d < 3 and hasattr(x, "__dict__") and not callable(x):
            kids = list(vars(x).values())
        else:
            kids = []
        for k in kids:
            depth[id(k)] = d + 1
        stack.extend(kids)
    return sum(seen.values())


class _Server:
    """``python -m widthscope.probe.resident``, started once (with the mmap threshold and one thread)
    and kept for this process's later measurements: each work it is sent is measured in a child it
    forks, so every measurement starts from the server's heap, which holds nothing but the
    libraries (their imports are paid once, not per measurement). Messages: 8-byte length + bytes."""

    def __init__(self) -> None:
        # the server imports what this process imports: this package's folder first, then this process's path
        path = [str(Path(__file__).resolve().parents[2]), *(p or os.getcwd() for p in sys.path)]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        self.err = tempfile.TemporaryFile()
        preload = [m for m in _PRELOAD if m in sys.modules]  # libraries this process uses, imported up front
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "widthscope.probe.resident", *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
            start_new_session=True,  # its measuring child goes with it when it is stopped
        )

    def measure(self, payload: bytes) -> str:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
            if not ready:
                self.close()
                return f"error the measuring process ran past {TIMEOUT_S:.0f} s"
            n = int.from_bytes(proc.stdout.read(8) or b"", "little")
            got = proc.stdout.read(n).decode(errors="replace") if n else ""
        except (OSError, ValueError):
            got = ""
        if not got:
            self.close()
            self.err.seek(0)
            tail = (self.err.read().decode(errors="replace").strip().splitlines() or ["no answer"])[-1]
            return f"error the measuring process failed ({tail[:400]})"
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            if f is not None:
                f.close()


_PRELOAD = ("transformers", "accelerate", "datasets", "sklearn", "tokenizers", "safetensors")
_SERVERS: list[_Server] = []


def _close_server() -> None:
    while _SERVERS:
        _SERVERS.pop().close()


atexit.register(_close_server)


def _in_fresh_process(payload: bytes) -> Resident | None:
    """What the server measured; ``None`` where it could not load the work (a fork is tried then);
    an error in the work itself is a ``Resident`` with ``why``."""
    if not _SERVERS or _SERVERS[0].proc.poll() is not None:
        _close_server()
        _SERVERS.append(_Server())
    msg = _SERVERS[0].measure(payload)
    if msg.startswith("unpickle "):
        return None
    try:
        peak, left = (int(v) for v in msg.split())
    except ValueError:
        _close_server()  # what failed may have left the server in a bad state: a new one next time
        return Resident(None, None, msg.removeprefix("error ") if msg.startswith("error the") else msg)
    return Resident(peak, left, where="fresh process")


def _answer(pid: int, r: int, w: int) -> str:
    """What the forked child ``pid`` wrote to its pipe ``(r, w)``, read to the end; the child reaped."""
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace")


def _in_forked_child(fn: Callable[[], Any], warm: Callable[[], Any] | None) -> Resident:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report one line, leave without running the parent's exit handlers
        os.close(r)
        try:
            peak, left = _measure_here(fn, warm)
            msg = f"{peak} {left}"
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which says so
            msg = f"error {type(e).__name__}: {e}".replace("\n", " ")[:500]
        try:
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    msg = _answer(pid, r, w)
    try:
        peak, left = (int(v) for v in msg.split())
    except ValueError:
        return Resident(None, None, f"the measured child failed ({msg or 'no answer'})")
    return Resident(peak, left, where="forked child")


def resident_peak(
    fn: Callable[[], Any],
    device: torch.device | str = "cpu",
    *,
    fresh: bool = True,
    warm: Callable[[], Any] | None = None,
) -> Resident:
    """The memory ``fn()`` adds, measured the way ``benchmarks/plan_accuracy*.py`` measure a run
    (see the module docstring): on CUDA in this process; on Linux CPU with glibc in a fresh process
    where ``fn`` pickles and its tensors fit in memory twice (and ``fresh``), else in a forked
    child. Elsewhere nothing runs and ``Resident(None, None, why)`` says why. An error in ``fn`` is
    reported in ``why``, not raised. ``warm`` (default ``fn``) runs first, then ``fn`` is measured:
    a smaller work of the same kind maps the libraries' code as well, and leaves the caches a new
    shape fills (the kernels' buffers) to be counted, as the run counts them."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        left = torch.cuda.memory_allocated(device) - before
        del out
        return Resident(max(0, torch.cuda.max_memory_allocated(device) - before), max(0, left), where="cuda")
    why = _cannot_measure()
    if why:
        return Resident(None, None, why)
    if fresh:
        free, _ = device_memory("cpu")
        if free is None or 3 * _held_bytes((fn, warm)) < free:
            try:
                payload = pickle.dumps((fn, warm), protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, AttributeError, TypeError):
                payload = b""  # a lambda or a local class: the fork below
            if payload:
                got = _in_fresh_process(payload)
                if got is not None:
                    return got
    if not hasattr(os, "fork"):
        return Resident(None, None, "no fork on this system")
    return _in_forked_child(fn, warm)


def larger(counted: int, measured: Resident) -> tuple[int, str]:
    """The larger of the counted bytes and the measured peak, and which it is ("measured" or "counted")."""
    if measured.peak is not None and measured.peak > counted:
        return measured.peak, "measured"
    return counted, "counted"


def _read(stream: Any) -> bytes | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    return stream.read(int.from_bytes(head, "little"))


def _serve(preload: list[str]) -> None:
    """The server (``python -m widthscope.probe.resident [LIBRARY ...]``): reads pickled works that
    :func:`resident_peak` wrote (never a user's file), measures each in a forked child, answers
    ``peak left`` (or ``error ...`` / ``unpickle ...``); the libraries a work imported are imported
    here after it, so the next child has them."""
    for name in preload:
        if name in _PRELOAD:
            importlib.import_module(name)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while (payload := _read(inp)) is not None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.dup2(2, 1)  # what the work prints goes to the log, not into the answers
            before = set(sys.modules)
            try:
                fn, warm = pickle.loads(payload)  # noqa: S301 - written by resident_peak in the parent, a moment ago
            except Exception as e:  # noqa: BLE001 - the parent runs the work in a forked child of its own instead
                msg = f"unpickle {type(e).__name__}: {e}"
            else:
                del payload
                try:
                    peak, left = _measure_here(fn, warm)
                    msg = f"{peak} {left}"
                except BaseException as e:  # noqa: BLE001 - reported to the parent, which says so
                    msg = f"error {type(e).__name__}: {e}"
            new = sorted(set(sys.modules) - before)
            os.write(w, (msg.replace("\n", " ")[:500] + "\n" + " ".join(new)).encode())
            os._exit(0)
        msg, _, imported = _answer(pid, r, w).partition("\n")
        for name in imported.split():
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - only a head start for the next child
                continue
        answer = (msg or "error the measuring child died").encode()
        out.write(len(answer).to_bytes(8, "little") + answer)
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1:])
