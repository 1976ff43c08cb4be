"""The resumable grid runner and the durable I/O helpers."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from widthscope._io import append_jsonl, atomic_write_json, format_table, read_jsonl
from widthscope.errors import WidthscopeError
from widthscope.sweeps.grid import cell_id, load_rows, parse_shard, run_grid, shard_cells


def test_jsonl_survives_torn_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    append_jsonl(p, [{"a": 1}, {"a": 2}])
    with open(p, "a") as f:
        f.write('{"a": 3, "b"')  # what a kill -9 mid-write can leave
    assert [r["a"] for r in read_jsonl(p)] == [1, 2]
    append_jsonl(p, [{"a": 4}])
    assert [r["a"] for r in read_jsonl(p)] == [1, 2, 4]


def test_atomic_json_nonfinite_is_null(tmp_path):
    p = atomic_write_json(tmp_path / "x.json", {"v": float("nan"), "w": [1.0, float("inf")]})
    assert json.loads(p.read_text()) == {"v": None, "w": [1.0, None]}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]



def test_unwritable_output_paths_raise_widthscope_error(tmp_path):
    # --out / --json pointing at a directory or below a file used to end in an OSError traceback
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(WidthscopeError, match="it is a directory"):
        atomic_write_json(tmp_path, {"a": 1})
    with pytest.raises(WidthscopeError, match=r"file.txt' is a file, not a directory"):
        atomic_write_json(blocker / "out.json", {"a": 1})
    with pytest.raises(WidthscopeError, match="cannot write"):
        append_jsonl(blocker / "sub" / "rows.jsonl", [{"a": 1}])
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]
    atomic_write_json(tmp_path / "new" / "ok.json", {"a": 1})          # parents are created
    assert json.loads((tmp_path / "new" / "ok.json").read_text()) == {"a": 1}

def test_format_table():
    t = format_table([{"x": 1.23456, "name": "a"}, {"x": float("nan"), "name": "bb"}])
    assert "1.235" in t and "-" in t and "bb" in t


def test_parse_shard_errors():
    assert parse_shard("2/3") == (2, 3)
    for bad in ["0/3", "4/3", "a/b", "3"]:
        with pytest.raises(WidthscopeError, match="shard"):
            parse_shard(bad)


def test_shards_partition_grid():
    cells = [{"w": w, "s": s} for w in (8, 16, 32) for s in range(3)]
    parts = [shard_cells(cells, k, 4) for k in range(1, 5)]
    ids = [cell_id(c) for p in parts for c in p]
    assert sorted(ids) == sorted(cell_id(c) for c in cells) and len(set(ids)) == len(cells)


def test_run_grid_resumes_without_redoing(tmp_path):
    cells = [{"w": w} for w in (1, 2, 3, 4)]
    calls = []

    def fn(cell, cell_dir):
        calls.append(cell["w"])
        return [{"y": cell["w"] * 10 + j} for j in range(2)]

    r1 = run_grid(cells[:2], fn, tmp_path)
    assert len(r1.done) == 2
    r2 = run_grid(cells, fn, tmp_path)
    assert calls == [1, 2, 3, 4] and len(r2.skipped) == 2
    rows = read_jsonl(tmp_path / "results.jsonl")
    assert sorted(r["y"] for r in rows) == [10, 11, 20, 21, 30, 31, 40, 41]


def test_run_grid_kill9_then_resume(tmp_path):
    """A process killed mid-grid leaves only whole cells; a rerun completes the grid exactly once."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        from widthscope.sweeps.grid import run_grid
        cells = [{{"w": w}} for w in range(6)]
        def fn(cell, d):
            if cell["w"] == 3 and len(sys.argv) > 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return [{{"y": cell["w"]}}]
        run_grid(cells, fn, {str(tmp_path / 'out')!r})
    """))
    p = subprocess.run([sys.executable, str(script), "kill"])
    assert p.returncode == -9
    assert len(list((tmp_path / "out" / "cells").glob("*.json"))) == 3
    subprocess.run([sys.executable, str(script)], check=True)
    rows = load_rows(tmp_path / "out")
    assert [r["y"] for r in rows] == list(range(6))


def test_shard_for_run_uses_torchrun_rank(monkeypatch):
    from widthscope.sweeps.grid import shard_for_run

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert shard_for_run(None) == (1, 1)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    assert shard_for_run(None) == (3, 3)
    assert shard_for_run("1/2") == (1, 2)  # an explicit --shard wins
