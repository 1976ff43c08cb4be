"""`widthscope sweep` and `widthscope linearize`: every bad config is one line, exit 2, before any
data loads or any cell trains, and leaves no output folder; a results folder is locked while a run
writes into it; `results.jsonl` is a valid view of the finished cells after any interruption; a
SIGTERM while the command is still importing ends with the standard one-line message."""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import widthscope.cli as cli
from widthscope.cli import main
from widthscope._io import LOCK
from widthscope._io import lock_held as _held
from widthscope.sweeps.grid import lock_out_dir

from test_faults import TINY_LIN, TINY_SWEEP

LIN5 = TINY_LIN.replace("widths = [16]", "widths = [8, 16, 32, 64, 128]")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _sub(text: str, old: str, new: str) -> str:
    assert old in text, old  # a table row whose edit does not apply would test nothing
    return text.replace(old, new)


_sw, _lin = functools.partial(_sub, TINY_SWEEP), functools.partial(_sub, LIN5)


FAM = "train = { steps = 30, lr = 0.01, batch_size = 32 }"
CERT = "certify = { n_probe_train = 32, n_probe_test = 32, batch_size = 16 }"


def _mon(keys: str) -> str:
    return _sw(CERT, CERT + f"\nmonitor = {{ {keys} }}")


# (command, config: TOML text, b"bytes" for a binary file, or None for a directory, what the line must say)
BAD = [
    ("sweep", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "is not a text file (not UTF-8; a binary file?)"),
    ("sweep", b"[sweep]\nname = 'x\x00'\n", "is not a text file (it holds NUL bytes"),
    ("sweep", None, "is a directory, not a TOML file: pass the file itself"),
    ("sweep", "", "has no [[family]] entries (the file sets nothing); add at least one, e.g. [[family]] name"),
    ("sweep", "# nothing yet\n", "has no [[family]] entries (the file sets nothing)"),
    ("sweep", "[sweep\n", "is not valid TOML"),
    ("sweep", _sw("certify = { n_probe_train = 32", 'certify = { points = ["no.such.point"], n_probe_train = 32'),
     "family 'mlp' certify.points: unknown insertion point 'no.such.point'"),
    ("sweep", _sw("certify = { n_probe_train = 32", 'certify = { points = ["blocks.0", "blocks.7"], n_probe_train = 32'),
     "unknown insertion point 'blocks.7'. Did you mean 'blocks.1'? block outputs (the defaults): blocks.0, blocks.1"),
    ("sweep", _sw('name = "mlp"\n', 'name = "mlp"\nmodel = "transformer"\n'),
     "model 'transformer' is not a model family; valid: mlp, resnet20, llama, pythia"),
    ("sweep", _sw('name = "mlp"\n', 'name = "wide-mlp"\n'), "model 'wide-mlp' is not a model family"),
    ("sweep", _sw("model_options = { depth = 2 }", "model_options = { depth = 2, dropout = 0.1 }"),
     "model 'mlp' at width 8 with model_options {'depth': 2, 'dropout': 0.1}: bad option for model family 'mlp'"),
    ("sweep", _sw('name = "mlp"\n', 'name = "lm"\nmodel = "pythia"\n').replace("widths = [8, 16, 32]", "widths = [48, 64]")
     .replace('dataset = "digits"', 'dataset = "text"\ndata_options = { seq_len = 16 }')
     .replace("model_options = { depth = 2 }", "model_options = { depth = 1, heads = 3 }"),
     "family 'lm': model 'pythia' at width 64 with model_options {'depth': 1, 'heads': 3}: pythia: width 64 must be "
     "divisible by heads=3"),
    ("sweep", _sw("model_options = { depth = 2 }", 'model_options = { activation = "swishy" }'),
     "unknown activation 'swishy'"),
    ("sweep", _sw("model_options = { depth = 2 }", "model_options = { sigma_w = inf }"),
     "family[1].model_options.sigma_w = inf: must be a finite number"),
    ("sweep", _sw(FAM, 'train = { steps = 30, lr = 0.01, optimizer = "lbfgs" }'),
     "train.optimizer 'lbfgs' unknown; valid: adamw, sgd"),
    ("sweep", _sw(FAM, 'train = { steps = 30, lr = 0.01, schedule = "linear" }'),
     "train.schedule 'linear' unknown; valid: cosine, constant"),
    ("sweep", _sw(FAM, 'train = { steps = 30, lr = 0.01, loss = "l1" }'), "train.loss 'l1' unknown"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = 0.01, batch_size = 0 }"),
     "train.batch_size must be a whole number >= 1 (got 0)"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = 0.01, eval_batch_size = 0 }"), "train.eval_batch_size must be"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = inf }"), "train.lr must be a finite number > 0, got inf"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = nan }"), "train.lr must be a finite number > 0, got nan"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = -0.1 }"), "train.lr must be a finite number > 0, got -0.1"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = 0.01, warmup = -1 }"), "train.warmup must be a finite number >= 0"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = 0.01, clip = inf }"), "train.clip must be a finite number >= 0"),
    ("sweep", _sw(FAM, "train = { steps = 30, lr = 0.01, weight_decay = nan }"), "train.weight_decay must be a finite"),
    ("sweep", _sw(FAM, "train = { steps = 0, lr = 0.01 }"), "train.steps must be a whole number >= 1 (got 0)"),
    ("sweep", _sw('interventions = "none"', 'interventions = "none"\ndevice = "nope:7"'),
     "[sweep] device 'nope:7' is not a torch device"),
    ("sweep", _sw('interventions = "none"', 'interventions = "none"\ndevice = "cuda:99"'), "[sweep] device 'cuda:99'"),
    ("sweep", _sw('interventions = "none"', 'interventions = "none"\ndevice = "meta"'), "device 'meta' holds no data"),
    ("sweep", _sw('interventions = "none"', 'interventions = "bias"\netas = [0.1, inf]'),
     "[sweep] etas must be a non-empty list of positive finite numbers"),
    ("sweep", _sw("widths = [8, 16, 32]", "widths = [8, 16, inf]"), "widths must be positive finite numbers"),
    ("sweep", _sw('dataset = "digits"', 'dataset = "digitz"'), "dataset 'digitz' unknown; valid: fashion-mnist"),
    ("sweep", _sw('dataset = "digits"', 'dataset = "digits"\nprobes = [{ name = "n", shift = "noise:inf" }]'),
     "unknown shift 'noise:inf'"),
    ("sweep", _sw('dataset = "digits"', 'dataset = "text"\ndata_options = { seq_len = 16 }')
     .replace(FAM, 'train = { steps = 30, lr = 0.01, loss = "mse" }'),
     "train.loss = 'mse' is for classification; 'text' is language modelling"),
    # monitor = {...}: alignment over training (docs/monitor.md §8)
    ("sweep", _mon("evry = 5"), "[family.monitor]: unknown key(s) 'evry' (did you mean 'every'?)"),
    ("sweep", _mon("every = 0"), "monitor.every must be a whole number of optimizer steps >= 1 or \"log\""),
    ("sweep", _mon("every = -3"), "monitor.every must be a whole number of optimizer steps >= 1"),
    ("sweep", _mon('every = "linear"'), "monitor.every must be a whole number of optimizer steps >= 1 or \"log\""),
    ("sweep", _mon("every = 5, count = 4"), "monitor.count sets the number of log-spaced probes"),
    ("sweep", _mon("count = 1"), "monitor.count (the number of log-spaced probes) must be a whole number >= 2"),
    ("sweep", _mon("every = 5, at = [0, 30]"), "monitor: give at = [steps] or every/count, not both"),
    ("sweep", _mon("at = [0, 31]"), "monitor.at must be a non-empty list of optimizer steps 0..30 (train.steps)"),
    ("sweep", _mon('points = ["blocks.9"]'), "family 'mlp' monitor.points: unknown insertion point 'blocks.9'"),
    ("sweep", _mon("n_train = 200"), "monitor.n_train=200 exceeds the training set size 128"),
    ("sweep", _mon("n_test = 65"), "monitor.n_test=65 exceeds n_test=64"),
    ("sweep", _mon("n_train = 2"), "monitor.n_train (train-pool size) must be a whole number >= 4 (got 2)"),
    ("sweep", _mon("n_train = 6, n_test = 6"), "monitor: the pools (6 train, 6 held-out) are smaller than every (M, K) "
     "of the sweep [(8, 8)]; raise monitor.n_train/n_test or set monitor.M"),
    ("sweep", _mon("n_train = 16, M = 20"), "monitor: (M, K) = (20, 20) needs at least 20 train and 20 held-out"),
    ("sweep", _mon("delta = 1.5"), "monitor.delta must be a probability in (0, 1)"),
    ("sweep", _mon('probe = "shifted"'), "monitor.probe 'shifted' is not one of the family's probes (it has none"),
    ("sweep", _mon("seq_len = 32"), "monitor.seq_len is a text probe length; 'digits' is not text: omit it"),
    ("sweep", _sw(CERT, CERT + "\nmonitor = 5"), "family 'mlp' monitor must be a table"),
    ("linearize", b"\xff\xfe\x00\x01binary", "linearize config"),
    ("linearize", None, "is a directory, not a TOML file"),
    ("linearize", "", "sets nothing: at least widths = [...] is needed, e.g. widths = [64, 128, 256, 512, 1024]"),
    ("linearize", "seeds = [0]\n", "widths must list at least 5 positive integers (got None)"),
    ("linearize", _lin('name = "digits"', 'name = "digitz"'), "data.name 'digitz' is not a classification dataset"),
    ("linearize", _lin('name = "digits"', 'name = "text"'), "data.name 'text' is not a classification dataset"),
    ("linearize", _lin("depth = 2", 'depth = 2\nactivation = "swishy"'), "[model] unknown activation 'swishy'"),
    ("linearize", _lin("depth = 2", "depth = 0"), "[model] mlp option depth must be a positive integer"),
    ("linearize", _lin("depth = 2", "depth = 2\nsigma_w = inf"), "model.sigma_w = inf: must be a finite number"),
    ("linearize", _lin("seeds = [0]", 'seeds = ["a"]'), "seeds must be a non-empty list of distinct whole numbers"),
    ("linearize", _lin("steps = 4", "steps = 4\neta0 = inf"), "train.eta0 must be a finite number > 0"),
    ("linearize", _lin("steps = 4", 'steps = 4\noptimizer = "lbfgs"'), "train.optimizer 'lbfgs'"),
    ("linearize", _lin("steps = 4", "steps = true"), "train.steps must be a positive integer"),
    ("linearize", _lin("n_test = 32", "n_test = 32\nseed = -1"), "data.seed must be a whole number"),
]


@pytest.fixture
def no_data(monkeypatch):
    """A config check that reaches the data (or a cell) has come too late: fail loudly."""
    import widthscope.data as wdata

    def too_late(*a, **k):
        raise AssertionError("data loaded before the config was refused")

    monkeypatch.setattr(wdata, "load", too_late)


def _config(tmp_path: Path, config) -> Path:
    if config is None:
        d = tmp_path / "configs"
        d.mkdir()
        (d / "a.toml").write_text(TINY_SWEEP)
        return d
    p = tmp_path / "cfg.toml"
    p.write_bytes(config) if isinstance(config, bytes) else p.write_text(config)
    return p


@pytest.mark.parametrize("cmd,config,msg", BAD, ids=[f"{c}-{i}-{m[:40]}" for i, (c, _, m) in enumerate(BAD)])
def test_bad_config_is_one_line_before_any_work_and_leaves_nothing(cmd, config, msg, tmp_path, capsys, no_data):
    out = tmp_path / "new" / "out"
    rc = main([cmd, str(_config(tmp_path, config)), "--out", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"widthscope {cmd}: error: ") and msg in lines[0], lines[0]
    assert not (tmp_path / "new").exists()  # not even an empty --out (nor its parent)


def test_existing_out_folder_is_kept_and_left_untouched(tmp_path, capsys, no_data):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("x")
    cfg = _config(tmp_path, _sw("certify = { n_probe_train = 32", 'certify = { points = ["x"], n_probe_train = 32'))
    assert main(["sweep", str(cfg), "--out", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert "unknown insertion point 'x'" in capsys.readouterr().err


def test_dry_run_checks_the_points_too(tmp_path, capsys, no_data):
    cfg = _config(tmp_path, _sw("certify = { n_probe_train = 32", 'certify = { points = ["x"], n_probe_train = 32'))
    assert main(["sweep", str(cfg), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "unknown insertion point 'x'" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_named_points_and_empty_points_list_are_accepted(tmp_path):
    from widthscope.sweeps.alignment import check_structure, load_config

    cfg = load_config(_config(tmp_path, _sw("certify = {", 'certify = { points = ["blocks.1"],')))
    assert check_structure(cfg) == {"mlp": ["blocks.1"]}
    cfg = load_config(_config(tmp_path, _sw("certify = {", "certify = { points = [],")))
    assert check_structure(cfg) == {"mlp": ["blocks.0", "blocks.1"]}  # [] means the defaults, as in a cell


# ----------------------------------------------------------------------------- faults
def test_sigterm_while_the_command_imports_is_the_one_line_message(monkeypatch, capsys):
    # The signal arrives while the command's module (torch, transformers, ...) is being imported,
    # before argparse has even seen the options.
    real = cli.importlib.import_module

    def import_then_term(name):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(name)

    monkeypatch.setattr(cli, "importlib", types.SimpleNamespace(import_module=import_then_term))
    before = signal.getsignal(signal.SIGTERM)
    assert main(["sweep", "whatever.toml"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["widthscope sweep: terminated (SIGTERM); no finished results were written"]
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


def _spawn(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WIDTHSCOPE_PROGRESS": "0",
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "widthscope", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(cond, proc, what, timeout=180):
    t0 = time.time()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended before {what}: {proc.communicate()[1][-2000:]}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def rows_by_cell(path: Path) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)  # every line is whole JSON: the file is replaced, never appended to
        by.setdefault(row["cell_id"], []).append(row)
    return by


@pytest.mark.slow
def test_lock_refuses_a_second_sweep_and_kill9_keeps_a_valid_results_view(tmp_path, capsys):
    (tmp_path / "slow.toml").write_text(TINY_SWEEP.replace("steps = 30", "steps = 600"))
    out = tmp_path / "s"
    p = _spawn(["sweep", str(tmp_path / "slow.toml"), "--out", str(out)], tmp_path)
    try:
        _wait(lambda: (out / LOCK).exists() and _held(out / LOCK)
              and (out / LOCK).read_text().strip() == str(p.pid), p, "it held the lock")
        # a second, identical sweep into the same folder: refused, naming the holder
        capsys.readouterr()
        assert main(["sweep", str(tmp_path / "slow.toml"), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by another sweep (pid {p.pid})" in err[0], err
        assert "choose another --out" in err[0]
        # ... and so is a shard beside the unsharded run (a shard holds the folder shared)
        assert main(["sweep", str(tmp_path / "slow.toml"), "--out", str(out), "--shard", "2/3"]) == 2
        assert f"(pid {p.pid})" in capsys.readouterr().err
        # kill -9 once a cell is in the results view
        cells = out / "cells"
        _wait(lambda: (out / "results.jsonl").exists() and (out / "results.jsonl").stat().st_size > 0, p,
              "a cell finished")
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    files = {q.stem: json.loads(q.read_text())["rows"] for q in cells.glob("*.json")}
    view = rows_by_cell(out / "results.jsonl")
    assert 1 <= len(files) < 3 and view and set(view) <= set(files)
    assert len(files) - len(view) <= 1  # at most the cell whose file landed in the instant before the kill
    for cid, rows in view.items():
        assert rows == files[cid]
    with lock_out_dir(out):  # the kernel released the dead process's lock
        pass


def test_shards_share_a_folder_and_a_second_copy_of_one_shard_is_refused(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    with lock_out_dir(out, (1, 2)), lock_out_dir(out, (2, 2)):
        # lock_out_dir is per open file, so one process can stand in for two (flock semantics)
        from widthscope.errors import WidthscopeError

        with pytest.raises(WidthscopeError, match=rf"in use by another sweep \(pid {os.getpid()}, shard 1/2\)"):
            with lock_out_dir(out, (1, 2)):
                pass
        with pytest.raises(WidthscopeError, match=rf"pid {os.getpid()}, shard 1/2, pid {os.getpid()}, shard 2/2"):
            with lock_out_dir(out, (1, 1)):
                pass
    with lock_out_dir(out):
        pass


def test_linearize_holds_the_lock_too(tmp_path, capsys):
    (tmp_path / "lin.toml").write_text(LIN5)
    out = tmp_path / "l"
    out.mkdir()
    with lock_out_dir(out):
        assert main(["linearize", str(tmp_path / "lin.toml"), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is in use by another linearize run" in err[0] and f"pid {os.getpid()}" in err[0], err
    assert not (out / "cells").exists()


def test_every_shipped_sweep_config_passes_the_structure_check():
    from widthscope.sweeps.alignment import check_structure, load_config

    paths = [p for p in sorted((Path(SRC).parent / "configs").glob("*.toml")) if "[[family]]" in p.read_text()]
    if not paths:
        pytest.skip("configs/ not present")
    for p in paths:
        cfg = load_config(p)
        points = check_structure(cfg, device=False)
        assert set(points) == {f.name for f in cfg.families} and all(points.values()), p


def test_a_folder_that_cannot_be_locked_runs_with_a_note(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with lock_out_dir(tmp_path / "nfs", (1, 2)):
        pass
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be locked (No locks available)" in err[0]
