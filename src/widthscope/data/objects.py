"""Objects a Hugging Face user already holds as probe batches (:func:`batches_from`, :func:`pools_from`),
and what the input layer needs to know of a model in memory (task, vocabulary, masking)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from .._args import describe, is_batch, not_a_collection
from ..errors import WidthscopeError, WidthscopeTypeError
from ..models.hf import hf_task, max_positions, vocab_size
from ..probe.batches import to_batches
from ..probe.collect import masked_lm_loss
from .sources import is_dataset, is_dataset_dict, is_texts

__all__ = ["batches_from", "pools_from", "is_object_pool", "task_of", "loss_for", "DATA_ACCEPTS"]

DATA_ACCEPTS = (
    "a list of texts (list[str], with tokenizer=), a BatchEncoding or mapping of tensors, a "
    "datasets.Dataset (a text column or tokenized columns), a datasets.DatasetDict (train and "
    "validation/test splits; data only), a DataLoader, or a list of batches ((x, y), LongTensor "
    "ids (B, T), dicts with 'input_ids')"
)
LM = ("causal-lm", "lm")


def _wrapped(model: nn.Module) -> nn.Module | None:
    """The model a PEFT or ``torch.compile`` wrapper holds, or None (not a wrapper)."""
    get = getattr(model, "get_base_model", None)
    if callable(get):
        try:
            inner = get()
        except Exception:  # noqa: BLE001 - a method of that name that is not PEFT's: not a wrapper
            inner = None
        if isinstance(inner, nn.Module) and inner is not model:
            return inner
    inner = model._modules.get("_orig_mod") if isinstance(model, nn.Module) else None
    return inner if isinstance(inner, nn.Module) and inner is not model else None


def task_of(model: nn.Module) -> str | None:
    """The model's task (widthscope's, a ``PreTrainedModel``'s head, a wrapped model's), or None."""
    for _ in range(8):  # a compiled PEFT model: wrappers around wrappers
        task = _own_task(model)
        inner = _wrapped(model) if task is None else None
        if inner is None:
            return task
        model = inner
    return None


def _own_task(model: nn.Module) -> str | None:
    task = getattr(model, "widthscope_task", None)
    if isinstance(task, str) and task:
        return task
    config = getattr(model, "widthscope_config", None)
    if config is not None:
        return "lm" if (config or {}).get("family") in ("llama", "pythia") else "classification"
    if not any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(model).__mro__
    ):
        return None
    try:
        return hf_task({"architectures": [type(model).__name__]}, f"{type(model).__name__}")
    except WidthscopeError:
        archs = list(getattr(getattr(model, "config", None), "architectures", None) or [])
        if archs:
            return hf_task({"architectures": archs}, f"{type(model).__name__}.config")
        raise


def model_dir(model: nn.Module) -> Path | None:
    hf = getattr(model, "widthscope_hf", None) or {}
    return Path(hf["directory"]) if hf.get("directory") else None


def check_ids(ids: torch.Tensor, model: nn.Module, what: str) -> None:
    """Every token id in ``[0, vocab)``, before any forward pass (one line naming both sizes)."""
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


def tokenizer_name(tok: Any) -> str:
    return getattr(tok, "name", None) or f"{type(tok).__name__}({getattr(tok, 'name_or_path', '')})"


def check_vocabulary(tok: Any, model: nn.Module, where: str | None = None) -> None:
    """The tokenizer must not produce ids past the model's embedding (``where``: the Python argument)."""
    V = vocab_size(model)
    if V is None:
        return
    try:
        n = len(tok)
    except TypeError:  # a tokenizer callable of no known size: its ids are checked as they come
        return
    if n > V:
        fix = "pass the matching one with --tokenizer" if where is None else "pass the model's own tokenizer"
        raise WidthscopeError(
            f"{where + ': ' if where else ''}tokenizer {tokenizer_name(tok)} has {n} tokens but the model's "
            f"embedding has {V} rows: this is not the model's tokenizer; {fix}"
        )


def mask_tokens(
    ids: torch.Tensor, attention: torch.Tensor, tok: Any, *, rate: float = 0.15, seed: int = 0
) -> tuple[dict[str, torch.Tensor], int]:
    """Masked-LM examples: ``rate`` of each sequence's ordinary tokens (at least one) replaced by the
    mask token (seeded), ``labels`` the originals there and -100 elsewhere; and the number of
    sequences dropped for having no ordinary token."""
    mask_id = getattr(tok, "mask_token_id", None)
    if mask_id is None:
        raise WidthscopeError(
            f"tokenizer {tokenizer_name(tok)} has no mask token: a masked LM needs one "
            "(use the checkpoint's own tokenizer)"
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


def loss_for(task: str | None) -> Callable[[Any, Any], torch.Tensor] | None:
    """The loss the command line uses for ``task`` (None: the probe's default for the batch)."""
    return masked_lm_loss if task == "masked-lm" else None


def is_object_pool(obj: Any) -> bool:
    """A pool only :func:`batches_from` reads (texts, a ``datasets.Dataset``), not plain batches."""
    return _is_texts(obj) or is_dataset(obj, iterable=True)


def _is_texts(obj: Any) -> bool:
    return is_texts(obj) and len(obj) > 0


def _where(fn: str, name: str) -> str:
    arg, _, part = name.partition("[")
    return f"{fn}({arg}=...)" + (f" {name}" if part else "")


def check_tokenizer(tokenizer: Any, fn: str = "certify") -> None:
    """A tokenizer object or None; a wrong type is one line naming ``tokenizer``."""
    if tokenizer is None:
        return
    if isinstance(tokenizer, (str, bytes, nn.Module, torch.Tensor)) or not callable(tokenizer):
        hint = " (a path: load it with AutoTokenizer.from_pretrained(path))" if isinstance(tokenizer, str) else ""
        raise WidthscopeTypeError(
            f"{fn}(tokenizer=...): tokenizer must be a Hugging Face tokenizer object (e.g. "
            "transformers.AutoTokenizer.from_pretrained(...)), or None when the data is already tokenized, "
            f"got {describe(tokenizer)}{hint}"
        )


def _bad_data(fn: str, name: str, value: Any, hint: str = "") -> WidthscopeTypeError:
    return WidthscopeTypeError(f"{_where(fn, name)}: {name} must be {DATA_ACCEPTS}; got {describe(value)}{hint}")


def _tensor(v: Any, key: str, where: str) -> torch.Tensor:
    try:
        return torch.as_tensor(v)
    except (ValueError, TypeError, RuntimeError):
        raise WidthscopeError(
            f"{where}: column {key!r} is not one tensor (sequences of different lengths?): tokenize with "
            "padding=True, return_tensors='pt'"
        ) from None


def _pad_right(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    rows_t = [torch.as_tensor(list(r), dtype=torch.int64) for r in rows]
    return torch.nn.utils.rnn.pad_sequence(rows_t, batch_first=True, padding_value=int(value))


def pad_id_of(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return 0


def _tokenize(texts: Sequence[str], tokenizer: Any, seq_len: int | None, where: str) -> dict[str, torch.Tensor]:
    """Token ids of each text (truncated to ``seq_len``), right-padded to the longest of the pool."""
    if tokenizer is None:
        raise WidthscopeError(
            f"{where}: texts need a tokenizer: pass tokenizer=AutoTokenizer.from_pretrained(...) "
            "(the model's own), or tokenized data (a BatchEncoding)"
        )
    kw: dict[str, Any] = {"truncation": True, "max_length": int(seq_len)} if seq_len is not None else {}
    try:
        enc = tokenizer(list(texts), **kw)
        rows = enc["input_ids"]
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure becomes one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WidthscopeError(
            f"{where}: the tokenizer failed on the texts ({type(exc).__name__}: {first[:200]})"
        ) from None
    return _padded_ids([list(r) for r in rows], tokenizer)


def _padded_ids(rows: list[list[int]], tokenizer: Any) -> dict[str, torch.Tensor]:
    """Token id rows right-padded to the longest, with their attention mask."""
    ids = _pad_right(rows, pad_id_of(tokenizer))
    lengths = torch.tensor([len(r) for r in rows])
    return {"input_ids": ids, "attention_mask": (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()}


def check_positions(model: nn.Module, ids: torch.Tensor, where: str) -> None:
    limit = max_positions(model)
    if limit is not None and ids.ndim == 2 and ids.shape[1] > limit:
        raise WidthscopeError(
            f"{where}: sequences of {ids.shape[1]} tokens exceed the model's maximum sequence length "
            f"{limit}: pass seq_len=<= {limit} (texts are truncated to it)"
        )


def prepare_objects(
    pool: dict[str, torch.Tensor], task: str | None, tokenizer: Any, seed: int, where: str, *, from_text: bool
) -> Any:
    """A whole pool (a dict of tensors) made into what the task's batches hold."""
    if task == "masked-lm" and "labels" not in pool and "input_ids" in pool:
        if tokenizer is None:
            raise WidthscopeError(
                f"{where}: a masked LM's examples are masked with the tokenizer's mask token: pass tokenizer=..."
            )
        ids = pool["input_ids"]
        att = pool.get("attention_mask")
        masked, dropped = mask_tokens(ids, torch.ones_like(ids) if att is None else att, tokenizer, seed=seed)
        if dropped:
            raise WidthscopeError(f"{where}: {dropped} sequence(s) have no ordinary token to mask: drop them")
        return masked
    if task == "sequence-classification":
        y = pool.get("labels", pool.get("label"))
        if y is None:
            raise WidthscopeError(
                f"{where}: a sequence classifier needs labels: give a mapping/BatchEncoding with 'labels', "
                "or a datasets.Dataset with a 'label' column"
            )
        x = {k: v for k, v in pool.items() if k not in ("labels", "label")}
        return (x, y.long())
    if task == "image-classification" and "pixel_values" in pool:
        y = pool.get("labels", pool.get("label"))
        if y is None:
            raise WidthscopeError(f"{where}: an image classifier needs 'labels' beside 'pixel_values'")
        return (pool["pixel_values"], y.long())
    if from_text and task in LM and "labels" not in pool:
        ids, mask = pool["input_ids"], pool["attention_mask"]
        out = dict(pool)
        out["labels"] = ids.masked_fill(mask == 0, -100)
        short = (mask.sum(1) < 2).nonzero()
        if short.numel():
            raise WidthscopeError(
                f"{where}: text {int(short[0, 0])} has fewer than 2 tokens (nothing to predict): "
                "drop empty/one-word texts"
            )
        return out
    return pool


def from_mapping(obj: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
    pool = {str(k): _tensor(v, str(k), where) for k, v in obj.items()}
    if not pool:
        raise WidthscopeError(f"{where}: the mapping is empty: give input_ids (and attention_mask, labels)")
    sizes = {k: (v.shape[0] if v.ndim else None) for k, v in pool.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise WidthscopeError(f"{where}: the tensors must share their first (example) dimension; got {sizes}")
    return pool


def dataset_pool(
    ds: Any, task: str | None, tokenizer: Any, seq_len: int | None, text_column: str | None, where: str
) -> tuple[dict[str, torch.Tensor], bool, str]:
    cols = list(ds.column_names or [])
    labels = next((c for c in ("labels", "label") if c in cols), None)
    if labels is not None and task != "sequence-classification":
        # class labels mean nothing to a language model; token labels (lists) are kept
        first = ds[0][labels] if len(ds) else None
        if not isinstance(first, (list, tuple)):
            labels = None
    if "input_ids" in cols and text_column is None:
        pool = _padded_ids([list(r) for r in ds["input_ids"]], tokenizer)
        if "attention_mask" in cols:
            pool["attention_mask"] = _pad_right([list(r) for r in ds["attention_mask"]], 0)
        if labels is not None:
            lab = list(ds[labels])
            pool["labels"] = (
                _pad_right([list(r) for r in lab], -100)
                if lab and isinstance(lab[0], (list, tuple))
                else torch.tensor(lab)
            )
        return pool, False, f"datasets.Dataset of {len(ds)} tokenized rows"
    col = text_column or "text"
    if col not in cols:
        raise WidthscopeError(
            f"{where}: the dataset has no {col!r} column (columns: {', '.join(cols)}): pass "
            "text_column=NAME, or tokenize it (columns input_ids, attention_mask)"
        )
    texts = list(ds[col])
    if not _is_texts(texts):
        raise WidthscopeError(f"{where}: column {col!r} must hold texts (str)")
    pool = _tokenize(texts, tokenizer, seq_len, where)
    if labels is not None:
        pool["labels"] = torch.tensor(list(ds[labels]))
    return pool, True, f"datasets.Dataset of {len(ds)} texts (column {col!r})"


def batches_from(
    obj: Any,
    *,
    model: nn.Module,
    tokenizer: Any = None,
    seq_len: int | None = None,
    batch_size: int = 32,
    text_column: str | None = None,
    seed: int = 0,
    fn: str = "certify",
    name: str = "data",
) -> tuple[list[Any], Callable[[Any, Any], torch.Tensor] | None, str]:
    """One pool as the user holds it (:data:`DATA_ACCEPTS`) -> (batches, the task's loss or None,
    description): texts tokenized and right-padded, a ``DataLoader`` drawn once, masked-LM tokens masked."""
    check_tokenizer(tokenizer, fn)
    where = _where(fn, name)
    if tokenizer is not None:  # before any forward: ids past the embedding fail deep inside it
        check_vocabulary(tokenizer, model, f"{fn}(tokenizer=...)")
    if is_dataset_dict(obj, iterable=True):
        raise _bad_data(fn, name, obj, " (a DatasetDict gives both pools: pass it alone as data)")
    task = task_of(model)
    loss = loss_for(task)

    if isinstance(obj, (str, bytes)):
        raise _bad_data(fn, name, obj, " (a path or name: use widthscope.InputSpec(model=..., data=PATH))")
    pool: dict[str, torch.Tensor] | None = None
    from_text = False
    if _is_texts(obj):
        if task is None:
            raise WidthscopeError(
                f"{where}: texts need a model whose task is known (a transformers PreTrainedModel or "
                f"a widthscope model); {type(model).__name__} is neither: pass tokenized batches"
            )
        pool, from_text, what = _tokenize(obj, tokenizer, seq_len, where), True, f"{len(obj)} texts"
    elif isinstance(obj, Mapping):
        pool = from_mapping(obj, where)
        what = f"{type(obj).__name__} of {next(iter(pool.values())).shape[0]} examples"
    elif is_dataset(obj, iterable=True):
        if not hasattr(obj, "column_names") or not hasattr(obj, "__len__"):
            raise _bad_data(fn, name, obj, " (an IterableDataset: materialise it, e.g. Dataset.from_list(list(it)))")
        pool, from_text, what = dataset_pool(obj, task, tokenizer, seq_len, text_column, where)
    if pool is not None:
        if "input_ids" in pool:
            check_positions(model, pool["input_ids"], where)
        batches = to_batches(prepare_objects(pool, task, tokenizer, seed, where, from_text=from_text), batch_size)
        return batches, loss, what
    if isinstance(obj, DataLoader):
        out = []
        for b in obj:  # drawn once: the pool stays fixed
            if isinstance(b, Mapping):
                b = prepare_objects(from_mapping(b, where), task, tokenizer, seed, where, from_text=False)
            out.append(b)
        if not out:
            raise WidthscopeError(f"{where}: the DataLoader gave no batches")
        return out, loss, f"DataLoader of {len(out)} batches"
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise WidthscopeError(f"{where}: the list is empty: give at least one batch (or text)")
        for i, b in enumerate(obj):
            if not is_batch(b):
                raise WidthscopeTypeError(f"{where}: item {i} is {describe(b)}: {name} must be {DATA_ACCEPTS}")
        return list(obj), loss, f"{len(obj)} batches"

    if isinstance(obj, torch.Tensor):
        if obj.ndim >= 3 and not obj.is_floating_point():
            return obj, loss, f"{obj.shape[0]} stacked batches of token ids"  # type: ignore[return-value]
        raise _bad_data(fn, name, obj, " (one tensor: pass a list of batches, e.g. [ids], or (X, y))")
    if not_a_collection(obj):
        raise _bad_data(fn, name, obj)
    return obj, loss, f"{type(obj).__name__} of batches"  # another iterable: the probe checks each batch


def pools_from(
    data: Any,
    test: Any,
    *,
    model: nn.Module,
    tokenizer: Any = None,
    seq_len: int | None = None,
    batch_size: int = 32,
    text_column: str | None = None,
    seed: int = 0,
    fn: str = "certify",
) -> tuple[list[Any], list[Any], Callable[[Any, Any], torch.Tensor] | None, dict[str, str]]:
    """Both pools from ``data`` and ``test``, or a ``DatasetDict``'s train and validation/test splits."""
    info: dict[str, str] = {}
    if is_dataset_dict(data, iterable=True):
        if test is not None:
            raise WidthscopeTypeError(
                f"{fn}(test=...): a DatasetDict gives both pools (train and validation/test splits); drop test"
            )
        splits = list(data.keys())
        held = next((s for s in ("validation", "test") if s in data), None)
        if "train" not in data or held is None:
            raise WidthscopeError(
                f"{fn}(data=...): the DatasetDict has splits {', '.join(splits) or 'none'}: it needs 'train' and "
                "'validation' (or 'test'); pass the two pools instead, certify(model, train, test)"
            )
        tr, te, info["split"] = data["train"], data[held], f"DatasetDict splits train / {held} (not re-split)"
        names = ("data['train']", f"data[{held!r}]")
    else:
        tr, te, names = data, test, ("data", "test")
    kw = dict(model=model, tokenizer=tokenizer, seq_len=seq_len, batch_size=batch_size, text_column=text_column, fn=fn)
    train, loss, info["train"] = batches_from(tr, seed=seed, name=names[0], **kw)
    held_out, _, info["test"] = batches_from(te, seed=seed + 1, name=names[1], **kw)
    return train, held_out, loss, info
