"""The input options of ``certify`` and ``grow`` on the command line, and the one place each
command turns them into an :class:`~widthscope.data.spec.InputSpec` (:func:`spec_from_args`).

The input layer (:mod:`widthscope.data.inputs`) never sees ``argparse``: it takes the spec.
Per command, :func:`spec_from_args` applies what the command's options mean for the inputs
(``grow``: pool sizes 2048 / 512 capped at what the data has when not given; ``certify``: its
``--protocol``'s input preset). Every option that fits only some models defaults to ``None``, so
which were *given* is read off the namespace, which is never changed.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..data.inputs import WINDOW
from ..data.published import ALL
from ..data.spec import EMPTY_DOCS, INPUT_DEFAULTS, OPTIONAL_FIELDS, SEQUENCES, InputSpec
from ..errors import WidthscopeError
from ..models.dispatch import DEVICE_MAPS
from .checks import given

__all__ = ["add_arguments", "spec_from_args", "GROW_POOLS"]

GROW_POOLS = (2048, 512)  # grow's default pool sizes (capped at what the data has)


def add_arguments(
    p: argparse.ArgumentParser,
    *,
    model_required: bool = False,
    model_default: str | None = None,
    n_train: int | None = 256,
    n_test: int | None = 256,
    n_train_help: str = "",
    n_test_help: str = "",
) -> None:
    """The input options every command shares (model, data, tokenizer, sequences, pools).

    Options that fit only some models default to None, so "was it given" is knowable
    (:data:`widthscope.validate.APPLIES`); the spec fills the defaults in (:meth:`InputSpec.filled`).
    ``n_*_help`` describe a default computed later (``n_train=None``)."""
    _model_arguments(p, model_required, model_default)
    _data_arguments(p)
    _pool_arguments(p, n_train, n_test, n_train_help, n_test_help)


def _model_arguments(p: argparse.ArgumentParser, model_required: bool, model_default: str | None) -> None:
    """The model: checkpoint or hub id, revision, placement over devices, task, dtype, tokenizer."""
    p.add_argument(
        "--model",
        required=model_required,
        default=model_default,
        help="checkpoint: a widthscope directory, a .safetensors file with a config.json beside it, or "
        "a Hugging Face directory (any causal LM, masked LM, sequence or image classifier), a "
        "Hugging Face hub id org/name or hub cache folder models--org--name (read from the hub "
        "cache; downloaded unless HF_HUB_OFFLINE=1); 'builtin' trains a small MLP on digits",
    )
    p.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="branch, tag or commit of a hub --model (default main); the tokenizer comes from the same "
        "revision; results record the id, this revision and the commit it resolved to",
    )
    p.add_argument(
        "--device-map",
        default=None,
        choices=DEVICE_MAPS,
        help="spread a Hugging Face --model over the devices and memory of --max-memory (accelerate's "
        "big-model dispatch; layers that fit nowhere go to disk and are reloaded block by block)",
    )
    p.add_argument(
        "--max-memory",
        default=None,
        metavar="DEV=SIZE,...",
        help="per-device memory for --device-map, e.g. cpu=2GB,0=10GiB,disk ('disk' allows offloading "
        "the rest to disk)",
    )
    p.add_argument(
        "--offload-folder",
        default=None,
        metavar="DIR",
        help="where disk-offloaded weights go (default: a temporary folder, removed afterwards)",
    )
    p.add_argument(
        "--task",
        default=None,
        choices=("causal-lm", "masked-lm", "sequence-classification", "image-classification"),
        help="the HF checkpoint's task when its config.json names no architecture",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16", "float64"),
        help="model dtype (auto: the checkpoint's); statistics always accumulate in float64",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory (default: the checkpoint's own), or 'bytes' for byte-level ids",
    )


def _data_arguments(p: argparse.ArgumentParser) -> None:
    """The data: sources, splits, fields, and how documents become sequences."""
    p.add_argument(
        "--data",
        default=None,
        help="the data: a dataset name, a text file or directory, .jsonl/.json/.csv/.parquet, a datasets "
        "save_to_disk directory, a folder of split files, a Hugging Face dataset hf:NAME[:CONFIG][@REVISION] "
        "(from the datasets cache; streamed where only a prefix is needed), or an ImageFolder directory; a "
        "source with its own splits gives train -> train pool, validation (else test) -> held-out pool, "
        "anything else is split by --test-fraction (default: the checkpoint's recorded dataset)",
    )
    p.add_argument("--train-data", default=None, help="the train pool's own file/directory/hf:NAME (with --test-data)")
    p.add_argument(
        "--test-data", default=None, help="the held-out pool's own file/directory/hf:NAME (with --train-data)"
    )
    p.add_argument(
        "--train-split",
        default=None,
        help="split of a dataset with splits (a DatasetDict directory, a folder of split files, hf:NAME) "
        "for the train pool (default train)",
    )
    p.add_argument(
        "--test-split",
        default=None,
        help="split of a dataset with splits (a DatasetDict directory, a folder of split files, hf:NAME) "
        "for the held-out pool (default validation, else test)",
    )
    p.add_argument("--data-root", default=None, help="root folder of a named image dataset's files")
    p.add_argument(
        "--text-field",
        default=None,
        help="text field/column of .jsonl/.json/.csv/.parquet/datasets/hf: data (default text); --text-column "
        "is the same",
    )
    p.add_argument("--text-column", dest="text_field", help=argparse.SUPPRESS)
    p.add_argument("--label-field", default=None, help="label column for sequence classification (default label)")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per sequence (default: the checkpoint's recorded one, else 128 for HF models, 64 for byte models)",
    )
    p.add_argument(
        "--sequences",
        default=None,
        choices=SEQUENCES,
        help="concatenate: documents joined with EOS, cut into --seq-len chunks, tail dropped (default "
        "for causal LMs); per-document: one padded sequence per document (default otherwise); "
        "truncate: each document with at least --seq-len tokens, cut to --seq-len (shorter ones "
        "skipped: the alignment script without --concatenate)",
    )
    p.add_argument(
        "--empty-docs",
        default=None,
        choices=EMPTY_DOCS,
        help="empty or whitespace-only documents: skip them before tokenizing (default; the published "
        "scripts' rule) or eos (kept: each adds its EOS separator to concatenated chunks)",
    )
    p.add_argument(
        "--first",
        action="store_true",
        help="take the first sequences of each source (the published scripts) instead of seeded random ones",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"tokens read per source for random pools (default {WINDOW} x the pool sizes x --seq-len)",
    )
    p.add_argument(
        "--train-pool",
        choices=("fitted", "fresh"),
        default=None,
        help="widthscope checkpoints: draw the train pool from the examples the model was fitted on "
        "(default, from its data record) or a fresh sample of the train part",
    )
    p.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="held-out fraction when one --data corpus is split (default 0.1); given for a dataset with its "
        "own splits, it re-splits the train split into both pools (reported in the notes)",
    )


def _pool_arguments(
    p: argparse.ArgumentParser, n_train: int | None, n_test: int | None, n_train_help: str, n_test_help: str
) -> None:
    """Threads and the two pools' sizes."""
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads (default: torch's choice; 1 is best on a busy machine)",
    )
    p.add_argument(
        "--n-train",
        type=pool_size,
        default=n_train,
        help=f"train pool size, or all: every sequence (default {n_train if n_train is not None else n_train_help})",
    )
    p.add_argument(
        "--n-test",
        type=pool_size,
        default=n_test,
        help=f"held-out pool size, or all: every sequence (default {n_test if n_test is not None else n_test_help})",
    )


def spec_from_args(
    args: argparse.Namespace, command: str, *, preset: Mapping[str, Any] | None = None, seed: int | None = None
) -> InputSpec:
    """The input spec of ``command`` (``certify``, ``grow``, or ``inputs`` for the bare input
    options) from its parsed options; ``args`` is not changed.

    An option counts as given when it is set (its argument defaults to ``None``). ``preset``: the
    values of options not given (``certify --protocol``; not recorded as given). ``seed``: the
    run's seed (the command's options hold it), else ``args.seed``."""
    fields = {f.name for f in dataclasses.fields(InputSpec)} - {"given", "cap_pools"}
    values: dict[str, Any] = {k: getattr(args, k) for k in fields if hasattr(args, k)}
    given_now = tuple(sorted(d for d in OPTIONAL_FIELDS if given(args, d)))
    for key, value in (preset or {}).items():
        if values.get(key) is None or values.get(key) is False:
            values[key] = value
    values["first"] = bool(values.get("first", False))
    if seed is not None:
        values["seed"] = seed
    elif values.get("seed") is None:
        values.pop("seed", None)
    if values.get("model") is None:
        raise WidthscopeError(
            f"{command}: --model is required (a checkpoint directory, a .safetensors file with "
            "its config, or 'builtin')"
        )
    if command == "grow":
        n_tr, n_te = values.get("n_train"), values.get("n_test")
        values["cap_pools"] = n_tr is None or n_te is None
        values["n_train"] = GROW_POOLS[0] if n_tr is None else n_tr
        values["n_test"] = GROW_POOLS[1] if n_te is None else n_te
    values["given"] = given_now
    for k in INPUT_DEFAULTS:  # a default is the spec's (InputSpec.filled): "not given" stays None
        if k not in given_now:
            values[k] = None
    return InputSpec(**values)


def pool_size(text: str) -> int | str:
    """``argparse`` type of ``--n-train`` / ``--n-test``: an integer or ``"all"``."""
    if str(text).strip().lower() == ALL:
        return ALL
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number or 'all' (every sequence there is)") from None
