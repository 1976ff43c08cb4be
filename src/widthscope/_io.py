"""Small I/O helpers shared by every long-running command.

Why these exist: long runs must never lose finished work. Files are written to a temporary
sibling and renamed into place (atomic on POSIX), and JSONL rows are appended with one
``write`` + ``fsync`` each, so a ``kill -9`` can at worst leave a truncated *last* line,
which :func:`read_jsonl` drops.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = [
    "check_writable",
    "atomic_write_text",
    "atomic_write_json",
    "append_jsonl",
    "read_jsonl",
    "to_jsonable",
    "format_table",
    "progress",
]


def to_jsonable(obj: Any) -> Any:
    """Convert tensors, numpy values, dataclasses and non-finite floats to plain JSON."""
    import dataclasses

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


def _unwritable(path: Path, exc: OSError) -> Exception:
    from .errors import WidthscopeError

    reason = exc.strerror or str(exc)
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            reason = f"{str(blocker)!r} is a file, not a directory"
    return WidthscopeError(f"cannot write {str(path)!r}: {reason}; choose another output path "
                           "(a file in a writable directory)")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; an unwritable path raises WidthscopeError naming it."""
    path = Path(path)
    if path.is_dir():
        from .errors import WidthscopeError

        raise WidthscopeError(f"cannot write {str(path)!r}: it is a directory; give a file path "
                              f"such as {str(path / 'results.json')!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are shared like any file
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _unwritable(path, exc) from None
        raise
    return path


def check_writable(path: str | os.PathLike) -> Path:
    """Fail now, before any work, if ``path`` cannot be written (a directory, a read-only or
    missing parent); leaves nothing behind but the parent folder."""
    path = Path(path)
    if path.is_dir():
        from .errors import WidthscopeError

        raise WidthscopeError(f"cannot write {str(path)!r}: it is a directory; give a file path "
                              f"such as {str(path / 'results.json')!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        # A previous kill may have left a partial last line: start ours on a fresh line.
        if os.fstat(fd).st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    payload = "\n" + payload
        os.write(fd, payload.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read rows, skipping blank lines and a torn line left by an interrupted append."""
    path = Path(path)
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _fmt(v: Any, floatfmt: str) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return format(v, floatfmt)
    if v is None:
        return "-"
    return str(v)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                 *, floatfmt: str = ".4g", title: str | None = None) -> str:
    """Plain-text table for the terminal (no dependency beyond the standard library)."""
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


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
             disable: bool | None = None, **kw: Any) -> Iterator:
    """tqdm progress bar on stderr; silent when stderr is not a terminal unless forced.

    ``WIDTHSCOPE_PROGRESS=1`` forces bars on, ``=0`` forces them off.
    """
    from tqdm.auto import tqdm

    if disable is None:
        env = os.environ.get("WIDTHSCOPE_PROGRESS")
        disable = (env == "0") if env is not None else not sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True,
                leave=False, **kw)
