r"""The one place that turns an input spec into (model, tokenizer, probe pools).

:func:`resolve` takes an :class:`~widthscope.data.spec.InputSpec` (the command line builds it
from its options in :func:`widthscope.cli.inputs.spec_from_args`; Python users build it
directly, ``widthscope.load_inputs(spec)``); every check that can
fail runs here, *before* the first forward pass: the model loads, the task has a loss, the
tokenizer's vocabulary fits the model's embedding, every token id is in range, the sequence
length fits the position embeddings, the pools have the sizes asked for.

What a model gets (``--model``):

- widthscope checkpoints (our families): the dataset recorded in the checkpoint with its
  recorded options and split seed (so the held-out part really is held out), or ``--data NAME``
  / a data path; byte-level LMs read text files with byte tokens.
- Hugging Face directories (:mod:`widthscope.models.hf`), hub ids ``org/name`` at
  ``spec.revision`` and hub cache folders (:mod:`widthscope.hub`: resolved to the local
  snapshot first; the tokenizer defaults to the same snapshot): the task from ``config.json``;
  text through the checkpoint's own tokenizer (``AutoTokenizer`` from the directory, or
  ``--tokenizer PATH``; ``--tokenizer bytes`` only when asked for), images through its image
  processor (``AutoImageProcessor``).

Data: ``--data`` (one corpus, split into train / held-out by a seeded permutation of its
sequences, ``--test-fraction``; a ``DatasetDict`` directory uses its own train and
validation/test splits) or ``--train-data`` and ``--test-data`` (two sources: the train pool from
one, the held-out pool from the other, as the published protocol uses WikiText train vs
validation). Formats: :mod:`widthscope.data.corpus` (text), ImageFolder directories (images).

Pools: seeded random subsets (train: ``seed``, held-out: ``seed + 1``) of the sequences read,
or with ``--first`` the first ones in corpus order. Only a window of the corpus is tokenized:
``--max-tokens`` (default ``20 × (n_train + n_test) × seq_len``, recorded in the result), so a
multi-GB corpus never has to fit in memory. A pool size of ``"all"`` (spec only) takes every
sequence/example there is, reading the whole text source unless ``max_tokens`` is set.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .. import _args
from ..errors import WidthscopeError, WidthscopeTypeError
from .published import empty_note
from .spec import InputSpec, PoolSize

__all__ = [
    "Inputs",
    "InputSpec",
    "resolve",
    "load_inputs",
    "load_model",
    "load_tokenizer",
    "mask_tokens",
    "check_ids",
    "WINDOW",
]

WINDOW = 20  # default corpus window: this many times the pool sizes
LM_TASKS = ("causal-lm", "masked-lm", "lm")


@dataclasses.dataclass
class Inputs:
    """A loaded model and its two probe pools (pooled examples, batch-shaped).

    ``task``: ``causal-lm`` | ``masked-lm`` | ``sequence-classification`` |
    ``image-classification`` (HF) or ``lm`` / ``classification`` (widthscope families).
    ``info`` is JSON-able: where the data came from and how it was cut.
    """

    model: nn.Module
    task: str
    train: Any
    test: Any
    loss_fn: Callable | None
    tokenizer: Any
    info: dict[str, Any]
    notes: list[str]
    split: Any = None  # the widthscope Split, for our own datasets
    offsets: dict[str, Any] | None = None  # byte models with a data record: corpus offsets of each pool row
    spec: InputSpec | None = None  # what was resolved (for the results file: ``spec.to_dict()``)
    data: str | None = None  # the --data the pools came from (the recorded dataset when none was given)


# ----------------------------------------------------------------------------- model
def load_model(path: str, *, dtype: str = "auto", task: str | None = None, revision: str | None = None) -> nn.Module:
    """A checkpoint (widthscope or Hugging Face) on the CPU in eval mode, with a clear error.

    ``path``: a local checkpoint, a Hugging Face hub id ``org/name`` at ``revision`` (branch, tag or
    commit; default ``main``), or a hub cache folder ``models--org--name`` (:mod:`widthscope.hub`:
    resolved to the local snapshot; the cache only when ``HF_HUB_OFFLINE=1``). A hub model carries
    ``widthscope_hub`` (id, revision, commit), which :func:`resolve` records in ``Inputs.info``."""
    from ..hub import attach, resolve_model

    p, hub = resolve_model(path, revision)
    if not p.exists():
        raise WidthscopeError(
            f"--model {path!r}: no such file or directory; give a checkpoint directory, a "
            ".safetensors file with its config, a Hugging Face hub id (org/name), or 'builtin'"
        )
    from .. import checkpoint

    return attach(checkpoint.load(str(p), dtype=dtype, task=task), hub)


def model_task(model: nn.Module) -> str:
    task = getattr(model, "widthscope_task", None)
    if task:
        return task
    fam = (getattr(model, "widthscope_config", None) or {}).get("family")
    return "lm" if fam in ("llama", "pythia") else "classification"


def _model_dir(model: nn.Module) -> Path | None:
    hf = getattr(model, "widthscope_hf", None) or {}
    return Path(hf["directory"]) if hf.get("directory") else None


# ----------------------------------------------------------------------------- tokenizer
def load_tokenizer(spec: str | None, model: nn.Module, task: str) -> Any:
    """``bytes`` -> :class:`ByteTokenizer`; a path -> ``AutoTokenizer``; None -> the model's own."""
    from .corpus import ByteTokenizer

    if spec == "bytes":
        return ByteTokenizer()
    from ..models.hf import vocab_size

    V = vocab_size(model)
    # Byte ids only where the embedding has room for them: never suggest what would be refused.
    or_bytes = (
        " (or --tokenizer bytes for byte-level ids)"
        if V is None or V >= len(ByteTokenizer())
        else f" (byte-level ids do not fit its {V}-token vocabulary)"
    )
    if spec is None:
        if task == "lm":  # widthscope's own byte-level LMs
            return ByteTokenizer()
        where = _model_dir(model)
        if where is None:
            raise WidthscopeError(f"this checkpoint has no tokenizer directory: pass --tokenizer PATH{or_bytes}")
    else:
        where = _tokenizer_dir(spec, model)
        if not where.exists():
            raise WidthscopeError(
                f"--tokenizer {spec!r} does not exist: give the directory a tokenizer was "
                "saved to (tokenizer.save_pretrained), a Hugging Face hub id (org/name), or 'bytes'"
            )
    known = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")
    if where.is_dir() and not any((where / k).is_file() for k in known):
        raise WidthscopeError(
            f"no tokenizer in {where} (none of {', '.join(known[:4])}, ...): save the model's "
            f"tokenizer there (tokenizer.save_pretrained(DIR)) or pass --tokenizer PATH{or_bytes}"
        )
    import warnings

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(where), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WidthscopeError(
            f"could not load the tokenizer in {where} ({type(exc).__name__}: {first[:200]})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _tokenizer_dir(spec: str, model: nn.Module) -> Path:
    """``--tokenizer``'s directory: a local path, or a hub id (or cache folder) resolved like
    ``--model``: at the model's commit when it is the model's own repository, else at ``main``."""
    from ..hub import hub_record, resolve_model

    rec = hub_record(model) or {}
    same = rec.get("repo_id") == spec and not Path(spec).expanduser().exists()
    return resolve_model(spec, rec.get("commit") if same else None, flag="--tokenizer")[0]


def _tok_name(tok: Any) -> str:
    return getattr(tok, "name", None) or f"{type(tok).__name__}({getattr(tok, 'name_or_path', '')})"


def check_vocabulary(tok: Any, model: nn.Module) -> None:
    """The tokenizer must not produce ids the model's embedding does not have."""
    from ..models.hf import vocab_size

    V = vocab_size(model)
    if V is None:
        return
    n = len(tok)
    if n > V:
        raise WidthscopeError(
            f"tokenizer {_tok_name(tok)} has {n} tokens but the model's embedding has {V} rows: "
            "this is not the model's tokenizer; pass the matching one with --tokenizer"
        )


def check_ids(ids: torch.Tensor, model: nn.Module, what: str) -> None:
    """Every token id in ``[0, vocab)``, before any forward pass (one line naming both sizes)."""
    from ..models.hf import vocab_size

    V = vocab_size(model)
    if V is None or ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= V:
        raise WidthscopeError(
            f"{what} token ids span {lo}..{hi} but the model's vocabulary has {V} entries "
            f"(ids 0..{V - 1}): the tokenizer does not match the model; pass the matching "
            "one with --tokenizer"
        )


def mask_tokens(
    ids: torch.Tensor, attention: torch.Tensor, tok: Any, *, rate: float = 0.15, seed: int = 0
) -> tuple[dict[str, torch.Tensor], int]:
    """Masked-LM examples: ``rate`` of each sequence's ordinary tokens (at least one) replaced by
    the mask token (seeded); ``labels`` hold the originals there and ``-100`` elsewhere.

    Returns the batch dict and the number of sequences dropped for having no ordinary token.
    """
    mask_id = getattr(tok, "mask_token_id", None)
    if mask_id is None:
        raise WidthscopeError(
            f"tokenizer {_tok_name(tok)} has no mask token: a masked LM needs one (use the checkpoint's own tokenizer)"
        )
    special = torch.tensor(sorted(set(getattr(tok, "all_special_ids", []) or [])), dtype=torch.int64)
    cand = attention.bool() & ~torch.isin(ids, special)
    keep = cand.any(1)
    ids, attention, cand = ids[keep], attention[keep], cand[keep]
    g = torch.Generator().manual_seed(int(seed))
    score = torch.rand(ids.shape, generator=g).masked_fill(~cand, 2.0)
    n_mask = (cand.sum(1).float() * rate).round().clamp_min(1).long()
    order = score.argsort(1)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(ids.shape[1]).expand_as(order).contiguous())
    chosen = (ranks < n_mask[:, None]) & cand
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    masked = torch.where(chosen, torch.full_like(ids, int(mask_id)), ids)
    return {"input_ids": masked, "attention_mask": attention, "labels": labels}, int((~keep).sum())


# ----------------------------------------------------------------------------- pools
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
    """``n`` of ``n_total`` items (seeded, sorted; or the first ``n``); ``fixes``: what else helps.
    ``n="all"``: every item (in order)."""
    if n == "all":
        return torch.arange(n_total)
    k = min(n, n_total) if cap else n  # cap (a default pool size): take what there is
    if k > n_total:
        unit = what[:-1] if n_total == 1 and what.endswith("s") else what
        raise WidthscopeError(
            f"{flag} {k} but {where} gave only {n_total} {unit}: lower {flag} (or {flag} all), or {fixes}"
        )
    if first:
        return torch.arange(k)
    return torch.randperm(n_total, generator=torch.Generator().manual_seed(int(seed)))[:k].sort().values


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


def _index(data: Any, idx: torch.Tensor) -> Any:
    from ..probe.intervene import index_batch as index

    return index(data, idx)


def _count(data: Any) -> int:
    from ..probe.intervene import batch_size_of

    return batch_size_of(data)


def _limit(spec: InputSpec, n: int | None, seq_len: int) -> tuple[int | None, int | None]:
    """(sequence limit, token limit) for reading one source; ``n=None`` (a pool of "all"): the
    whole source, or ``max_tokens`` of it."""
    if n is None:
        return None, spec.max_tokens
    if spec.first:
        return n, None
    max_tokens = spec.max_tokens if spec.max_tokens is not None else WINDOW * n * seq_len
    return None, max_tokens


# ----------------------------------------------------------------------------- text
def _text_source(path: str, split: str | None, spec: InputSpec, labels: bool, skipped: list[str]) -> tuple[Any, str]:
    from .corpus import documents

    if path == "prose":  # Python's own English prose, one document per help topic (and the license)
        import pydoc_data.topics as topics

        from .text import prose

        docs = [topics.topics[k] for k in sorted(topics.topics)]
        lic = prose()[0].decode("utf-8")[len("\n\n".join(docs)) :].strip()
        return (iter([d]) for d in docs + ([lic] if lic else [])), "English prose shipped with Python"
    return documents(
        path,
        text_field=spec.text_field if spec.is_given("text_field") else None,
        split=split,
        label_field=spec.label_field if labels else None,
        skipped=skipped,
    )


def _read_text(
    path: str,
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
    from .corpus import sequences

    count = None if n == "all" else n
    skipped: list[str] = []
    docs, source = _text_source(path, split, spec, labels, skipped)
    limit, max_tokens = _limit(spec, count, seq_len)
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


def _split_sources(spec: InputSpec) -> tuple[str, str | None, str, str | None, str, Any]:
    """(train path, train split, test path, test split, how, the SplitChoice of a --data folder with
    its own splits or None) from --data / --train-data / --test-data. A folder with splits
    (DatasetDict, split files: :func:`widthscope.data.corpus.choose_splits`) gives each pool its own
    split, never pooled and re-split; ``--test-fraction`` given explicitly re-splits one split."""
    from .corpus import choose_splits, default_split, is_dataset_dir

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
        _refuse_given(spec, ("test_fraction",), "--train-data/--test-data (two sources, nothing is split)")
        # a source with splits given without --*-split: its train split trains, its validation/test split is held out
        return (
            spec.train_data,
            spec.train_split or default_split(spec.train_data, "train"),
            spec.test_data,
            spec.test_split or default_split(spec.test_data, "test"),
            "two sources",
            None,
        )
    assert spec.data is not None  # _resolve sets --data when no --train-data/--test-data are given
    path = Path(spec.data).expanduser()
    choice = choose_splits(
        path, spec.train_split, spec.test_split, spec.test_fraction if spec.is_given("test_fraction") else None
    )
    if choice is not None:
        return spec.data, choice.train, spec.data, choice.test, choice.how, choice
    if spec.train_split or spec.test_split:
        if is_dataset_dir(path):
            raise WidthscopeError(f"{path} holds one dataset without splits: drop --train-split/--test-split")
    return spec.data, None, spec.data, None, "one corpus", None


def _text_pools(
    spec: InputSpec, model: nn.Module, task: str, tok: Any, seq_len: int, mode: str, seed: int, show: bool
) -> tuple[Any, Any, dict[str, Any], list[str]]:
    labels = task == "sequence-classification"
    tr_path, tr_split, te_path, te_split, how, choice = _split_sources(spec)
    n_tr, n_te = spec.n_train, spec.n_test
    notes: list[str] = list(choice.notes) if choice is not None else []
    info: dict[str, Any] = {"split": how}
    one = how in ("one corpus", "one split", "re-split on request")  # one corpus cut into both pools
    if one:
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
        seqs, src = _read_text(tr_path, tr_split, tok, spec, seq_len, mode, need, labels, "tokenize", show)
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
                len(train_ids), n_tr, seed, spec.first, "train sequences", "--n-train", tr_path, spec.cap_pools, fixes
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
                te_path,
                spec.cap_pools,
                fixes,
            )
        ]
        tr_seqs = te_seqs = seqs
    else:
        tr_seqs, info["train"] = _read_text(
            tr_path, tr_split, tok, spec, seq_len, mode, n_tr, labels, "tokenize train", show
        )
        te_seqs, info["test"] = _read_text(
            te_path, te_split, tok, spec, seq_len, mode, n_te, labels, "tokenize held-out", show
        )
        if Path(tr_path).resolve() == Path(te_path).resolve() and tr_split == te_split:
            raise WidthscopeError(
                f"--train-data and --test-data are the same source ({tr_path}): the held-out "
                "pool must be other text; use --data to split one corpus"
            )
        a = pick_pool(
            int(tr_seqs.ids.shape[0]),
            n_tr,
            seed,
            spec.first,
            "train sequences",
            "--n-train",
            tr_path,
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
            te_path,
            spec.cap_pools,
            _text_fixes(te_seqs, mode, info["test"]["max_tokens"]),
        )
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
        if _count(train) < 4 or _count(test) < 4:
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
            "tokenizer": _tok_name(tok),
            "seq_len": seq_len,
            "sequences": mode,
            "first": bool(spec.first),
            "separator_id": sep,
            "n_train": _count(train),
            "n_test": _count(test),
            "pool_rule": "first sequences" if spec.first else f"seeded random subsets (seeds {seed}, {seed + 1})",
        }
    )
    if task == "masked-lm":
        info["masking"] = "15% of each sequence's ordinary tokens (at least one) replaced by the mask token, seeded"
    if mode == "concatenate" and sep is None:
        notes.append(f"tokenizer {_tok_name(tok)} has no EOS/SEP token: documents were joined without a separator")
    for part in ("train", "test"):
        src = info.get(part) or {}
        if src.get("skipped_files"):
            notes.append(
                f"{src['skipped_files']} non-text file(s) skipped in {src['source']} (e.g. {src['skipped'][0]})"
            )
    return train, test, info, notes


# ----------------------------------------------------------------------------- images
def _image_folder(path: Path) -> list[tuple[Path, str]]:
    from .corpus import IMAGE_SUFFIXES

    classes = sorted(d for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    items = [(f, c.name) for c in classes for f in sorted(c.rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not classes or not items:
        raise WidthscopeError(
            f"{path} is not an ImageFolder directory: expected one sub-folder per class "
            f"holding images ({', '.join(IMAGE_SUFFIXES[:4])}, ...)"
        )
    return items


def _image_pools(
    spec: InputSpec, model: nn.Module, seed: int, show: bool
) -> tuple[Any, Any, dict[str, Any], list[str]]:
    from PIL import Image, UnidentifiedImageError

    from .._io import progress

    where = _model_dir(model)
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
        _refuse_given(spec, ("test_fraction",), "--train-data/--test-data (two sources, nothing is split)")
        tr_items, te_items = _image_folder(Path(spec.train_data)), _image_folder(Path(spec.test_data))
        how = "two ImageFolder directories"
    else:
        assert spec.data is not None  # _resolve sets --data when no --train-data/--test-data are given
        root = Path(spec.data).expanduser()
        subs = {d.name: d for d in root.iterdir() if d.is_dir()}
        test_dir = next((subs[k] for k in ("val", "validation", "test") if k in subs), None)
        if "train" in subs and test_dir is not None:
            _refuse_given(spec, ("test_fraction",), f"{root} (its own train/ and {test_dir.name}/ folders)")
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
def _named_pools(
    name: str, spec: InputSpec, model: nn.Module, task: str, seed: int
) -> tuple[Any, Any, dict[str, Any], list[str], Any]:
    """Our own named datasets (digits, fashion-mnist, text, ...) with the checkpoint's recorded
    options, split seed and — where it has one — its data record: the held-out pool comes only
    from held-out data and the train pool from the examples the model was fitted on."""
    from .. import data
    from ..checkpoint import recorded_data

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
        "n_train": _count(train),
        "n_test": _count(test),
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
    import hashlib

    from .text import corpus_chunks, read_corpus, recorded_chunks

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


# ----------------------------------------------------------------------------- resolve
def _check_sources(spec: InputSpec) -> None:
    """The data sources exist (and are text where text is expected), before any model loads."""
    from .spec import check_source

    for name in ("data", "train_data", "test_data"):
        v = getattr(spec, name)
        if v is not None:
            check_source("--" + name.replace("_", "-"), v)


def resolve(spec: InputSpec, *, model: nn.Module | None = None, show_progress: bool = True) -> Inputs:
    """Load ``spec.model`` (unless ``model`` is given) and build both probe pools; see the module docstring.

    ``spec`` is an :class:`~widthscope.data.spec.InputSpec` (validated when made); the result
    carries it (``Inputs.spec``) for the results file."""
    if not isinstance(spec, InputSpec):
        raise WidthscopeTypeError(
            f"load_inputs(spec=...) (resolve) takes an InputSpec, got {_args.describe(spec)}: "
            "build one with widthscope.InputSpec(model=..., ...) (the command line: "
            "widthscope.cli.inputs.spec_from_args)"
        )
    if model is not None:
        _args.module("load_inputs", "model", model, accepts=f"{_args.MODULE} or None (load spec.model)")
    _args.boolean("load_inputs", "show_progress", show_progress)
    _check_sources(spec)
    if model is None and spec.model == "builtin":
        raise WidthscopeError(
            "model 'builtin' is built and trained by `widthscope certify`: pass the model "
            "(resolve(spec, model=...)) or a checkpoint path"
        )
    if model is not None:
        _check_revision_of(model, spec)
    inputs = _resolve(spec.filled(), model, show_progress)
    inputs.spec = spec
    _record_hub(inputs)
    return inputs


load_inputs = resolve  # the public name (``widthscope.load_inputs``)


def _check_revision_of(model: nn.Module, spec: InputSpec) -> None:
    """A model loaded beforehand from the spec's hub id must be the revision the spec asks for
    (one line naming both, never probing other weights than the results record)."""
    from ..hub import DEFAULT_REVISION, hub_record

    rec = hub_record(model)
    repo = rec.get("repo_id") if rec else None
    if rec is None or (repo != spec.model and Path(spec.model).name != "models--" + str(repo).replace("/", "--")):
        if spec.revision is not None and rec is None:
            raise WidthscopeError(
                f"the spec asks for revision {spec.revision!r} of {spec.model!r} but the model "
                "passed was not loaded from the Hugging Face hub: load it with "
                "widthscope.data.inputs.load_model(spec.model, revision=spec.revision)"
            )
        return
    want = spec.revision or DEFAULT_REVISION
    if rec.get("revision") is not None and want not in (rec.get("revision"), rec.get("commit")):
        raise WidthscopeError(
            f"the spec asks for revision {want!r} of {spec.model} but the model passed was loaded at "
            f"revision {rec.get('revision')!r} (commit {rec.get('commit')}): load it with "
            "widthscope.data.inputs.load_model(spec.model, revision=spec.revision)"
        )


def _record_hub(inputs: Inputs) -> None:
    """A hub model's id, the revision asked for and the commit it resolved to, in ``info["hub"]``."""
    from ..hub import hub_record

    rec = hub_record(inputs.model)
    if rec is not None:
        inputs.info["hub"] = dict(rec)


def _resolve(spec: InputSpec, model: nn.Module | None, show_progress: bool) -> Inputs:
    from . import DATASETS

    if model is None:
        model = load_model(spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision)
    task = model_task(model)
    _check_options_fit(spec, task)
    seed = int(spec.seed)
    notes: list[str] = []
    name = spec.data
    if name is None and spec.train_data is None:
        from ..checkpoint import recorded_data

        name = recorded_data(model).get("dataset") or _recorded_name(model)
        if name is None:
            raise WidthscopeError(
                f"the checkpoint {spec.model!r} does not record its dataset: pass --data (a "
                "dataset name or a file/directory) or --train-data and --test-data"
            )
    split = None
    if name is not None and name in DATASETS and spec.train_data is None:
        if task == "sequence-classification":
            raise WidthscopeError(
                f"--data {name!r} has no labels: a sequence classifier needs labelled text, a "
                ".jsonl/.csv/.parquet table or datasets directory with --label-field"
            )
        if task == "image-classification":
            raise WidthscopeError(
                f"--data {name!r}: give this image classifier an ImageFolder directory, so its own "
                "image processor resizes and normalises the images as in training (widthscope's "
                "normalisation would feed it other inputs)"
            )
        if name in ("text", "prose") and task in ("causal-lm", "masked-lm"):
            # The built-in corpora (Python's standard library, its English prose) through the
            # model's own tokenizer, never as byte ids.
            import sysconfig

            name = str(Path(sysconfig.get_paths()["stdlib"])) if name == "text" else "prose"
            spec = dataclasses.replace(spec, data=name)
        else:
            if spec.tokenizer not in (None, "bytes") and task == "lm":
                raise WidthscopeError(
                    "--tokenizer applies to text files given with --data PATH, not to the recorded byte-level corpus"
                )
            _refuse_given(
                spec,
                ("text_field", "label_field", "sequences", "max_tokens", "test_fraction", "train_split", "test_split"),
                f"the named dataset {name!r} (its own recorded split)",
            )
            train, test, info, more, split = _named_pools(name, spec, model, task, seed)
            _check_seq_len(model, info.get("seq_len"))
            offsets = split if isinstance(split, dict) else None
            return Inputs(
                model,
                task,
                train,
                test,
                None,
                None,
                info,
                more,
                None if offsets is not None else split,
                offsets,
                data=spec.data or name,
            )
    if spec.data is None and spec.train_data is None:
        spec = dataclasses.replace(spec, data=name)
    if task == "classification":
        raise WidthscopeError(
            f"this widthscope model is a classifier: pass a dataset name ({', '.join(DATASETS)}) "
            "with --data, not a file"
        )
    _refuse_given(spec, ("data_root", "train_pool"), "data files (both are for named datasets and their records)")
    if task == "image-classification":
        train, test, info, more = _image_pools(spec, model, seed, show_progress)
        return Inputs(model, task, train, test, None, None, info, more, data=spec.data)
    tok = load_tokenizer(spec.tokenizer, model, task)
    check_vocabulary(tok, model)
    rec_len = (getattr(model, "widthscope_extra", None) or {}).get("data_options", {}).get("seq_len")
    seq_len = spec.seq_len or rec_len or (64 if task == "lm" else 128)
    _check_seq_len(model, seq_len)
    mode = spec.sequences or ("concatenate" if task in ("causal-lm", "lm") else "per-document")
    if task == "sequence-classification" and mode != "per-document":
        raise WidthscopeError("sequence classification needs --sequences per-document (one labelled text each)")
    train, test, info, more = _text_pools(
        spec, model, "causal-lm" if task == "lm" else task, tok, seq_len, mode, seed, show_progress
    )
    from ..probe.collect import masked_lm_loss

    loss = masked_lm_loss if task == "masked-lm" else None
    return Inputs(model, task, train, test, loss, tok, info, notes + more, data=spec.data)


def _check_options_fit(spec: InputSpec, task: str) -> None:
    """Options that mean nothing for this model are refused, never silently ignored."""
    if spec.task is not None and spec.task != task:
        raise WidthscopeError(
            f"--task {spec.task} but this model is a {task} model (its task is fixed by the model): drop --task"
        )
    # given by the user (a --protocol preset's text settings simply do not apply to other models)
    text_only = [
        "--" + d.replace("_", "-") for d in ("tokenizer", "seq_len", "sequences", "max_tokens") if spec.is_given(d)
    ]
    if task in ("image-classification", "classification") and text_only:
        raise WidthscopeError(
            f"{', '.join(text_only)} {'apply' if len(text_only) > 1 else 'applies'} to text models; "
            "this model is an image/feature classifier: drop "
            f"{'them' if len(text_only) > 1 else 'it'}"
        )
    if task != "sequence-classification" and spec.is_given("label_field"):
        raise WidthscopeError(
            f"--label-field applies to sequence classifiers (labelled text); this is a {task} model: drop --label-field"
        )
    if task not in ("sequence-classification", "causal-lm", "masked-lm", "lm") and spec.is_given("text_field"):
        raise WidthscopeError(f"--text-field applies to text models; this is a {task} model: drop --text-field")


def _refuse_given(spec: InputSpec, dests: tuple[str, ...], what: str) -> None:
    """One line for the first of ``dests`` given explicitly although ``what`` does not use it."""
    for d in dests:
        if spec.is_given(d):
            flag = "--" + d.replace("_", "-")
            raise WidthscopeError(f"{flag} does not apply to {what}: drop {flag}")


def _recorded_name(model: nn.Module) -> str | None:
    for attr in ("widthscope_extra", "widthscope_config"):
        meta = getattr(model, attr, None)
        if isinstance(meta, dict) and isinstance(meta.get("dataset"), str):
            return meta["dataset"]
    return None


def _check_seq_len(model: nn.Module, seq_len: int | None) -> None:
    from ..models.hf import max_positions

    limit = max_positions(model)
    if seq_len is not None and limit is not None and seq_len > limit:
        raise WidthscopeError(
            f"--seq-len {seq_len} exceeds the model's maximum sequence length {limit}; use --seq-len <= {limit}"
        )
