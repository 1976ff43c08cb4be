"""I/O helpers of the long-running commands: atomic writes, durable JSONL appends (a torn last line is
skipped and named by :func:`read_jsonl`), the results' lock, tables and progress lines."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence, Sized

from .errors import WidthscopeError


def to_jsonable(obj: Any) -> Any:
    """Convert tensors, numpy values, dataclasses and non-finite floats to plain JSON."""
    import dataclasses  # noqa: PLC0415  start-up time: `widthscope --help` imports this module

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # torch / numpy
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN/Inf; pandas reads null as NaN
    if isinstance(obj, Path):
        return str(obj)
    return obj


def first_nonfinite(obj: Any, where: str = "") -> str | None:
    """Dotted name of the first non-finite float in a parsed config, else ``None``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"{where} = {obj}"
    items = (
        obj.items()
        if isinstance(obj, Mapping)
        else ((f"[{i + 1}]", v) for i, v in enumerate(obj))
        if isinstance(obj, (list, tuple))
        else ()
    )
    for k, v in items:
        name = f"{where}{k}" if str(k).startswith("[") else f"{where}.{k}" if where else str(k)
        found = first_nonfinite(v, name)
        if found:
            return found
    return None


def read_toml(path: str | os.PathLike, what: str, hint: str) -> dict[str, Any]:
    """Parse the TOML file ``path``; every failure is one line naming ``what`` and ``hint``."""
    if sys.version_info >= (3, 11):
        import tomllib  # noqa: PLC0415  start-up time: `widthscope --help` imports this module
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # noqa: PLC0415  start-up time: `widthscope --help` imports this module
    p = Path(path)

    def error(why: str) -> WidthscopeError:
        return WidthscopeError(f"{what} {str(p)!r} {why}")

    def binary(why: str) -> WidthscopeError:
        return error(f"is not a text file ({why}; a binary file?): pass a TOML file; {hint}")

    if p.is_dir():
        found = sorted(q.name for q in p.glob("*.toml"))[:3]
        held = f" (it holds {', '.join(found)})" if found else ""
        raise error(f"is a directory, not a TOML file: pass the file itself{held}; {hint}")
    if not p.exists():
        raise error(f"not found: pass a TOML file; {hint}")
    try:
        raw = p.read_bytes()
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise error(
                f"is UTF-16 or UTF-32 text (it starts with a byte-order mark): save it as UTF-8 "
                f"(e.g. iconv -t UTF-8); {hint}"
            ) from None
        raise binary("not UTF-8") from None
    except OSError as exc:
        raise error(f"cannot be read ({exc.strerror or exc}); {hint}") from None
    if "\x00" in text:
        raise binary("it holds NUL bytes")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"is not valid TOML: {' '.join(str(exc).split())}") from None


_FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a used-up quota


def unwritable(path: Path, exc: OSError) -> Exception:
    reason = exc.strerror or str(exc)
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            reason = f"{str(blocker)!r} is a file, not a directory"
    fix = (
        "free space (or raise the quota) or choose an output path on another disk"
        if exc.errno in _FULL
        else "choose an output path inside a writable directory"
    )
    return WidthscopeError(f"cannot write {str(path)!r}: {reason}; {fix}")


def _sibling(path: Path, suffix: str) -> tuple[int, str]:
    """A temporary file beside ``path`` (its folder created): (fd, name); one error line if not."""
    if path.is_dir():
        raise WidthscopeError(
            f"cannot write {str(path)!r}: it is a directory; give a file path such as {str(path / 'results.json')!r}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise unwritable(path, exc) from None


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """``write(tmp)`` a temporary sibling, then rename it to ``path`` (no temporary left on failure)."""
    path = Path(path)
    fd, tmp = _sibling(path, ".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are shared like any file
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise unwritable(path, exc) from None
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    return atomic_write(path, write)


KEPT_WORK: list[Any] = []


def on_interrupt(describe: Any) -> None:
    """Register ``describe() -> str | None``: the finished work on disk, named if a run is stopped."""
    KEPT_WORK.append(describe)


def kept_work() -> list[str]:
    """The registered descriptions of finished work on disk."""
    out = []
    for fn in KEPT_WORK:
        with contextlib.suppress(Exception):  # a description must never hide the interruption itself
            out.append(fn())
    return list(filter(None, out))


def missing_parents(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first."""
    return list(itertools.takewhile(lambda p: not p.exists(), path.parents))


def remove_empty(folders: Iterable[Path]) -> None:
    """Remove the given folders (deepest first) where they are still empty."""
    for p in folders:
        with contextlib.suppress(OSError):  # not empty (or gone)
            p.rmdir()


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_space(path: str | os.PathLike, need_bytes: int, what: str = "the results") -> None:
    """One line if the file system holding ``path`` has less free space than ``need_bytes``."""
    path = Path(path)
    where = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        import shutil  # noqa: PLC0415  start-up time: `widthscope --help` imports this module

        free = shutil.disk_usage(where).free
    except OSError:
        return  # a file system that cannot say: the write itself will tell
    if need_bytes > free:
        raise WidthscopeError(
            f"cannot write {str(path)!r}: {what} need about {human_size(need_bytes)} but only "
            f"{human_size(free)} is free on the disk holding {str(where)!r}; free space or choose "
            "an output path on another disk"
        )


def check_writable(path: str | os.PathLike, need_bytes: int = 0, what: str = "the results") -> Path:
    """Fail now if ``path`` cannot be written (or lacks ``need_bytes`` of free space)."""
    path = Path(path)
    created = missing_parents(path)
    try:
        fd, tmp = _sibling(path, ".probe")
        os.close(fd)
        os.unlink(tmp)
        if need_bytes:
            check_space(path, need_bytes, what)
    finally:
        remove_empty(created)
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def append_jsonl(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append rows durably: all rows of one call go out in a single write, then fsync."""
    path = Path(path)
    payload = "".join(json.dumps(to_jsonable(r), sort_keys=True) + "\n" for r in rows)
    if not payload:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # the umask decides, as for any file
    except OSError as exc:
        raise unwritable(path, exc) from None
    try:
        size = os.fstat(fd).st_size
        # a previous kill may have left a partial last line: start ours on a fresh one
        if size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    payload = "\n" + payload
        data = payload.encode("utf-8")
        try:
            done = 0
            while done < len(data):  # a write that fills the disk writes part of it; the next one fails
                done += os.write(fd, data[done:])
            os.fsync(fd)
        except OSError as exc:  # a full disk: cut the file back to its rows before this call
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise unwritable(path, exc) from None
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- the results' lock
LOCK = ".widthscope.lock"  # the lock file's name (sweeps: inside the results folder)
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system without flock


def lock_holder(path: Path) -> str:
    """Who holds the lock file ``path``: ``pid N`` (the pid its holder wrote there), else "another process"."""
    try:
        pid = path.read_text(encoding="utf-8").strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


def lock_held(path: Path) -> bool:
    """True when some process holds ``path`` locked (we can probe it without waiting)."""
    import fcntl  # noqa: PLC0415  start-up time: `widthscope --help` imports this module

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """``fd`` is the file now at ``path`` (a lock file another run removed as it left is not)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def hold_lock(
    path: str | os.PathLike,
    refuse: Callable[[str], Exception],
    *,
    shard: tuple[int, int] = (1, 1),
    what: str = "run",
    where: str | os.PathLike | None = None,
    tidy: bool = False,
) -> Iterator[None]:
    """Hold an advisory ``flock`` on ``path`` (a shard ``k/n``: ``path`` shared and ``PATH.k-of-n``
    exclusive), with our pid written in it; a held lock raises ``refuse(holder)``; a file system
    without locks: a note on stderr. ``tidy``: remove the lock files and folders this call created."""
    import fcntl  # noqa: PLC0415  start-up time: `widthscope --help` imports this module

    path = Path(path)
    k, n = shard
    mine = path if n == 1 else path.with_name(f"{path.name}.{k}-of-{n}")
    folders = missing_parents(path)  # deepest first: what the lock's own mkdir creates
    locked: list[tuple[Path, int, bool]] = []  # (path, fd, created by this call), each one locked
    opened: list[int] = []

    def open_file(p: Path) -> tuple[int, bool]:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            try:
                return os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), True
            except FileExistsError:
                return os.open(p, os.O_RDWR), False
        except FileNotFoundError:
            return -1, False  # removed by the run that just left it: create it again
        except OSError as exc:
            raise unwritable(p, exc) from None

    def take(p: Path, mode: int) -> int | None:
        for _ in range(100):  # each retry: the lock's holder left and removed the file in between
            fd, created = open_file(p)
            if fd < 0:
                continue
            opened.append(fd)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if p != path or mode == fcntl.LOCK_SH:  # an unsharded run (or this same shard) holds it
                    raise refuse(lock_holder(p) + ("" if p == path else f", shard {k}/{n}")) from None
                shards = [q for q in sorted(path.parent.glob(path.name + ".*-of-*")) if lock_held(q)]
                raise refuse(
                    ", ".join(
                        f"{lock_holder(q)}, shard {q.name.rsplit('.', 1)[1].replace('-of-', '/')}" for q in shards
                    )
                    or lock_holder(path)
                ) from None
            except OSError as exc:
                if exc.errno not in _NO_LOCKS:
                    raise
                if created:  # no lock to hold: the file is of no use
                    with contextlib.suppress(OSError):
                        p.unlink()
                print(
                    f"note: {str(where or path.parent)!r} cannot be locked ({exc.strerror}); "
                    f"do not start a second {what} into it",
                    file=sys.stderr,
                )
                return None
            if _same_file(fd, p):
                locked.append((p, fd, created))
                return fd
        raise WidthscopeError(f"cannot lock {str(p)!r}: it is removed and created again without end")

    def release(remove_all: bool) -> None:
        """Unlock; remove the lock files this call created (all of them with ``remove_all``)."""
        for p, fd, created in reversed(locked):
            # only a file this run holds alone (a shard's shared lock may have company), still at its path
            if (remove_all or created) and _same_file(fd, p):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    p.unlink()
                except OSError:
                    pass  # another shard still holds it (its last holder removes it), or it is gone
        for fd in reversed(opened):
            os.close(fd)  # releases the lock
        remove_empty(folders)  # only those still empty

    try:
        fd = take(path, fcntl.LOCK_SH) if n > 1 else None
        fd = take(mine, fcntl.LOCK_EX) if n == 1 or fd is not None else None
        if fd is not None:
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError as exc:  # a full disk, a quota: one line, and no empty lock file left
                raise unwritable(mine, exc) from None
    except BaseException:  # refused, unwritable, interrupted: leave nothing this call created
        release(tidy)
        raise
    try:
        yield
    finally:
        if tidy:
            release(True)
        else:
            for fd in reversed(opened):
                os.close(fd)  # releases the lock; the file stays (harmless, see above)


class Skipped(NamedTuple):
    """One line (1-based; ``None``: a whole file) a reader left out, and why; ``str()`` says it."""

    path: str
    line: int | None
    why: str

    @property
    def where(self) -> str:
        return f"{self.path} line {self.line}" if self.line is not None else self.path

    def __str__(self) -> str:
        return f"{self.where}: {self.why}, skipped"


def skip_lines(problems: Sequence[Skipped], limit: int = 5) -> list[str]:
    """The first ``limit`` skips, one sentence each, then one line counting the rest."""
    out = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        out.append(f"... and {len(problems) - limit} more damaged line(s)/file(s) skipped ({len(problems)} in all)")
    return out


def warn_skips(problems: Sequence[Skipped], prefix: str = "widthscope", limit: int = 5) -> None:
    """Log skips to stderr: damaged input is never dropped without a word."""
    for line in skip_lines(problems, limit):
        print(f"{prefix}: note: {line}", file=sys.stderr)


def refuse_skips(problems: Sequence[Skipped], fix: str) -> Exception:
    """The one error line of ``--strict``: the first skip, how many in all, and ``fix``."""
    more = f" (and {len(problems) - 1} more damaged line(s)/file(s))" if len(problems) > 1 else ""
    return WidthscopeError(f"{problems[0].where}: {problems[0].why}{more}; --strict refuses damaged input: {fix}")


def record_skips(found: list[Skipped], problems: list[Skipped] | None) -> None:
    """Add ``found`` to ``problems``; without a list, say them on stderr."""
    if problems is None:
        warn_skips(found)
    else:
        problems.extend(found)


def cut_off(text: str, exc: json.JSONDecodeError) -> bool:
    """True when ``text`` reads as valid JSON stopped early (an interrupted write or copy)."""
    return exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")


def _why_not_json(line: str, exc: json.JSONDecodeError, last_unterminated: bool) -> str:
    if "\x00" in line:
        return "not JSON (NUL bytes: the zero fill a crash can leave)"
    if cut_off(line, exc):
        return "not JSON (torn line: " + (
            "the last line, cut off by an interrupted write)" if last_unterminated else "it ends mid-row)"
        )
    return f"not JSON ({exc.msg}, column {exc.colno})"


_JSON_TYPE = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def read_jsonl(path: str | os.PathLike, problems: list[Skipped] | None = None) -> list[dict[str, Any]]:
    """Rows of a JSONL file (none if missing); damaged lines are skipped and named."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise WidthscopeError(
            f"cannot read {str(path)!r} ({exc.strerror or exc}): pass a readable JSONL file"
        ) from None
    rows: list[dict[str, Any]] = []
    found: list[Skipped] = []
    lines = raw.split(b"\n")
    for i, blob in enumerate(lines, 1):
        try:
            line = blob.decode("utf-8").strip()
        except UnicodeDecodeError:
            found.append(Skipped(str(path), i, "not UTF-8 text"))
            continue
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            found.append(Skipped(str(path), i, _why_not_json(line, exc, i == len(lines))))
            continue
        if not isinstance(row, dict):
            found.append(Skipped(str(path), i, f"a JSON {_JSON_TYPE.get(type(row), 'value')}, not a row object"))
            continue
        rows.append(row)
    record_skips(found, problems)
    return rows


def _fmt(v: Any, floatfmt: str) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, floatfmt) if isinstance(v, float) else str(v)


def format_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    floatfmt: str = ".4g",
    title: str | None = None,
) -> str:
    """Plain-text table for the terminal."""
    if not rows:
        return (title + "\n" if title else "") + "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c), floatfmt) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.rjust(w) for c, w in zip(columns, widths))
    out = [title] if title else []
    out += [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


class LogProgress:
    """tqdm's interface as log lines (``sweep demo: 3/8 (38%) 4m10s elapsed, ~6m57s left``), at most every
    ``$WIDTHSCOPE_PROGRESS_INTERVAL`` seconds (default 30) and when a long loop ends."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "") -> None:
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if isinstance(iterable, Sized) else None)
        self.desc = desc or "progress"
        self.n = 0
        self.interval = float(os.environ.get("WIDTHSCOPE_PROGRESS_INTERVAL", 30))
        self.t0 = self.last = time.monotonic()
        self.postfix = ""

    @staticmethod
    def _fmt(s: float) -> str:
        s = int(s)
        if s >= 3600:
            return f"{s // 3600}h{s % 3600 // 60:02d}m"
        return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"

    def _line(self, now: float) -> str:
        el = now - self.t0
        if self.total:
            left = f", ~{self._fmt(el / self.n * (self.total - self.n))} left" if self.n else ""
            done = f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)"
            return f"{self.desc}: {done} {self._fmt(el)} elapsed{left}{self.postfix}"
        return f"{self.desc}: {self.n} done, {self._fmt(el)} elapsed{self.postfix}"

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            print(self._line(now), file=sys.stderr, flush=True)

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = " (" + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")" if kw else ""

    def close(self) -> None:
        now = time.monotonic()
        if now - self.t0 >= self.interval and self.last != now:
            self.last = now
            print(self._line(now) + " - done", file=sys.stderr, flush=True)

    def __iter__(self) -> Iterator:
        try:
            for x in self.iterable:  # type: ignore[union-attr]
                yield x
                self.update(1)
        finally:
            self.close()


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    disable: bool | None = None,
    **kw: Any,
) -> Any:
    """A tqdm bar on a terminal, :class:`LogProgress` lines in a log (``WIDTHSCOPE_PROGRESS=0/1``)."""
    from tqdm.auto import tqdm

    env = os.environ.get("WIDTHSCOPE_PROGRESS")
    if env == "0" or disable is True:
        return tqdm(iterable, total=total, desc=desc, disable=True, **kw)
    if env == "1" or sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, disable=False, dynamic_ncols=True, leave=False, **kw)
    return LogProgress(iterable, total=total, desc=desc)
