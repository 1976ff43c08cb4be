"""Image datasets from their standard file formats: IDX (MNIST, Fashion-MNIST) and the CIFAR
python-pickle batches (read with an unpickler that can only rebuild numpy arrays)."""

from __future__ import annotations

import gzip
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import WidthscopeError
from . import Split, subset

FASHION_ROOT = "/usr/share/datasets/fashion-mnist"
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): magic ``00 00 <type> <ndim>``, big-endian uint32 dims, data."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise WidthscopeError(f"{path} is a corrupt gzip file ({exc}); re-download or re-install it") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise WidthscopeError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise WidthscopeError(
            f"{path}: header says shape {dims} ({expected} bytes of data) but the file has "
            f"{len(raw) - header}; the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _find_idx(root: Path, dataset: str) -> dict[str, Path]:
    cands = {k: (root / f"{s}.gz", root / s, root / s.replace("-idx", ".idx")) for k, s in IDX_FILES.items()}
    found = {k: p for k, ps in cands.items() if (p := next((c for c in ps if c.is_file()), None)) is not None}
    missing = [s for k, s in IDX_FILES.items() if k not in found]
    if missing:
        how = (
            "install the Debian/Ubuntu package: apt-get install dataset-fashion-mnist (files go to "
            f"{FASHION_ROOT}), or pass root= a directory holding them"
            if dataset == "fashion-mnist"
            else "download the four MNIST IDX files and pass root= their directory"
        )
        raise WidthscopeError(
            f"{dataset}: missing {', '.join(m + '(.gz)' for m in missing)} in {root}; "
            f"expected {', '.join(s + '(.gz)' for s in IDX_FILES.values())}; {how}"
        )
    return found


def _channel_stats(X: np.ndarray, luma: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel float64 mean and std of ``(N, C, H, W)`` byte images in [0, 1], 4096 at a time."""
    if len(X) == 0:
        raise WidthscopeError(f"per-channel statistics need at least one image; got an empty array {X.shape}")
    s1 = s2 = torch.zeros(X.shape[1] if luma is None else 1, dtype=torch.float64)
    for i in range(0, len(X), 4096):
        x = torch.tensor(np.asarray(X[i : i + 4096]), dtype=torch.float64) * (1 / 255.0)  # a copy: may be read-only
        if luma is not None:
            x = torch.einsum("oc,nchw->nohw", luma.double(), x)
        s1, s2 = s1 + x.sum(dim=(0, 2, 3)), s2 + x.square().sum(dim=(0, 2, 3))
    count = len(X) * X.shape[2] * X.shape[3]
    mean = s1 / count
    var = (s2 - count * mean.square()) / max(count - 1, 1)
    return mean, var.clamp_min(0).sqrt().clamp_min(1e-12)


def _finish_images(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    n_train: int | None,
    n_test: int | None,
    seed: int,
    num_classes: int,
    meta: dict[str, Any],
    *,
    flatten: bool,
    normalize: bool,
    luma: torch.Tensor | None = None,
) -> Split:
    """Seeded subsets of ``(N, C, H, W)`` byte images: grayscale (``luma``), in [0, 1], normalised, flattened."""
    stats = _channel_stats(train[0], luma) if normalize else None
    rng = np.random.default_rng(seed)
    parts = []
    for (X, y), n, part in ((train, n_train, "train"), (test, n_test, "test")):
        idx = subset(len(y), n, rng, part)
        meta[f"{part}_indices"] = None if idx is None else idx.tolist()
        X, y = (X, y) if idx is None else (X[idx], y[idx])
        x = torch.from_numpy(np.array(X)).float()  # a copy: frombuffer arrays are read-only
        if luma is not None:
            x = (x * luma.view(1, 3, 1, 1)).sum(1, keepdim=True)
        parts.append((x / 255.0, torch.from_numpy(np.array(y)).long()))
    (Xtr, ytr), (Xte, yte) = parts
    if luma is not None:
        meta["grayscale"] = "0.299 R + 0.587 G + 0.114 B"
    if stats is not None:  # per-channel zero mean / unit variance
        mean, std = stats
        m, s = mean.float().view(1, -1, 1, 1), std.float().view(1, -1, 1, 1)
        Xtr, Xte = (Xtr - m) / s, (Xte - m) / s
        meta["normalization"] = {"mean": mean.tolist(), "std": std.tolist(), "computed_on": "whole train part"}
    shape = tuple(Xtr.shape[1:])
    if flatten:
        Xtr, Xte = Xtr.flatten(1), Xte.flatten(1)
        shape = (int(np.prod(shape)),)
    return Split((Xtr, ytr), (Xte, yte), "classification", num_classes, shape, name, meta)


def load_idx(
    name: str,
    root: str | None,
    n_train: int | None,
    n_test: int | None,
    seed: int,
    *,
    flatten: bool = False,
    grayscale: bool = True,
    normalize: bool = True,
) -> Split:
    """MNIST / Fashion-MNIST (``grayscale`` is accepted for symmetry: the images are grayscale)."""
    if root is None:
        if name != "fashion-mnist":
            raise WidthscopeError(f"{name} needs root= the directory with {', '.join(IDX_FILES.values())}(.gz)")
        root = FASHION_ROOT
    files = _find_idx(Path(root).expanduser(), name)
    parts = []
    for part in ("train", "test"):
        X, y = read_idx(files[f"{part}_images"]), read_idx(files[f"{part}_labels"])
        if X.ndim != 3 or len(X) != len(y):
            raise WidthscopeError(
                f"{name}: {part} images {X.shape} and labels {y.shape} do not match (expected (n, H, W) and (n,))"
            )
        parts.append((X[:, None], y))
    meta: dict[str, Any] = {
        "source": {k: str(p) for k, p in files.items()},
        "seed": seed,
        "split_rule": "official split: train-* files for train, t10k-* files for test",
    }
    train, test = parts
    return _finish_images(name, train, test, n_train, n_test, seed, 10, meta, flatten=flatten, normalize=normalize)


# Everything a CIFAR batch pickle legitimately references: numpy array reconstruction.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode(str, "latin1")``: how protocol-2 pickles written by Python 3 spell bytes."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that can only rebuild numpy arrays (the CIFAR batch contents)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("_codecs", "encode"):
            return _latin1_encode
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: CIFAR pickles may only contain numpy arrays")


def safe_pickle_load(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return SafeUnpickler(io.BufferedReader(f), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        raise WidthscopeError(
            f"{path}: unsafe or invalid pickle ({exc}); use the original CIFAR python-version files"
        ) from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise WidthscopeError(f"{path} is not a readable CIFAR batch pickle ({type(exc).__name__}: {exc})") from None


def _cifar_files(name: str, root: Path) -> tuple[list[Path], list[Path]]:
    sub = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    base = root / sub if (root / sub).is_dir() else root
    if name == "cifar10":
        train = [base / f"data_batch_{i}" for i in range(1, 6)]
        test = [base / "test_batch"]
    else:
        train, test = [base / "train"], [base / "test"]
    missing = [p.name for p in train + test if not p.is_file()]
    if missing:
        raise WidthscopeError(
            f"{name}: missing {', '.join(missing)} in {base}; expected the python version "
            f"({sub}/{', '.join(p.name for p in train + test)}), e.g. extracted from "
            f"{'cifar-10-python.tar.gz' if name == 'cifar10' else 'cifar-100-python.tar.gz'}"
        )
    return train, test


def _read_cifar(paths: list[Path], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        d = safe_pickle_load(p)
        if not isinstance(d, dict) or b"data" not in d or label_key not in d:
            raise WidthscopeError(f"{p} has no {b'data'!r} / {label_key!r} entries: not a CIFAR batch")
        data = np.asarray(d[b"data"])
        if data.ndim != 2 or data.shape[1] != 3072:
            raise WidthscopeError(f"{p}: data has shape {data.shape}, expected (n, 3072) uint8")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d[label_key], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def load_cifar(
    name: str,
    root: str | None,
    n_train: int | None,
    n_test: int | None,
    seed: int,
    *,
    flatten: bool = False,
    grayscale: bool = False,
    normalize: bool = True,
    labels: str = "fine",
) -> Split:
    """CIFAR-10 / CIFAR-100 from the python-pickle batches (``labels`` fine|coarse for CIFAR-100)."""
    if root is None:
        raise WidthscopeError(
            f"{name} needs root= the directory holding "
            f"{'cifar-10-batches-py' if name == 'cifar10' else 'cifar-100-python'}"
        )
    if labels not in ("fine", "coarse"):
        raise WidthscopeError(f"labels must be 'fine' or 'coarse', got {labels!r}")
    train_files, test_files = _cifar_files(name, Path(root).expanduser())
    key = b"labels" if name == "cifar10" else (b"fine_labels" if labels == "fine" else b"coarse_labels")
    meta: dict[str, Any] = {
        "source": [str(p) for p in train_files + test_files],
        "seed": seed,
        "split_rule": "official split: training batches for train, test batch for test",
    }
    luma = torch.tensor([[0.299, 0.587, 0.114]]) if grayscale else None  # ITU-R BT.601 RGB -> gray
    num_classes = 10 if name == "cifar10" else (100 if labels == "fine" else 20)
    train, test = _read_cifar(train_files, key), _read_cifar(test_files, key)
    return _finish_images(
        name, train, test, n_train, n_test, seed, num_classes, meta, flatten=flatten, normalize=normalize, luma=luma
    )
