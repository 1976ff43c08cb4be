"""The memory terms of the training plans (``grow --plan``, ``linearize --plan``) against brute-force
counts on tiny models: the counter of live tensor bytes (``probe.cost.live_peak``), the data held,
the growth ranking's extrapolation, the pooled samples, the growth and the linearization cell.
No timing (``time_run=False``)."""

from __future__ import annotations

import torch

from widthscope.grow.inputs import builtin_inputs
from widthscope.grow.options import GrowOptions
from widthscope.grow.pipeline import _split_pools
from widthscope.grow.plan import _rank, _sub_pools, growth_bytes, plan_grow, ranking_bytes
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
    first = live_peak(lambda: _rank(model, pools.probe_train, pools.rank_test, names[:1], opts, None))[1]
    samples = 8 * (pools.n_train + pools.n_rank) * 64 * (len(names) - 1)  # float64 (n, width) per point
    assert got == first + samples
    # the first point's own samples are inside the counted ranking
    assert first >= 8 * (pools.n_train + pools.n_rank) * 64


def test_ranking_bytes_extrapolates_along_the_chord():
    opts, model, _, _, pools = _builtin(n_train=128, n_test=64, batch_size=8)
    names = resolve_points(model, opts.points)
    widths = {n: 64 for n in names}
    got = ranking_bytes(model, names, widths, pools, opts, None)
    sizes = ((8, 8), (16, 16))
    peaks = [
        live_peak(lambda a=a, b=b: _rank(model, *_sub_pools(pools, a, b), names[:1], opts, None))[1] for a, b in sizes
    ]
    per = (peaks[1] - peaks[0]) / 16
    others = 8 * (pools.n_train + pools.n_rank) * 64 * (len(names) - 1)
    assert got == round(peaks[0] + per * (pools.n_train + pools.n_rank - 16)) + others
    assert per >= 8 * 64  # at least each example's float64 sample of the point


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


def test_resident_peak_measures_what_the_work_makes_resident():
    import pytest

    from widthscope.probe.cost_plan import Resident, larger, resident_peak

    mib50 = 50 * 2**20 // 4  # float32 elements of 50 MiB (52.4 MB)
    got = resident_peak(lambda: torch.ones(mib50))
    if got.peak is None:  # not Linux with glibc and /proc/self/status's VmHWM: nothing is measured
        pytest.skip(got.why)
    assert got.left is not None
    assert 45e6 <= got.peak < 80e6
    assert 45e6 <= got.left < 80e6  # the result is alive when the resident set is read

    def transient() -> torch.Tensor:
        a = torch.ones(mib50)
        del a  # given back (the mmap threshold is 64 KiB in the measuring child)
        return torch.ones(mib50 // 5)  # 10 MiB

    got = resident_peak(transient)
    assert got.peak is not None and got.left is not None
    assert 45e6 <= got.peak < 80e6
    assert 8e6 <= got.left < 20e6
    failed = resident_peak(lambda: 1 / 0)
    assert failed.peak is None and "ZeroDivisionError" in failed.why
    assert larger(100, Resident(None, None, "x")) == (100, "counted")
    assert larger(100, Resident(200, 0)) == (200, "measured")
    assert larger(300, Resident(200, 0)) == (300, "counted")
