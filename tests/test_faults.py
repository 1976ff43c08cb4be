"""One error line and nothing lost: every command with every shared bad value, a full disk, an
unwritable output, and signals sent to running commands."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from widthscope.cli import main

TINY_SWEEP = """
[sweep]
name = "tiny"
seeds = [0]
M = [8]
draws = 50
interventions = "none"

[[family]]
name = "mlp"
widths = [8, 16, 32]
dataset = "digits"
n_train = 128
n_test = 64
model_options = { depth = 2 }
train = { steps = 30, lr = 0.01, batch_size = 32 }
certify = { n_probe_train = 32, n_probe_test = 32, batch_size = 16 }
"""
TINY_LIN = """
name = "lin"
widths = [16]
seeds = [0]
[model]
depth = 2
[data]
name = "digits"
n_train = 32
n_test = 32
[train]
steps = 4
log_steps = [0, 4]
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    (root / "sweep.toml").write_text(TINY_SWEEP)
    (root / "lin.toml").write_text(TINY_LIN)
    (root / "a_file").write_text("not a directory")
    import torch

    from widthscope.certification.samples import save

    g = torch.Generator().manual_seed(0)
    save(root / "s.safetensors", {"p": torch.randn(16, 4, generator=g, dtype=torch.float64)},
         {"p": torch.randn(16, 4, generator=g, dtype=torch.float64)}, {"settings": {"M": [4]}})
    return root


def _base(cmd, root):
    return {"certify": ["certify"], "grow": ["grow", "--model", "builtin"], "stats": ["stats", str(root / "s.safetensors")],
            "sweep": ["sweep", str(root / "sweep.toml")], "report": ["report", str(root)],
            "demo": ["demo", "--quick"], "linearize": ["linearize", str(root / "lin.toml")],
            "grow-bench": ["grow-bench", "--quick"]}[cmd]


BAD = [  # (commands, extra argv, what the one line must say)
    (("certify", "grow", "stats"), ["--seed", "-1"], "--seed -1: must be a whole number in 0.."),
    (("certify", "grow", "stats", "sweep", "linearize", "grow-bench"), ["--threads", "0"], "--threads 0"),
    (("grow-bench",), ["--seeds", "x"], "expected comma-separated whole numbers"),
    (("grow-bench",), ["--M", "2"], "--M 2: must be >= 4"),
    (("certify", "grow"), ["--n-train", "2"], "--n-train 2: must be a whole number >= 4"),
    (("certify", "grow"), ["--batch-size", "0"], "--batch-size 0"),
    (("certify", "grow"), ["--seq-len", "1"], "--seq-len 1"),
    (("certify", "grow"), ["--dtype", "float8"], "invalid choice"),
    (("certify", "stats"), ["--draws", "0"], "--draws 0"),
    (("certify",), ["--device", "nope:7"], "is not a torch device"),
    (("certify", "stats"), ["--M", "x"], "expected comma-separated whole numbers"),
    (("grow",), ["--steps", "0"], "--steps 0"),
    (("grow",), ["--lr", "-1"], "--lr -1.0: must be a positive finite number"),
    (("certify", "grow"), ["--data", "/no/such/corpus.txt"], "not a dataset name"),
    (("certify", "grow", "stats"), ["--out", "{file}/x.json"], "cannot write"),
    (("sweep", "report", "demo", "linearize", "grow-bench"), ["--out", "{file}/dir"], "cannot write"),
]
CASES = [(cmd, argv, msg) for cmds, argv, msg in BAD for cmd in cmds]


@pytest.mark.parametrize("cmd,argv,msg", CASES, ids=[f"{c}{' '.join(a)}" for c, a, _ in CASES])
def test_every_command_every_bad_value_is_one_line(cmd, argv, msg, env, capsys, tmp_path):
    argv = [a.replace("{file}", str(env / "a_file")) for a in argv]
    out = tmp_path / "out"
    if "--out" not in argv and cmd in ("certify", "grow", "stats"):
        argv += ["--out", str(out / "r.json")]
    elif "--out" not in argv:
        argv += ["--out", str(out)]
    before = set(env.rglob("*"))
    try:
        rc = main([*_base(cmd, env), *argv])
    except SystemExit as exc:  # argparse errors exit through SystemExit
        rc = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert msg in lines[0], lines[0]
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))  # no output left behind
    assert set(env.rglob("*")) == before


def test_disk_full_during_a_sweep_keeps_finished_cells_and_says_so(env, tmp_path, monkeypatch, capsys):
    import safetensors.torch

    real = safetensors.torch.save_file
    calls = {"n": 0}

    def full(*a, **k):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    rc = main(["sweep", str(env / "sweep.toml"), "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "No space left on device" in err[0] and "kept: 1 finished cell(s)" in err[0]
    assert len(list((tmp_path / "s" / "cells").glob("*.json"))) == 1
    from test_bad_input_sweep import rows_by_cell  # results.jsonl: a valid view of that cell, without a rerun

    (cell,) = (tmp_path / "s" / "cells").glob("*.json")
    assert rows_by_cell(tmp_path / "s" / "results.jsonl") == {cell.stem: json.loads(cell.read_text())["rows"]}
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert main(["sweep", str(env / "sweep.toml"), "--out", str(tmp_path / "s")]) == 0  # resumes
    assert len(list((tmp_path / "s" / "cells").glob("*.json"))) == 3


def test_disk_full_when_certify_writes_is_one_line(tmp_path, monkeypatch, capsys):
    import widthscope._io as io

    real = os.replace

    def full(src, dst):
        if str(dst).endswith("c.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(io.os, "replace", full)
    rc = main(["certify", "--train-steps", "2", "--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10",
               "--interventions", "none", "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "No space left on device" in err[0]
    assert not (tmp_path / "c.json").exists() and not list(tmp_path.glob(".c.json*"))  # no partial file


def _spawn(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WIDTHSCOPE_PROGRESS": "0"}
    return subprocess.Popen([sys.executable, "-m", "widthscope", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_signals_end_runs_cleanly_with_an_accurate_message(env, tmp_path):
    # SIGTERM during a sweep: the finished cells are kept and the message counts them.
    slow = TINY_SWEEP.replace("steps = 30", "steps = 400")
    (tmp_path / "slow.toml").write_text(slow)
    p = _spawn(["sweep", str(tmp_path / "slow.toml"), "--out", str(tmp_path / "s")], tmp_path)
    cells = tmp_path / "s" / "cells"
    t0 = time.time()
    while time.time() - t0 < 120 and not (cells.is_dir() and list(cells.glob("*.json"))):
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    n = len(list(cells.glob("*.json")))
    assert p.returncode == 143 and "Traceback" not in err, err
    assert f"terminated (SIGTERM); kept: {n} finished cell(s)" in err and 1 <= n < 3
    # SIGINT while certify is still training: nothing was written, and it says so.
    p = _spawn(["certify", "--train-steps", "1000000", "--out", str(tmp_path / "c.json")], tmp_path)
    time.sleep(6)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted; no finished results were written" in err, err
    assert not (tmp_path / "c.json").exists()


def test_certify_resume_continues_where_an_interrupted_run_stopped(tmp_path, stop_second_intervention, capsys):
    argv = ["certify", "--train-steps", "5", "--n-train", "48", "--n-test", "48", "--M", "8,16", "--draws", "100"]
    assert main([*argv, "--out", str(tmp_path / "full.json")]) == 0
    full = json.loads((tmp_path / "full.json").read_text())
    stop_second_intervention.on()
    out = tmp_path / "c.json"
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"kept: 1 finished point(s) in {out}.parts (rerun with --resume" in err and not out.exists()
    stop_second_intervention.off()
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert "resume: 1 of 3 point(s) already finished" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["settings"]["resumed_points"] == [full["points"][0]["point"]]
    assert res["points"] == full["points"] and res["ranking"] == full["ranking"]
    _same_settings(res, full)
    assert not Path(str(out) + ".parts").exists()  # cleared once the whole result is written
    # other settings never reuse a part
    assert main([*argv, "--out", str(out), "--seed", "1", "--resume"]) == 0
    assert "resume:" not in capsys.readouterr().out


def _same_settings(resumed, full):
    """Key for key the uninterrupted run's settings; ``resumed_points`` records the resume itself."""
    a = {k: v for k, v in resumed["settings"].items() if k != "resumed_points"}
    assert a == full["settings"], sorted(set(a.items()) ^ set(full["settings"].items()), key=str)


def test_certify_resume_after_the_last_part_records_the_same_settings(tmp_path, monkeypatch, capsys):
    """Killed after every point was finished, before the JSON was written: the result is assembled
    from the parts alone, and still says how its interventions were run."""
    import widthscope.certification.pipeline as pl

    argv = ["certify", "--train-steps", "5", "--n-train", "48", "--n-test", "48", "--M", "8,16", "--draws", "100",
            "--n-etas", "3", "--max-rel-step", "0.01"]
    assert main([*argv, "--out", str(tmp_path / "full.json")]) == 0
    full = json.loads((tmp_path / "full.json").read_text())
    out = tmp_path / "c.json"
    real = pl.atomic_write_json

    def stop_at_the_result(path, obj):
        if Path(path) == out:
            raise KeyboardInterrupt
        return real(path, obj)

    monkeypatch.setattr(pl, "atomic_write_json", stop_at_the_result)
    assert main([*argv, "--out", str(out)]) == 130
    monkeypatch.setattr(pl, "atomic_write_json", real)
    assert len(list(Path(str(out) + ".parts").glob("*.json"))) == 3 and not out.exists()
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert "resume: 3 of 3 point(s) already finished" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["settings"]["n_etas"] == 3 and res["settings"]["max_rel_step"] == 0.01
    assert res["points"] == full["points"] and res["ranking"] == full["ranking"]
    _same_settings(res, full)


def test_log_progress_lines_when_not_a_terminal(monkeypatch, capsys):
    from widthscope._io import progress

    monkeypatch.setenv("WIDTHSCOPE_PROGRESS", "")
    monkeypatch.setenv("WIDTHSCOPE_PROGRESS_INTERVAL", "0")
    list(progress(range(3), desc="cells"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("cells: 1/3 (33%)") and lines[-1].endswith("- done") and "3/3 (100%)" in lines[-1]
    monkeypatch.setenv("WIDTHSCOPE_PROGRESS", "0")
    list(progress(range(3), desc="cells"))
    assert capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, delay", [(signal.SIGINT, 130, 0.3), (signal.SIGINT, 130, 1.5),
                                              (signal.SIGTERM, 143, 0.3)])
def test_a_signal_while_modules_import_still_stops_the_run(tmp_path, sig, code, delay):
    # Raised inside an import, a KeyboardInterrupt can be swallowed by a library's import fallback
    # and the run went on (or died of the signal after the message): signals that arrive while
    # modules import are recorded and acted on once the imports are done.
    p = _spawn(["certify", "--train-steps", "1000000", "--out", str(tmp_path / "c.json")], tmp_path)
    time.sleep(delay)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    what = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert p.returncode == code and f"widthscope certify: {what}; no finished results were written" in err, err
    assert "Traceback" not in err and not (tmp_path / "c.json").exists()
