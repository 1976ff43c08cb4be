"""Models larger than memory: accelerate's device map / disk offload, probed with the same numbers.

A tiny LLaMA saved with ``save_pretrained`` is loaded plainly and with a ``max_memory`` a third of
its weights (some blocks on disk); ``certify`` (probe, certificates, misalignment, interventions,
held-out losses) must give the plain run's numbers within the tolerances stated in
:func:`assert_same`. The blocks of an offloaded model recompute in the backward (each offloaded
weight is loaded twice per batch); a point inside a block falls back to the plain backward.
"""

import copy
import gc
import math
import os
from pathlib import Path

import pytest
import torch

from hf_tiny import state_bytes, tiny_llama
from widthscope.certification import certify_dict
from widthscope.errors import WidthscopeError
from widthscope.models import dispatch as dispatch_module
from widthscope.models.dispatch import (
    check_max_memory,
    dispatch,
    fix_mmap_threshold,
    mmap_threshold,
    parse_max_memory,
    releasing_memory,
)
from widthscope.models.hf import load_hf
from widthscope.probe import collect
from widthscope.probe.offload import input_device, recompute_blocks, recomputed, recomputing, restore_blocks
from widthscope.probe.structure import main_stack

pytest.importorskip("accelerate")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    m = tiny_llama()
    m.save_pretrained(d)
    return d, state_bytes(m)


@pytest.fixture(scope="module")
def pools():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (48, 12), generator=g)
    return [ids[i : i + 8] for i in range(0, 32, 8)], [ids[32:40], ids[40:48]]


def _offloaded_blocks(model):
    return [n for n in main_stack(model) if all(p.device.type == "meta" for p in model.get_submodule(n).parameters())]


def _numbers(x, path=""):
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            out.update(_numbers(v, f"{path}.{k}"))
        return out
    if isinstance(x, list):
        out = {}
        for i, v in enumerate(x):
            out.update(_numbers(v, f"{path}[{i}]"))
        return out
    return {path: x}


def assert_same(a, b, draws):
    """The offloaded run's certify result against the plain one's, point by point.

    Tolerances (both runs compute the same float32 operations on the same weights and batch
    shapes; the recomputed blocks rerun them, so the numbers agree to float32 rounding, measured
    bit-equal on the CPUs we tried, where the statistics accumulate in float64):
    statistics of the samples rel 1e-4 (abs 1e-9); held-out losses and their changes abs 5e-6 x
    the loss (a few float32 ulps of the mean loss); the misalignment probability and its interval
    abs 3/draws (a draw whose mu_M . g_K is within rounding of 0 may flip); ``retention`` and
    ``sign_agrees`` follow from ``actual`` and are not compared again.
    """
    assert [p["point"] for p in a["points"]] == [p["point"] for p in b["points"]]
    checked = 0
    for pa, pb in zip(a["points"], b["points"]):
        na, nb = _numbers(pa), _numbers(pb)
        assert na.keys() == nb.keys()
        loss = max(1.0, abs(pa["interventions"][0]["loss_before"])) if pa.get("interventions") else 1.0
        for k, x in na.items():
            y = nb[k]
            if k.endswith((".retention", ".sign_agrees")):
                continue
            if isinstance(x, float) and isinstance(y, float):
                if ".misalignment." in k:
                    assert abs(x - y) <= 3 / draws, k
                elif k.endswith((".actual", ".loss_before")):
                    assert abs(x - y) <= 5e-6 * loss, (k, x, y)
                elif math.isfinite(x):
                    assert y == pytest.approx(x, rel=1e-4, abs=1e-9), k
                else:
                    assert x == y, k
                checked += 1
            else:
                assert x == y, k
    assert checked > 100  # the comparison saw the numbers


def test_offloaded_certify_equals_plain(ckpt, pools):
    d, weights = ckpt
    budget = weights // 3  # weights 3x the budget
    plain = load_hf(d)
    off = load_hf(d, device_map="auto", max_memory={"cpu": budget, "disk": None})
    rec = off.widthscope_hf
    assert "disk" in rec["device_map"].values() and "cpu" in rec["device_map"].values()
    assert rec["max_memory"] == {"cpu": budget, "disk": None} and Path(rec["offload_folder"]).is_dir()
    assert _offloaded_blocks(off), "some blocks must be on disk"
    assert recomputed(off) == off.widthscope_points and rec["recompute_blocks"] == 4
    assert off.config.use_cache is False
    # no process-wide malloc setting unless asked (test_malloc_threshold_only_when_asked)
    assert rec["release_memory"] is False and rec["malloc_mmap_threshold"] == mmap_threshold()
    tr, te = pools
    draws = 200
    a = certify_dict(plain, tr, te, M=[8, 16], draws=draws, progress=False)
    b = certify_dict(off, tr, te, M=[8, 16], draws=draws, progress=False)
    assert all(r["interventions"] for r in b["points"])  # the bias interventions ran
    assert_same(a, b, draws)


def test_malloc_threshold_only_when_asked(ckpt, monkeypatch):
    """glibc's mmap threshold is process-wide and cannot be set back to adaptive: widthscope
    fixes it for an offloaded model only when asked (``release_memory=True``, or within
    ``releasing_memory()``, as the command line runs), never for a model that is not offloaded;
    what is in effect is recorded."""
    d, weights = ckpt
    calls = []
    monkeypatch.setattr(dispatch_module, "fix_mmap_threshold", lambda: calls.append(1) or False)
    budget = f"cpu={weights // 3},disk"
    rec = load_hf(d, device_map="auto", max_memory=budget).widthscope_hf
    assert calls == [] and rec["release_memory"] is False and rec["offloaded"]
    with releasing_memory():
        rec = load_hf(d, device_map="auto", max_memory=budget).widthscope_hf
        assert calls == [1] and rec["release_memory"] is True
        load_hf(d, device_map="auto")  # everything fits: nothing offloaded, nothing set
        assert calls == [1]
        with releasing_memory(False):
            dispatch(tiny_llama(2), "auto", max_memory=f"cpu={state_bytes(tiny_llama(2)) // 2},disk")
        assert calls == [1]
    off = dispatch(tiny_llama(2), "auto", max_memory=f"cpu={state_bytes(tiny_llama(2)) // 2},disk", release_memory=True)
    assert calls == [1, 1] and off.widthscope_dispatch["release_memory"] is True
    with pytest.raises(WidthscopeError, match="release_memory"):
        dispatch(tiny_llama(2), release_memory="yes")


def test_mmap_threshold_reports_the_environment(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert mmap_threshold() == 131072
    assert fix_mmap_threshold() is False  # the environment's setting is left as it is


def _count_loads(model, blocks):
    """Wrap the pre-forward of accelerate's hooks inside ``blocks``: how often weights are loaded."""
    count = [0]
    for name in blocks:
        for m in model.get_submodule(name).modules():
            hook = getattr(m, "_hf_hook", None)
            if hook is not None and getattr(hook, "offload", False):
                pre = hook.pre_forward

                def counted(module, *args, _pre=pre, **kwargs):
                    count[0] += 1
                    return _pre(module, *args, **kwargs)

                hook.pre_forward = counted
    return count


def test_offloaded_blocks_recompute_in_the_backward_same_gradients(ckpt, pools):
    d, weights = ckpt
    plain = load_hf(d)
    off = load_hf(d, device_map="auto", max_memory=f"cpu={weights // 3},disk")
    tr, _ = pools
    ref = collect(plain, tr, progress=False)
    count = _count_loads(off, _offloaded_blocks(off))
    got = collect(off, tr, progress=False)
    twice = count[0]
    restore_blocks(off)  # the plain backward: every offloaded weight loaded once per batch
    assert recomputed(off) == []
    count[0] = 0
    again = collect(off, tr, progress=False)
    # recomputed: every offloaded block but the stack's first, whose input needs no gradient
    blocks = _offloaded_blocks(off)
    skipped = 1 if blocks[0] == main_stack(off)[0] else 0
    assert count[0] > 0 and twice == count[0] + count[0] * (len(blocks) - skipped) // len(blocks)
    for p in ref:  # float32 gradients pooled in float64; same ops both ways (see assert_same)
        torch.testing.assert_close(got[p], ref[p], rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(again[p], ref[p], rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.losses, ref.losses, rtol=1e-6, atol=0)
    folder = off.widthscope_hf["offload_folder"]
    assert Path(folder).is_dir()
    del off
    gc.collect()
    assert not Path(folder).exists()  # the temporary folder goes with the model


def test_point_inside_a_block_falls_back_to_the_plain_backward(ckpt, pools):
    d, weights = ckpt
    plain = load_hf(d)
    off = load_hf(d, device_map="auto", max_memory=f"cpu={weights // 3},disk")
    inner = off.widthscope_points[-1] + ".mlp"  # on disk; a checkpoint would fire its hook twice
    pts = [inner, off.widthscope_points[-1]]
    tr, _ = pools
    ref = collect(plain, tr, points=pts, progress=False)
    got = collect(off, tr, points=pts, progress=False)
    for p in pts:
        torch.testing.assert_close(got[p], ref[p], rtol=1e-5, atol=1e-9)


def test_dispatch_in_memory_model_and_its_folder(pools):
    plain = tiny_llama(3)
    off = dispatch(copy.deepcopy(plain), "auto", max_memory=f"cpu={state_bytes(plain) // 2},disk")
    rec = off.widthscope_dispatch
    folder = rec["offload_folder"]
    assert "disk" in rec["device_map"].values() and Path(folder).is_dir()
    assert input_device(off) == torch.device("cpu") and _offloaded_blocks(off)
    tr, _ = pools
    ref, got = collect(plain, tr, progress=False), collect(off, tr, progress=False)
    for p in ref:
        torch.testing.assert_close(got[p], ref[p], rtol=1e-5, atol=1e-9)
    with pytest.raises(WidthscopeError, match="already dispatched"):
        dispatch(off)
    del off, got
    gc.collect()
    assert not Path(folder).exists()  # the temporary folder goes with the model


def test_recomputing_restores_forward_and_cache():
    m = tiny_llama(2)
    with recomputing(m) as names:
        assert names == ["model.layers.0", "model.layers.1"] and m.config.use_cache is False
        assert "forward" in m.model.layers[0].__dict__
    assert m.config.use_cache is True and recomputed(m) == []
    assert "forward" not in m.model.layers[0].__dict__
    assert recompute_blocks(m, ["model.layers.1"]) == ["model.layers.1"]
    assert restore_blocks(m) == ["model.layers.1"] and "forward" not in m.model.layers[1].__dict__


def test_parse_max_memory_forms():
    assert parse_max_memory("cpu=2MB,0=10GiB,disk") == {"cpu": 2_000_000, 0: 10 * 2**30, "disk": None}
    assert parse_max_memory(" cuda:1 = 1.5GB , disk=3KiB") == {1: 1_500_000_000, "disk": 3072}
    assert parse_max_memory("cpu=512") == {"cpu": 512}
    assert check_max_memory({"cpu": "2MB", 0: 1000, "disk": None}) == {"cpu": 2_000_000, 0: 1000, "disk": None}
    assert check_max_memory(None) is None


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "empty"),
        ("cpu", "has no size"),
        ("cpu=2XB", "not a size"),
        ("cpu=-1MB", "not a size"),
        ("gpu=1GB", "unknown device"),
        ("cpu=1MB,cpu=2MB", "twice"),
        ("cpu=1MB,,disk", "empty entry"),
    ],
)
def test_parse_max_memory_refuses_in_one_line(text, says):
    with pytest.raises(WidthscopeError, match=says) as e:
        parse_max_memory(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--max-memory")


@pytest.mark.parametrize("value", [{"cpu": -3}, {"cpu": True}, [1, 2], {}, {"tpu": "1GB"}])
def test_check_max_memory_refuses_bad_values(value):
    with pytest.raises(WidthscopeError, match="max_memory") as e:
        check_max_memory(value)
    assert "\n" not in str(e.value)


def test_load_refuses_bad_placements_before_loading(ckpt):
    d, weights = ckpt
    cases = [
        (dict(max_memory="cpu=1MB"), "need device_map"),
        (dict(device_map="auto", max_memory="cpu=1XB"), "not a size"),
        (dict(device_map="everywhere"), "device_map must be"),
        (dict(device_map="auto", device="meta"), "both given"),
        # no disk named: the rest may not go to disk
        (dict(device_map="auto", max_memory=f"cpu={weights // 3}"), "add disk"),
    ]
    for kw, says in cases:
        with pytest.raises(WidthscopeError, match=says) as e:
            load_hf(d, **kw)
        assert "\n" not in str(e.value), kw


# ----------------------------------------------------------------------------- the command line
def test_cli_certify_offloaded_equals_plain(tmp_path, capsys):
    """``certify --device-map auto --max-memory cpu=...,disk`` on a Hugging Face directory: the
    same numbers as the plain run (tolerances of :func:`assert_same`), the placement recorded."""
    import json

    from hf_tiny import corpus, save_model, write_text_files
    from widthscope.cli import main

    d = save_model(tmp_path / "m", "llama")
    text = write_text_files(tmp_path / "data", corpus(40), "docs")["txt"]
    weights = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    common = [
        "certify",
        "--model",
        str(d),
        "--data",
        str(text),
        "--seq-len",
        "16",
        "--n-train",
        "16",
        "--n-test",
        "16",
        "--M",
        "4,8",
        "--draws",
        "50",
        "--batch-size",
        "8",
    ]
    assert main([*common, "--out", str(tmp_path / "plain.json")]) == 0
    assert (
        main(
            [
                *common,
                "--device-map",
                "auto",
                "--max-memory",
                f"cpu={weights // 3}B,disk",
                "--out",
                str(tmp_path / "off.json"),
            ]
        )
        == 0
    )
    plain, off = (json.loads((tmp_path / f).read_text()) for f in ("plain.json", "off.json"))
    assert_same(plain, off, 50)
    spec = off["settings"]["input_spec"]
    assert spec["device_map"] == "auto" and spec["max_memory"].endswith(",disk")
    placed = off["settings"]["placement"]
    assert "disk" in placed["device_map"].values() and placed["offloaded"], placed
    assert "placement" not in plain["settings"]
    capsys.readouterr()


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--max-memory", "cpu=1MB"], "needs device_map"),
        (["--device-map", "auto", "--max-memory", "cpu=1XB"], "not a size"),
        (["--device-map", "everywhere"], "invalid choice"),
    ],
)
def test_cli_placement_refused_in_one_line(tmp_path, capsys, extra, says):
    from cli_run import run_cli

    rc, lines, cap = run_cli(["certify", "--model", str(tmp_path / "nothing"), *extra], capsys)
    assert rc == 2 and says in cap.err, cap.err


def test_cli_offload_folder_may_not_be_an_input_or_inside_one(tmp_path, capsys):
    """The offload folder is written: inside the model's folder (or equal to an output) is refused
    before any weight loads."""
    from cli_run import run_cli
    from hf_tiny import save_model

    d = save_model(tmp_path / "m", "llama")
    capsys.readouterr()  # transformers' save progress, not the command's
    before = sorted(p.name for p in d.iterdir())
    for folder, says in ((d / "offload", "--model"), (tmp_path / "c.json", "--out")):
        rc, lines, cap = run_cli(
            [
                "certify",
                "--model",
                str(d),
                "--device-map",
                "auto",
                "--max-memory",
                "cpu=1MB,disk",
                "--offload-folder",
                str(folder),
                "--out",
                str(tmp_path / "c.json"),
            ],
            capsys,
        )
        assert rc == 2 and len(lines) == 1 and says in lines[0], cap.err
    assert sorted(p.name for p in d.iterdir()) == before
