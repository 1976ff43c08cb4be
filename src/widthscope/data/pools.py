"""The two probe pools of :func:`widthscope.data.inputs.resolve` from text, ImageFolder directories,
named datasets and tokenized objects, each ``(train, held-out, info, notes)``: seeded subsets (train
``seed``, held-out ``seed + 1``) of a source cut by ``test_fraction``, or of its own splits."""

from __future__ import annotations

import hashlib
import pydoc_data.topics as topics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from .. import data
from .._io import progress
from ..checkpoint import recorded_data
from ..errors import WidthscopeError
from ..probe.batches import batch_size_of, index_batch
from .corpus import sequences
from .objects import (
    check_ids,
    check_positions,
    dataset_pool,
    from_mapping,
    mask_tokens,
    model_dir,
    pad_id_of,
    prepare_objects,
    tokenizer_name,
)
from .sniff import IMAGE_SUFFIXES
from .sources import choose, default_split_of, describe, documents_of, is_dataset_dict, same_source
from .spec import WINDOW, InputSpec, PoolSize
from .text import corpus_chunks, prose, read_corpus, recorded_chunks

Pools = tuple[Any, Any, dict[str, Any], list[str]]


# ----------------------------------------------------------------------------- shared
def pick_pool(
    n_total: int,
    n: PoolSize,
    seed: int,
    first: bool,
    what: str,
    flag: str,
    where: str,
    cap: bool = False,
    fixes: str = "give more data",
) -> torch.Tensor:
    """``n`` of ``n_total`` items (seeded and sorted, or the first; ``cap``: take what there is)."""
    if n == "all":
        return torch.arange(n_total)
    k = min(n, n_total) if cap else n
    if k > n_total:
        unit = what[:-1] if n_total == 1 and what.endswith("s") else what
        raise WidthscopeError(
            f"{flag} {k} but {where} gave only {n_total} {unit}: lower {flag} (or {flag} all), or {fixes}"
        )
    if first:
        return torch.arange(k)
    return torch.randperm(n_total, generator=torch.Generator().manual_seed(int(seed)))[:k].sort().values


def _pick_pools(
    spec: InputSpec, sizes: tuple[int, int], unit: str, where: tuple[str, str], fixes: tuple[str, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the train pool (seed ``spec.seed``) and the held-out pool (``spec.seed + 1``)."""
    fixes = fixes or (f"give more {unit}",) * 2
    parts = (("train", "--n-train", spec.n_train), ("held-out", "--n-test", spec.n_test))
    a, b = (
        pick_pool(sizes[i], n, spec.seed + i, spec.first, f"{p} {unit}", f, where[i], spec.cap_pools, fixes[i])
        for i, (p, f, n) in enumerate(parts)
    )
    return a, b


def refuse_given(spec: InputSpec, dests: tuple[str, ...], what: str) -> None:
    """One line for the first of ``dests`` given explicitly although ``what`` does not use it."""
    for d in dests:
        if spec.is_given(d):
            flag = "--" + d.replace("_", "-")
            raise WidthscopeError(f"{flag} does not apply to {what}: drop {flag}")


def _sources(spec: InputSpec) -> tuple[Any, str | None, Any, str | None, str, Any]:
    """(train source, its split, held-out source, its split, how, the ``--data`` SplitChoice or None)."""
    if (spec.train_data is None) != (spec.test_data is None):
        raise WidthscopeError(
            "give --train-data and --test-data together (the train pool from one, the held-out "
            "pool from the other), or one --data source to split"
        )
    if spec.train_data is not None:
        if spec.data is not None:
            raise WidthscopeError(
                "--data and --train-data/--test-data both given: use one source (--data) or two "
                "(--train-data and --test-data)"
            )
        refuse_given(spec, ("test_fraction",), "--train-data/--test-data (two sources, nothing is split)")
        tr_split = spec.train_split or default_split_of(spec.train_data, "train")
        te_split = spec.test_split or default_split_of(spec.test_data, "test")
        if same_source(spec.train_data, spec.test_data) and tr_split == te_split:
            raise WidthscopeError(
                f"--train-data and --test-data are the same source ({describe(spec.train_data)}): the "
                "held-out pool must be other data; use --data to split one source"
            )
        return spec.train_data, tr_split, spec.test_data, te_split, "two sources", None
    assert spec.data is not None  # resolve sets --data when no --train-data/--test-data are given
    choice = choose(
        spec.data, spec.train_split, spec.test_split, spec.test_fraction if spec.is_given("test_fraction") else None
    )
    if choice is not None:
        return spec.data, choice.train, spec.data, choice.test, choice.how, choice
    if spec.train_split or spec.test_split:
        raise WidthscopeError(f"{describe(spec.data)} has no splits: drop --train-split/--test-split")
    return spec.data, None, spec.data, None, "one corpus", None


def _cut(n: int, spec: InputSpec, what: str, first: bool = True) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``n`` rows cut into train and held-out rows (seeded, or in order), and the rule in words."""
    frac = spec.test_fraction
    assert frac is not None  # a filled spec (InputSpec.filled) has a test fraction
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(spec.seed)))
    n_hold = min(max(1, int(round(frac * n))), n - 1) if n > 1 else 0
    if spec.first and first:
        rule = f"first {1 - frac:.0%} of the {what} train, the rest held out"
        return torch.arange(n - n_hold), torch.arange(n - n_hold, n), rule
    rule = f"{what} split by a seeded permutation (seed {spec.seed}, held-out fraction {frac})"
    return perm[n_hold:].sort().values, perm[:n_hold].sort().values, rule


def _integrity(choice: Any, how: str, rule: str, test_source: str, kind: str, unit: str) -> str:
    """``heldout_integrity`` of pools from a source's own splits, one source cut here, or two sources."""
    if choice is not None:
        return choice.integrity
    unless = "held-out only if the model never trained on it"
    if how == "one corpus":
        return f"one {kind}, split here ({rule}): the pools share no {unit}; {unless}"
    return f"two sources: held-out pool only from {test_source}; {unless}"


# ----------------------------------------------------------------------------- text
def _text_fixes(seqs: Any, mode: str, max_tokens: int | None) -> str:
    """What gives a text pool more sequences: only the fixes that can help this source."""
    fixes = {
        "concatenate": ["lower --seq-len (more chunks)"],
        "truncate": ["lower --seq-len (more documents are long enough)"],
    }.get(mode, [])
    if seqs.exhausted or not max_tokens:
        fixes.append("give more text (the whole source was read)")
    else:
        fixes.append(f"raise --max-tokens (only the first {max_tokens} tokens were read)")
    return " or ".join(fixes)


def _empty_note(info: dict[str, Any], what: str) -> str | None:
    """One line naming a source's empty / whitespace-only documents and what became of them."""
    n = info.get("empty_documents") or 0
    if not n:
        return None
    fate = (
        "skipped before tokenizing (--empty-docs skip, the published scripts' rule)"
        if info.get("empty_rule") == "skip"
        else "kept as documents (--empty-docs eos: each adds its EOS separator in concatenated chunks)"
    )
    return f"{what}: {n} of {info.get('documents_read')} documents read were empty or whitespace-only: {fate}"


def _read_text(
    src: Any, split: str | None, tok: Any, spec: InputSpec, seq_len: int, mode: str, n: PoolSize | None, desc: str,
    labels: bool, show: bool,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """One source cut into enough sequences for a pool of ``n`` (None or ``"all"``: the whole source)."""
    if n is None or n == "all":
        limit, max_tokens = None, spec.max_tokens
    elif spec.first:
        limit, max_tokens = n, None
    else:
        limit, max_tokens = None, spec.max_tokens if spec.max_tokens is not None else WINDOW * n * seq_len
    skipped: list[str] = []
    if src == "prose":  # Python's own English prose, one document per help topic (and the license)
        texts = [topics.topics[k] for k in sorted(topics.topics)]
        lic = prose()[0].decode("utf-8")[len("\n\n".join(texts)) :].strip()
        docs: Any = (iter([d]) for d in texts + ([lic] if lic else []))
        source = "English prose shipped with Python"
    else:
        text_field = spec.text_field if spec.is_given("text_field") else None
        label_field, whole = spec.label_field if labels else None, limit is None and max_tokens is None
        docs, source = documents_of(
            src, split=split, text_field=text_field, label_field=label_field, skipped=skipped, whole=whole
        )
    empty = spec.empty_docs or "skip"
    seqs = sequences(
        docs, tok, seq_len=seq_len, mode=mode, limit=limit, max_tokens=max_tokens, labels=labels,
        show_progress=show, desc=desc, empty=empty,
    )  # fmt: skip
    info = {
        "source": source,
        "documents_read": seqs.documents,
        "tokens_read": seqs.tokens,
        "sequences": int(seqs.ids.shape[0]),
        "corpus_exhausted": seqs.exhausted,
        "max_tokens": max_tokens,
        "skipped_files": len(skipped),
        "empty_documents": seqs.empty_docs,
        "empty_rule": empty,
    }
    optional = {"split": split, "skipped": skipped[:20], "dropped_short_documents": seqs.dropped_short}
    info.update({k: v for k, v in optional.items() if v})
    return seqs, info


def _seq_examples(seqs: Any, idx: torch.Tensor, task: str, tok: Any, seed: int) -> tuple[Any, int]:
    """The pool's rows as the task's examples, and the sequences masking dropped."""
    ids = seqs.ids[idx]
    mask = None if seqs.mask is None else seqs.mask[idx]
    if task == "masked-lm":
        return mask_tokens(ids, torch.ones_like(ids) if mask is None else mask, tok, seed=seed)
    if task == "sequence-classification":
        return ({"input_ids": ids, "attention_mask": mask}, seqs.labels[idx]), 0
    return (ids if mask is None else {"input_ids": ids, "attention_mask": mask}), 0


def text_pools(spec: InputSpec, model: nn.Module, task: str, tok: Any, seq_len: int, mode: str, show: bool) -> Pools:
    """Both pools of ``seq_len``-token sequences (``mode``: :func:`widthscope.data.corpus.sequences`)."""
    labels = task == "sequence-classification"
    tr_src, tr_split, te_src, te_split, how, choice = _sources(spec)
    notes: list[str] = list(choice.notes) if choice is not None else []
    info: dict[str, Any] = {"split": how}
    one = how not in ("two sources", "dataset splits")  # one corpus (or split) cut into both pools
    read = (tok, spec, seq_len, mode)
    if one:
        n_tr, n_te, frac = spec.n_train, spec.n_test, spec.test_fraction
        assert frac is not None  # a filled spec (InputSpec.filled) has a test fraction
        # enough sequences that both parts can fill their pools
        need = None
        if isinstance(n_tr, int) and isinstance(n_te, int):
            need = max(int((n_tr + 1) / (1 - frac)), int((n_te + 1) / frac)) + 1
        tr_seqs, info["train"] = _read_text(tr_src, tr_split, *read, need, "tokenize", labels, show)
        te_seqs, info["test"] = tr_seqs, info["train"]
        tr_rows, te_rows, info["rule"] = _cut(int(tr_seqs.ids.shape[0]), spec, "sequences of one corpus")
    else:
        tr_seqs, info["train"] = _read_text(tr_src, tr_split, *read, spec.n_train, "tokenize train", labels, show)
        te_seqs, info["test"] = _read_text(te_src, te_split, *read, spec.n_test, "tokenize held-out", labels, show)
        tr_rows, te_rows = torch.arange(len(tr_seqs.ids)), torch.arange(len(te_seqs.ids))
    fixes = tuple(_text_fixes(q, mode, info[p]["max_tokens"]) for q, p in ((tr_seqs, "train"), (te_seqs, "test")))
    where = (describe(tr_src), describe(te_src))
    a, b = _pick_pools(spec, (len(tr_rows), len(te_rows)), "sequences", where, fixes)
    a, b = tr_rows[a], te_rows[b]
    check_ids(tr_seqs.ids[a], model, "train")
    check_ids(te_seqs.ids[b], model, "held-out")
    info["heldout_integrity"] = _integrity(
        choice, how, info.get("rule", ""), info["test"]["source"], "corpus", "sequence"
    )
    sources = {"corpus": info["train"]} if one else {"train source": info["train"], "held-out source": info["test"]}
    notes += [line for what, src in sources.items() if (line := _empty_note(src, what))]
    train, d1 = _seq_examples(tr_seqs, a, task, tok, spec.seed)
    test, d2 = _seq_examples(te_seqs, b, task, tok, spec.seed + 1)
    if d1 or d2:
        notes.append(f"masked LM: dropped {d1 + d2} sequence(s) with no ordinary token to mask")
        if batch_size_of(train) < 4 or batch_size_of(test) < 4:
            raise WidthscopeError("fewer than 4 sequences left after masking: give longer documents")
    n_labels = getattr(getattr(model, "config", None), "num_labels", None)
    for what, ex in (("train", train), ("held-out", test)) if labels else ():
        y = ex[1]
        if isinstance(n_labels, int) and y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_labels):
            raise WidthscopeError(
                f"{what} labels span {int(y.min())}..{int(y.max())} but the model has "
                f"{n_labels} labels: map --label-field to 0..{n_labels - 1}"
            )
    sep = tr_seqs.separator
    info.update(
        tokenizer=tokenizer_name(tok),
        seq_len=seq_len,
        sequences=mode,
        first=bool(spec.first),
        separator_id=sep,
        n_train=batch_size_of(train),
        n_test=batch_size_of(test),
        pool_rule=_pool_rule(spec, "sequences"),
    )
    if task == "masked-lm":
        info["masking"] = "15% of each sequence's ordinary tokens (at least one) replaced by the mask token, seeded"
    if mode == "concatenate" and sep is None:
        notes.append(f"tokenizer {tokenizer_name(tok)} has no EOS/SEP token: documents were joined without a separator")
    for part in ("train", "test"):
        src = info.get(part) or {}
        if src.get("skipped_files"):
            notes.append(
                f"{src['skipped_files']} non-text file(s) skipped in {src['source']} (e.g. {src['skipped'][0]})"
            )
    return train, test, info, notes


def _pool_rule(spec: InputSpec, unit: str) -> str:
    return f"first {unit}" if spec.first else f"seeded random subsets (seeds {spec.seed}, {spec.seed + 1})"


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


def _image_items(spec: InputSpec) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]], str]:
    """The train and held-out (image, class) items, and how they were split."""
    if spec.train_data is not None or spec.test_data is not None:
        if spec.train_data is None or spec.test_data is None:
            raise WidthscopeError("give --train-data and --test-data together, or one --data ImageFolder")
        refuse_given(spec, ("test_fraction",), "--train-data/--test-data (two sources, nothing is split)")
        return _image_folder(Path(spec.train_data)), _image_folder(Path(spec.test_data)), "two ImageFolder directories"
    assert spec.data is not None  # resolve sets --data when no --train-data/--test-data are given
    root = Path(spec.data).expanduser()
    subs = {d.name: d for d in root.iterdir() if d.is_dir()}
    test_dir = next((subs[k] for k in ("val", "validation", "test") if k in subs), None)
    if "train" in subs and test_dir is not None:
        refuse_given(spec, ("test_fraction",), f"{root} (its own train/ and {test_dir.name}/ folders)")
        return _image_folder(subs["train"]), _image_folder(test_dir), f"ImageFolder train/ and {test_dir.name}/"
    items = _image_folder(root)
    tr, te, _ = _cut(len(items), spec, "images", first=False)
    how = f"one ImageFolder split by a seeded permutation (held-out fraction {spec.test_fraction})"
    return [items[i] for i in tr.tolist()], [items[i] for i in te.tolist()], how


def image_pools(spec: InputSpec, model: nn.Module, show: bool) -> Pools:
    """Both pools from ImageFolder directories, through the checkpoint's own image processor."""
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
    tr_items, te_items, how = _image_items(spec)
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

    def load(items: list[tuple[Path, str]], idx: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        pix, ys = [], []
        for i in progress(idx.tolist(), desc=f"images ({what})", disable=None if show else True):
            f, c = items[i]
            try:
                with Image.open(f) as im:
                    rgb = im.convert("RGB" if getattr(cfg, "num_channels", 3) == 3 else "L")
            except (UnidentifiedImageError, OSError) as exc:
                raise WidthscopeError(f"{f} is not a readable image ({exc})") from None
            pix.append(proc(images=rgb, return_tensors="pt")["pixel_values"][0])
            ys.append(label_of[c])
        return torch.stack(pix), torch.tensor(ys, dtype=torch.int64)

    a, b = _pick_pools(spec, (len(tr_items), len(te_items)), "images", (how, how))
    train, test = load(tr_items, a, "train images"), load(te_items, b, "held-out images")
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
    name: str, spec: InputSpec, model: nn.Module, task: str
) -> tuple[Any, Any, dict[str, Any], list[str], Any]:
    """Pools of our own named datasets with the checkpoint's recorded options, split seed and data
    record; the last item is the :class:`~widthscope.data.Split` or a byte model's corpus offsets."""
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
    split_seed = int(rec.get("seed", spec.seed))
    notes: list[str] = []
    if task in ("causal-lm", "masked-lm", "sequence-classification") and not text_like:
        raise WidthscopeError(
            f"--data {name!r} is an image/feature dataset but the model is a {task} model: give text data"
        )
    if text_like and isinstance(record, dict) and record.get("kind") == "text-bytes":
        got = _text_from_record(record, root, options, spec, name)
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
    elif text_like and rec and options["seq_len"] == trained_len:
        integrity = (
            "same chunking as training (recorded seq_len and split seed); the corpus version is not "
            "verifiable (no data record)"
        )
    elif text_like:
        integrity = "unverified: the checkpoint records no held-out text ranges" + (
            f" and --seq-len {options['seq_len']} differs from the trained {trained_len}: the re-cut "
            "'held-out' chunks can contain training text"
            if trained_len and options["seq_len"] != trained_len
            else ""
        )
    else:
        integrity = "split by example: held-out = the dataset's held-out part (independent of any chunking)"
    split = data.load(name, root=root, seed=split_seed, **options)
    if task == "image-classification":
        cfg = model.config
        c, s = getattr(cfg, "num_channels", None), getattr(cfg, "image_size", None)
        got_shape = tuple(split.train[0].shape[1:])
        if got_shape != (c, s, s):
            raise WidthscopeError(
                f"{name} images have shape {got_shape} but the model expects ({c}, {s}, {s}): give an "
                "ImageFolder directory (resized by the model's image processor)"
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
    where = (f"the training part of {name}", f"the held-out part of {name}")
    a, b = _pick_pools(spec, (len(train_pair[0]), len(split.test[0])), "examples", where)
    train, test = tuple(t[a] for t in train_pair), tuple(t[b] for t in split.test)
    if split.task == "lm":  # the tokens alone
        train, test = train[0], test[0]
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
        "n_train": batch_size_of(train),
        "n_test": batch_size_of(test),
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
    record: dict[str, Any], root: str | None, options: dict[str, Any], spec: InputSpec, corpus: str
) -> tuple[Any, Any, dict[str, Any], dict] | None:
    """Byte-model pools at any sequence length from the recorded byte ranges (None: corpus changed)."""
    buf, _, source, _ = read_corpus(root, int(options.get("max_bytes", 2_000_000)), corpus)
    if hashlib.sha256(buf).hexdigest() != record.get("corpus_sha256"):
        return None
    L = int(options["seq_len"])
    if spec.train_pool == "fitted":
        part, rule = "fitted", "the fitted byte ranges (the chunks the model trained on)"
    else:
        part, rule = "train", "the train part (every byte outside the held-out ranges), fresh seeded sample"
    tr_idx = torch.as_tensor(recorded_chunks(record, len(buf), L, part))
    te_idx = torch.as_tensor(recorded_chunks(record, len(buf), L, "heldout"))
    where = (f"the recorded train ranges at --seq-len {L}", f"the recorded held-out ranges at --seq-len {L}")
    fixes = ("lower --seq-len (more chunks)",) * 2
    a, b = _pick_pools(spec, (len(tr_idx), len(te_idx)), "chunks", where, fixes)
    a, b = tr_idx[a], te_idx[b]
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


# ----------------------------------------------------------------------------- tokenized objects
def _join(batches: list[Any], pad_id: int, where: str) -> Any:
    """The batches of a ``DataLoader`` as one pool (2-D tensors of dicts right-padded to the longest)."""
    first = batches[0]
    if isinstance(first, Mapping):
        keys = list(first)
        if any(not isinstance(b, Mapping) or list(b) != keys for b in batches):
            raise WidthscopeError(f"{where}: the DataLoader's batches have different keys")
        out = {}
        for k in keys:
            parts = [torch.as_tensor(b[k]) for b in batches]
            if parts[0].ndim == 2:
                value = {"attention_mask": 0, "labels": -100, "token_type_ids": 0}.get(k, pad_id)
                T = max(p.shape[1] for p in parts)
                parts = [torch.nn.functional.pad(p, (0, T - p.shape[1]), value=value) for p in parts]
            try:
                out[k] = torch.cat(parts)
            except RuntimeError as exc:
                raise WidthscopeError(f"{where}: the batches' {k!r} tensors do not join ({exc})") from None
        return out
    if isinstance(first, (tuple, list)) and len(first) == 2:
        return tuple(torch.cat([torch.as_tensor(b[i]) for b in batches]) for i in range(2))
    if isinstance(first, torch.Tensor):
        return torch.cat(batches)
    raise WidthscopeError(
        f"{where}: the DataLoader gives {type(first).__name__} batches: give dicts of tensors, (x, y) pairs or tensors"
    )


def _whole(obj: Any, split: str | None, task: str, tok: Any, where: str) -> tuple[Any, str]:
    """One tokenized source (a split of it) as one pool of raw examples, and its description."""
    if is_dataset_dict(obj):
        if split is None or split not in obj:
            raise WidthscopeError(f"{where}: the DatasetDict has no split {split!r} (splits: {', '.join(obj)})")
        pool, _, what = dataset_pool(obj[split], task, tok, None, None, where)
        return pool, f"DatasetDict split {split!r}: {what}"
    if split is not None:
        raise WidthscopeError(f"{where}: {describe(obj)} has no splits: drop --train-split/--test-split")
    if isinstance(obj, DataLoader):
        batches = list(obj)  # drawn once: the pool stays fixed
        if not batches:
            raise WidthscopeError(f"{where}: the DataLoader gave no batches")
        return _join(batches, pad_id_of(tok), where), f"DataLoader of {len(batches)} batches"
    if isinstance(obj, Mapping):
        pool = from_mapping(obj, where)
        return pool, f"{type(obj).__name__} of {next(iter(pool.values())).shape[0]} examples"
    pool, _, what = dataset_pool(obj, task, tok, None, None, where)
    return pool, what


def _ready(raw: Any, task: str, tok: Any, seed: int, model: nn.Module, where: str) -> Any:
    """Raw examples made into what the task's batches hold (masking, labels split off), checked."""
    pool = prepare_objects(raw, task, tok, seed, where, from_text=False) if isinstance(raw, dict) else raw
    x = pool[0] if isinstance(pool, tuple) else pool
    ids = x.get("input_ids") if isinstance(x, dict) else None
    if isinstance(ids, torch.Tensor):
        check_positions(model, ids, where)
        check_ids(ids, model, where)
    return pool


def object_pools(spec: InputSpec, model: nn.Module, task: str, tok: Any) -> Pools:
    """Both pools from tokenized objects, prepared for the task as for ``ws.certify``."""
    given = [d for d in ("seq_len", "sequences", "max_tokens", "empty_docs", "label_field") if spec.is_given(d)]
    if given:
        raise WidthscopeError(
            f"InputSpec({given[0]}=...) applies to text; the data are tokenized examples "
            "(a BatchEncoding, mapping, DataLoader or tokenized Dataset): drop it (tokenize with it instead)"
        )
    tr_src, tr_split, te_src, te_split, how, choice = _sources(spec)
    notes: list[str] = list(choice.notes) if choice is not None else []
    info: dict[str, Any] = {"split": how}
    two = how == "two sources"
    tr_raw, tr_what = _whole(tr_src, tr_split, task, tok, "train_data" if two else "InputSpec(data=...)")
    if how not in ("two sources", "dataset splits"):  # one source cut into both pools
        tr_rows, te_rows, info["rule"] = _cut(batch_size_of(tr_raw), spec, "examples of one object")
        te_raw, tr_raw = index_batch(tr_raw, te_rows), index_batch(tr_raw, tr_rows)
        te_what = tr_what
    else:
        te_raw, te_what = _whole(te_src, te_split, task, tok, "test_data" if two else "InputSpec(data=...)")
    info["heldout_integrity"] = _integrity(choice, how, info.get("rule", ""), describe(te_src), "object", "example")
    info["train"], info["test"] = {"source": f"{tr_what} (in memory)"}, {"source": f"{te_what} (in memory)"}
    where = (describe(tr_src), describe(te_src))
    a, b = _pick_pools(spec, (batch_size_of(tr_raw), batch_size_of(te_raw)), "examples", where)
    train = _ready(index_batch(tr_raw, a), task, tok, spec.seed, model, "train pool")
    test = _ready(index_batch(te_raw, b), task, tok, spec.seed + 1, model, "held-out pool")
    info.update(
        n_train=batch_size_of(train),
        n_test=batch_size_of(test),
        first=bool(spec.first),
        pool_rule=_pool_rule(spec, "examples"),
    )
    return train, test, info, notes
