"""Datasets: real file formats written by the tests, disjoint splits, safe unpickling, errors."""
import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from widthscope.data import available, batches, load
from widthscope.data.files import FASHION_ROOT, read_idx
from widthscope.errors import WidthscopeError


def test_available_and_unknown():
    assert set(available()) == {"fashion-mnist", "mnist", "cifar10", "cifar100", "mnist1d", "digits", "text",
                                "prose"}
    with pytest.raises(WidthscopeError, match="digits"):
        load("imagenet")
    with pytest.raises(WidthscopeError, match="bad option"):
        load("digits", colour=True)


# ----------------------------------------------------------------------------------- digits

def test_digits_disjoint_normalised_on_train_and_seeded():
    from sklearn.datasets import load_digits

    s = load("digits", seed=3)
    tr, te = s.meta["train_indices"], s.meta["test_indices"]
    assert len(tr) + len(te) == 1797 and not set(tr) & set(te)
    assert s.train[0].shape == (len(tr), 64) and s.input_shape == (64,) and s.num_classes == 10
    raw = load_digits()
    m, sd = raw.data[tr].mean(), raw.data[tr].std(ddof=1)
    np.testing.assert_allclose(s.train[0].numpy(), (raw.data[tr] - m) / sd, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.test[0].numpy(), (raw.data[te] - m) / sd, rtol=1e-5, atol=1e-5)
    assert torch.equal(s.test[1], torch.tensor(raw.target[te]))
    assert s.train[0].dtype == torch.float32 and s.train[1].dtype == torch.int64
    small = load("digits", n_train=100, n_test=50, seed=3)
    assert set(small.meta["train_indices"]) <= set(tr) and set(small.meta["test_indices"]) <= set(te)
    assert load("digits", n_train=100, seed=3).meta["train_indices"] == load("digits", n_train=100, seed=3).meta["train_indices"]
    assert load("digits", n_train=100, seed=4).meta["train_indices"] != small.meta["train_indices"]
    with pytest.raises(WidthscopeError, match="only"):
        load("digits", n_train=5000)


def test_mnist1d_matches_package_and_restores_global_rng():
    import random

    np.random.seed(123)
    random.seed(123)
    expected_np, expected_py = np.random.rand(), random.random()
    np.random.seed(123)
    random.seed(123)
    s = load("mnist1d", n_train=300, n_test=100, seed=1)
    assert np.random.rand() == expected_np and random.random() == expected_py
    assert s.train[0].shape == (300, 40) and s.test[0].shape == (100, 40) and s.num_classes == 10
    full = load("mnist1d")
    assert full.train[0].shape == (4000, 40) and full.test[0].shape == (1000, 40)
    idx = s.meta["train_indices"]
    assert torch.equal(s.train[0], full.train[0][idx]) and torch.equal(s.train[1], full.train[1][idx])


# ------------------------------------------------------------------------------------- text

def test_text_chunks_are_exact_disjoint_byte_ranges(tmp_path):
    (tmp_path / "b.txt").write_bytes(("ünïcödé bytes " * 48).encode()[:768])
    (tmp_path / "a.md").write_bytes(b"hello world " * 20)
    (tmp_path / "skip.bin").write_bytes(b"\x00" * 1000)
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 3)  # binary by content: skipped
    corpus = (tmp_path / "a.md").read_bytes() + (tmp_path / "b.txt").read_bytes()  # sorted order
    s = load("text", root=str(tmp_path), seq_len=16, test_fraction=0.25, seed=5)
    assert s.task == "lm" and s.num_classes == 256 and s.input_shape == (16,)
    X, y = s.train
    assert y is X and X.dtype == torch.int64
    tr, te = s.meta["train_indices"], s.meta["test_indices"]
    n_chunks = len(corpus) // 16
    assert sorted(tr + te) == list(range(n_chunks)) and not set(tr) & set(te)
    assert len(te) == round(0.25 * n_chunks)
    for row, i in zip(s.test[0], te):
        assert bytes(row.tolist()) == corpus[i * 16:(i + 1) * 16]
    one = load("text", root=str(tmp_path / "b.txt"), seq_len=32)
    assert one.meta["bytes"] == 768 and len(one.train[0]) + len(one.test[0]) == 24


def test_text_default_corpus_is_stdlib_and_deterministic():
    a = load("text", max_bytes=20_000, seq_len=32)
    b = load("text", max_bytes=20_000, seq_len=32)
    assert a.meta["bytes"] == 20_000 and all(f.endswith(".py") for f in a.meta["files"])
    assert torch.equal(a.train[0], b.train[0])


def test_text_errors(tmp_path):
    with pytest.raises(WidthscopeError, match="does not exist"):
        load("text", root=str(tmp_path / "nope"))
    with pytest.raises(WidthscopeError, match="none of the files"):
        load("text", root=str(tmp_path))
    (tmp_path / "t.txt").write_bytes(b"abc")
    with pytest.raises(WidthscopeError, match="at least 2"):
        load("text", root=str(tmp_path))


def test_batches_cover_once_seeded_and_lm_yields_tensor():
    X = torch.arange(10).float().view(10, 1)
    y = torch.arange(10)
    got = list(batches((X, y), 4))
    assert [len(b[1]) for b in got] == [4, 4, 2] and torch.equal(torch.cat([b[1] for b in got]), y)
    sh = torch.cat([b[1] for b in batches((X, y), 3, shuffle=True, seed=7)])
    assert sorted(sh.tolist()) == list(range(10)) and not torch.equal(sh, y)
    assert torch.equal(sh, torch.cat([b[1] for b in batches((X, y), 3, shuffle=True, seed=7)]))
    T = torch.randint(0, 256, (5, 8))
    lm = list(batches((T, T), 2))
    assert all(isinstance(b, torch.Tensor) for b in lm) and torch.equal(torch.cat(lm), T)
    sliced = (T[:3], T[:3])  # slicing both parts keeps them views of one tensor: still tokens
    assert all(isinstance(b, torch.Tensor) for b in batches(sliced, 2))
    assert all(isinstance(b, tuple) for b in batches((T, T.clone()), 2))


# -------------------------------------------------------------------------------------- IDX

def write_idx(path, arr, gz):
    codes = {np.uint8: 0x08}
    header = bytes([0, 0, codes[arr.dtype.type], arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    data = header + arr.tobytes()
    if gz:
        path = Path(str(path) + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        Path(path).write_bytes(data)


def make_idx_dir(root, gz, n_train=30, n_test=12):
    rng = np.random.default_rng(0)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8)}
    for name, a in arrays.items():
        write_idx(root / name, a, gz)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_idx_loader_reads_real_format(tmp_path, gz):
    arrays = make_idx_dir(tmp_path, gz)
    s = load("mnist", root=str(tmp_path), normalize=False)
    assert s.train[0].shape == (30, 1, 28, 28) and s.input_shape == (1, 28, 28)
    np.testing.assert_allclose(s.train[0][:, 0].numpy(), arrays["train-images-idx3-ubyte"] / 255.0, rtol=1e-6)
    assert s.test[1].tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    n = load("mnist", root=str(tmp_path), flatten=True, n_train=10, seed=2)
    assert n.train[0].shape == (10, 784) and n.input_shape == (784,)
    raw = arrays["train-images-idx3-ubyte"][n.meta["train_indices"]].astype(np.float64) / 255
    all_train = arrays["train-images-idx3-ubyte"].astype(np.float64) / 255  # whole train part
    mean, std = all_train.mean(), all_train.std(ddof=1)
    np.testing.assert_allclose(n.train[0].numpy(), ((raw - mean) / std).reshape(10, -1), rtol=1e-4, atol=1e-5)
    assert read_idx(next(tmp_path.iterdir())).dtype == np.uint8


def test_idx_missing_and_corrupt_files(tmp_path):
    with pytest.raises(WidthscopeError, match="apt-get install dataset-fashion-mnist"):
        load("fashion-mnist", root=str(tmp_path))
    with pytest.raises(WidthscopeError, match="needs root"):
        load("mnist")
    make_idx_dir(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 99) + b"\x01")
    with pytest.raises(WidthscopeError, match="truncated"):
        load("mnist", root=str(tmp_path))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(WidthscopeError, match="not an IDX file"):
        load("mnist", root=str(tmp_path))


@pytest.mark.skipif(not os.path.isdir(FASHION_ROOT), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist():
    s = load("fashion-mnist", n_train=2000, n_test=500, flatten=True, seed=0)
    assert s.train[0].shape == (2000, 784) and s.test[0].shape == (500, 784) and s.num_classes == 10
    assert set(s.train[1].tolist()) == set(range(10))
    # normalised with the statistics of all 60k training images, so a subset is only close to 0/1
    assert abs(float(s.train[0].mean())) < 0.05 and abs(float(s.train[0].std()) - 1) < 0.05
    assert s.meta["normalization"]["computed_on"] == "whole train part"


# ------------------------------------------------------------------------------------ CIFAR

def write_cifar10(root, n_per_batch=6, n_test=5, protocol=2):
    base = root / "cifar-10-batches-py"
    base.mkdir()
    rng = np.random.default_rng(1)
    written = {}
    for name, n in [(f"data_batch_{i}", n_per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        d = {b"batch_label": b"x", b"labels": rng.integers(0, 10, n).tolist(),
             b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"filenames": [b"f.png"] * n}
        (base / name).write_bytes(pickle.dumps(d, protocol=protocol))
        written[name] = d
    return written


@pytest.mark.parametrize("protocol", [2, 3, 5])
def test_cifar10_pickle_layout_and_grayscale(tmp_path, protocol):
    w = write_cifar10(tmp_path, protocol=protocol)
    s = load("cifar10", root=str(tmp_path), normalize=False)
    assert s.train[0].shape == (30, 3, 32, 32) and s.test[0].shape == (5, 3, 32, 32) and s.num_classes == 10
    first = w["data_batch_1"][b"data"][0].reshape(3, 32, 32) / 255.0
    np.testing.assert_allclose(s.train[0][0].numpy(), first, rtol=1e-6)
    assert s.train[1][:6].tolist() == w["data_batch_1"][b"labels"]
    g = load("cifar10", root=str(tmp_path / "cifar-10-batches-py"), grayscale=True, normalize=False, flatten=True)
    assert g.input_shape == (1024,)
    gray = (0.299 * first[0] + 0.587 * first[1] + 0.114 * first[2]).reshape(-1)
    np.testing.assert_allclose(g.train[0][0].numpy(), gray, rtol=1e-5, atol=1e-6)


def test_cifar100_fine_and_coarse(tmp_path):
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    rng = np.random.default_rng(2)
    for name, n in (("train", 8), ("test", 4)):
        d = {b"fine_labels": rng.integers(0, 100, n).tolist(), b"coarse_labels": rng.integers(0, 20, n).tolist(),
             b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
        (base / name).write_bytes(pickle.dumps(d, protocol=2))
        if name == "train":
            fine, coarse = d[b"fine_labels"], d[b"coarse_labels"]
    s = load("cifar100", root=str(tmp_path))
    assert s.num_classes == 100 and s.train[1].tolist() == fine
    c = load("cifar100", root=str(tmp_path), labels="coarse")
    assert c.num_classes == 20 and c.train[1].tolist() == coarse
    m = s.meta["normalization"]["mean"]
    assert len(m) == 3 and torch.allclose(s.train[0].mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_pickle",))


def test_cifar_malicious_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_cifar10(tmp_path)
    evil = {b"labels": [0], b"data": np.zeros((1, 3072), np.uint8), b"x": _Evil()}
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(WidthscopeError, match="refusing to load .*system"):
        load("cifar10", root=str(tmp_path))
    assert not (tmp_path / "pwned_by_pickle").exists()


def test_cifar_missing_files_message(tmp_path):
    with pytest.raises(WidthscopeError, match="data_batch_1.*test_batch"):
        load("cifar10", root=str(tmp_path))
    with pytest.raises(WidthscopeError, match="needs root"):
        load("cifar100")


def test_subsets_share_the_whole_train_part_normalisation(tmp_path):
    """A model trained on one subset and probed on another must see the same input map."""
    arrays = make_idx_dir(tmp_path, gz=True)
    raw = arrays["train-images-idx3-ubyte"].astype(np.float64) / 255.0
    m, sd = raw.mean(), raw.std(ddof=1)
    a = load("mnist", root=str(tmp_path), n_train=10, seed=1)
    b = load("mnist", root=str(tmp_path), n_train=20, seed=2)
    for s in (a, b):
        idx = s.meta["train_indices"]
        np.testing.assert_allclose(s.train[0][:, 0].numpy(), (raw[idx] - m) / sd, rtol=1e-5, atol=1e-5)
    (tmp_path / "c").mkdir()
    write_cifar10(tmp_path / "c")
    full = load("cifar10", root=str(tmp_path / "c"), grayscale=True)
    sub = load("cifar10", root=str(tmp_path / "c"), grayscale=True, n_train=7, seed=5)
    assert full.meta["normalization"] == sub.meta["normalization"]
    torch.testing.assert_close(sub.train[0], full.train[0][sub.meta["train_indices"]])
    # digits: the statistics do not depend on the subset either
    d1, d2 = load("digits", n_train=50, seed=0), load("digits", n_train=300, seed=0)
    assert d1.meta["normalization"] == d2.meta["normalization"]


def test_text_option_types_are_checked(tmp_path):
    (tmp_path / "t.txt").write_bytes(("ünïcödé text, " * 80).encode())
    for kw, msg in [(dict(seq_len="64"), "seq_len must be an integer >= 2"),
                    (dict(seq_len=1), "seq_len must be an integer >= 2"),
                    (dict(max_bytes=0), "max_bytes must be a positive integer"),
                    (dict(max_bytes=1.5), "max_bytes must be a positive integer"),
                    (dict(test_fraction="0.1"), "test_fraction must be a number")]:
        with pytest.raises(WidthscopeError, match=msg):
            load("text", root=str(tmp_path), **kw)
    split = load("text", root=str(tmp_path), seq_len=16, max_bytes=512)
    assert len(split.train[0]) + len(split.test[0]) == 512 // 16


def test_prose_is_pythons_own_english_and_splits_like_text():
    s = load("prose", seq_len=128, seed=1, max_bytes=200_000)
    assert s.name == "prose" and s.task == "lm" and s.input_shape == (128,)
    assert "pydoc_data.topics" in s.meta["files"]
    tr, te = set(s.meta["train_indices"]), set(s.meta["test_indices"])
    assert not tr & te and len(tr) + len(te) == 200_000 // 128
    text = b"".join(bytes(r.tolist()) for r in s.train[0][:4]).decode("utf-8", errors="replace")
    assert sum(c.isalpha() or c.isspace() for c in text) > 0.8 * len(text)  # prose, not code
    with pytest.raises(WidthscopeError, match="takes no root"):
        load("prose", root="/tmp")
