"""The memory terms of the training plans (``grow --plan``, ``linearize --plan``) against brute-force
counts on tiny models: the counter of live tensor bytes (``probe.cost.live_peak``), the data held,
the growth ranking's extrapolation, the pooled samples, the growth and the linearization cell.
No timing (``time_run=False``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from widthscope.growth.inputs import builtin_inputs
from widthscope.growth.options import GrowOptions
from widthscope.growth.pipeline import _split_pools
from widthscope.growth.plan import _rank, _ranking_peak, _sub_pools, growth_bytes, plan_grow, ranking_bytes
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


def test_plan_grow_counts_the_data_it_holds_and_every_phase():
    opts, model, full, split, pools = _builtin()
    plan = plan_grow(None, opts, n_train=64, n_test=32, time_run=False)
    tensors = [*full.train, *full.test, *split[0], *split[1]]
    tensors += [*pools.probe_train, *pools.rank_test, *pools.evaluate]
    assert dict(plan.other_bytes)["data and its pools"] == _storages(*tensors)
    assert dict(plan.other_bytes)["the original model"] == sum(4 * p.numel() for p in model.parameters())
    phases = dict(plan.phases)
    assert set(phases) == {"ranking the points (counted, extrapolated)", "growing a block (1 x; counted at one step)"}
    largest = max([s.step_bytes for s in plan.stages] + list(phases.values()))
    assert plan.peak_bytes == largest + sum(dict(plan.other_bytes).values())
    compared = plan_grow(None, opts, n_train=64, n_test=32, time_run=False, compare=True)
    assert any(k.startswith("continue baseline") for k in dict(compared.phases))
    grow_compared = next(b for k, b in compared.phases if k.startswith("growing"))
    # compare grows 3 times: the previous grown model is still held beside the next growth
    assert grow_compared > phases["growing a block (1 x; counted at one step)"]


def test_ranking_bytes_is_the_counted_ranking_plus_the_other_points_samples():
    # pools no larger than the batch: the ranking is counted at the run's own size (no extrapolation)
    opts, model, _, _, pools = _builtin(n_train=40, n_test=24, batch_size=64)
    names = resolve_points(model, opts.points)
    widths = {n: 64 for n in names}
    got = ranking_bytes(model, names, widths, pools, opts, None)
    first, last = (
        live_peak(lambda p=p: _rank(model, pools.probe_train, pools.rank_test, [p], opts, None))[1]
        for p in (names[0], names[-1])
    )
    samples = 8 * (pools.n_train + pools.n_rank) * 64 * (len(names) - 1)  # float64 (n, width) per point
    assert got == max(first, last) + samples
    # the first point's own samples are inside the counted ranking
    assert first >= 8 * (pools.n_train + pools.n_rank) * 64


def test_ranking_bytes_extrapolates_each_end_point_in_train_and_held_out_examples():
    opts, model, _, _, pools = _builtin(n_train=128, n_test=64, batch_size=8)
    names = resolve_points(model, opts.points)
    assert len(names) > 1
    widths = {n: 64 for n in names}
    # a known peak per call: the first point cheap in held-out examples, the last one dear (as the line search
    # at a LLaMA's last block); fitted from (a, b), (2a, b), (a, 2b) with a, b two batches (16) at least
    cost = {names[0]: (1000, 10, 20), names[-1]: (500, 5, 900)}
    seen, warmed = [], []

    def fake(work, warm):
        _, train, test, points, *_ = work.args
        (point,) = points
        a, b = len(train[0]), len(test[0])
        seen.append((point, a, b))
        _, w_train, w_test, w_points, w_opts, _ = warm.args
        warmed.append((w_points[0] == point, len(w_train[0]), len(w_test[0]), w_opts.M, w_opts.K))
        c0, ca, cb = cost[point]
        return c0 + ca * a + cb * b

    got = _ranking_peak(model, names, widths, pools, opts, None, fake)
    n_tr, n_rk = pools.n_train, pools.n_rank
    want = max(c0 + ca * n_tr + cb * n_rk for c0, ca, cb in cost.values())
    others = 8 * (n_tr + n_rk) * 64 * (len(names) - 1)
    assert got == want + others
    assert {(a, b) for _, a, b in seen} == {(16, 16), (32, 16), (16, 32)}
    assert {p for p, _, _ in seen} == {names[0], names[-1]}
    # each measurement warmed on the same point at a size none of the three has (the run meets its size
    # once: what a new size fills is in its peak), with M and K no larger than that size
    assert set(warmed) == {(True, 8, 8, 8, 8)}
    # and on the real counter: the larger end's fit at the run's pools, + the other points' samples
    counted = ranking_bytes(model, names, widths, pools, opts, None)
    assert counted >= live_peak(lambda: _rank(model, *_sub_pools(pools, 16, 16), names[:1], opts, None))[1] + others


def test_growth_bytes_holds_the_grown_copy_and_its_optimizer_state():
    opts, model, _, split, pools = _builtin()
    names = resolve_points(model, opts.points)
    got = growth_bytes(model, names[0], 64, split[0], pools, opts, None)
    weights = sum(4 * p.numel() for p in model.parameters())
    block = 2 * 64 * 64 * 4  # W_in and W_out of a width-64 block (float32)
    # the copy of the model with its block, and AdamW's two moments of the block's parameters
    assert got >= weights + block + 2 * block


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
