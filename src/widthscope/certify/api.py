"""``ws.certify``: the public certify function, returning a typed :class:`CertifyResult`.

Calling the package (``import widthscope as ws; ws.certify(model, data, M=...)``) runs
:func:`certify_model`; :func:`widthscope.certify.certify` is the same pipeline returning the JSON
dict a results file holds.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn

from ..data.spec import InputSpec
from ..errors import WidthscopeTypeError
from ..options import CertifyOptions
from .pipeline import certify
from .result import CertifyResult

__all__ = ["certify_model"]


def certify_model(model: nn.Module, data: Any, test: Iterable[Any] | None = None, *,
                  options: CertifyOptions | None = None, batch_size: int = 32,
                  loss_fn: Callable[[Any, Any], torch.Tensor] | None = None, progress: bool = True,
                  **keywords: Any) -> CertifyResult:
    """Certify every insertion point of ``model`` on ``data``; returns a :class:`CertifyResult`.

    ``data``: the train batches with ``test`` the held-out ones; or a pair ``(train_batches,
    test_batches)``; or an :class:`~widthscope.data.spec.InputSpec` (its pools are built for
    ``model`` by :func:`widthscope.load_inputs` and cut into batches of ``batch_size``, with the
    loss of the model's task). ``options`` (a :class:`~widthscope.options.CertifyOptions`) and the
    keywords (``M=``, ``K=``, ``draws=``, ... as :func:`widthscope.certify.certify` takes them)
    set the statistics; the keywords override the options' fields.
    """
    if isinstance(data, InputSpec):
        if test is not None:
            raise WidthscopeTypeError("certify(test=...): an InputSpec builds both pools; drop test")
        from ..data.inputs import load_inputs
        from ..probe.intervene import to_batches

        inputs = load_inputs(data, model=model, show_progress=progress)
        train, test = to_batches(inputs.train, batch_size), to_batches(inputs.test, batch_size)
        loss_fn = loss_fn or inputs.loss_fn
    elif test is None:
        if not (isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], torch.Tensor)):
            raise WidthscopeTypeError("certify(data=...): give train and held-out batches (certify(model, train, "
                                      "test)), a pair (train_batches, test_batches), or an InputSpec; got "
                                      f"{type(data).__name__}")
        train, test = data
    else:
        train = data
    res = certify(model, train, test, options=options, loss_fn=loss_fn, progress=progress, **keywords)
    return CertifyResult.from_dict(res)
