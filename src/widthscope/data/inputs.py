"""The one place that turns an :class:`~widthscope.data.spec.InputSpec` into (model, tokenizer, probe
pools): :func:`resolve` (``widthscope.load_inputs``), with every check before the first forward pass."""

from __future__ import annotations

import dataclasses
import sysconfig
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from torch import nn

from .. import _args, checkpoint
from ..checkpoint import recorded_data
from ..errors import WidthscopeError, WidthscopeTypeError
from ..hub import DEFAULT_REVISION, attach, hub_record, resolve_model
from ..models.hf import max_positions, vocab_size
from . import DATASETS
from .corpus import ByteTokenizer
from .objects import check_vocabulary, loss_for, model_dir, task_of
from .pools import image_pools, named_pools, object_pools, refuse_given, text_pools
from .sources import check_splits_given, describe, is_hf_ref, is_tokenized_object, parse_ref, record
from .spec import TASKS, InputSpec, check_source

__all__ = ["Inputs", "InputSpec", "resolve", "load_inputs", "load_model", "load_tokenizer"]


@dataclasses.dataclass
class Inputs:
    """A loaded model, its task, its two probe pools, and ``info`` on where the data came from."""

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


def _check_sources(spec: InputSpec) -> None:
    """The data sources exist (text where text is expected), ``--*-split`` only for sources with splits."""
    for name in ("data", "train_data", "test_data"):
        v = getattr(spec, name)
        if v is not None:
            check_source("--" + name.replace("_", "-"), v)
    check_splits_given(spec.data, spec.train_data, spec.test_data, spec.train_split, spec.test_split)


def resolve(spec: InputSpec, *, model: nn.Module | None = None, show_progress: bool = True) -> Inputs:
    """Load ``spec.model`` (unless ``model`` is given) and build both probe pools; the result carries
    ``spec`` (``Inputs.spec``) for the results file."""
    if not isinstance(spec, InputSpec):
        raise WidthscopeTypeError(
            f"load_inputs(spec=...) (resolve) takes an InputSpec, got {_args.describe(spec)}: "
            "build one with widthscope.InputSpec(model=..., ...) (the command line: "
            "widthscope.cli.inputs.spec_from_args)"
        )
    if model is not None:
        _args.module("load_inputs", "model", model, accepts=f"{_args.MODULE} or None (load spec.model)")
    _args.boolean("load_inputs", "show_progress", show_progress)
    if isinstance(spec.model, nn.Module):  # a spec made in memory
        if model is not None and model is not spec.model:
            raise WidthscopeError(
                "load_inputs(model=...) and InputSpec(model=<object>) name two different models: give one"
            )
        model = spec.model
    _check_sources(spec)
    if model is None and spec.model == "builtin":
        raise WidthscopeError(
            "model 'builtin' is built and trained by `widthscope certify`: pass the model "
            "(resolve(spec, model=...)) or a checkpoint path"
        )
    if model is not None and isinstance(spec.model, str):
        _check_revision_of(model, spec)
    inputs = _resolve(spec.filled(), model, show_progress)
    inputs.spec = spec
    rec = hub_record(inputs.model)  # a hub model's id, the revision asked for and its commit
    if rec is not None:
        inputs.info["hub"] = dict(rec)
    return inputs


load_inputs = resolve  # the public name (``widthscope.load_inputs``)


def _check_revision_of(model: nn.Module, spec: InputSpec) -> None:
    """A model loaded beforehand from the spec's hub id must be the revision the spec asks for."""
    assert isinstance(spec.model, str)  # (a model object in the spec is the model itself)

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


def _resolve(spec: InputSpec, model: nn.Module | None, show_progress: bool) -> Inputs:
    if model is None:
        model = load_model(
            spec.model, dtype=spec.dtype, task=spec.task, revision=spec.revision, placement=placement_of(spec)
        )
    elif not isinstance(spec.model, str):
        load_model(spec.model, dtype=spec.dtype)  # (refuses a dtype for a model object)
    task = _task(model, spec)
    _check_options_fit(spec, task)
    name = spec.data
    if name is None and spec.train_data is None:
        config = getattr(model, "widthscope_config", None)
        name = recorded_data(model).get("dataset") or (config.get("dataset") if isinstance(config, dict) else None)
        if not isinstance(name, str):
            what = repr(spec.model) if isinstance(spec.model, str) else f"object {type(spec.model).__name__}"
            raise WidthscopeError(
                f"the model {what} does not record its dataset: pass --data (InputSpec(data=...): a "
                "dataset name, a file/directory, hf:NAME or texts/a Dataset in memory) or --train-data and --test-data"
            )
    if isinstance(name, str) and name in DATASETS and spec.train_data is None:
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
            # the built-in corpora through the model's own tokenizer, never as byte ids
            name = str(Path(sysconfig.get_paths()["stdlib"])) if name == "text" else "prose"
            spec = dataclasses.replace(spec, data=name)
        else:
            if spec.tokenizer not in (None, "bytes") and task == "lm":
                raise WidthscopeError(
                    "--tokenizer applies to text files given with --data PATH, not to the recorded byte-level corpus"
                )
            refuse_given(
                spec,
                ("text_field", "label_field", "sequences", "max_tokens", "test_fraction", "train_split", "test_split"),
                f"the named dataset {name!r} (its own recorded split)",
            )
            train, test, info, notes, split = named_pools(name, spec, model, task)
            _check_seq_len(model, info.get("seq_len"))
            offsets = split if isinstance(split, dict) else None
            split = None if offsets is not None else split
            return Inputs(model, task, train, test, None, None, info, notes, split, offsets, data=spec.data or name)
    if spec.data is None and spec.train_data is None:
        spec = dataclasses.replace(spec, data=name)
    if task == "classification":
        raise WidthscopeError(
            f"this widthscope model is a classifier: pass a dataset name ({', '.join(DATASETS)}) "
            "with --data, not a file"
        )
    refuse_given(spec, ("data_root", "train_pool"), "data files (both are for named datasets and their records)")
    loss = loss_for(task)
    if _tokenized(spec):
        tok = _tokenizer(spec, model, task, needed=task == "masked-lm")
        train, test, info, notes = object_pools(spec, model, task, tok)
        return Inputs(model, task, train, test, loss, tok, info, notes, data=describe(spec.data or spec.train_data))
    if task == "image-classification":
        train, test, info, notes = image_pools(spec, model, show_progress)
        return Inputs(model, task, train, test, None, None, info, notes, data=spec.data)
    tok = _tokenizer(spec, model, task, needed=True)
    rec_len = (getattr(model, "widthscope_extra", None) or {}).get("data_options", {}).get("seq_len")
    seq_len = spec.seq_len or rec_len or (64 if task == "lm" else 128)
    _check_seq_len(model, seq_len)
    mode = spec.sequences or ("concatenate" if task in ("causal-lm", "lm") else "per-document")
    if task == "sequence-classification" and mode != "per-document":
        raise WidthscopeError("sequence classification needs --sequences per-document (one labelled text each)")
    train, test, info, notes = text_pools(
        spec, model, "causal-lm" if task == "lm" else task, tok, seq_len, mode, show_progress
    )
    notes += _record_datasets(spec, info)
    data = None if spec.data is None else describe(spec.data)
    return Inputs(model, task, train, test, loss, tok, info, notes, data=data)


def _task(model: nn.Module, spec: InputSpec) -> str:
    """The model's task; a model object of no known kind takes ``spec.task``, never an assumed one."""
    t = task_of(model)
    if t is not None:
        return t
    if isinstance(spec.model, str):
        return "classification"
    if spec.task is None:
        raise WidthscopeError(
            f"InputSpec(model=<{type(model).__name__} object>): its task is unknown (not a transformers "
            f"PreTrainedModel or a widthscope model): pass task= ({', '.join(TASKS)})"
        )
    return spec.task


def _tokenized(spec: InputSpec) -> bool:
    """The spec's data are tokenized objects (pools of examples), not text; mixed kinds are refused."""
    field = spec.text_field if spec.is_given("text_field") else None
    srcs = [v for v in (spec.data, spec.train_data, spec.test_data) if v is not None]
    kinds = {is_tokenized_object(v, field) for v in srcs}
    if len(kinds) > 1:
        raise WidthscopeError(
            "train_data and test_data are of two kinds (one text, one tokenized): give both pools the same kind"
        )
    return kinds == {True}


def _tokenizer(spec: InputSpec, model: nn.Module, task: str, *, needed: bool) -> Any:
    """The spec's tokenizer object, the one its path names, or the model's own (None: not needed)."""
    tok = spec.tokenizer
    if tok is None or isinstance(tok, str):
        if tok is None and not needed:
            return None
        if tok is None and not isinstance(spec.model, str) and getattr(model, "widthscope_hf", None) is None:
            raise WidthscopeError(
                f"InputSpec(model=<{type(model).__name__} object>) carries no tokenizer: pass its tokenizer, "
                "InputSpec(tokenizer=AutoTokenizer.from_pretrained(...))"
            )
        tok = load_tokenizer(tok, model, task)
    check_vocabulary(tok, model)
    return tok


def _record_datasets(spec: InputSpec, info: dict[str, Any]) -> list[str]:
    """Hugging Face datasets' records in ``info``; a note when offline reading cannot honour a revision."""
    recs, notes = {}, []
    for role, field in (("train", "train_data"), ("test", "test_data")):
        src = spec.data if spec.data is not None else getattr(spec, field)
        if not is_hf_ref(src):
            continue
        rec = record(parse_ref(src))
        recs[role] = {**rec, "split": (info.get(role) or {}).get("split")}
        rev = rec["revision"]
        if rec["offline"] and rev is not None and rev != rec["hash"] and role == "train":
            notes.append(
                f"{src}: offline, datasets reads the latest cached copy (hash {rec['hash']}); it cannot check "
                f"that this is revision {rev!r}: cache it by its commit hash to be sure"
            )
    if recs:
        info["hf_dataset"] = recs
    return notes


def _check_options_fit(spec: InputSpec, task: str) -> None:
    """Options that mean nothing for this model are refused, never silently ignored."""
    if spec.task is not None and spec.task != task:
        raise WidthscopeError(
            f"--task {spec.task} but this model is a {task} model (its task is fixed by the model): drop --task"
        )
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


def placement_of(spec: Any) -> dict[str, Any] | None:
    """An input spec's big-model placement as :func:`widthscope.models.hf.load_hf` takes it, or None."""
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
    """A checkpoint (local, hub id at ``revision``, hub cache folder) on the CPU in eval mode."""
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


def load_tokenizer(spec: str | None, model: nn.Module, task: str) -> Any:
    """``bytes`` -> :class:`ByteTokenizer`; a path -> ``AutoTokenizer``; None -> the model's own."""
    if spec == "bytes":
        return ByteTokenizer()

    V = vocab_size(model)
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
    """``--tokenizer``'s directory: a path, or a hub id (at the model's commit if it is the model's repo)."""
    rec = hub_record(model) or {}
    same = rec.get("repo_id") == spec and not Path(spec).expanduser().exists()
    return resolve_model(spec, rec.get("commit") if same else None, flag="--tokenizer")[0]


def _check_seq_len(model: nn.Module, seq_len: int | None) -> None:
    limit = max_positions(model)
    if seq_len is not None and limit is not None and seq_len > limit:
        raise WidthscopeError(
            f"--seq-len {seq_len} exceeds the model's maximum sequence length {limit}; use --seq-len <= {limit}"
        )
