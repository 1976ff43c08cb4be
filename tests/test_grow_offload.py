"""``grow`` on a model offloaded to disk: the plain run's numbers, the placement kept.

A tiny LLaMA saved with safetensors is loaded plainly and with a ``max_memory`` a third of its
weights (blocks on disk). ``grow`` ranks the points (the probe), grows a block at the best one on
a copy of the model (:func:`widthscope.probe.offload.copy_model`: accelerate's hooks copied, the
offloaded weights shared and read per block, the blocks recomputed in the backward) and trains it;
every number must equal the plain run's within :func:`assert_rows_same`'s tolerances. What
cannot run offloaded (training every parameter: ``train_all``, ``compare``'s baseline) is refused
in one line before any work.
"""

import gc
import json
import math
import os
import weakref
from pathlib import Path

import pytest
import torch

from hf_tiny import state_bytes, tiny_llama
from widthscope.errors import WidthscopeError
from widthscope.growth import grow
from widthscope.growth.block import continue_training, grow_at, step_flops
from widthscope.models.dispatch import dispatch
from widthscope.models.hf import load_hf
from widthscope.probe.batches import index_batch
from widthscope.probe.offload import copy_model, module_device, offloaded_modules, recomputed, restore_blocks
from widthscope.probe.structure import main_stack

pytest.importorskip("accelerate")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# the settings every run below shares (few steps: the comparison, not the growth, is tested)
KW = dict(M=8, K=8, steps=3, lr=1e-2, batch_size=8, criterion="gradmax", progress=False)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    m = tiny_llama()
    m.save_pretrained(d)
    return d, state_bytes(m)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (80, 12), generator=g)
    return ids[:48], ids[48:]


def _offloaded(d, weights):
    return load_hf(d, device_map="auto", max_memory={"cpu": weights // 3, "disk": None})


def _on_disk(model):
    return [n for n in main_stack(model) if all(p.device.type == "meta" for p in model.get_submodule(n).parameters())]


def _numbers(x, path=""):
    if isinstance(x, dict):
        return {k2: v2 for k, v in x.items() for k2, v2 in _numbers(v, f"{path}.{k}").items()}
    if isinstance(x, list):
        return {k2: v2 for i, v in enumerate(x) for k2, v2 in _numbers(v, f"{path}[{i}]").items()}
    return {path: x}


LOSSES = (".loss_before", ".loss_after", ".delta")


def assert_rows_same(a, b):
    """The offloaded grow's rows against the plain one's, number by number.

    Both runs compute the same float32 operations on the same weights and batch shapes (the
    recomputed blocks rerun them), so they agree to float32 rounding (bit-equal on the CPUs we
    tried; the statistics accumulate in float64): statistics rel 1e-4 (abs 1e-9); held-out losses
    and their changes, also after training, abs 5e-6 x the loss (a few float32 ulps of the mean
    loss); FLOPs and counts exactly (counted from shapes, not summed). Not-a-number (a criterion
    undefined at a point) on both sides alike.
    """
    assert [r["point"] for r in a] == [r["point"] for r in b]
    checked = 0
    for ra, rb in zip(a, b):
        na, nb = _numbers(ra), _numbers(rb)
        assert na.keys() == nb.keys()
        loss = max(1.0, abs(ra.get("loss_before") or 1.0))
        for k, x in na.items():
            y = nb[k]
            if isinstance(x, float) and isinstance(y, float):
                if math.isnan(x) or math.isnan(y):
                    assert math.isnan(x) and math.isnan(y), k
                elif k.endswith(LOSSES) or ".loss_at." in k:
                    assert abs(x - y) <= 5e-6 * loss, (k, x, y)
                else:
                    assert y == pytest.approx(x, rel=1e-4, abs=1e-9), (k, x, y)
                checked += 1
            else:
                assert x == y, (k, x, y)
    return checked


def _margin_ok(cands):
    """The ranking compared exactly only where consecutive scores differ by more than rounding."""
    s = [c["score"] for c in cands]
    return all(abs(s[i] - s[i + 1]) > 1e-3 * max(abs(s[i]), 1e-12) for i in range(len(s) - 1))


def test_grow_offloaded_equals_plain(ckpt, data):
    d, weights = ckpt
    plain, off = load_hf(d), _offloaded(d, weights)
    assert _on_disk(off), "some blocks must be on disk"
    before = recomputed(off)
    a = grow(plain, data, **KW)
    b = grow(off, data, **KW)
    assert _margin_ok(a["candidates"])  # so the same best point is no accident of rounding
    assert b["chosen"] == a["chosen"]
    assert assert_rows_same(a["candidates"], b["candidates"]) > 50
    assert assert_rows_same(a["growth"], b["growth"]) > 5
    g = b["growth"][0]
    assert g["flops"] == a["growth"][0]["flops"]  # the recomputation is not counted
    assert g["loss_after"] != g["loss_before"]  # the block trained
    assert b["settings"] == a["settings"]
    # the original is as it was: no insertion, its blocks still recompute, weights still on disk
    assert recomputed(off) == before == main_stack(off)
    assert all(type(off.get_submodule(n)).__name__ != "Inserted" for n in main_stack(off))


def test_grown_copy_keeps_the_placement(ckpt, data):
    d, weights = ckpt
    off = _offloaded(d, weights)
    train, test = data
    point = _on_disk(off)[-1]
    grown, res = grow_at(
        off, point, train, test, probe_train=train[:8], probe_test=test[:8], steps=2, lr=1e-2,
        block_width=None, width=32, show_progress=False,
    )  # fmt: skip
    inserted = grown.get_submodule(point)
    assert type(inserted).__name__ == "Inserted"
    block = inserted.inner
    # the copy's blocks run through accelerate's hooks, reading the same offloaded store
    assert block._hf_hook.weights_map is off.get_submodule(point)._hf_hook.weights_map
    assert all(p.device.type == "meta" for p in block.parameters())  # still offloaded
    assert set(recomputed(grown)) == {n + ".inner" if n == point else n for n in main_stack(off)}
    assert offloaded_modules(grown) == offloaded_modules(off)
    # the new block lives where its point runs, and it trained
    new = list(inserted.widthscope_insert.parameters())
    assert all(p.device == module_device(off, point) for p in new)
    assert float(inserted.widthscope_insert.w_out.detach().abs().sum()) > 0  # W_out starts at zero
    assert res["loss_after"] != res["loss_before"]
    # resident weights are the copy's own: changing them changes the copy only
    emb = grown.model.embed_tokens.weight
    assert emb.device.type != "meta" and emb.data_ptr() != off.model.embed_tokens.weight.data_ptr()


def test_copy_model_runs_its_own_blocks_and_keeps_the_folder(data):
    """A block the original keeps resident: the copy's recomputed forward runs the copy's weights
    (a wrapper copied as it is would run the original's). The temporary offload folder stays while
    a copy reads it, and goes with the last model."""
    plain = tiny_llama(3)
    dmap = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "disk"}
    dmap.update({"model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"})
    off = dispatch(tiny_llama(3), dmap)
    folder = Path(off.widthscope_dispatch["offload_folder"])
    assert recomputed(off) == main_stack(off)
    twin = copy_model(off)
    x = data[0][:4]
    with torch.no_grad():
        torch.testing.assert_close(twin(x).logits, plain(x).logits, rtol=1e-5, atol=1e-6)
        twin.model.layers[0].mlp.down_proj.weight.mul_(2.0)
        changed = twin(x).logits
        same = off(x).logits
    torch.testing.assert_close(same, plain(x).logits, rtol=1e-5, atol=1e-6)
    assert (changed - same).abs().max() > 1e-4  # the copy ran its own (doubled) weights
    # and with gradients (the checkpointed path) as well
    loss = twin(x).logits.sum()
    loss.backward()
    assert twin.model.layers[0].mlp.down_proj.weight.grad is not None
    assert off.model.layers[0].mlp.down_proj.weight.grad is None
    del off
    gc.collect()
    assert folder.is_dir()  # the copy still reads it
    with torch.no_grad():
        twin(x)
    del twin
    gc.collect()
    assert not folder.exists()


def _track_loaded(model):
    """The largest number of bytes of offloaded weights alive at once (loaded by accelerate's hooks
    and held, e.g. by autograd for the backward), checked after each offloaded module's forward."""
    live: list = []
    peak = [0]
    for mod in model.modules():
        hook = getattr(mod, "_hf_hook", None)
        if hook is None or not getattr(hook, "offload", False):
            continue

        def counted(module, output, _post=hook.post_forward, _sub=hook.place_submodules):
            live.extend(weakref.ref(p) for p in module.parameters(recurse=_sub) if p.device.type != "meta")
            alive = [r() for r in live]
            peak[0] = max(peak[0], sum(t.numel() * t.element_size() for t in alive if t is not None))
            return _post(module, output)

        hook.post_forward = counted
    return peak


def test_training_the_grown_block_keeps_offloaded_weights_out_of_memory(data):
    """A training step of the grown model (the new block trains, growth at the first block) holds
    at most two blocks' offloaded weights at once with the recomputation (the block being
    recomputed and the one just before it) beside the offloaded weights outside the blocks (the
    output head); without it (the blocks' forwards restored) every later block's stay for the
    backward. Eight blocks, all on disk."""
    train, _ = data
    dmap = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
    dmap.update({f"model.layers.{i}": "disk" for i in range(8)})
    peaks, sizes = {}, {}
    for recompute in (True, False):
        off = dispatch(tiny_llama(8), dmap)
        if not recompute:
            restore_blocks(off)
        blocks = _on_disk(off)
        assert blocks == main_stack(off), off.hf_device_map

        def size(module):  # the placeholders on meta have the weights' shapes and dtype
            return sum(p.numel() * p.element_size() for p in module.parameters())

        block = max(size(off.get_submodule(n)) for n in blocks)
        outside = sum(size(off.get_submodule(n)) for n in offloaded_modules(off) if n not in blocks)
        sizes[recompute] = block, outside
        point = blocks[0]
        grown, _ = grow_at(
            off, point, train, train[:8], probe_train=train[:8], probe_test=train[8:16], steps=0,
            lr=1e-2, block_width=None, width=32, show_progress=False, loss_before=0.0,
        )  # fmt: skip
        new = {id(p) for p in grown.get_submodule(point).widthscope_insert.parameters()}
        for p in grown.parameters():  # as grow_at trains: the new block only
            p.requires_grad_(id(p) in new)
        peak = _track_loaded(grown)
        step_flops(grown, index_batch(train, slice(0, 8)))  # one training step's forward and backward
        peaks[recompute] = peak[0]
    block, outside = sizes[True]
    assert outside < block  # the bounds below are about blocks
    assert peaks[True] <= outside + 2 * block, (peaks, block, outside)
    with pytest.raises(WidthscopeError, match="no module on a device"):  # everything on disk
        dispatch(tiny_llama(2), "auto", max_memory={"cpu": 1000, "disk": None})
    assert peaks[False] >= outside + 7 * block, (peaks, block, outside)  # the 7 blocks after the point


def test_step_flops_leave_out_the_recomputation(ckpt, data):
    d, weights = ckpt
    plain, off = load_hf(d), _offloaded(d, weights)
    batch = data[0][:8]
    for m in (plain, off):  # the whole model trains: every block is back-propagated through
        for p in m.parameters():
            p.requires_grad_(True)
    assert step_flops(off, batch) == step_flops(plain, batch) > 0


@pytest.mark.parametrize("setting, says", [(dict(train_all=True), "--train-all"), (dict(compare=True), "--compare")])
def test_training_every_parameter_is_refused_offloaded(ckpt, data, setting, says):
    d, weights = ckpt
    off = _offloaded(d, weights)
    with pytest.raises(WidthscopeError, match=says) as e:
        grow(off, data, **{**KW, **setting})
    msg = str(e.value)
    assert "\n" not in msg and "offloaded" in msg and "--max-memory" in msg
    with pytest.raises(WidthscopeError, match="--compare"):
        continue_training(off, data[0], data[1], flops=1e6, lr=1e-2)


# ----------------------------------------------------------------------------- the command line
def _cli_common(tmp_path):
    from hf_tiny import corpus, save_model, write_text_files

    d = save_model(tmp_path / "m", "llama")
    text = write_text_files(tmp_path / "data", corpus(40), "docs")["txt"]
    weights = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    common = ["grow", "--model", str(d), "--data", str(text), "--seq-len", "16", "--n-train", "16",
              "--n-test", "16", "--M", "4", "--K", "4", "--steps", "2", "--batch-size", "8",
              "--criterion", "gradmax"]  # fmt: skip
    return common, weights


def test_cli_grow_offloaded_equals_plain(tmp_path, capsys):
    from widthscope.cli import main

    common, weights = _cli_common(tmp_path)
    assert main([*common, "--out", str(tmp_path / "plain.json")]) == 0
    off_args = ["--device-map", "auto", "--max-memory", f"cpu={weights // 3}B,disk"]
    assert main([*common, *off_args, "--out", str(tmp_path / "off.json")]) == 0
    plain, off = (json.loads((tmp_path / f).read_text()) for f in ("plain.json", "off.json"))
    if _margin_ok(plain["candidates"]):
        assert off["chosen"] == plain["chosen"]
        assert_rows_same(plain["rows"], off["rows"])
    else:  # a tie within rounding: the same candidates, in either order
        key = {r["point"]: r for r in plain["candidates"]}
        assert_rows_same([key[r["point"]] for r in off["candidates"]], off["candidates"])
    placed = off["settings"]["placement"]
    assert "disk" in placed["device_map"].values() and placed["offloaded"], placed
    assert "placement" not in plain["settings"]
    capsys.readouterr()


def test_cli_grow_train_all_offloaded_refused_before_the_data(tmp_path, capsys):
    from cli_run import run_cli

    common, weights = _cli_common(tmp_path)
    capsys.readouterr()
    args = [*common, "--device-map", "auto", "--max-memory", f"cpu={weights // 3}B,disk", "--train-all"]
    rc, lines, cap = run_cli(args, capsys)
    assert rc == 2 and len(lines) == 1 and "--train-all" in lines[0] and "offloaded" in lines[0], cap.err
