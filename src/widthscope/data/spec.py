r"""The typed input spec (:class:`InputSpec`): what :func:`widthscope.data.inputs.resolve` builds the
model, tokenizer and probe pools from; validated when made, recorded in every results file. Fields
mean what the command-line options of the same name mean; ``None`` is "not given". Details:
docs/certify.md §3, docs/huggingface.md §6 and §9.

Example (a tiny widthscope classifier checkpoint, probed on its recorded digits split)::

    >>> import tempfile, widthscope as ws
    >>> from widthscope import checkpoint, models
    >>> net = models.build("mlp", 16, in_dim=64, out_dim=10, depth=2)
    >>> ck = checkpoint.save(net, tempfile.mkdtemp() + "/ck", extra={"dataset": "digits"})
    >>> spec = ws.InputSpec(model=str(ck), n_train=32, n_test=16, seed=3)
    >>> inputs = ws.load_inputs(spec)
    >>> inputs.task, inputs.train[0].shape, inputs.test[0].shape
    ('classification', torch.Size([32, 64]), torch.Size([16, 64]))
    >>> ws.InputSpec.from_dict(spec.to_dict()) == spec
    True
    >>> ws.InputSpec(model=str(ck), n_test=2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --n-test 2 (input spec field n_test): must be a whole number >= 4 ... or 'all'
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, Mapping

from torch import nn

from .._args import describe
from ..errors import WidthscopeError, WidthscopeTypeError
from ..models.dispatch import DEVICE_MAPS, parse_max_memory
from ..models.hf import DTYPES, TASKS
from ..options import SEED_MAX, option
from . import DATASETS
from .sniff import precheck
from .sources import check_object, is_hf_ref, parse_ref, split_names
from .sources import describe as describe_source

__all__ = ["InputSpec", "PoolSize", "INPUT_DEFAULTS", "DTYPES", "TASKS", "check_source", "OPTIONAL_FIELDS"]

PoolSize = int | Literal["all"]  # a whole number >= 4, or "all"
ALL = "all"


def is_all(n: Any) -> bool:
    """A pool size of ``"all"``: every sequence / example the source gives."""
    return isinstance(n, str) and n == ALL


Source = Any  # a path, a dataset name, hf:NAME[:CONFIG][@REVISION], or an object in memory
OBJECT_FIELDS = ("model", "tokenizer", "data", "train_data", "test_data")  # may hold objects in memory
IN_MEMORY = "<in memory: "  # how to_dict records an object
SEQUENCES = ("concatenate", "per-document", "truncate")
EMPTY_DOCS = ("skip", "eos")  # empty/whitespace-only documents: skipped (the published scripts) or an EOS each
TRAIN_POOLS = ("fitted", "fresh")
WINDOW = 20  # default corpus window: this many times the pool sizes (tokens read per source)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bad(name: str, value: Any, fix: str) -> WidthscopeError:
    shown = repr(value) if isinstance(value, str) else value
    return WidthscopeError(f"{_flag(name)} {shown} (input spec field {name}): {fix}")


def _bad_type(name: str, value: Any, fix: str) -> WidthscopeTypeError:
    """:func:`_bad` for a value of the wrong type: a TypeError too, saying the type it got."""
    return WidthscopeTypeError(
        f"{_flag(name)} {value!r} (input spec field {name}): {fix}; got {describe(value)} (InputSpec({name}=...))"
    )


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Everything :func:`widthscope.data.inputs.resolve` needs; see the module docstring."""

    model: str | nn.Module = dataclasses.field(  # required: no default
        metadata=option(
            help="checkpoint: a widthscope directory, a .safetensors file with a config.json beside it, or "
            "a Hugging Face directory (any causal LM, masked LM, sequence or image classifier), a "
            "Hugging Face hub id org/name or hub cache folder models--org--name (read from the hub "
            "cache; downloaded unless HF_HUB_OFFLINE=1); 'builtin' trains a small MLP on digits",
            cli=False,  # required or defaulted per command: cli.inputs adds it
        ).metadata
    )
    revision: str | None = option(
        help="branch, tag or commit of a hub --model (default main); the tokenizer comes from the same "
        "revision; results record the id, this revision and the commit it resolved to",
        metavar="REV",
    )
    task: str | None = option(
        help="the HF checkpoint's task when its config.json names no architecture",
        choices=TASKS,
        applies="hf",
    )
    dtype: str = option(
        "auto",
        help="model dtype (auto: the checkpoint's); statistics always accumulate in float64",
        choices=DTYPES,
    )
    device_map: str | None = option(
        help="spread a Hugging Face --model over the devices and memory of --max-memory (accelerate's "
        "big-model dispatch; layers that fit nowhere go to disk and are reloaded block by block)",
        choices=DEVICE_MAPS,
    )
    max_memory: str | None = option(  # widthscope.models.dispatch.parse_max_memory
        help="per-device memory for --device-map, e.g. cpu=2GB,0=10GiB,disk ('disk' allows offloading "
        "the rest to disk)",
        metavar="DEV=SIZE,...",
    )
    offload_folder: str | None = option(
        help="where disk-offloaded weights go (default: a temporary folder, removed afterwards)",
        metavar="DIR",
    )
    tokenizer: Any = option(  # a path/hub id, "bytes", or a tokenizer object
        help="tokenizer directory (default: the checkpoint's own), or 'bytes' for byte-level ids",
        applies="text",
    )
    data: Source = option(
        help="the data: a dataset name, a text file or directory, .jsonl/.json/.csv/.parquet, a datasets "
        "save_to_disk directory, a folder of split files, a Hugging Face dataset hf:NAME[:CONFIG][@REVISION] "
        "(from the datasets cache; streamed where only a prefix is needed), or an ImageFolder directory; a "
        "source with its own splits gives train -> train pool, validation (else test) -> held-out pool, "
        "anything else is split by --test-fraction (default: the checkpoint's recorded dataset)",
        applies="checkpoints",
    )
    train_data: Source = option(
        help="the train pool's own file/directory/hf:NAME (with --test-data)", applies="two_sources"
    )
    test_data: Source = option(
        help="the held-out pool's own file/directory/hf:NAME (with --train-data)", applies="two_sources"
    )
    train_split: str | None = option(
        help="split of a dataset with splits (a DatasetDict directory, a folder of split files, hf:NAME) "
        "for the train pool (default train)",
        applies="text",
    )
    test_split: str | None = option(
        help="split of a dataset with splits (a DatasetDict directory, a folder of split files, hf:NAME) "
        "for the held-out pool (default validation, else test)",
        applies="text",
    )
    data_root: str | None = option(help="root folder of a named image dataset's files", applies="widthscope")
    text_field: str | None = option(
        help="text field/column of .jsonl/.json/.csv/.parquet/datasets/hf: data (default text); --text-column "
        "is the same",
        fallback="text",
        applies="text",
    )
    label_field: str | None = option(
        help="label column for sequence classification (default label)",
        fallback="label",
        applies="hf_sequence_classifiers",
    )
    seq_len: int | None = option(
        help="tokens per sequence (default: the checkpoint's recorded one, else 128 for HF models, 64 for byte models)",
        kind="int",
        lo=2,
        hi=10**6,
        unit="tokens (one input and one predicted token)",
        applies="text",
    )
    sequences: str | None = option(
        help="concatenate: documents joined with EOS, cut into --seq-len chunks, tail dropped (default "
        "for causal LMs); per-document: one padded sequence per document (default otherwise); "
        "truncate: each document with at least --seq-len tokens, cut to --seq-len (shorter ones "
        "skipped: the alignment script without --concatenate)",
        choices=SEQUENCES,
        applies="text",
    )
    empty_docs: str | None = option(
        help="empty or whitespace-only documents: skip them before tokenizing (default; the published "
        "scripts' rule) or eos (kept: each adds its EOS separator to concatenated chunks)",
        choices=EMPTY_DOCS,
        fallback="skip",
        applies="text",
    )
    first: bool = option(
        False,
        help="take the first sequences of each source (the published scripts) instead of seeded random ones",
        applies="checkpoints",
    )
    max_tokens: int | None = option(
        help=f"tokens read per source for random pools (default {WINDOW} x the pool sizes x --seq-len)",
        kind="int",
        lo=1,
        hi=10**12,
        unit="tokens",
        applies="text",
    )
    train_pool: str | None = option(
        help="widthscope checkpoints: draw the train pool from the examples the model was fitted on "
        "(default, from its data record) or a fresh sample of the train part",
        choices=TRAIN_POOLS,
        fallback="fitted",
        applies="widthscope",
    )
    test_fraction: float | None = option(
        help="held-out fraction when one --data corpus is split (default 0.1); given for a dataset with its "
        "own splits, it re-splits the train split into both pools (reported in the notes)",
        kind="float",
        fallback=0.1,
        applies="splittable",
    )
    n_train: PoolSize = option(
        256,
        help="train pool size, or all: every sequence",
        kind="pool",
        lo=4,
        hi=10**7,
        unit="examples; the unbiased estimators need at least 4",
        cli=False,  # its default is the command's: cli.inputs adds it
    )
    n_test: PoolSize = option(
        256,
        help="held-out pool size, or all: every sequence",
        kind="pool",
        lo=4,
        hi=10**7,
        unit="examples; the unbiased estimators need at least 4",
        cli=False,
    )
    seed: int = 0  # the command's options hold it (CertifyOptions.seed, GrowOptions.seed)
    cap_pools: bool = False  # the pool sizes are upper bounds: take what the data has
    # the fields set explicitly (None: every optional field that is not None/False)
    given: tuple[str, ...] | None = None

    def _check_placement(self) -> None:
        """``device_map`` / ``max_memory`` / ``offload_folder``: for checkpoints loaded from files only."""
        placed = [n for n in ("device_map", "max_memory", "offload_folder") if getattr(self, n) is not None]
        if not placed:
            return
        if not isinstance(self.model, str) or self.model == "builtin":
            what = "the model object" if not isinstance(self.model, str) else "the built-in model"
            raise _bad(
                placed[0],
                getattr(self, placed[0]),
                f"applies to checkpoints loaded from files; {what} is used where it is "
                "(widthscope.models.dispatch.dispatch(model, ...) places a model object)",
            )
        if self.max_memory is not None:
            if self.device_map is None:
                raise _bad("max_memory", self.max_memory, "needs device_map (e.g. --device-map auto)")
            if not isinstance(self.max_memory, str):
                raise _bad_type("max_memory", self.max_memory, "must be text such as 'cpu=2GB,disk'")
            parse_max_memory(self.max_memory)
        if self.offload_folder is not None and (not isinstance(self.offload_folder, str) or not self.offload_folder):
            raise _bad_type("offload_folder", self.offload_folder, "must be a folder path")

    def __post_init__(self) -> None:
        self._check_placement()
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in OBJECT_FIELDS and v is not None and not isinstance(v, str):
                _check_object(f.name, v)
            elif (problem := _problem(f.name, v)) is not None:
                typed, fix = problem  # a value of the wrong type: _bad_type (a TypeError too)
                raise (_bad if typed else _bad_type)(f.name, v, fix)
        if self.revision is not None and (not isinstance(self.model, str) or self.model == "builtin"):
            why = "; the model object is already loaded" if self.model != "builtin" else ", not to --model builtin"
            raise _bad(
                "revision",
                self.revision,
                f"applies to Hugging Face hub ids (org/name) and hub cache folders{why}: drop it",
            )
        given: Any = self.given
        if given is None:  # every optional field set
            given = [n for n in OPTIONAL_FIELDS if getattr(self, n) is not None and getattr(self, n) is not False]
        elif not isinstance(given, (list, tuple)) or not all(isinstance(g, str) for g in given):
            raise _bad_type("given", given, "must be a list of field names")
        object.__setattr__(self, "given", tuple(sorted(set(given))))
        unknown = [g for g in given if g not in OPTIONAL_FIELDS]
        if unknown:
            raise _bad("given", unknown[0], f"name optional fields of the spec ({', '.join(OPTIONAL_FIELDS[:5])}, ...)")

    # ------------------------------------------------------------------------- given / defaults
    def is_given(self, name: str) -> bool:
        """Was ``name`` set explicitly (so a refusal for a model it does not fit is right)?"""
        assert self.given is not None  # __post_init__ made it a tuple
        return name in self.given

    def filled(self) -> InputSpec:
        """This spec with :data:`INPUT_DEFAULTS` in the fields left unset (``given`` unchanged)."""
        return dataclasses.replace(self, **{k: v for k, v in INPUT_DEFAULTS.items() if getattr(self, k) is None})

    # ------------------------------------------------------------------------- objects
    def _key(self) -> tuple[Any, ...]:
        """The fields, objects in memory by identity (a model or tensors have no value equality)."""
        return tuple(
            v if isinstance(v, (str, int, float, bool, tuple, type(None))) else ("object", id(v))
            for v in (getattr(self, f.name) for f in dataclasses.fields(self))
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, InputSpec)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # ------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-able (the fields; ``given`` as a list; an object in memory as ``"<in memory: ...>"``)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in OBJECT_FIELDS:  # objects in memory
            if not isinstance(d[name], (str, type(None))):
                d[name] = describe_source(d[name]) if "data" in name else f"{IN_MEMORY}{type(d[name]).__name__}>"
        d["given"] = list(d["given"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **objects: Any) -> InputSpec:
        """The spec :meth:`to_dict` recorded, with ``objects`` put back for the ``<in memory: ...>`` fields."""
        bad = sorted(set(objects) - set(OBJECT_FIELDS))
        if bad:
            raise WidthscopeTypeError(
                f"InputSpec.from_dict({bad[0]}=...): only {', '.join(OBJECT_FIELDS)} take objects in memory"
            )
        if not isinstance(d, Mapping):
            raise WidthscopeError(f"an input spec must be a JSON object (a dict), got {type(d).__name__}")
        d = {**d, **objects}
        fields = {fl.name for fl in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise WidthscopeError(
                f"input spec has unknown field {unknown[0]!r}: the fields are {', '.join(sorted(fields))}"
            )
        if "model" not in d:
            raise WidthscopeError("input spec has no 'model': name the checkpoint")
        return cls(**d)


_META = {f.name: f.metadata for f in dataclasses.fields(InputSpec)}
OPTIONAL_FIELDS = tuple(n for n, m in _META.items() if m.get("applies"))
INPUT_DEFAULTS: dict[str, Any] = {
    f.name: f.metadata["fallback"] for f in dataclasses.fields(InputSpec) if f.metadata.get("fallback") is not None
}


_TEXT = {  # what a text field takes (the rest: a path or name)
    "model": "give a checkpoint directory, a .safetensors file with its config, a Hugging Face hub id (org/name), "
    "or 'builtin'",
    "revision": "must be a non-empty string (a branch, tag or commit hash)",
}


def _problem(name: str, v: Any) -> tuple[bool, str] | None:
    """Why ``v`` cannot be field ``name`` (whether its type is right, and the fix), or None."""
    meta = _META[name]
    kind, lo, choices = meta.get("kind"), meta.get("lo"), meta.get("choices")
    if name in ("first", "cap_pools"):
        return None if isinstance(v, bool) else (False, "must be True or False")
    if name == "seed":
        return None if _whole(v) and 0 <= v <= SEED_MAX else (_whole(v), f"must be a whole number in 0..{SEED_MAX}")
    if kind == "pool":
        fix = f"must be a whole number >= {lo} (the unbiased estimators need at least 4 examples) or 'all'"
        return None if v == ALL or (_whole(v) and v >= lo) else (_whole(v) or isinstance(v, str), fix)
    if (v is None and name != "model") or name in ("given", "max_memory", "offload_folder"):
        return None  # (_check_placement)
    if kind == "int":
        return None if _whole(v) and v >= lo else (_whole(v), f"must be a whole number >= {lo} ({meta['unit']})")
    if kind == "float":
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        return None if number and 0 < v < 1 else (number, "must be between 0 and 1 (the held-out fraction)")
    if choices:
        return (
            None if isinstance(v, str) and v in choices else (isinstance(v, str), f"choose one of {', '.join(choices)}")
        )
    if not isinstance(v, str) or not (v.strip() if name == "revision" else v):
        return isinstance(v, str), _TEXT.get(name, "must be a non-empty string (a path or name)")
    if v.startswith(IN_MEMORY):
        why = "this spec was recorded from an object in memory: pass the object again, InputSpec.from_dict(d, "
        return True, why + f"{name}=...)"
    if name in ("data", "train_data", "test_data") and is_hf_ref(v):
        parse_ref(v, _flag(name))
    return None


def _check_object(name: str, v: Any) -> None:
    """An object in memory of the kind field ``name`` takes, or one line naming what it accepts."""
    if name == "model":
        ok = isinstance(v, nn.Module)
        why = "give a checkpoint path, a Hugging Face hub id (org/name), 'builtin', or a model object "
        why += "(a torch.nn.Module, e.g. a transformers PreTrainedModel)"
    elif name == "tokenizer":
        ok = not isinstance(v, (bytes, nn.Module)) and callable(v) and not hasattr(v, "__array__")
        why = "give a tokenizer directory or hub id, 'bytes', or a Hugging Face tokenizer object "
        why += "(transformers.AutoTokenizer.from_pretrained(...))"
    else:
        problem = check_object(name, v)
        ok, why = problem is None, problem or ""
    if not ok:
        raise _bad_type(name, v, why)


def check_source(flag: str, value: Any) -> None:
    """A data source is a dataset name, a reachable ``hf:`` dataset, a path (text if given as text), or an object."""
    if not isinstance(value, str) or value in DATASETS:
        return

    if is_hf_ref(value):
        split_names(parse_ref(value, flag), flag)  # opening it checks it is reachable or cached
        return
    if not Path(value).expanduser().exists():
        raise WidthscopeError(
            f"{flag} {value!r}: not a dataset name ({', '.join(DATASETS)}) and not an existing file or directory"
        )

    precheck(value, flag)
