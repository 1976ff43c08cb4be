"""Writers and their bad places (issue 42): an --offload-folder that is a file or read-only, a
--max-memory naming a GPU this machine lacks, two certify runs on one --out, a full disk at each
write, and a SIGTERM as early as a handler can exist. Each is one stderr line and exit status 2 (143
for SIGTERM) before any work, and leaves nothing a rerun would trust."""

from __future__ import annotations

import ast
import errno
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import widthscope.checkpoint as checkpoint_mod
import widthscope.models.hf as hf_mod
from cli_run import one_line, run_cli
from hf_tiny import corpus, save_model, write_text_files
from test_faults import TINY_SWEEP
from widthscope import _io
from widthscope._io import LOCK, append_jsonl, atomic_write_text, hold_lock, lock_held
from widthscope.certification.pipeline import CertifyJob, _lock
from widthscope.cli import main
from widthscope.data.spec import InputSpec
from widthscope.errors import WidthscopeError

TRAINED = "builtin: MLP width 128"  # what certify prints once the built-in model has trained
FAST = ["--train-steps", "2", "--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny Hugging Face causal LM directory and a text file to probe it with."""
    root = tmp_path_factory.mktemp("writers")
    model = save_model(root / "m", "llama")
    text = write_text_files(root / "data", corpus(40), "docs")["txt"]
    return model, text


def _hf_args(hf, command="certify"):
    model, text = hf
    common = ["--model", str(model), "--data", str(text), "--seq-len", "16"]
    if command == "certify":
        common += ["--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10"]
    return [command, *common]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _no_load(monkeypatch):
    """Loading the Hugging Face checkpoint fails the test: the refusal must come before it."""

    def loaded(*a, **k):
        raise AssertionError("the model started loading before the refusal")

    monkeypatch.setattr(hf_mod, "load_hf", loaded)
    monkeypatch.setattr(checkpoint_mod, "load_hf", loaded)  # the name the input layer calls


def _read_only(monkeypatch, root: Path, code: int = errno.EROFS) -> None:
    """Everything under ``root`` behaves as on a read-only file system (root ignores chmod, so
    the tests cannot rely on permissions): creating a folder or opening a file to write fails."""
    real_open, real_mkdir = os.open, os.mkdir

    def inside(path) -> bool:
        p = os.path.abspath(os.fsdecode(path))
        return p == str(root) or p.startswith(str(root) + os.sep)

    def fake_open(path, flags, *a, **k):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if inside(path):
            if os.path.isdir(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


def _full_at(monkeypatch, ends: str, code: int = errno.ENOSPC) -> None:
    """``os.write`` to a file whose name ends with ``ends`` fails as on a full disk (``code``)."""
    real = os.write

    def full(fd, data):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if name.endswith(ends):
            raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")


# ----------------------------------------------------------------------------- 1. --offload-folder
@pytest.mark.parametrize("command", ["certify", "grow"])
def test_offload_folder_that_is_a_file_is_one_line_before_the_model_loads(command, hf, tmp_path, capsys, monkeypatch):
    _no_load(monkeypatch)
    blocker = tmp_path / "weights.bin"
    blocker.write_bytes(b"keep me")
    argv = [
        *_hf_args(hf, command),
        "--device-map",
        "auto",
        "--max-memory",
        "cpu=1MB,disk",
        "--offload-folder",
        str(blocker),
        "--out",
        str(tmp_path / "new" / "r.json"),
    ]
    cap = one_line(argv, capsys, "it is a file, not a directory; choose another --offload-folder")
    assert cap.out.strip() == "" and blocker.read_bytes() == b"keep me"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("code, says", [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")])
@pytest.mark.parametrize("command", ["certify", "grow"])
def test_offload_folder_in_a_read_only_place_is_one_line_before_the_model_loads(
    command, code, says, hf, tmp_path, capsys, monkeypatch
):
    _no_load(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    _read_only(monkeypatch, ro, code)
    for folder in (ro, ro / "deeper" / "off"):  # the folder itself, and one the run would create
        argv = [
            *_hf_args(hf, command),
            "--device-map",
            "auto",
            "--max-memory",
            "cpu=1MB,disk",
            "--offload-folder",
            str(folder),
            "--out",
            str(tmp_path / "r.json"),
        ]
        cap = one_line(argv, capsys, "--offload-folder: cannot write")
        assert says in cap.err and cap.out.strip() == ""
    monkeypatch.undo()
    assert list(ro.iterdir()) == [] and not (tmp_path / "r.json").exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes through chmod")
def test_offload_folder_without_write_permission_is_one_line(hf, tmp_path, capsys, monkeypatch):
    _no_load(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        argv = [
            *_hf_args(hf),
            "--device-map",
            "auto",
            "--max-memory",
            "cpu=1MB,disk",
            "--offload-folder",
            str(ro / "off"),
            "--out",
            str(tmp_path / "c.json"),
        ]
        one_line(argv, capsys, "Permission denied")
    finally:
        ro.chmod(0o755)


def test_sweep_offload_folder_that_is_a_file_is_one_line_before_any_cell(tmp_path, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    cfg = TINY_SWEEP.replace(
        'interventions = "none"',
        f'interventions = "none"\ndevice_map = "auto"\noffload_folder = "{tmp_path / "a_file"}"',
    )
    (tmp_path / "s.toml").write_text(cfg)
    one_line(
        ["sweep", str(tmp_path / "s.toml"), "--out", str(tmp_path / "s")],
        capsys,
        "it is a file, not a directory; choose another [sweep] offload_folder",
    )
    assert not (tmp_path / "s").exists() and (tmp_path / "a_file").read_text() == "not a folder"


# ----------------------------------------------------------------------------- 2. --max-memory
@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("budget, gpu", [("0=1GB", 0), ("cpu=1GB,cuda:1=2GB,disk", 1)])
def test_max_memory_naming_a_missing_gpu_is_one_line_before_the_model_loads(
    budget, gpu, hf, tmp_path, capsys, monkeypatch, no_gpu
):
    _no_load(monkeypatch)
    argv = [*_hf_args(hf), "--device-map", "auto", "--max-memory", budget, "--out", str(tmp_path / "c.json")]
    cap = one_line(argv, capsys, f"--max-memory {budget!r} names GPU {gpu} but no GPU is visible")
    assert "cpu=" in cap.err and cap.out.strip() == "" and not (tmp_path / "c.json").exists()


def test_max_memory_past_the_visible_gpus_is_one_line(hf, tmp_path, capsys, monkeypatch):
    _no_load(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    argv = [*_hf_args(hf), "--device-map", "auto", "--max-memory", "0=1GB,3=1GB", "--out", str(tmp_path / "c.json")]
    one_line(argv, capsys, "names GPU 3 but only 2 GPU(s) are visible (0..1)")


def test_max_memory_cpu_only_still_runs_without_a_gpu(hf, tmp_path, capsys, no_gpu):
    """The check refuses only what names a missing device: a CPU budget runs as before."""
    argv = [
        *_hf_args(hf),
        "--interventions",
        "none",
        "--device-map",
        "auto",
        "--max-memory",
        "cpu=1GB",
        "--out",
        str(tmp_path / "c.json"),
    ]
    rc, _, cap = run_cli(argv, capsys)
    assert rc == 0, cap.err
    assert json.loads((tmp_path / "c.json").read_text())["settings"]["input_spec"]["max_memory"] == "cpu=1GB"


def test_library_load_and_sweep_refuse_a_missing_gpu_in_one_line(hf, tmp_path, capsys, no_gpu):
    with pytest.raises(WidthscopeError, match="names GPU 0 but no GPU is visible") as e:
        hf_mod.load_hf(hf[0], device_map="auto", max_memory="0=1GB")
    assert "\n" not in str(e.value)
    cfg = TINY_SWEEP.replace(
        'interventions = "none"', 'interventions = "none"\ndevice_map = "auto"\nmax_memory = "0=1GB,cpu=1GB"'
    )
    (tmp_path / "s.toml").write_text(cfg)
    cap = one_line(
        ["sweep", str(tmp_path / "s.toml"), "--out", str(tmp_path / "s")],
        capsys,
        "sweep config family 'mlp' max_memory '0=1GB,cpu=1GB' names GPU 0 but no GPU is visible",
    )
    assert "train" not in cap.out and not (tmp_path / "s").exists()  # before the first cell trains


# ----------------------------------------------------------------------------- 3. one certify per --out
def _certify_lock(out: Path):
    """The lock ``widthscope certify --out OUT`` takes (held here, in this process: flock is per
    open file, so the run's own open and flock conflict with it as another process's would)."""
    return _lock(CertifyJob(spec=InputSpec(model="builtin"), out=str(out)))


def test_a_second_certify_on_one_out_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "res" / "c.json"
    with _certify_lock(out):
        assert lock_held(Path(f"{out}.parts") / LOCK)
        cap = one_line(
            ["certify", *FAST, "--out", str(out)],
            capsys,
            f"--out {str(out)!r} is being written by another certify run (pid {os.getpid()})",
        )
        assert "choose another --out" in cap.err and TRAINED not in cap.out  # before training
        assert not out.exists()
    # the holder left: nothing of the lock remains (not even the folders it created) ...
    assert not (tmp_path / "res").exists()
    # ... and a run goes ahead, leaving its result only
    assert main(["certify", *FAST, "--interventions", "none", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["c.json"]


def test_a_second_certify_process_is_refused_while_the_first_runs(tmp_path):
    """Two real processes: the first holds the lock while it trains; the second is refused in one line."""
    out = tmp_path / "c.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WIDTHSCOPE_PROGRESS": "0"}
    cmd = [sys.executable, "-m", "widthscope", "certify", "--train-steps", "1000000", "--out", str(out)]
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = Path(f"{out}.parts") / LOCK
    try:
        t0 = time.time()
        while not (lock_held(lock) and _io.lock_holder(lock) == f"pid {first.pid}"):
            assert first.poll() is None and time.time() - t0 < 120, first.communicate()
            time.sleep(0.05)
        second = subprocess.run(
            [*cmd[:-1], str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"is being written by another certify run (pid {first.pid})" in lines[0]
        assert TRAINED not in second.stdout
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 143 and not lock.parent.exists()  # stopped: nothing left behind


def test_a_stale_certify_lock_from_a_killed_run_does_not_block(tmp_path, capsys):
    out = tmp_path / "c.json"
    parts = Path(f"{out}.parts")
    parts.mkdir()
    (parts / LOCK).write_text("999999\n")  # what a kill -9 leaves: the kernel released its lock
    assert main(["certify", *FAST, "--interventions", "none", "--out", str(out)]) == 0
    assert out.exists() and not parts.exists()


def test_refused_certify_runs_leave_no_lock_behind(tmp_path, capsys):
    """A run refused after it took the lock (a check that needs the model) removes it with its folders."""
    out = tmp_path / "new" / "c.json"
    one_line(["certify", *FAST, "--project", "2000000", "--out", str(out)], capsys, "--project 2000000")
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- 4. a full disk at each write
@needs_proc
@pytest.mark.parametrize(
    "code, says",
    [(errno.ENOSPC, "No space left on device"), (errno.EDQUOT, "quota"), (errno.EROFS, "Read-only file system")],
)
def test_sweep_lock_on_a_full_disk_is_one_line_and_leaves_no_lock_file(code, says, tmp_path, capsys, monkeypatch):
    (tmp_path / "s.toml").write_text(TINY_SWEEP)
    _full_at(monkeypatch, LOCK, code)
    cap = one_line(
        ["sweep", str(tmp_path / "s.toml"), "--out", str(tmp_path / "s")],
        capsys,
        f"cannot write {str(tmp_path / 's' / LOCK)!r}",
    )
    assert says.lower() in cap.err.lower() and "Traceback" not in cap.err
    assert not (tmp_path / "s").exists()  # neither an empty lock file nor the folder made for it
    if code in (errno.ENOSPC, errno.EDQUOT):
        assert "free space" in cap.err


@needs_proc
def test_certify_lock_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    _full_at(monkeypatch, LOCK)
    out = tmp_path / "new" / "c.json"
    cap = one_line(["certify", *FAST, "--out", str(out)], capsys, "No space left on device")
    assert TRAINED not in cap.out and not (tmp_path / "new").exists()


@needs_proc
def test_a_lock_file_of_an_earlier_run_is_kept_when_the_write_fails(tmp_path, monkeypatch):
    """Only what this call created is removed: a lock file that was there stays."""
    (tmp_path / LOCK).write_text("123\n")
    _full_at(monkeypatch, LOCK)
    with pytest.raises(WidthscopeError, match="No space left on device"):
        with hold_lock(tmp_path / LOCK, lambda h: WidthscopeError(h)):
            pass
    assert (tmp_path / LOCK).exists()


@needs_proc
def test_append_jsonl_on_a_full_disk_leaves_the_rows_it_had(tmp_path, monkeypatch):
    path = tmp_path / "monitor.jsonl"
    append_jsonl(path, [{"step": 0}, {"step": 1}])
    before = path.read_bytes()
    real = os.write

    def half_then_full(fd, data):  # a disk that fills mid-write: part of the row lands, then ENOSPC
        if os.readlink(f"/proc/self/fd/{fd}").endswith("monitor.jsonl"):
            if len(data) > 4:
                return real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(WidthscopeError, match="No space left on device.*free space") as e:
        append_jsonl(path, [{"step": 2, "loss": 0.5}])
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    assert path.read_bytes() == before  # no torn row for a rerun to read
    append_jsonl(path, [{"step": 2}])
    assert [r["step"] for r in _io.read_jsonl(path)] == [0, 1, 2]


def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    path.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(WidthscopeError, match="No space left on device"):
        atomic_write_text(path, "new\n" * 1000)
    monkeypatch.undo()
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_certify_part_on_a_full_disk_keeps_finished_points_and_resumes(tmp_path, capsys, monkeypatch):
    """The disk fills while the second point's part is written: one line naming what was kept, only
    whole parts on disk, and --resume finishes the run from them."""
    real = os.replace
    seen = {"parts": 0}

    def full(src, dst):
        if str(dst).endswith(".json") and ".parts" in str(dst):
            seen["parts"] += 1
            if seen["parts"] == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "c.json"
    argv = ["certify", *FAST, "--interventions", "none", "--out", str(out)]
    cap = one_line(argv, capsys, "No space left on device")
    assert "kept: 1 finished point(s)" in cap.err and not out.exists()
    parts = Path(f"{out}.parts")
    assert sorted(p.suffix for p in parts.iterdir()) == [".json"]  # one whole part, no temporary, no lock
    json.loads(next(parts.iterdir()).read_text())
    monkeypatch.undo()
    assert main([*argv, "--resume"]) == 0
    assert "resume: 1 of" in capsys.readouterr().out and out.exists() and not parts.exists()


def test_samples_on_a_full_disk_are_one_line_and_leave_no_temporary(tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*a, **k):  # what safetensors raises on a full disk (its own type, not OSError)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    samples = tmp_path / "s.safetensors"
    cap = one_line(
        [
            "certify",
            *FAST,
            "--interventions",
            "none",
            "--out",
            str(tmp_path / "c.json"),
            "--save-samples",
            str(samples),
        ],
        capsys,
        f"cannot write {str(samples)!r}",
    )
    assert "No space left on device" in cap.err and not samples.exists()
    assert not list(tmp_path.glob(".s.safetensors*"))


# ----------------------------------------------------------------------------- 5. SIGTERM at once
def _catches(pid: int, sig: int, argv_tail: list[str]) -> bool:
    """The process ``pid`` runs our command (exec done: its command line ends with ``argv_tail``)
    and has a handler for ``sig`` (bit ``sig - 1`` of ``SigCgt`` in ``/proc/PID/status``)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    if [os.fsdecode(a) for a in cmdline[-len(argv_tail) :]] != argv_tail:
        return False  # not exec'd yet: that is the test process's copy
    mask = next((int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("SigCgt:")), 0)
    return bool(mask >> (sig - 1) & 1)


@needs_proc
@pytest.mark.slow
@pytest.mark.parametrize("entry, delay", [("module", 0.0), ("module", 0.3), ("console", 0.0)])
def test_sigterm_as_soon_as_a_handler_can_exist_is_one_line(entry, delay, tmp_path):
    """SIGTERM the moment the process can catch it (no fixed sleep: a slow machine only waits longer).

    Before Python runs the entry module's first lines no handler can exist (the kernel's default
    kills the process, status -15, whatever widthscope does), so the signal is sent once
    ``/proc/PID/status`` shows SIGTERM caught, polled as fast as we can: for ``python -m widthscope``
    that is the first statement of widthscope/__main__.py, before ``widthscope.cli`` (or torch)
    is imported; for the ``widthscope`` script, the first statement of ``widthscope.cli.main``.
    From there on a SIGTERM at any moment, ``delay`` seconds later too (inside the imports), is the
    one "terminated (SIGTERM)" line and status 143."""
    tail = ["certify", "--plan", "--out", str(tmp_path / "c.json")]
    if entry == "module":
        cmd = [sys.executable, "-m", "widthscope", *tail]
    else:
        script = Path(sys.executable).with_name("widthscope")
        if not script.exists():
            pytest.skip("no widthscope console script beside this Python")
        cmd = [str(script), *tail]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WIDTHSCOPE_PROGRESS": "0"}
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not _catches(p.pid, signal.SIGTERM, tail):
            assert p.poll() is None, "the command ended before it caught SIGTERM"
            assert time.monotonic() - t0 < 120, "no SIGTERM handler within 120 s"
            time.sleep(0.0002)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 143, (p.returncode, err)
    assert lines == ["widthscope certify: terminated (SIGTERM); no finished results were written"], err
    assert out.strip() == "" and not (tmp_path / "c.json").exists()


def test_the_entry_module_installs_its_handlers_before_importing_anything():
    """What the test above cannot see (it waits for the handler, however late): in
    ``python -m widthscope`` nothing but ``signal`` is imported before SIGTERM/SIGINT are caught.
    (The package's ``__init__`` runs first; it imports only small modules of its own.)"""
    origin = importlib.util.find_spec("widthscope.__main__").origin  # found, not run
    body = ast.parse(Path(origin).read_text(encoding="utf-8")).body

    def installs(node, sig):
        return (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "signal.signal"
            and ast.unparse(node.value.args[0]) == sig
        )

    first = next(i for i, n in enumerate(body) if installs(n, "signal.SIGTERM"))
    before = [n for n in body[:first] if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in before] == ["import signal"], [ast.unparse(n) for n in before]
    assert installs(body[first + 1], "signal.SIGINT")
