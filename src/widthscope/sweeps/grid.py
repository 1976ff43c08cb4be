"""Resumable, shardable execution of a grid of independent cells.

A finished cell is one file, ``cells/<cell_id>.json``, written atomically with all its rows;
``results.jsonl`` is a view rebuilt atomically from them. Shard ``k/n`` takes cells ``k-1, k-1+n, ...``
of the grid; a run holds an advisory lock on the folder (:func:`lock_out_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from .. import distributed
from .._env import environment, torch_threads
from .._io import (
    LOCK,
    Skipped,
    atomic_write_json,
    atomic_write_text,
    cut_off,
    hold_lock,
    on_interrupt,
    progress,
    record_skips,
    to_jsonable,
    unwritable,
    warn_skips,
)
from ..errors import WidthscopeError

__all__ = [
    "cell_id",
    "parse_shard",
    "shard_for_run",
    "finish_after_ranks",
    "shard_cells",
    "run_grid",
    "load_rows",
    "lock_out_dir",
    "GridResult",
    "read_cell",
    "cell_state",
    "new_backup_dir",
    "set_aside",
]

RESULTS = "results.jsonl"
BACKUP = "backup"  # damaged files set aside and replaced results live here, never deleted


def cell_id(cell: Mapping[str, Any]) -> str:
    """Stable identifier of a cell: a short hash of its canonical JSON."""
    blob = json.dumps(to_jsonable(cell), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"k/n"`` (1-based k) -> ``(k, n)``; ``None`` -> ``(1, 1)``."""
    if text is None:
        return (1, 1)
    try:
        k_s, n_s = str(text).split("/")
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise WidthscopeError(f"--shard {text!r}: expected the form k/n with whole numbers, e.g. 2/4") from None
    if not (n >= 1 and 1 <= k <= n):
        raise WidthscopeError(f"--shard {text!r}: need 1 <= k <= n (got k={k}, n={n})")
    return (k, n)


def shard_for_run(text: str | None) -> tuple[int, int]:
    """``--shard`` when given; else, under ``torchrun`` with ``W`` ranks, rank ``r`` runs shard ``r+1/W``."""
    if text is not None:
        return parse_shard(text)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 and "RANK" in os.environ:
        return (int(os.environ["RANK"]) + 1, world)
    return (1, 1)


def finish_after_ranks(shard_text: str | None, finish: Callable[[], Any]) -> bool:
    """Under ``torchrun`` (no ``--shard``): wait for every rank, then call ``finish()`` on rank 0 and
    return False; otherwise return True (this process prints the summary itself)."""
    if shard_text is not None or int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return True
    distributed.init_from_env(timeout_s=float(os.environ.get("WIDTHSCOPE_DIST_TIMEOUT", 7 * 24 * 3600)))
    distributed.barrier()
    if distributed.is_main():
        finish()
    distributed.barrier()
    return False


@contextlib.contextmanager
def lock_out_dir(out_dir: str | os.PathLike, shard: tuple[int, int] = (1, 1), what: str = "sweep") -> Iterator[None]:
    """Hold an advisory ``flock`` on ``out_dir`` while a run writes into it (:func:`widthscope._io.hold_lock`):
    shared by the shards of one grid, exclusive otherwise; a second run is refused naming the holder."""
    out_dir = Path(out_dir)

    def refuse(holder: str) -> WidthscopeError:
        return WidthscopeError(
            f"results directory {str(out_dir)!r} is in use by another {what} ({holder}); "
            f"wait for it to finish or stop it, or choose another --out"
        )

    with hold_lock(out_dir / LOCK, refuse, shard=shard, what=what, where=out_dir):
        yield


def shard_cells(cells: Sequence[Mapping[str, Any]], k: int, n: int) -> list[Mapping[str, Any]]:
    """Cells ``k-1, k-1+n, k-1+2n, ...`` of the grid (deterministic, disjoint, covering)."""
    return [c for i, c in enumerate(cells) if i % n == k - 1]


@dataclass
class GridResult:
    out_dir: Path
    done: list[str] = field(default_factory=list)  # ran in this call
    skipped: list[str] = field(default_factory=list)  # already finished before this call
    rows: list[dict[str, Any]] = field(default_factory=list)  # every finished row in out_dir
    damaged: list[str] = field(default_factory=list)  # damaged cell files of this shard, set aside (new paths)
    problems: list[Skipped] = field(default_factory=list)  # damaged cell files left out of ``rows``

    @property
    def results_path(self) -> Path:
        return self.out_dir / RESULTS


def cell_path(out_dir: Path, cid: str) -> Path:
    return out_dir / "cells" / f"{cid}.json"


def read_cell(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a readable cell file, ``(None, why)`` for a damaged one."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if not text.strip():
        return None, "empty (a write the file system lost?)"
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        if "\x00" in text:
            return None, "not JSON (NUL bytes: the zero fill a crash can leave)"
        if cut_off(text, exc):
            return None, "not JSON (truncated: it ends mid-record)"
        return None, f"not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
    if not isinstance(rec, dict) or not isinstance(rec.get("rows"), list):
        return None, "not a cell record (no 'rows' list)"
    if not all(isinstance(r, dict) for r in rec["rows"]):
        return None, "not a cell record (its rows are not all JSON objects)"
    return rec, None


def cell_state(out_dir: Path, cell: Mapping[str, Any]) -> bool | str:
    """For a dry run: True for a finished cell, False for one not run, else why it runs again."""
    path = cell_path(out_dir, cell_id(cell))
    if not path.exists():
        return False
    return "damaged: runs again" if read_cell(path)[1] else True


def new_backup_dir(out_dir: str | Path) -> Path:
    """A fresh ``OUT/backup/<date-time>`` path (not created yet) for files set aside now."""
    base = Path(out_dir) / BACKUP / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def set_aside(out_dir: str | Path, paths: Sequence[Path], backup: Path) -> list[Path]:
    """Move ``paths`` (inside ``out_dir``) to the same place under ``backup``; return the new paths."""
    out_dir = Path(out_dir)
    moved = []
    for p in paths:
        dest = backup / Path(p).relative_to(out_dir)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, dest)
        except OSError as exc:
            raise unwritable(dest, exc) from None
        moved.append(dest)
    return moved


def load_rows(
    out_dir: str | Path, *, rebuild: bool = True, problems: list[Skipped] | None = None
) -> list[dict[str, Any]]:
    """All rows of all finished cells in ``out_dir``, in a stable order; ``rebuild``: also rewrite
    ``results.jsonl`` atomically. A damaged cell file is skipped and named (in ``problems`` when given,
    else on stderr)."""
    out_dir = Path(out_dir)
    rows: list[dict[str, Any]] = []
    found: list[Skipped] = []
    for p in sorted((out_dir / "cells").glob("*.json")):
        rec, why = read_cell(p)
        if rec is None:
            found.append(Skipped(str(p), None, str(why)))
        else:
            rows.extend(rec["rows"])
    rows.sort(key=lambda r: (r.get("cell_index", 0), r.get("row_index", 0)))
    record_skips(found, problems)
    if rebuild and (out_dir / "cells").exists():
        atomic_write_text(out_dir / RESULTS, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return rows


def run_grid(
    cells: Sequence[Mapping[str, Any]],
    fn: Callable[[Mapping[str, Any], Path], list[dict[str, Any]]],
    out_dir: str | Path,
    *,
    shard: tuple[int, int] = (1, 1),
    desc: str = "cells",
    record: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> GridResult:
    """Run ``fn(cell, cell_dir) -> rows`` for every unfinished cell of this shard (``cell_dir``: its
    scratch folder). Each row gets ``cell_id``, ``cell_index``, ``row_index``, the cell's parameters and
    the ``env_*`` fields of :func:`widthscope._env.environment` (row keys win); ``record(cell)``: more
    top-level entries of the cell's file (never ``cell``, ``cell_id``, ``rows``)."""
    out_dir = Path(out_dir)
    try:
        (out_dir / "cells").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(out_dir / "cells", exc) from None

    def finished() -> str | None:
        n_done = len(list((out_dir / "cells").glob("*.json")))
        return (
            f"{n_done} finished cell(s) in {out_dir / 'cells'} (rerun the same command to resume)" if n_done else None
        )

    on_interrupt(finished)
    k, n = shard
    result = GridResult(out_dir=out_dir)
    todo = []
    damaged: list[tuple[Path, str]] = []
    for i, c in enumerate(cells):
        if i % n != k - 1:
            continue
        cid = cell_id(c)
        path = cell_path(out_dir, cid)
        why = read_cell(path)[1] if path.exists() else ""
        if why is None:
            result.skipped.append(cid)
            continue
        if why:
            damaged.append((path, why))
        todo.append((i, c, cid))
    if damaged:  # keep the file for inspection and compute the cell again
        moved = set_aside(out_dir, [p for p, _ in damaged], new_backup_dir(out_dir))
        for (path, why), dest in zip(damaged, moved):
            print(
                f"widthscope: note: damaged cell file {path}: {why}; moved to {dest}, the cell runs again",
                file=sys.stderr,
            )
            result.damaged.append(str(dest))
    for i, c, cid in progress(todo, desc=desc, total=len(todo)):
        t0 = time.perf_counter()
        cell_dir = out_dir / "artifacts" / cid
        try:
            cell_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unwritable(cell_dir, exc) from None
        rows = fn(c, cell_dir)
        elapsed = time.perf_counter() - t0
        env = environment()
        full = [
            {"cell_seconds": elapsed, **env, **to_jsonable(dict(c)), **to_jsonable(r)}
            | {"cell_id": cid, "cell_index": i, "row_index": j}
            for j, r in enumerate(rows)
        ]
        extra = {k: v for k, v in (record(c) if record else {}).items() if k not in ("cell", "cell_id", "rows")}
        atomic_write_json(cell_path(out_dir, cid), {"cell": c, "cell_id": cid, **to_jsonable(extra), "rows": full})
        load_rows(out_dir, problems=[])  # results.jsonl stays a valid view (damage: said below)
        result.done.append(cid)
    result.rows = load_rows(out_dir, problems=result.problems)
    if result.problems:  # cells outside this run's shard or grid: their own run sets them aside
        warn_skips(result.problems)
        print(
            f"widthscope: note: {RESULTS} leaves out the {len(result.problems)} damaged cell file(s) above; "
            "rerun the sweep that owns them to compute them again, or `widthscope repair "
            f"{out_dir}` to set them aside with a backup",
            file=sys.stderr,
        )
    return result


@contextlib.contextmanager
def claim_out_dir(
    out_dir: Path, record: dict[str, Any], what: str, shard: tuple[int, int] = (1, 1), threads: int | None = None
) -> Iterator[None]:
    """Hold the lock of ``out_dir``, refuse a folder whose ``sweep.json`` holds another ``fingerprint``
    (``what``: "a sweep", "a suite"), (re)write ``record`` there, and run at ``threads`` torch CPU threads."""
    with torch_threads(threads), lock_out_dir(out_dir, shard, "sweep"):
        marker = Path(out_dir) / "sweep.json"
        if marker.exists():
            try:
                old = json.loads(marker.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                old = {}
            if old.get("fingerprint") not in (None, record["fingerprint"]):
                raise WidthscopeError(
                    f"results directory {str(out_dir)!r} holds {what} with a different config "
                    f"(fingerprint {old.get('fingerprint')} vs {record['fingerprint']}): resuming would mix "
                    "results. Use another --out, or delete that directory to start over"
                )
        atomic_write_json(marker, record)
        yield
