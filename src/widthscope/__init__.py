"""widthscope: why and when width helps.

Public API (thin re-exports of the subpackages, imported lazily so ``import widthscope`` is
cheap and the command line starts fast):

Alignment certificates (``widthscope.stats``, ``widthscope.probe``)
    moments, certificate, misalignment, plan, collect, insertion_points
    (the whole pipeline: ``widthscope.certification.certify_dict``)
Interventions and growth (``widthscope.probe``)
    insert, intervene
Linearization diagnostics (``widthscope.linear``)
    linearize, ntk, nngp, kernel_predict, correlation, train_side_by_side
    (``ntk``/``nngp``/``linearize`` take an ``nn.Module`` or a function ``f(params, x)`` with ``params=``)
The public functions (``widthscope.api``): ``certify(model, data, M=...)`` -> :class:`CertifyResult`
    (``data``: train and held-out batches, a pair of them, or an :class:`InputSpec`), with
    :class:`CertifyOptions`; ``grow(model, data)`` with :class:`GrowOptions`; ``AlignmentMonitor``
    (during training) with :class:`MonitorOptions`; ``sweep(config, out_dir)`` (a sweep config:
    ``widthscope.sweeps.load_config``'s, a TOML dict or path); :class:`ReportOptions`
Inputs (``widthscope.data``): a checkpoint, its data and its two probe pools
    InputSpec, load_inputs (``load_inputs(InputSpec(model=..., data=..., n_train=...))``;
    the command line builds the same spec from its options)
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from .errors import WidthscopeError

_EXPORTS = {
    "certify": "widthscope.api",
    "grow": "widthscope.api",
    "sweep": "widthscope.api",
    "moments": "widthscope.stats",
    "certificate": "widthscope.stats",
    "misalignment": "widthscope.stats",
    "plan": "widthscope.stats",
    "collect": "widthscope.probe",
    "insertion_points": "widthscope.probe",
    "insert": "widthscope.probe",
    "intervene": "widthscope.probe",
    "linearize": "widthscope.linear",
    "ntk": "widthscope.linear",
    "nngp": "widthscope.linear",
    "kernel_predict": "widthscope.linear",
    "correlation": "widthscope.linear",
    "train_side_by_side": "widthscope.linear",
    "InputSpec": "widthscope.data.spec",
    "load_inputs": "widthscope.data.inputs",
    "AlignmentMonitor": "widthscope.monitor",
    "MonitorOptions": "widthscope.monitor",
    "CertifyOptions": "widthscope.options",
    "InterventionOptions": "widthscope.options",
    "GrowOptions": "widthscope.growth.options",
    "ReportOptions": "widthscope.report.options",
    "CertifyResult": "widthscope.certification.result",
    "PointCertificate": "widthscope.certification.result",
}

__all__ = ["WidthscopeError", "__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'widthscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
