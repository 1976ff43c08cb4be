"""Text probe pools (:mod:`widthscope.data.inputs`): the train / held-out sources from --data or
--train-data/--test-data (:func:`_split_sources`), reading and tokenizing a window of each, and
cutting both pools of sequences (:func:`text_pools`)."""

from __future__ import annotations

import pydoc_data.topics as topics
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import WidthscopeError
from .loading import check_ids, mask_tokens, tokenizer_name
from .pools import pick_pool, pool_size, read_limits, refuse_given
from .published import empty_note
from .sequences import sequences
from .sniff import is_dataset_dir
from .sources import choose, default_split_of, describe, documents_of, same_source
from .spec import InputSpec, PoolSize
from .text import prose


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


# ----------------------------------------------------------------------------- text
def _text_source(
    src: Any, split: str | None, spec: InputSpec, labels: bool, skipped: list[str], whole: bool
) -> tuple[Any, str]:
    if src == "prose":  # Python's own English prose, one document per help topic (and the license)
        docs = [topics.topics[k] for k in sorted(topics.topics)]
        lic = prose()[0].decode("utf-8")[len("\n\n".join(docs)) :].strip()
        return (iter([d]) for d in docs + ([lic] if lic else [])), "English prose shipped with Python"
    return documents_of(
        src,
        split=split,
        text_field=spec.text_field if spec.is_given("text_field") else None,
        label_field=spec.label_field if labels else None,
        skipped=skipped,
        whole=whole,
    )


def _read_text(
    path: Any,
    split: str | None,
    tok: Any,
    spec: InputSpec,
    seq_len: int,
    mode: str,
    n: PoolSize | None,
    labels: bool,
    desc: str,
    show: bool,
) -> tuple[Any, dict[str, Any]]:
    count = None if n == "all" else n
    skipped: list[str] = []
    limit, max_tokens = read_limits(spec, count, seq_len)
    docs, source = _text_source(path, split, spec, labels, skipped, limit is None and max_tokens is None)
    empty = spec.empty_docs or "skip"
    seqs = sequences(
        docs,
        tok,
        seq_len=seq_len,
        mode=mode,
        limit=limit,
        max_tokens=max_tokens,
        labels=labels,
        show_progress=show,
        desc=desc,
        empty=empty,
    )
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
    if split is not None:
        info["split"] = split
    if skipped:
        info["skipped"] = skipped[:20]
    if seqs.dropped_short:
        info["dropped_short_documents"] = seqs.dropped_short
    return seqs, info


def _seq_examples(seqs: Any, idx: torch.Tensor | None, task: str, tok: Any, seed: int) -> tuple[Any, int]:
    ids = seqs.ids if idx is None else seqs.ids[idx]
    mask = None if seqs.mask is None else (seqs.mask if idx is None else seqs.mask[idx])
    if task == "masked-lm":
        att = torch.ones_like(ids) if mask is None else mask
        return mask_tokens(ids, att, tok, seed=seed)
    if task == "sequence-classification":
        y = seqs.labels if idx is None else seqs.labels[idx]
        return ({"input_ids": ids, "attention_mask": mask}, y), 0
    if mask is None:
        return ids, 0
    return {"input_ids": ids, "attention_mask": mask}, 0


def _split_sources(spec: InputSpec) -> tuple[Any, str | None, Any, str | None, str, Any]:
    """(train source, train split, test source, test split, how, the SplitChoice of a --data source
    with its own splits or None) from --data / --train-data / --test-data. A source with splits
    (DatasetDict, split files, a Hugging Face dataset: :func:`widthscope.data.sources.choose`) gives
    each pool its own split, never pooled and re-split; ``--test-fraction`` given explicitly
    re-splits one split."""
    if (spec.train_data is None) != (spec.test_data is None):
        raise WidthscopeError(
            "give --train-data and --test-data together (the train pool from one, the held-out "
            "pool from the other), or one --data corpus to split"
        )
    if spec.train_data is not None and spec.test_data is not None:  # (both or neither, checked above)
        if spec.data is not None:
            raise WidthscopeError(
                "--data and --train-data/--test-data both given: use one corpus (--data) or two "
                "(--train-data and --test-data)"
            )
        refuse_given(spec, ("test_fraction",), "--train-data/--test-data (two sources, nothing is split)")
        # a source with splits given without --*-split: its train split trains, its validation/test split is held out
        return (
            spec.train_data,
            spec.train_split or default_split_of(spec.train_data, "train"),
            spec.test_data,
            spec.test_split or default_split_of(spec.test_data, "test"),
            "two sources",
            None,
        )
    assert spec.data is not None  # _resolve sets --data when no --train-data/--test-data are given
    choice = choose(
        spec.data, spec.train_split, spec.test_split, spec.test_fraction if spec.is_given("test_fraction") else None
    )
    if choice is not None:
        return spec.data, choice.train, spec.data, choice.test, choice.how, choice
    if spec.train_split or spec.test_split:
        if isinstance(spec.data, str) and is_dataset_dir(Path(spec.data).expanduser()):
            raise WidthscopeError(f"{spec.data} holds one dataset without splits: drop --train-split/--test-split")
    return spec.data, None, spec.data, None, "one corpus", None


def _one_corpus_pools(
    spec: InputSpec,
    source: Any,
    split: str | None,
    tok: Any,
    seq_len: int,
    mode: str,
    labels: bool,
    seed: int,
    show: bool,
    info: dict[str, Any],
) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """One corpus (or one split) read once and cut into both pools by a seeded permutation of its
    sequences (``--first``: the first part trains, the next is held out): (train and held-out
    sequences, the rows of each pool)."""
    tr_path = te_path = source
    n_tr, n_te = spec.n_train, spec.n_test
    frac = spec.test_fraction
    assert frac is not None  # a filled spec (InputSpec.filled) has a test fraction
    if not 0 < frac < 1:
        raise WidthscopeError(f"--test-fraction {frac}: must be between 0 and 1")
    # Enough sequences that both parts can fill their pools.
    need: int | None
    if n_tr == "all" or n_te == "all":
        need = None
    else:
        need = max(int((n_tr + 1) / (1 - frac)) + 1, int((n_te + 1) / frac) + 1)
    seqs, src = _read_text(tr_path, split, tok, spec, seq_len, mode, need, labels, "tokenize", show)
    info["train"] = info["test"] = src
    n = int(seqs.ids.shape[0])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    n_hold = min(max(1, int(round(frac * n))), n - 1) if n > 1 else 0
    test_ids, train_ids = perm[:n_hold].sort().values, perm[n_hold:].sort().values
    if spec.first:  # contiguous: the first part of the corpus trains, the next is held out
        cut = n - n_hold
        train_ids, test_ids = torch.arange(cut), torch.arange(cut, n)
    info["rule"] = (
        f"sequences of one corpus split by a seeded permutation (seed {seed}, held-out fraction {frac})"
        if not spec.first
        else f"first {1 - frac:.0%} of the sequences train, the rest held out"
    )
    fixes = _text_fixes(seqs, mode, src["max_tokens"])
    a = train_ids[
        pick_pool(
            len(train_ids),
            n_tr,
            seed,
            spec.first,
            "train sequences",
            "--n-train",
            describe(tr_path),
            spec.cap_pools,
            fixes,
        )
    ]
    b = test_ids[
        pick_pool(
            len(test_ids),
            n_te,
            seed + 1,
            spec.first,
            "held-out sequences",
            "--n-test",
            describe(te_path),
            spec.cap_pools,
            fixes,
        )
    ]
    tr_seqs = te_seqs = seqs
    return tr_seqs, te_seqs, a, b


def _two_source_pools(
    spec: InputSpec,
    srcs: tuple[Any, str | None, Any, str | None],
    tok: Any,
    seq_len: int,
    mode: str,
    labels: bool,
    seed: int,
    show: bool,
    info: dict[str, Any],
) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """Each pool read from its own source or split: (train and held-out sequences, the rows of each pool)."""
    tr_path, tr_split, te_path, te_split = srcs
    n_tr, n_te = spec.n_train, spec.n_test
    tr_seqs, info["train"] = _read_text(
        tr_path, tr_split, tok, spec, seq_len, mode, n_tr, labels, "tokenize train", show
    )
    te_seqs, info["test"] = _read_text(
        te_path, te_split, tok, spec, seq_len, mode, n_te, labels, "tokenize held-out", show
    )
    if same_source(tr_path, te_path) and tr_split == te_split:
        raise WidthscopeError(
            f"--train-data and --test-data are the same source ({describe(tr_path)}): the held-out "
            "pool must be other text; use --data to split one corpus"
        )
    a = pick_pool(
        int(tr_seqs.ids.shape[0]),
        n_tr,
        seed,
        spec.first,
        "train sequences",
        "--n-train",
        describe(tr_path),
        spec.cap_pools,
        _text_fixes(tr_seqs, mode, info["train"]["max_tokens"]),
    )
    b = pick_pool(
        int(te_seqs.ids.shape[0]),
        n_te,
        seed + 1,
        spec.first,
        "held-out sequences",
        "--n-test",
        describe(te_path),
        spec.cap_pools,
        _text_fixes(te_seqs, mode, info["test"]["max_tokens"]),
    )
    return tr_seqs, te_seqs, a, b


def text_pools(
    spec: InputSpec, model: nn.Module, task: str, tok: Any, seq_len: int, mode: str, seed: int, show: bool
) -> tuple[Any, Any, dict[str, Any], list[str]]:
    labels = task == "sequence-classification"
    tr_path, tr_split, te_path, te_split, how, choice = _split_sources(spec)
    notes: list[str] = list(choice.notes) if choice is not None else []
    info: dict[str, Any] = {"split": how}
    one = how in ("one corpus", "one split", "re-split on request")  # one corpus cut into both pools
    if one:
        tr_seqs, te_seqs, a, b = _one_corpus_pools(
            spec, tr_path, tr_split, tok, seq_len, mode, labels, seed, show, info
        )
    else:
        srcs = (tr_path, tr_split, te_path, te_split)
        tr_seqs, te_seqs, a, b = _two_source_pools(spec, srcs, tok, seq_len, mode, labels, seed, show, info)
    check_ids(tr_seqs.ids[a], model, "train")
    check_ids(te_seqs.ids[b], model, "held-out")
    if choice is not None:
        info["heldout_integrity"] = choice.integrity
    elif one:
        info["heldout_integrity"] = (
            f"one corpus, split here ({info['rule']}): the pools share no sequence; "
            "held-out only if the model never trained on this corpus"
        )
    else:
        info["heldout_integrity"] = (
            f"two sources: held-out pool only from {info['test']['source']}; held-out "
            "only if the model never trained on it"
        )
    for what, src in (
        {"corpus": info["train"]} if one else {"train source": info["train"], "held-out source": info["test"]}
    ).items():
        line = empty_note(src, what)
        if line:
            notes.append(line)
    train, d1 = _seq_examples(tr_seqs, a, task, tok, seed)
    test, d2 = _seq_examples(te_seqs, b, task, tok, seed + 1)
    if d1 or d2:
        notes.append(f"masked LM: dropped {d1 + d2} sequence(s) with no ordinary token to mask")
        if pool_size(train) < 4 or pool_size(test) < 4:
            raise WidthscopeError("fewer than 4 sequences left after masking: give longer documents")
    if labels:
        n_labels = getattr(getattr(model, "config", None), "num_labels", None)
        for what, ex in (("train", train), ("held-out", test)):
            y = ex[1]
            if isinstance(n_labels, int) and y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_labels):
                raise WidthscopeError(
                    f"{what} labels span {int(y.min())}..{int(y.max())} but the model has "
                    f"{n_labels} labels: map --label-field to 0..{n_labels - 1}"
                )
    sep = tr_seqs.separator
    info.update(
        {
            "tokenizer": tokenizer_name(tok),
            "seq_len": seq_len,
            "sequences": mode,
            "first": bool(spec.first),
            "separator_id": sep,
            "n_train": pool_size(train),
            "n_test": pool_size(test),
            "pool_rule": "first sequences" if spec.first else f"seeded random subsets (seeds {seed}, {seed + 1})",
        }
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
