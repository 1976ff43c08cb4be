"""Image and classification probe pools (:mod:`widthscope.data.inputs`): ImageFolder directories
through the checkpoint's image processor, and widthscope's own named datasets with the checkpoint's
recorded options, split seed and data record."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import data
from .._io import progress
from ..checkpoint import recorded_data
from ..errors import WidthscopeError
from .corpus import IMAGE_SUFFIXES
from .loading import check_ids, model_dir
from .pools import pick_pool, pool_size, refuse_given
from .spec import InputSpec, PoolSize
from .text import corpus_chunks, read_corpus, recorded_chunks


# ----------------------------------------------------------------------------- images
def _image_folder(path: Path) -> list[tuple[Path, str]]:
    classes = sorted(d for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    items = [(f, c.name) for c in classes for f in sorted(c.rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not classes or not items:
        raise WidthscopeError(
            f"{path} is not an ImageFolder directory: expected one sub-folder per class "
            f"holding images ({', '.join(IMAGE_SUFFIXES[:4])}, ...)"
        )
    return items


def image_pools(spec: InputSpec, model: nn.Module, seed: int, show: bool) -> tuple[Any, Any, dict[str, Any], list[str]]:
    from PIL import Image, UnidentifiedImageError

    where = model_dir(model)
    if where is None or not (where / "preprocessor_config.json").is_file():
        raise WidthscopeError(
            f"no image processor in {where}: image models need the checkpoint's "
            "preprocessor_config.json (image_processor.save_pretrained(DIR)) so images are "
            "resized and normalised as in training"
        )
    from transformers import AutoImageProcessor

    try:
        proc = AutoImageProcessor.from_pretrained(str(where), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise WidthscopeError(
            f"could not load the image processor in {where} ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    if spec.train_data is not None or spec.test_data is not None:
        if spec.train_data is None or spec.test_data is None:
            raise WidthscopeError("give --train-data and --test-data together, or one --data ImageFolder")
        refuse_given(spec, ("test_fraction",), "--train-data/--test-data (two sources, nothing is split)")
        tr_items, te_items = _image_folder(Path(spec.train_data)), _image_folder(Path(spec.test_data))
        how = "two ImageFolder directories"
    else:
        assert spec.data is not None  # _resolve sets --data when no --train-data/--test-data are given
        root = Path(spec.data).expanduser()
        subs = {d.name: d for d in root.iterdir() if d.is_dir()}
        test_dir = next((subs[k] for k in ("val", "validation", "test") if k in subs), None)
        if "train" in subs and test_dir is not None:
            refuse_given(spec, ("test_fraction",), f"{root} (its own train/ and {test_dir.name}/ folders)")
            tr_items, te_items = _image_folder(subs["train"]), _image_folder(test_dir)
            how = f"ImageFolder train/ and {test_dir.name}/"
        else:
            items = _image_folder(root)
            perm = torch.randperm(len(items), generator=torch.Generator().manual_seed(int(seed))).tolist()
            assert spec.test_fraction is not None  # a filled spec (InputSpec.filled) has a test fraction
            n_hold = max(1, int(round(spec.test_fraction * len(items))))
            te_items = [items[i] for i in sorted(perm[:n_hold])]
            tr_items = [items[i] for i in sorted(perm[n_hold:])]
            how = f"one ImageFolder split by a seeded permutation (held-out fraction {spec.test_fraction})"
    cfg: Any = model.config  # a transformers config
    names = sorted({c for _, c in tr_items} | {c for _, c in te_items})
    id2label = {int(k): v for k, v in (getattr(cfg, "id2label", None) or {}).items()}
    default_names = all(v == f"LABEL_{k}" for k, v in id2label.items())
    if not default_names and set(names) <= set(id2label.values()):
        label_of = {v: k for k, v in id2label.items()}
        rule = "class folders matched to the model's id2label names"
    elif not default_names:
        raise WidthscopeError(
            f"class folders {', '.join(names[:5])} do not match the model's labels "
            f"{', '.join(list(id2label.values())[:5])}: rename the folders to the label names"
        )
    else:
        if len(names) > cfg.num_labels:
            raise WidthscopeError(f"{len(names)} class folders but the model has {cfg.num_labels} labels")
        label_of = {c: i for i, c in enumerate(names)}
        rule = "class folders in sorted order = label ids 0.. (the model's labels are unnamed)"

    def load(
        items: list[tuple[Path, str]], n: PoolSize, s: int, flag: str, what: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        idx = pick_pool(len(items), n, s, spec.first, what, flag, how, spec.cap_pools).tolist()
        pix, ys = [], []
        for i in progress(idx, desc=f"images ({what})", disable=None if show else True):
            f, c = items[i]
            try:
                with Image.open(f) as im:
                    rgb = im.convert("RGB" if getattr(cfg, "num_channels", 3) == 3 else "L")
            except (UnidentifiedImageError, OSError) as exc:
                raise WidthscopeError(f"{f} is not a readable image ({exc})") from None
            pix.append(proc(images=rgb, return_tensors="pt")["pixel_values"][0])
            ys.append(label_of[c])
        return torch.stack(pix), torch.tensor(ys, dtype=torch.int64)

    train = load(tr_items, spec.n_train, seed, "--n-train", "train images")
    test = load(te_items, spec.n_test, seed + 1, "--n-test", "held-out images")
    info = {
        "split": how,
        "classes": names,
        "label_rule": rule,
        "n_train": len(train[1]),
        "n_test": len(test[1]),
        "processor": type(proc).__name__,
        "first": bool(spec.first),
    }
    return train, test, info, []


# ----------------------------------------------------------------------------- widthscope datasets
def named_pools(
    name: str, spec: InputSpec, model: nn.Module, task: str, seed: int
) -> tuple[Any, Any, dict[str, Any], list[str], Any]:
    """Our own named datasets (digits, fashion-mnist, text, ...) with the checkpoint's recorded
    options, split seed and — where it has one — its data record: the held-out pool comes only
    from held-out data and the train pool from the examples the model was fitted on."""
    rec_all = recorded_data(model)
    same = spec.data is None or (spec.data == rec_all.get("dataset") and spec.data_root is None)
    rec = rec_all if same else {}
    record = (getattr(model, "widthscope_extra", None) or {}).get("data_record") if same else None
    options: dict[str, Any] = {k: v for k, v in rec.get("options", {}).items() if k != "root"}
    root = spec.data_root or rec.get("options", {}).get("root")
    trained_len = options.get("seq_len")
    text_like = name in ("text", "prose")
    if text_like:
        options["seq_len"] = spec.seq_len or options.get("seq_len", 64)
    split_seed = int(rec.get("seed", seed))
    notes: list[str] = []
    if task in ("causal-lm", "masked-lm", "sequence-classification") and not text_like:
        raise WidthscopeError(
            f"--data {name!r} is an image/feature dataset but the model is a {task} model: give text data"
        )
    if text_like and isinstance(record, dict) and record.get("kind") == "text-bytes":
        got = _text_from_record(record, root, options, spec, seed, corpus=name)
        if got is not None:
            train, test, info, offsets = got
            check_ids(train, model, "train")
            check_ids(test, model, "held-out")
            info.update(dataset=name, options=options, split_seed=split_seed, recorded=True)
            return train, test, info, notes, offsets
        integrity = (
            "unverified: the corpus differs from the one the checkpoint was trained on (SHA-256 "
            "mismatch); pools come from re-splitting it, so held-out text may have been trained on"
        )
    elif text_like:
        integrity = (
            "same chunking as training (recorded seq_len and split seed); the corpus version is not "
            "verifiable (no data record)"
            if rec and options["seq_len"] == trained_len
            else "unverified: the checkpoint records no held-out text ranges"
            + (
                f" and --seq-len {options['seq_len']} differs from the trained {trained_len}: the re-cut "
                "'held-out' chunks can contain training text"
                if trained_len and options["seq_len"] != trained_len
                else ""
            )
        )
    else:
        integrity = "split by example: held-out = the dataset's held-out part (independent of any chunking)"
    split = data.load(name, root=root, seed=split_seed, **options)
    if task == "image-classification":
        X = split.train[0]
        cfg = model.config
        want = (getattr(cfg, "num_channels", None), getattr(cfg, "image_size", None))
        got_shape = tuple(X.shape[1:])
        if X.dim() != 4 or got_shape[0] != want[0] or got_shape[1] != want[1] or got_shape[2] != want[1]:
            raise WidthscopeError(
                f"{name} images have shape {got_shape} but the model expects "
                f"({want[0]}, {want[1]}, {want[1]}): give an ImageFolder directory (resized by "
                "the model's image processor)"
            )
    pool_rule = "a fresh seeded sample of the train part"
    train_pair: tuple[torch.Tensor, ...] = split.train
    if split.task != "lm" and spec.train_pool == "fitted":
        fitted = _fitted_positions(record, split)
        if fitted is None:
            pool_rule += " (the checkpoint records no fitted examples)" if not isinstance(record, dict) else ""
        else:
            train_pair = tuple(t[fitted] for t in split.train)
            pool_rule = f"a seeded sample of the {len(fitted)} examples the model was fitted on"

    def sub(pair: Any, n: PoolSize, s: int, flag: str, what: str) -> Any:
        X, y = pair
        idx = pick_pool(len(X), n, s, spec.first, "examples", flag, f"the {what} part of {name}", spec.cap_pools)
        return X[idx] if (split.task == "lm") else (X[idx], y[idx])

    train = sub(train_pair, spec.n_train, seed, "--n-train", "training")
    test = sub(split.test, spec.n_test, seed + 1, "--n-test", "held-out")
    if split.task == "lm":
        check_ids(train, model, "train")
        check_ids(test, model, "held-out")
    if integrity.startswith("unverified"):
        notes.append(f"held-out integrity {integrity}")
    skipped = split.meta.get("skipped_files") or []
    if skipped:
        notes.append(f"{len(skipped)} non-text file(s) skipped in {split.meta.get('source')} (e.g. {skipped[0]})")
    info = {
        "dataset": name,
        "options": options,
        "split_seed": split_seed,
        "recorded": bool(rec),
        "n_train_examples": len(split.train[0]),
        "n_test_examples": len(split.test[0]),
        "n_train": pool_size(train),
        "n_test": pool_size(test),
        "heldout_integrity": integrity,
        "train_pool": pool_rule,
    }
    if split.task == "lm":
        info.update(tokenizer="bytes", seq_len=options.get("seq_len"), sequences="chunks of the byte corpus")
    return train, test, info, notes, split


def _fitted_positions(record: Any, split: Any) -> torch.Tensor | None:
    """Positions in ``split.train`` of the examples a checkpoint was fitted on (None: unknown)."""
    if not isinstance(record, dict) or record.get("kind") != "examples" or record.get("dataset") != split.name:
        return None
    fitted = record.get("fitted_indices")
    if fitted is None:
        return torch.arange(len(split.train[0]))
    full_idx = split.meta.get("train_indices")
    if full_idx is None:  # indices are positions in the train part
        pos = torch.as_tensor(fitted, dtype=torch.long)
        return pos if len(pos) and int(pos.max()) < len(split.train[0]) else None
    where = {int(v): i for i, v in enumerate(full_idx)}  # indices are dataset indices (digits)
    if not all(int(v) in where for v in fitted):
        return None
    return torch.tensor([where[int(v)] for v in fitted], dtype=torch.long)


def _text_from_record(
    record: dict[str, Any], root: str | None, options: dict[str, Any], spec: InputSpec, seed: int, corpus: str = "text"
) -> tuple[Any, Any, dict[str, Any], dict] | None:
    """Byte-model pools at any sequence length from the recorded byte ranges (None: corpus changed)."""
    buf, used, source, _ = read_corpus(root, int(options.get("max_bytes", 2_000_000)), corpus)
    if hashlib.sha256(buf).hexdigest() != record.get("corpus_sha256"):
        return None
    L = int(options["seq_len"])
    if spec.train_pool == "fitted":
        part, rule = "fitted", "the fitted byte ranges (the chunks the model trained on)"
    else:
        part, rule = "train", "the train part (every byte outside the held-out ranges), fresh seeded sample"
    tr_idx = torch.as_tensor(recorded_chunks(record, len(buf), L, part))
    te_idx = torch.as_tensor(recorded_chunks(record, len(buf), L, "heldout"))
    a = tr_idx[
        pick_pool(
            len(tr_idx),
            spec.n_train,
            seed,
            spec.first,
            "train chunks",
            "--n-train",
            f"the recorded train ranges at --seq-len {L}",
            spec.cap_pools,
            "lower --seq-len (more chunks)",
        )
    ]
    b = te_idx[
        pick_pool(
            len(te_idx),
            spec.n_test,
            seed + 1,
            spec.first,
            "held-out chunks",
            "--n-test",
            f"the recorded held-out ranges at --seq-len {L}",
            spec.cap_pools,
            "lower --seq-len (more chunks)",
        )
    ]
    train, test = corpus_chunks(buf, L, a.numpy()), corpus_chunks(buf, L, b.numpy())
    info = {
        "n_train": len(train),
        "n_test": len(test),
        "n_train_examples": len(tr_idx),
        "n_test_examples": len(te_idx),
        "source": source,
        "heldout_integrity": (
            f"verified: corpus SHA-256 matches; held-out pool only from the recorded "
            f"held-out byte ranges, train pool only from {rule}, at --seq-len {L} "
            f"(trained at {record.get('trained_seq_len')})"
        ),
        "train_pool": rule,
        "tokenizer": "bytes",
        "seq_len": L,
        "sequences": "chunks of the byte corpus",
    }
    return train, test, info, {"train": a * L, "test": b * L, "seq_len": L}
