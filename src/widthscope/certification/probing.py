"""The probe step of :func:`widthscope.certification.pipeline.certify_dict`: the pooled samples of every point.

Each rank probes its shard of the train (*a*) and held-out (*b*) batches (optionally projecting
each point's samples as they stream), keeping the prefix the bias interventions reuse; the
samples are then gathered across ranks. Also the batch helpers the monitor shares
(:func:`count_examples`, :func:`gather_rows`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from .. import distributed
from ..errors import WidthscopeError
from ..probe import collect
from ..probe.batches import as_examples
from ..probe.collect import float_dtype, to_device
from ..probe.prefix import keep_prefix
from ..stats.sketch import Projector

__all__ = ["low_precision", "count_examples", "gather_rows", "KeepPrefix", "probe_pools", "gather_pools"]


def low_precision(model: nn.Module) -> torch.dtype | None:
    """bfloat16/float16 when the model computes in it (its samples and losses round there), else None."""
    dtype = float_dtype(model)
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def count_examples(batches: Sequence[Any]) -> int:
    n = 0
    for b in batches:
        # any Mapping: a tokenizer's BatchEncoding is a UserDict, not a dict
        x = (
            (b["input_ids"] if "input_ids" in b else next(iter(b.values())))
            if isinstance(b, Mapping)
            else (b[0] if isinstance(b, (tuple, list)) else b)
        )
        if isinstance(x, Mapping):
            x = next(iter(x.values()))
        n += int(x.shape[0])
    return n


def gather_rows(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not distributed.is_distributed():
        return x
    # nccl gathers CUDA tensors only; gloo is happy with CPU ones.
    return distributed.all_gather_rows(x.to(device)).to("cpu")


class KeepPrefix:
    """Around the held-out probe: :func:`widthscope.probe.prefix.keep_prefix` on the first ``K``
    held-out examples when the bias interventions will use it (``wanted``), else nothing;
    ``.kept`` is the record afterwards (or ``None``)."""

    def __init__(
        self,
        model: nn.Module,
        names: list[str],
        test_list: list[Any],
        K: int,
        *,
        loss_fn: Callable | None,
        device: torch.device,
        wanted: bool,
    ):
        self.args = (model, names, test_list, K, loss_fn, device) if wanted else None
        self.kept: Any = None

    def __enter__(self) -> KeepPrefix:
        if self.args is not None:
            model, names, test_list, K, loss_fn, device = self.args
            dt = float_dtype(model)
            try:
                first = as_examples(test_list[:3])
            except WidthscopeError:  # batches that do not pool: the interventions say so themselves
                self.args = None
                return self
            self._cm = keep_prefix(model, names, first, K, loss_fn, lambda b: to_device(b, device, dt))
            self.kept = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.args is not None:
            self._cm.__exit__(*exc)


def probe_pools(
    model: nn.Module,
    names: list[str],
    train_list: list[Any],
    test_list: list[Any],
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    pool: str,
    train_mode: str,
    progress: bool,
    project: int | None,
    seed: int,
    keep: Any = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Probe this rank's shard of the train (*a*) and held-out (*b*) batches; with ``project``,
    each point's samples are projected as they stream (one projector per point); ``keep``: a
    context manager around the held-out probe (:class:`KeepPrefix`)."""
    projectors: dict[str, Any] = {}

    def _project(name: str, x: torch.Tensor) -> torch.Tensor:
        assert project is not None  # only installed with a projection
        if name not in projectors:  # same seed on every rank and for train/held-out
            projectors[name] = Projector(x.shape[1], project, seed=seed)
        return projectors[name](x)

    def probe(batches: list[Any]) -> Any:
        return collect(
            model,
            distributed.shard(batches),
            points=names,
            loss_fn=loss_fn,
            pool=pool,
            train_mode=train_mode,
            progress=progress,
            transform=_project if project else None,
        )

    qa = probe(train_list)
    with keep if keep is not None else nullcontext():
        qb = probe(test_list)
    return qa, qb, projectors


def gather_pools(
    qa: Any, qb: Any, names: list[str], device: torch.device, projectors: dict[str, Any], project: int | None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, int]]:
    """All ranks' samples per point, and each point's (unprojected) dimension ``d``."""
    gathered_a = {name: gather_rows(qa[name], device) for name in names}
    gathered_b = {name: gather_rows(qb[name], device) for name in names}
    dims = {name: int(projectors[name].d if project else gathered_a[name].shape[1]) for name in names}
    return gathered_a, gathered_b, dims
