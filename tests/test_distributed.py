"""widthscope.distributed under a real 2-process torchrun (gloo), against single-process results.

This file is both the pytest module and the worker script: pytest launches
``python -m torch.distributed.run --standalone --nproc_per_node=2 tests/test_distributed.py OUT``
in a subprocess (with a timeout), the worker computes everything through the distributed
helpers, and rank 0 writes OUT only after every rank succeeded (``run_rank_guarded``). The
test then recomputes every number in this single process and compares (float64, 1e-10).
Failure injection (``WS_TEST_FAIL=raise|kill`` on rank 1) must fail the job, name rank 1 and
leave no OUT; rerunning the same command without it succeeds.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
TIMEOUT = 240


# ----------------------------------------------------------------------------- shared inputs
def inputs() -> dict:
    g = torch.Generator().manual_seed(1234)
    return {
        # n > d: primal path (all_reduce); n <= d: dual path (gathered Gram)
        "Xp": torch.randn(37, 5, generator=g, dtype=torch.float64) * 0.7 + 0.3,
        "Xd": torch.randn(9, 20, generator=g, dtype=torch.float64) + 0.2,
        "Xa": torch.randn(41, 6, generator=g, dtype=torch.float64) + 0.25,
        "Xb": torch.randn(30, 6, generator=g, dtype=torch.float64) + 0.15,
        "x1": torch.randn(7, 3, generator=g, dtype=torch.float64),
        "x2": torch.randn(4, 3, generator=g, dtype=torch.float64),
        "px": torch.randn(26, 4, generator=g, dtype=torch.float64),
        "py": torch.randint(0, 3, (26,), generator=g),
    }


def tiny_net() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


def probe_net() -> torch.nn.Module:
    torch.manual_seed(11)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6),
                              torch.nn.Tanh(), torch.nn.Linear(6, 3)).double()
    net.widthscope_points = ["1", "3"]
    return net


def probe_batches(d: dict) -> list:
    return [(d["px"][i:i + 5], d["py"][i:i + 5]) for i in range(0, 26, 5)]


def mom(m) -> list[float]:
    return [m.mu_sq, m.mu_sigma_mu, m.tr_sigma_sq]


def cert(c) -> list[float]:
    return [c.expectation, c.variance, c.d_align, c.b_exact, c.b_align]


# ----------------------------------------------------------------------------- the worker
def worker(out: str) -> None:
    from widthscope import distributed as wd
    from widthscope import stats
    from widthscope._io import atomic_write_json
    from widthscope.probe import collect
    from widthscope.stats.sketch import Projector, finalize_projected

    wd.init_from_env()
    assert wd.world_size() == 2, "the worker expects 2 ranks"
    fail = os.environ.get("WS_TEST_FAIL", "")
    d = inputs()

    def job() -> dict:
        sl = {k: d[k][wd.shard_slice(d[k].shape[0])] for k in ("Xp", "Xd", "Xa", "Xb")}
        res = {}
        res["primal"] = mom(wd.gather_or_reduce(sl["Xp"]))
        res["primal_method"] = wd.gather_or_reduce(sl["Xp"]).method
        res["dual"] = mom(wd.gather_or_reduce(sl["Xd"]))
        res["dual_method"] = wd.gather_or_reduce(sl["Xd"]).method
        pa = wd.all_reduce_moments(stats.PrimalMoments(6).update(sl["Xa"]))
        pb = wd.all_reduce_moments(stats.PrimalMoments(6).update(sl["Xb"]))
        P = Projector(5, 3, seed=9)  # same seed on every rank: the same R
        proj = finalize_projected(wd.all_reduce_moments(stats.PrimalMoments(3).update(P(sl["Xp"]))), P)
        res["projected"] = [proj.mu_sq, proj.mu_sigma_mu, proj.tr_sigma_sq]
        if fail == "kill" and wd.rank() == 1:
            os.kill(os.getpid(), 9)  # dies mid-run: rank 0 is left waiting in a collective
        res["n_a"] = pa.n
        res["cert_one"] = cert(stats.certificate(pa.finalize(), M=8, K=8, populations="one"))
        res["cert_two"] = cert(stats.certificate(stats.cross_moments(pa, pb), M=8, K=8, populations="two"))
        res["cross_gram"] = wd.merge_cross_gram(sl["Xa"], sl["Xb"]).tolist()
        mis = wd.distributed_misalignment(sl["Xa"], sl["Xb"], M=8, K=6, draws=300, seed=5)
        res["mis"] = [mis.probability, mis.count, mis.mean_alignment]
        res["ntk"] = wd.distributed_ntk(tiny_net(), d["x1"], d["x2"]).tolist()
        res["ntk_same"] = wd.distributed_ntk(tiny_net(), d["x1"], trace=True).tolist()
        q = collect(probe_net(), wd.shard(probe_batches(d)), progress=False)
        res["probe"] = {p: wd.all_gather_rows(q[p]).tolist() for p in ("1", "3")}
        if fail == "raise" and wd.rank() == 1:
            raise RuntimeError("injected failure after all collectives")
        return res

    res = wd.run_rank_guarded(job, what="test job")
    if wd.is_main():
        atomic_write_json(out, res)


# ----------------------------------------------------------------------------- launching
def torchrun(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", WIDTHSCOPE_PROGRESS="0", PYTHONPATH=str(ROOT / "src"),
               WIDTHSCOPE_DIST_TIMEOUT="120")
    env.pop("WS_TEST_FAIL", None)  # only the faults asked for here
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def close(a, b, tol=1e-10) -> None:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    err = ((a - b).abs() / b.abs().clamp_min(1.0)).max().item() if a.numel() else 0.0
    assert err <= tol, f"max scaled difference {err:.3g} > {tol}"


def check_against_single_process(res: dict) -> None:
    from widthscope import stats
    from widthscope.linear import ntk
    from widthscope.probe import collect

    d = inputs()
    assert res["primal_method"] == "primal" and res["dual_method"] == "dual"
    close(res["primal"], mom(stats.moments(d["Xp"], method="primal")))
    close(res["dual"], mom(stats.moments(d["Xd"], method="dual")))
    # the primal merge is also equal to the Gram-form estimate on all rows
    close(res["primal"], mom(stats.moments(d["Xp"], method="dual")))
    assert res["n_a"] == 41
    close(res["cert_one"], cert(stats.certificate(d["Xa"], M=8, K=8, populations="one")))
    close(res["cert_two"], cert(stats.certificate(d["Xa"], d["Xb"], M=8, K=8, populations="two")))
    close(res["cross_gram"], d["Xa"] @ d["Xb"].T)
    from widthscope.stats.sketch import projected_moments

    pr = projected_moments(d["Xp"], k=3, seed=9)
    close(res["projected"], [pr.mu_sq, pr.mu_sigma_mu, pr.tr_sigma_sq])
    C = d["Xa"] @ d["Xb"].T
    mis = stats.misalignment_from_gram(C, M=8, K=6, draws=300, seed=5)
    # The merged C is summed in row blocks, so it may differ from C in the last bits; the count
    # is still exact because no draw's block mean is anywhere near 0 (checked on the same draws).
    from widthscope.stats.resample import _draw_indices

    gen = torch.Generator().manual_seed(5)
    I, J = _draw_indices(C.shape[0], 8, 300, gen), _draw_indices(C.shape[1], 6, 300, gen)
    assert C[I[:, :, None], J[:, None, :]].mean((1, 2)).abs().min() > 1e-6
    assert res["mis"][:2] == [mis.probability, mis.count]
    close(res["mis"][2], mis.mean_alignment)
    close(res["ntk"], ntk(tiny_net(), d["x1"], d["x2"]))
    close(res["ntk_same"], ntk(tiny_net(), d["x1"], trace=True))
    q = collect(probe_net(), probe_batches(d), progress=False)
    for p in ("1", "3"):  # gathered in the original example order
        close(res["probe"][p], q[p])


def test_two_ranks_match_single_process_and_failures_leave_no_file(tmp_path):
    out = tmp_path / "res.json"
    # 1) rank 1 raises after the last collective: rank 0 waits at the guard and is told.
    r = torchrun(str(HERE), str(out), env_extra={"WS_TEST_FAIL": "raise"})
    assert r.returncode != 0, r.stdout + r.stderr
    assert "rank 1" in r.stderr and "injected failure" in r.stderr, r.stderr[-3000:]
    assert "RankFailure" in r.stderr  # rank 0's own error names the failed peer
    assert not out.exists() and not list(tmp_path.iterdir())  # no partial/temp file either
    # 2) rank 1 is killed (SIGKILL) mid-run while rank 0 sits in a collective.
    r = torchrun(str(HERE), str(out), env_extra={"WS_TEST_FAIL": "kill"})
    assert r.returncode != 0
    assert "rank: 1" in r.stderr or "rank 1" in r.stderr, r.stderr[-3000:]
    assert not out.exists()
    # 3) the same command without the fault succeeds and matches one process.
    r = torchrun(str(HERE), str(out))
    assert r.returncode == 0, r.stderr[-4000:]
    check_against_single_process(json.loads(out.read_text()))


CERTIFY = ["-m", "widthscope", "certify", "--n-train", "48", "--n-test", "40", "--batch-size", "8",
           "--M", "8,16", "--K", "8,12", "--draws", "200", "--train-steps", "20", "--seed", "3"]


def _numbers(obj, prefix=""):
    """Flatten the numeric leaves of a certify result (timings excluded)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k not in ("timing", "settings"):
                yield from _numbers(v, f"{prefix}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{prefix}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield prefix, float(obj)


# The statistics are float64 sums of the same per-example gradients: equal to float64 rounding. The
# interventions evaluate a float32 model's held-out loss, summed over ranks in another order; MKL's
# kernels then round differently (with MKL_ENABLE_INSTRUCTIONS=AVX2 `actual` moved by 9.3e-9 on a
# loss near 5): allow a few float32 ulps of the loss, carried through to what is derived from it.
F32 = 2.0 ** -23
F32_ULPS = 16


def _tolerance(key, result):
    """Relative tolerance (times max(1, |value|)) for one flattened key of a certify result."""
    if "/interventions[" not in key:
        return 1e-10
    point, row = (int(i) for i in re.findall(r"\[(\d+)\]", key)[:2])
    iv = result["points"][point]["interventions"][row]
    loss_ulps = F32_ULPS * F32 * abs(iv["loss_before"])
    field = key.rsplit("/", 1)[1]
    if field in ("actual", "loss_before"):
        return loss_ulps
    if field == "retention":  # actual / predicted
        return loss_ulps / max(abs(iv["predicted"]), 1e-30)
    if field in ("K", "M"):
        return 0.0
    return F32_ULPS * F32 * 64  # float32 reductions over at most a few hundred terms (rms, norms, steps)


def test_certify_cli_under_torchrun_equals_single_process(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", WIDTHSCOPE_PROGRESS="0", PYTHONPATH=str(ROOT / "src"))
    r1 = subprocess.run([sys.executable, *CERTIFY, "--out", str(one)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = torchrun(*CERTIFY, "--out", str(two))
    assert r2.returncode == 0, r2.stderr[-3000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert b["settings"]["world_size"] == 2 and a["settings"]["world_size"] == 1
    na, nb = dict(_numbers(a)), dict(_numbers(b))
    assert na.keys() == nb.keys() and len(na) > 50
    for k in na:
        assert abs(na[k] - nb[k]) <= _tolerance(k, a) * max(1.0, abs(na[k])), (k, na[k], nb[k])
    # the seeded misalignment draws are the same draws: counts are equal exactly (a draw would have to
    # lie within float64 rounding of 0 to flip; the in-process worker test checks that margin)
    counts = [k for k in na if k.endswith("/count")]
    assert counts and all(na[k] == nb[k] for k in counts)


def test_single_process_helpers_are_identities():
    from widthscope import distributed as wd
    from widthscope import stats
    from widthscope.errors import WidthscopeError

    d = inputs()
    assert not wd.init_from_env() and wd.world_size() == 1 and wd.is_main()
    assert wd.shard(list(range(7))) == list(range(7)) and wd.shard_slice(7) == slice(0, 7)
    close(mom(wd.gather_or_reduce(d["Xp"])), mom(stats.moments(d["Xp"])))
    pm = stats.PrimalMoments(5).update(d["Xp"])
    assert wd.all_reduce_moments(pm) is pm
    close(wd.merge_cross_gram(d["Xa"], d["Xb"]), d["Xa"] @ d["Xb"].T)
    assert wd.run_rank_guarded(lambda a, b=0: a + b, 2, b=3) == 5
    import pytest

    with pytest.raises(WidthscopeError, match="PrimalMoments"):
        wd.all_reduce_moments(d["Xp"])
    with pytest.raises(WidthscopeError, match="method"):
        wd.gather_or_reduce(d["Xp"], method="gram")
    with pytest.raises(WidthscopeError, match="d=6 but test has d=5"):
        wd.merge_cross_gram(d["Xa"], d["Xp"])


if __name__ == "__main__":
    worker(sys.argv[1])


LIN_TOML = """
name = "tiny"
widths = [8, 16, 32, 64, 128]
seeds = [0, 1]
[model]
depth = 2
activation = "tanh"
parametrization = "ntk"
[data]
name = "digits"
n_train = 24
n_test = 16
[train]
eta0 = 0.5
alphas = [0.0]
steps = 3
log_steps = [0, 3]
dtype = "float64"
probe = 3
[correlations]
measure = ["C02"]
n_tuples = 2
output = "random"
[fit]
steps = [3]
"""


def test_linearize_sweep_under_torchrun_splits_cells_and_fits_once(tmp_path):
    """Each rank runs its own shard of the grid; rank 0 fits the slopes when all are in."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(LIN_TOML)
    r = torchrun("-m", "widthscope", "linearize", str(cfg), "--out", str(tmp_path / "two"))
    assert r.returncode == 0, r.stderr[-3000:]
    env = dict(os.environ, OMP_NUM_THREADS="1", WIDTHSCOPE_PROGRESS="0", PYTHONPATH=str(ROOT / "src"))
    r1 = subprocess.run([sys.executable, "-m", "widthscope", "linearize", str(cfg), "--out", str(tmp_path / "one")],
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert r1.returncode == 0, r1.stderr[-3000:]

    def rows(d):
        out = {}
        for line in (tmp_path / d / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            out[(row["cell_id"], row["row_index"])] = {k: v for k, v in row.items() if "second" not in k}
        return out

    one, two = rows("one"), rows("two")
    assert one.keys() == two.keys() and len(one) >= 10
    for key in one:
        assert one[key] == two[key], key
    s1 = json.loads((tmp_path / "one" / "slopes.json").read_text())
    s2 = json.loads((tmp_path / "two" / "slopes.json").read_text())
    assert s1 == s2
