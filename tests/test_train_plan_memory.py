"""The memory terms of ``linearize --plan`` against brute-force counts on tiny models: the counter of
live tensor bytes (``probe.cost.live_peak``) and the linearization cell (``grow --plan``: tests/test_plan.py).
No timing (``time_run=False``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from widthscope.probe.cost import live_peak
from widthscope.probe.points import resolve_points


def _storages(*tensors: torch.Tensor) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def test_live_peak_counts_the_tensors_made_and_their_peak():
    def made() -> list[torch.Tensor]:
        return [torch.zeros(100), torch.zeros(50, dtype=torch.float64), torch.zeros(3, 7, dtype=torch.int64)]

    out, peak = live_peak(made)
    assert peak == sum(t.numel() * t.element_size() for t in out) == 400 + 400 + 168

    def transient() -> torch.Tensor:
        a = torch.ones(1000)  # 4000 bytes, dropped before the second allocation
        s = a.sum()
        del a
        return torch.ones(10) + s  # the sum's 4 bytes, then 40 bytes

    _, peak = live_peak(transient)
    assert 4000 <= peak <= 4000 + 4 + 40 + 40
    x = torch.ones(1000)
    _, peak = live_peak(lambda: x.view(10, 100))  # a view of what existed before: nothing new
    assert peak == 0


def _builtin(n_train: int = 64, n_test: int = 32, **kw):
    opts = GrowOptions(**{"M": 8, "K": 8, "steps": 2, **kw})
    model, full, split = builtin_inputs(opts.seed, n_train, n_test)
    model.eval()
    pools = _split_pools(model, *split, opts, None)
    return opts, model, full, split, pools


def test_linearize_cell_bytes_hold_the_frozen_kernel_and_its_eigenbasis():
    from widthscope.linearization.config import validate_config
    from widthscope.linearization.plan import cell_bytes, plan_linearize

    cfg = validate_config(
        {
            "name": "tiny",
            "widths": [8, 12, 16, 20, 24],
            "seeds": [0],
            "data": {"name": "digits", "n_train": 32, "n_test": 16},
            "train": {"steps": 3, "alphas": [0.0], "log_steps": [0, 3], "dtype": "float64"},
            "correlations": {"measure": []},
            "fit": {"steps": [3]},
        }
    )
    plan = plan_linearize(cfg, time_run=False)
    X, Xt, o = 32, 16, 10
    data = X * 64 * 8 + X * o * 8 + Xt * 64 * 8 + Xt * o * 8  # float64 inputs and one-hot targets
    assert dict(plan.other_bytes)["data"] == data
    ((what, counted),) = plan.phases
    assert what.startswith("one cell at width 24")
    cell = {"width": 24, "seed": 0, "alpha": 0.0, "correlations": False, "config": "x"}
    assert counted == cell_bytes(cfg, cell)
    # the demo's full-batch SGD on MSE runs the closed form: Θ₀(X ∪ X_t, X) and its eigenvectors, float64
    kernel, eigenvectors = (X + Xt) * o * X * o * 8, (X * o) ** 2 * 8
    assert counted >= kernel + eigenvectors


def _transient(n: int) -> torch.Tensor:
    a = torch.ones(n)
    del a  # given back (the mmap threshold is 64 KiB where it is measured)
    return torch.ones(n // 5)


_SIZED: dict[int, torch.Tensor] = {}


def _fills_a_cache_per_size(n: int) -> torch.Tensor:
    """A work that keeps a buffer per size it meets (as kernels' caches and the allocator's pools do)."""
    if n not in _SIZED:
        _SIZED[n] = torch.ones(n)
    return torch.ones(8)


def test_a_work_warmed_at_another_size_counts_what_its_own_size_fills():
    # the run meets its size once: warmed on itself the per-size buffer is filled before the measurement
    # (not counted), warmed at another size it is filled in the measured run (counted), as in the run
    import functools

    from widthscope.probe.resident import resident_peak

    mib30 = 30 * 2**20 // 4
    on_itself = resident_peak(functools.partial(_fills_a_cache_per_size, mib30))
    if on_itself.peak is None:
        pytest.skip(on_itself.why)
    elsewhere = resident_peak(
        functools.partial(_fills_a_cache_per_size, mib30), warm=functools.partial(_fills_a_cache_per_size, 16)
    )
    assert on_itself.peak < 5e6
    assert elsewhere.peak is not None and 30e6 <= elsewhere.peak < 50e6


def _fail() -> None:
    raise ZeroDivisionError("on purpose")


def _resident_checks(fresh: bool) -> str:
    """The checks of :func:`test_resident_peak_measures_what_the_work_makes_resident`; returns why
    nothing was measured ("" when it was)."""
    import functools

    from widthscope.probe.resident import Resident, larger, resident_peak

    where = "fresh process" if fresh else "forked child"
    mib50 = 50 * 2**20 // 4  # float32 elements of 50 MiB (52.4 MB)
    got = resident_peak(functools.partial(torch.ones, mib50), fresh=fresh)
    if got.peak is None:  # not Linux with glibc and /proc/self/status's VmHWM: nothing is measured
        return got.why
    assert got.where == where
    assert got.left is not None
    assert 45e6 <= got.peak < 80e6
    assert 45e6 <= got.left < 80e6  # the result is alive when the resident set is read
    got = resident_peak(functools.partial(_transient, mib50), fresh=fresh)
    assert got.where == where and got.peak is not None and got.left is not None
    assert 45e6 <= got.peak < 80e6
    assert 8e6 <= got.left < 20e6, got  # 10 MiB
    warmed = resident_peak(functools.partial(torch.ones, mib50), fresh=fresh, warm=functools.partial(torch.ones, 8))
    assert warmed.peak is not None and 45e6 <= warmed.peak < 80e6  # warmed up on a small work of the same kind
    failed = resident_peak(_fail, fresh=fresh)
    assert failed.peak is None and "ZeroDivisionError: on purpose" in failed.why
    assert larger(100, Resident(None, None, "x")) == (100, "counted")
    assert larger(100, Resident(200, 0)) == (200, "measured")
    assert larger(300, Resident(200, 0)) == (300, "counted")
    return ""


@pytest.mark.parametrize("where", ["fresh process", "forked child"])
def test_resident_peak_measures_what_the_work_makes_resident(where):
    if where == "fresh process":
        why = _resident_checks(fresh=True)
    else:
        # a child forked from this test process would inherit its heap: a free chunk that earlier tests
        # left there serves the 50 MiB instead of mmap, and its pages stay resident after the free. The
        # mechanism is checked from a process whose heap is its own.
        import subprocess
        import sys

        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        code += "import test_train_plan_memory as t; print('WHY:' + t._resident_checks(fresh=False))"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        why = run.stdout.rsplit("WHY:", 1)[1].strip()
    if why:
        pytest.skip(why)


def test_resident_peak_forks_what_does_not_pickle():
    from widthscope.probe.resident import resident_peak

    mib20 = 20 * 2**20 // 4
    got = resident_peak(lambda: torch.ones(mib20))  # a lambda does not pickle: measured in a forked child
    if got.peak is None:
        pytest.skip(got.why)
    assert got.where == "forked child" and 18e6 <= got.peak < 40e6
