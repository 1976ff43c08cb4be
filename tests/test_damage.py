"""Nothing lost, nothing silent: damaged results, cell, certify and samples files are named (path, line,
why) on stderr and on the report page, or refused with one line (--strict, or where nothing can be
skipped); `report` never writes under its inputs; `repair` is the one command that rewrites a results
folder, and it keeps a backup."""
from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from widthscope._io import Skipped, append_jsonl, read_jsonl
from widthscope.cli import main
from widthscope.sweeps.grid import load_rows, run_grid

from cli_run import one_line, run_cli

WIDTHS, SEEDS, POINTS = (32, 64, 128), (0, 1), ("layers.0", "layers.1")
N_ROWS = len(WIDTHS) * len(SEEDS) * len(POINTS)  # 12 rows, 2 per cell


def _rows(cell):
    w, s = cell["width"], cell["seed"]
    out = []
    for pi, p in enumerate(POINTS):
        d = 2.0 + (pi + 1) * (w / 32) + 0.1 * s
        b = 1 / (1 + 8 * d)
        out.append({"kind": "alignment", "sweep": "dmg", "family": "mlp", "width": w, "seed": s, "point": p,
                    "point_index": pi, "M": 16, "K": 16, "two_d_align": d, "two_d_par": d, "one_d_align": d,
                    "two_b_align": b, "two_b_exact": 0.7 * b, "two_vacuous": False, "misalignment": b / 3,
                    "misalignment_low": b / 6, "misalignment_high": b / 2, "misalignment_draws": 100,
                    "test_loss": 1.0, "train_loss": 0.9})
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished sweep results folder (cells/ + results.jsonl), written by the real grid runner."""
    out = tmp_path_factory.mktemp("base") / "res"
    run_grid([{"width": w, "seed": s} for w in WIDTHS for s in SEEDS], lambda c, d: _rows(c), out)
    return out


@pytest.fixture
def res(base, tmp_path):
    out = tmp_path / "res"
    shutil.copytree(base, out)
    return out


_run, _one_line = run_cli, one_line  # tests/cli_run.py, shared by the bad-input tests


def _tree(root: Path) -> dict[str, str]:
    """Every path under root with a hash of its bytes: equal trees are byte-for-byte equal."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def _cells(res: Path) -> list[Path]:
    return sorted((res / "cells").glob("*.json"))


def _only_jsonl(res: Path) -> Path:
    """The results folder as `compact` copies leave it: results.jsonl alone, no cells/."""
    shutil.rmtree(res / "cells")
    return res


def _lines(res: Path) -> list[str]:
    return (res / "results.jsonl").read_text().splitlines()


def _write_lines(res: Path, lines: list[str], end: str = "\n") -> None:
    (res / "results.jsonl").write_bytes(("\n".join(lines) + end).encode("utf-8", "surrogateescape"))


# ----------------------------------------------------------------------------- damage, one case each
def cell_truncated(res):
    p = _cells(res)[0]
    p.write_text(p.read_text()[:80])
    return f"{p}: not JSON (truncated: it ends mid-record)"


def cell_not_utf8(res):
    p = _cells(res)[1]
    p.write_bytes(b"\xff\xfe\x00garbage")
    return f"{p}: not UTF-8 text"


def cell_empty(res):
    p = _cells(res)[2]
    p.write_bytes(b"")
    return f"{p}: empty"


def cell_nul_filled(res):
    p = _cells(res)[0]
    p.write_bytes(b"\x00" * 300)
    return f"{p}: not JSON (NUL bytes"


def cell_without_rows(res):
    p = _cells(res)[0]
    p.write_text(json.dumps({"cell": {"width": 32}, "cell_id": p.stem}))
    return f"{p}: not a cell record (no 'rows' list)"


def cell_rows_not_objects(res):
    p = _cells(res)[0]
    p.write_text(json.dumps({"cell": {}, "cell_id": p.stem, "rows": [1, 2]}))
    return f"{p}: not a cell record (its rows are not all JSON objects)"


def jsonl_torn_last_line(res):
    _only_jsonl(res)
    with open(res / "results.jsonl", "a") as f:
        f.write('{"kind": "alignment", "width": 2')  # what a kill -9 mid-append leaves
    return f"{res / 'results.jsonl'} line {N_ROWS + 1}: not JSON (torn line: the last line"


def jsonl_torn_middle_line(res):
    _only_jsonl(res)
    with open(res / "results.jsonl", "a") as f:
        f.write('{"kind": "alignment", "wid')
    append_jsonl(res / "results.jsonl", _rows({"width": 256, "seed": 0}))  # a later append starts a new line
    return f"{res / 'results.jsonl'} line {N_ROWS + 1}: not JSON (torn line: it ends mid-row)"


def jsonl_not_json_middle(res):
    _only_jsonl(res)
    lines = _lines(res)
    lines[4] = "<<<<<<< HEAD"  # a merge conflict marker pasted in
    _write_lines(res, lines)
    return f"{res / 'results.jsonl'} line 5: not JSON (Expecting value, column 1)"


def jsonl_not_utf8(res):
    _only_jsonl(res)
    raw = (res / "results.jsonl").read_bytes().split(b"\n")
    raw[2] = b'{"kind": "\xff"}'
    (res / "results.jsonl").write_bytes(b"\n".join(raw))
    return f"{res / 'results.jsonl'} line 3: not UTF-8 text"


def jsonl_array_line(res):
    _only_jsonl(res)
    lines = _lines(res)
    lines.insert(1, "[1, 2, 3]")
    _write_lines(res, lines)
    return f"{res / 'results.jsonl'} line 2: a JSON array, not a row object"


def jsonl_nul_line(res):
    _only_jsonl(res)
    lines = _lines(res)
    lines.insert(3, "\x00" * 40)
    _write_lines(res, lines)
    return f"{res / 'results.jsonl'} line 4: not JSON (NUL bytes"


Damage = namedtuple("Damage", "make rows_left")
DAMAGE = {f.__name__: Damage(f, n) for f, n in [
    (cell_truncated, N_ROWS - 2), (cell_not_utf8, N_ROWS - 2), (cell_empty, N_ROWS - 2),
    (cell_nul_filled, N_ROWS - 2), (cell_without_rows, N_ROWS - 2), (cell_rows_not_objects, N_ROWS - 2),
    (jsonl_torn_last_line, N_ROWS), (jsonl_torn_middle_line, N_ROWS + 2), (jsonl_not_json_middle, N_ROWS - 1),
    (jsonl_not_utf8, N_ROWS - 1), (jsonl_array_line, N_ROWS), (jsonl_nul_line, N_ROWS)]}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_report_names_each_skip_on_stderr_and_on_the_page(name, res, tmp_path, capsys):
    where = DAMAGE[name].make(res)
    before = _tree(res)
    rc, lines, cap = _run(["report", str(res), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0 and "Traceback" not in cap.err, cap.err
    assert lines[0].startswith(f"widthscope report: note: {where}"), lines[0]
    assert lines[0].endswith(", skipped")
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "damaged input: 1 line(s)/file(s) were skipped" in page
    assert where.replace("'", "&#x27;") in page  # html-escaped like every note
    assert f"{DAMAGE[name].rows_left} rows from" in page
    assert _tree(res) == before  # the input is only read


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_strict_report_refuses_damage_with_one_line(name, res, tmp_path, capsys):
    where = DAMAGE[name].make(res)
    before = _tree(res)
    cap = _one_line(["report", str(res), "--out", str(tmp_path / "rep"), "--strict"], capsys,
                    f"widthscope report: error: {where}")
    assert "--strict refuses damaged input" in cap.err and "widthscope repair DIR" in cap.err
    assert not (tmp_path / "rep").exists() and _tree(res) == before


def test_a_jsonl_file_given_directly_is_read_the_same_way(res, tmp_path, capsys):
    where = jsonl_torn_last_line(res)
    rc, lines, cap = _run(["report", str(res / "results.jsonl"), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0 and lines[0] == f"widthscope report: note: {where.split(' (')[0]} (torn line: the last line, " \
                                   "cut off by an interrupted write), skipped", cap.err
    _one_line(["report", str(res / "results.jsonl"), "--strict", "--out", str(tmp_path / "r2")], capsys,
              "line 13: not JSON (torn line")


def test_blank_lines_are_not_damage(res, tmp_path, capsys):
    _only_jsonl(res)
    _write_lines(res, ["", *_lines(res)[:6], "   ", "", *_lines(res)[6:]], end="\n\n")
    rc, lines, cap = _run(["report", str(res), "--out", str(tmp_path / "rep"), "--strict"], capsys)
    assert rc == 0 and not lines and "Traceback" not in cap.err, cap.err
    assert "damaged input" not in (tmp_path / "rep" / "report.html").read_text()


def test_many_skips_are_summed_up_after_the_first_few(res, tmp_path, capsys):
    _only_jsonl(res)
    _write_lines(res, [*_lines(res), *(f"garbage {i}" for i in range(9))])
    rc, lines, cap = _run(["report", str(res), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0, cap.err
    notes = [ln for ln in lines if ln.startswith("widthscope report: note:")]
    assert len(notes) == 6 and "line 13: not JSON" in notes[0]
    assert notes[-1] == "widthscope report: note: ... and 4 more damaged line(s)/file(s) skipped (9 in all)"
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "damaged input: 9 line(s)/file(s)" in page and "line 21: not JSON" in page  # the page lists all


def test_only_damaged_lines_is_one_line_naming_the_first(res, tmp_path, capsys):
    _only_jsonl(res)
    (res / "results.jsonl").write_text('{"kind": "ali\nnot json\n')
    _one_line(["report", str(res), "--out", str(tmp_path / "rep")], capsys,
              f"no readable rows in {res}: 2 damaged line(s)/file(s), first {res / 'results.jsonl'} line 1")


def test_damaged_cell_says_results_jsonl_still_holds_its_rows(res, tmp_path, capsys):
    cell_truncated(res)
    rc, _, cap = _run(["report", str(res), "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0, cap.err
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "results.jsonl still holds 2 row(s) of the 1 damaged cell file(s)" in page


# ----------------------------------------------------------------------------- report only reads
def test_report_on_a_read_only_copy_writes_nothing_under_it(res, tmp_path, capsys):
    """The bug: report rebuilt the input's results.jsonl from its readable cells (120 -> 100 rows),
    exit 0, no word. Tests run as root, which chmod does not stop: compare every byte."""
    cell_truncated(res)
    (res / "results.jsonl").unlink()  # once, report wrote a missing results.jsonl too
    before = _tree(res)
    for p in [res, *res.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        rc, lines, cap = _run(["report", str(res), "--out", str(tmp_path / "rep")], capsys)
    finally:
        for p in [res, *res.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert rc == 0 and "Traceback" not in cap.err, cap.err
    assert "cells/" in lines[0] and "not JSON (truncated" in lines[0]
    assert _tree(res) == before
    assert (tmp_path / "rep" / "report.html").is_file()


def test_report_asks_the_reader_not_to_rebuild(res, tmp_path, monkeypatch, capsys):
    import widthscope.sweeps.grid as grid

    seen = []
    real = grid.load_rows

    def spy(out_dir, **kw):
        seen.append(kw.get("rebuild", True))
        return real(out_dir, **kw)

    monkeypatch.setattr(grid, "load_rows", spy)
    assert main(["report", str(res), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    assert seen == [False]


# ----------------------------------------------------------------------------- the readers' API
def test_read_jsonl_collects_or_logs_every_skip(tmp_path, capsys):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\nnope\n{"a": 2}\n{"a": 3, "b"')
    problems: list[Skipped] = []
    assert [r["a"] for r in read_jsonl(p, problems)] == [1, 2]  # the rows, as before
    assert [(s.line, s.why.split(" (")[0]) for s in problems] == [(3, "not JSON"), (5, "not JSON")]
    assert str(problems[1]) == f"{p} line 5: not JSON (torn line: the last line, cut off by an interrupted write), skipped"
    assert capsys.readouterr().err == ""
    assert [r["a"] for r in read_jsonl(p)] == [1, 2]  # no list: said on stderr instead
    err = capsys.readouterr().err.splitlines()
    assert err == [f"widthscope: note: {s}" for s in problems]


def test_load_rows_names_damaged_cells_and_rebuild_false_writes_nothing(res, capsys):
    where = cell_truncated(res)
    before = _tree(res)
    problems: list[Skipped] = []
    rows = load_rows(res, rebuild=False, problems=problems)
    assert len(rows) == N_ROWS - 2 and [str(s) for s in problems] == [f"{where}, skipped"]
    assert _tree(res) == before and capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- certify JSON given to report
def _certify_json():
    cert = {"d_align": 2.0, "b_align": 0.1, "b_exact": 0.07, "vacuous": False}
    return {"settings": {"width": 64, "seed": 0, "architecture": "mlp", "estimator": "unbiased", "pool": "sum"},
            "points": [{"point": "layers.0", "d": 64, "certificates": [{"M": 16, "K": 16, "two": cert, "one": cert}]}]}


CERTIFY = [
    ("truncated", lambda t: t[: len(t) // 2].encode(), "is truncated: its JSON stops after"),
    ("empty", lambda t: b"", "is empty (an interrupted write?)"),
    ("not-utf8", lambda t: b"\xff\xfe" + t.encode("utf-16-le"), "is not UTF-8 text"),
    ("garbage", lambda t: b"{" + b"x" * 20 + b"}", "is not readable JSON"),
]


@pytest.mark.parametrize("name,damage,msg", CERTIFY, ids=[c[0] for c in CERTIFY])
def test_a_damaged_certify_json_is_refused_with_one_line(name, damage, msg, tmp_path, capsys):
    good, bad = tmp_path / "c64.json", tmp_path / "c128.json"
    good.write_text(json.dumps(_certify_json()))
    bad.write_bytes(damage(json.dumps({**_certify_json(), "settings": {**_certify_json()["settings"], "width": 128}},
                                      indent=1)))
    _one_line(["report", str(good), str(bad), "--out", str(tmp_path / "rep")], capsys, f"'{bad}' {msg}")
    assert not (tmp_path / "rep").exists()


# ----------------------------------------------------------------------------- samples given to stats
def _samples(path: Path, meta: dict[str, str] | None = None, drop: str | None = None) -> Path:
    from safetensors.torch import save_file

    from widthscope.certification.samples import save

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(12, 3, generator=g, dtype=torch.float64), torch.randn(12, 3, generator=g, dtype=torch.float64)
    save(path, {"p": a}, {"p": b}, {"settings": {"M": [4], "K": [4], "draws": 20}, "notes": ["ok"]})
    if meta is None and drop is None:
        return path
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = {**f.metadata(), **(meta or {})}
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != drop}
    save_file(tensors, str(path), metadata=header)
    return path


SAMPLES = [
    ("points-not-json", {"points": '["p", '}, None, "metadata 'points' is not JSON"),
    ("points-not-names", {"points": '{"p": 1}'}, None, "metadata 'points' is not a list of point names"),
    ("settings-not-json", {"settings": "{M: 4}"}, None, "metadata 'settings' is not JSON"),
    ("missing-test-tensor", None, "test/p", "point 'p' has no 'test' tensor ('test/p' is missing)"),
    ("missing-train-tensor", None, "train/p", "point 'p' has no 'train' tensor"),
]


@pytest.mark.parametrize("name,meta,drop,msg", SAMPLES, ids=[c[0] for c in SAMPLES])
def test_a_damaged_samples_file_is_one_line(name, meta, drop, msg, tmp_path, capsys):
    p = _samples(tmp_path / "s.safetensors", meta, drop)
    cap = _one_line(["stats", str(p)], capsys, f"widthscope stats: error: samples file {p}: {msg}")
    assert "certify --save-samples" in cap.err


def test_a_truncated_samples_file_is_one_line(tmp_path, capsys):
    p = _samples(tmp_path / "s.safetensors")
    p.write_bytes(p.read_bytes()[:-40])
    _one_line(["stats", str(p)], capsys, f"{p} is not a safetensors samples file")


def test_samples_with_damaged_notes_are_computed_with_a_note_or_refused_strictly(tmp_path, capsys):
    p = _samples(tmp_path / "s.safetensors", {"notes": "[oops"})
    rc, lines, cap = _run(["stats", str(p)], capsys)
    assert rc == 0 and "Traceback" not in cap.err, cap.err
    assert lines == [f"widthscope stats: note: {p}: metadata 'notes' is not JSON (Expecting value at char 1), skipped"]
    assert "p" in cap.out
    _one_line(["stats", str(p), "--strict"], capsys, f"{p}: metadata 'notes' is not JSON")


# ----------------------------------------------------------------------------- repair
def test_repair_keeps_a_backup_and_rebuilds_from_the_readable_cells(res, capsys):
    old = (res / "results.jsonl").read_bytes()
    damaged = _cells(res)[0]
    damaged_bytes = damaged.read_bytes()[:80]
    damaged.write_bytes(damaged_bytes)
    with open(res / "results.jsonl", "a") as f:
        f.write('{"torn": ')
    old = (res / "results.jsonl").read_bytes()
    readable = [r for p in _cells(res)[1:] for r in json.loads(p.read_text())["rows"]]
    rc, lines, cap = _run(["repair", str(res)], capsys)
    assert rc == 0 and not lines, cap.err
    out = cap.out.splitlines()
    backup = next((res / "backup").iterdir())
    assert out[0] == f"repair {res}: damaged cell file {damaged}: not JSON (truncated: it ends mid-record)"
    assert f"repair {res}: moved 1 damaged cell file(s) to {backup / 'cells'}" in out
    assert (f"repair {res}: kept the old results.jsonl ({N_ROWS} row(s), 1 damaged line(s)) as "
            f"{backup / 'results.jsonl'}") in out
    assert f"repair {res}: rebuilt results.jsonl from {len(WIDTHS) * len(SEEDS) - 1} readable cell file(s): " \
           f"{N_ROWS - 2} row(s)" in out
    assert any("held 2 row(s) of the 1 damaged cell(s); rerun the sweep" in ln for ln in out)
    # nothing lost: the damaged file and the old results.jsonl are in the backup, byte for byte
    assert (backup / "cells" / damaged.name).read_bytes() == damaged_bytes and not damaged.exists()
    assert (backup / "results.jsonl").read_bytes() == old
    key = lambda r: (r["cell_index"], r["row_index"])  # noqa: E731
    assert sorted(read_jsonl(res / "results.jsonl"), key=key) == sorted(readable, key=key)
    # a second repair finds nothing to do and writes nothing
    before = _tree(res)
    rc, _, cap = _run(["repair", str(res)], capsys)
    assert rc == 0 and "nothing to repair" in cap.out and _tree(res) == before
    # the sweep then computes the set-aside cell again
    again = run_grid([{"width": w, "seed": s} for w in WIDTHS for s in SEEDS], lambda c, d: _rows(c), res)
    assert again.done == [damaged.stem] and len(read_jsonl(res / "results.jsonl")) == N_ROWS


def test_repair_without_cells_keeps_the_readable_lines(res, capsys):
    jsonl_not_json_middle(res)
    old = (res / "results.jsonl").read_bytes()
    rc, _, cap = _run(["repair", str(res)], capsys)
    assert rc == 0, cap.err
    assert "rebuilt results.jsonl from its readable lines: 11 row(s)" in cap.out
    assert (next((res / "backup").iterdir()) / "results.jsonl").read_bytes() == old
    assert len(read_jsonl(res / "results.jsonl")) == N_ROWS - 1


def test_repair_dry_run_writes_nothing(res, capsys):
    cell_truncated(res)
    before = _tree(res)
    rc, _, cap = _run(["repair", str(res), "--dry-run"], capsys)
    assert rc == 0 and "would move 1 damaged cell file(s)" in cap.out and "dry run: nothing was written" in cap.out
    assert _tree(res) == before


@pytest.mark.parametrize("target,msg", [("nope", "does not exist"), ("res/results.jsonl", "is a file"),
                                        ("empty", "has neither results.jsonl nor cells/")])
def test_repair_bad_target_is_one_line(target, msg, res, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _one_line(["repair", str(tmp_path / target)], capsys, msg)


# ----------------------------------------------------------------------------- the sweep itself
def test_the_sweep_sets_a_damaged_cell_aside_and_runs_it_again(res, capsys):
    damaged = _cells(res)[3]
    damaged.write_bytes(b"\x00" * 64)
    calls = []

    def fn(c, d):
        calls.append(c)
        return _rows(c)

    got = run_grid([{"width": w, "seed": s} for w in WIDTHS for s in SEEDS], fn, res)
    err = capsys.readouterr().err.splitlines()
    assert len(calls) == 1 and got.done == [damaged.stem] and len(got.rows) == N_ROWS
    moved = Path(got.damaged[0])
    assert moved.parent.parent.parent == res / "backup" and moved.read_bytes() == b"\x00" * 64
    assert err == [f"widthscope: note: damaged cell file {damaged}: not JSON (NUL bytes: the zero fill a crash can "
                   f"leave); moved to {moved}, the cell runs again"]
    assert len(read_jsonl(res / "results.jsonl")) == N_ROWS


def test_the_sweep_names_damaged_cells_it_does_not_own(res, capsys):
    from widthscope.sweeps.grid import cell_id

    cells = [{"width": w, "seed": s} for w in WIDTHS for s in SEEDS]
    other = res / "cells" / f"{cell_id(cells[1])}.json"  # shard 2/2's cell
    other.write_text("{")
    got = run_grid(cells, lambda c, d: _rows(c), res, shard=(1, 2))
    err = capsys.readouterr().err
    assert other.exists() and [s.path for s in got.problems] == [str(other)]
    assert f"widthscope: note: {other}: not JSON (truncated: it ends mid-record), skipped" in err
    assert "rerun the sweep that owns them" in err and "Traceback" not in err
