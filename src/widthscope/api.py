"""The public functions ``ws.certify``, ``ws.grow`` and ``ws.sweep`` (pipelines: the packages
``widthscope.certification``, ``widthscope.growth`` and ``widthscope.sweeps``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn

from . import _args
from .certification.pipeline import certify_dict
from .certification.result import CertifyResult
from .data.inputs import load_inputs
from .data.objects import DATA_ACCEPTS, check_tokenizer, pools_from
from .data.sources import is_dataset_dict
from .data.spec import InputSpec
from .errors import WidthscopeTypeError
from .growth.pipeline import grow
from .options import CertifyOptions, check_keywords
from .probe.batches import to_batches
from .sweeps.alignment import run_sweep as sweep

__all__ = ["certify", "grow", "sweep"]

# what certify takes beside its options' fields (passed on to certify_dict)
_ALSO = ("samples_out", "on_point")
_HINTS = {"device": "the model is probed where it lies: move it first (model.to(device)); "}


def certify(
    model: nn.Module,
    data: Any,
    test: Iterable[Any] | Any | None = None,
    *,
    options: CertifyOptions | None = None,
    batch_size: int = 32,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    progress: bool = True,
    tokenizer: Any = None,
    seq_len: int | None = None,
    text_column: str | None = None,
    **keywords: Any,
) -> CertifyResult:
    """Certify every insertion point of ``model``; returns a :class:`CertifyResult`. ``data``: the train
    pool (with ``test``; any :mod:`widthscope.data.objects` form), a pair ``(train, test)``, a
    ``DatasetDict`` or an :class:`~widthscope.data.spec.InputSpec`; ``options`` and keywords
    (``M=``, ``draws=``, ...) set the statistics."""
    _args.module("certify", "model", model)
    check_keywords("certify", CertifyOptions, keywords, also=_ALSO, words="not a setting of certify", hints=_HINTS)
    check_tokenizer(tokenizer, "certify")
    _args.integer("certify", "batch_size", batch_size, lo=1)
    _args.integer("certify", "seq_len", seq_len, lo=2, optional=True)
    if text_column is not None and not isinstance(text_column, str):
        raise _args.wrong_type("certify", "text_column", "a column name (str) or None", text_column)
    info: dict[str, str] | None = None
    if isinstance(data, InputSpec):
        if test is not None:
            raise WidthscopeTypeError("certify(test=...): an InputSpec builds both pools; drop test")
        if tokenizer is not None or seq_len is not None or text_column is not None:
            raise WidthscopeTypeError(
                "certify(tokenizer=/seq_len=/text_column=...): an InputSpec names its own "
                "(InputSpec(tokenizer=..., seq_len=..., text_field=...)); drop them"
            )
        inputs = load_inputs(data, model=model, show_progress=progress)
        train, test = to_batches(inputs.train, batch_size), to_batches(inputs.test, batch_size)
        loss_fn = loss_fn or inputs.loss_fn
    else:
        if test is None and not is_dataset_dict(data, iterable=True):
            if not (
                isinstance(data, (tuple, list))
                and len(data) == 2
                and not isinstance(data[0], (torch.Tensor, str))
                and not isinstance(data[1], str)
            ):
                raise WidthscopeTypeError(
                    "certify(data=...): give the train and held-out pools (certify(model, train, "
                    "test)), a pair (train, test), a datasets.DatasetDict with train and "
                    f"validation/test splits, or an InputSpec; each pool may be {DATA_ACCEPTS}; got "
                    f"{_args.describe(data)}"
                )
            data, test = data
        seed = int(keywords.get("seed", getattr(options, "seed", 0) or 0))
        train, test, task_loss, info = pools_from(
            data,
            test,
            model=model,
            tokenizer=tokenizer,
            seq_len=seq_len,
            batch_size=batch_size,
            text_column=text_column,
            seed=seed,
            fn="certify",
        )
        loss_fn = loss_fn or task_loss
    res = certify_dict(model, train, test, options=options, loss_fn=loss_fn, progress=progress, **keywords)
    if info is not None and isinstance(res.get("settings"), dict):
        res["settings"]["data_objects"] = info
    return CertifyResult.from_dict(res)
