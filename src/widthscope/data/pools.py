"""What every probe pool shares (:mod:`widthscope.data.inputs`): seeded pool picks, the corpus
window read for a pool, batch indexing, and the refusal of options a source does not use."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import WidthscopeError
from ..probe.interventions import batch_size_of
from ..probe.interventions import index_batch as index
from .spec import WINDOW, InputSpec, PoolSize


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


def take_rows(data: Any, idx: torch.Tensor) -> Any:
    return index(data, idx)


def pool_size(data: Any) -> int:
    return batch_size_of(data)


def read_limits(spec: InputSpec, n: int | None, seq_len: int) -> tuple[int | None, int | None]:
    """(sequence limit, token limit) for reading one source; ``n=None`` (a pool of "all"): the
    whole source, or ``max_tokens`` of it."""
    if n is None:
        return None, spec.max_tokens
    if spec.first:
        return n, None
    max_tokens = spec.max_tokens if spec.max_tokens is not None else WINDOW * n * seq_len
    return None, max_tokens


def refuse_given(spec: InputSpec, dests: tuple[str, ...], what: str) -> None:
    """One line for the first of ``dests`` given explicitly although ``what`` does not use it."""
    for d in dests:
        if spec.is_given(d):
            flag = "--" + d.replace("_", "-")
            raise WidthscopeError(f"{flag} does not apply to {what}: drop {flag}")
