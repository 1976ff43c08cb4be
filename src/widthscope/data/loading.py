"""Model and tokenizer loading for :mod:`widthscope.data.inputs`, and the checks that run before
any forward pass: the tokenizer's vocabulary fits the model's embedding, every token id is in range,
the sequence length fits the position embeddings."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from .. import checkpoint
from ..errors import WidthscopeError
from ..hub import attach, hub_record, resolve_model
from ..models.hf import hf_task, max_positions, vocab_size
from .corpus import ByteTokenizer


# ----------------------------------------------------------------------------- model
def placement_of(spec: Any) -> dict[str, Any] | None:
    """An :class:`~widthscope.data.spec.InputSpec`'s big-model placement (``device_map``,
    ``max_memory``, ``offload_folder``) as :func:`widthscope.models.hf.load_hf` takes it, or None."""
    keys = ("device_map", "max_memory", "offload_folder")
    given = {k: getattr(spec, k, None) for k in keys if getattr(spec, k, None) is not None}
    return given or None


def load_model(
    path: str | nn.Module,
    *,
    dtype: str = "auto",
    task: str | None = None,
    revision: str | None = None,
    placement: Mapping[str, Any] | None = None,
) -> nn.Module:
    """A checkpoint (widthscope or Hugging Face) on the CPU in eval mode, with a clear error.

    ``path``: a local checkpoint, a Hugging Face hub id ``org/name`` at ``revision`` (branch, tag or
    commit; default ``main``), or a hub cache folder ``models--org--name`` (:mod:`widthscope.hub`:
    resolved to the local snapshot; the cache only when ``HF_HUB_OFFLINE=1``). A hub model carries
    ``widthscope_hub`` (id, revision, commit), which :func:`resolve` records in ``Inputs.info``.
    A model object (an ``InputSpec`` made in memory) is returned as it is: its dtype, device and
    mode are the user's."""
    if isinstance(path, nn.Module):
        if dtype != "auto":
            raise WidthscopeError(
                f"--dtype {dtype} (input spec field dtype) applies to checkpoints loaded from files; the model "
                f"object is used as it is: convert it yourself (model.to(torch.{dtype})) and drop dtype"
            )
        return path

    p, hub = resolve_model(path, revision)
    if not p.exists():
        raise WidthscopeError(
            f"--model {path!r}: no such file or directory; give a checkpoint directory, a "
            ".safetensors file with its config, a Hugging Face hub id (org/name), or 'builtin'"
        )

    return attach(checkpoint.load(str(p), dtype=dtype, task=task, placement=placement), hub)


def model_task(model: nn.Module) -> str:
    """``widthscope_task`` (models widthscope loaded), a widthscope family's (``lm`` /
    ``classification``), or a ``transformers.PreTrainedModel``'s from its class / config."""
    task = getattr(model, "widthscope_task", None)
    if task:
        return task
    if getattr(model, "widthscope_config", None) is None:
        hf = task_of(model)
        if hf is not None:
            return hf
    fam = (getattr(model, "widthscope_config", None) or {}).get("family")
    return "lm" if fam in ("llama", "pythia") else "classification"


def _is_hf(model: nn.Module) -> bool:
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(model).__mro__)


def wrapped_model(model: nn.Module) -> nn.Module | None:
    """The model a wrapper holds, or None (not a wrapper): a PEFT model's base model
    (``get_base_model()``), a ``torch.compile``d module's original (``_orig_mod``)."""
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
    """The model's task: ``widthscope_task`` (models widthscope loaded), a widthscope family
    (``lm`` / ``classification``), or a ``transformers.PreTrainedModel``'s head from its class (else
    its ``config.architectures``); a wrapper's (PEFT, ``torch.compile``: :func:`wrapped_model`) is
    the task of the model it wraps; None for any other ``nn.Module`` (its task is unknown)."""
    for _ in range(8):  # a compiled PEFT model: wrappers around wrappers
        task = _own_task(model)
        inner = wrapped_model(model) if task is None else None
        if inner is None:
            return task
        model = inner
    return None


def _own_task(model: nn.Module) -> str | None:
    task = getattr(model, "widthscope_task", None)
    if isinstance(task, str) and task:
        return task
    if getattr(model, "widthscope_config", None) is not None:
        fam = (getattr(model, "widthscope_config", None) or {}).get("family")
        return "lm" if fam in ("llama", "pythia") else "classification"
    if not _is_hf(model):
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


# ----------------------------------------------------------------------------- tokenizer
def load_tokenizer(spec: str | None, model: nn.Module, task: str) -> Any:
    """``bytes`` -> :class:`ByteTokenizer`; a path -> ``AutoTokenizer``; None -> the model's own."""
    if spec == "bytes":
        return ByteTokenizer()

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
        where = model_dir(model)
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
    rec = hub_record(model) or {}
    same = rec.get("repo_id") == spec and not Path(spec).expanduser().exists()
    return resolve_model(spec, rec.get("commit") if same else None, flag="--tokenizer")[0]


def tokenizer_name(tok: Any) -> str:
    return getattr(tok, "name", None) or f"{type(tok).__name__}({getattr(tok, 'name_or_path', '')})"


def check_vocabulary(tok: Any, model: nn.Module, where: str | None = None) -> None:
    """The tokenizer must not produce ids the model's embedding does not have. ``where`` names the
    Python argument (``certify(tokenizer=...)``); None: the command line's ``--tokenizer``."""
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


# ----------------------------------------------------------------------------- checks
def recorded_name(model: nn.Module) -> str | None:
    for attr in ("widthscope_extra", "widthscope_config"):
        meta = getattr(model, attr, None)
        if isinstance(meta, dict) and isinstance(meta.get("dataset"), str):
            return meta["dataset"]
    return None


def check_seq_len(model: nn.Module, seq_len: int | None) -> None:
    limit = max_positions(model)
    if seq_len is not None and limit is not None and seq_len > limit:
        raise WidthscopeError(
            f"--seq-len {seq_len} exceeds the model's maximum sequence length {limit}; use --seq-len <= {limit}"
        )
