"""Merging statistics across ``torch.distributed`` ranks (each a contiguous shard, :func:`shard`);
every function is a no-op in one process. The merges are exact (rows gathered in rank order);
:func:`run_rank_guarded` fails the whole job when any rank fails. Launch::

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m widthscope certify ...

Example (single process: every call is the identity)::

    >>> import torch
    >>> from widthscope import distributed as wd
    >>> wd.world_size(), wd.shard(list(range(5)))
    (1, [0, 1, 2, 3, 4])
    >>> wd.run_rank_guarded(lambda: 42)
    42
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist

from .errors import WidthscopeError
from .linear import ntk
from .stats import PrimalMoments, as_matrix, misalignment_from_gram, moments

if TYPE_CHECKING:
    from .stats.estimators import Estimator, Method

T = TypeVar("T")


# Seconds a rank waits at the guard for the others (or at a collective) before giving up.
DEFAULT_TIMEOUT_S = float(os.environ.get("WIDTHSCOPE_DIST_TIMEOUT", "1800"))
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_guard_calls = 0


class RankFailure(WidthscopeError):
    """Another rank (or this one) failed: the whole distributed job stops, nothing is written."""


# ----------------------------------------------------------------------------- process group
def launched_by_torchrun() -> bool:
    """True when the ``torchrun`` environment variables of a multi-process job are set."""
    return all(v in os.environ for v in _TORCHRUN_VARS) and int(os.environ["WORLD_SIZE"]) > 1


def init_from_env(backend: str | None = None, *, timeout_s: float | None = None) -> bool:
    """Join the ``torchrun`` process group (a no-op outside one); returns ``is_distributed()``.
    ``backend=None``: ``nccl`` with CUDA, else ``gloo``; ``timeout_s`` bounds every collective.

    Example::

        >>> init_from_env()   # plain python: nothing to join
        False
    """
    if not dist.is_available() or dist.is_initialized() or not launched_by_torchrun():
        return is_distributed()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl", "mpi"):
        raise WidthscopeError(f"unknown torch.distributed backend {backend!r}; use 'gloo' (CPU) or 'nccl' (GPU)")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise WidthscopeError("backend 'nccl' needs CUDA; use backend='gloo' on CPU-only machines")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=float(timeout_s or DEFAULT_TIMEOUT_S))
    dist.init_process_group(backend=backend, timeout=timeout)
    return is_distributed()


def is_distributed() -> bool:
    if not dist.is_available() or not (dist.is_initialized() or launched_by_torchrun()):
        return False
    if not dist.is_initialized():  # lazy join: a command that did not call init_from_env() first
        init_from_env()
    return dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def _comm_device() -> torch.device:
    """Device collectives need: CUDA for nccl, CPU for gloo."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_slice(n: int) -> slice:
    """This rank's contiguous block of ``range(n)``: sizes differ by at most one, rank order."""
    W, r = world_size(), rank()
    return slice(r * n // W, (r + 1) * n // W)


def shard(items: Sequence[T]) -> list[T]:
    """This rank's contiguous block of ``items`` (:func:`all_gather_rows` restores the order)."""
    return list(items[shard_slice(len(items))])


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's ``(n_r, ...)`` rows along dim 0, in rank order (sizes may differ)."""
    if not is_distributed():
        return x
    home = x.device
    x = x.to(_comm_device())
    n = torch.tensor([x.shape[0]], dtype=torch.long, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world_size())]
    dist.all_gather(sizes, n)
    m = int(max(s.item() for s in sizes))
    padded = torch.zeros((m, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    out = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(out, padded)
    return torch.cat([o[: int(s.item())] for o, s in zip(out, sizes)], dim=0).to(home)


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank (pickled; small objects only)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_comm_device())
    return box[0]


# ----------------------------------------------------------------------------- statistics
def all_reduce_moments(pm: Any) -> Any:
    """Exact merge (a SUM) of every rank's :class:`~widthscope.stats.PrimalMoments`, on every rank.

    Example::

        >>> import torch
        >>> from widthscope.stats import PrimalMoments
        >>> all_reduce_moments(PrimalMoments(3).update(torch.ones(4, 3))).n
        4
    """
    if not isinstance(pm, PrimalMoments):
        raise WidthscopeError(f"all_reduce_moments needs a widthscope.stats.PrimalMoments, got {type(pm).__name__}")
    if not is_distributed():
        return pm
    dims = [None] * world_size()
    dist.all_gather_object(dims, pm.d)
    if len(set(dims)) != 1:
        raise WidthscopeError(
            f"all_reduce_moments: ranks hold different dimensions {dims}; every rank "
            "must probe the same insertion point with the same pooling"
        )
    home = pm.s.device
    t = pm.to_tensor().to(_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return PrimalMoments.from_tensor(t.to(home), pm.d)


def gather_or_reduce(X: torch.Tensor, estimator: Estimator = "unbiased", method: Method = "auto") -> Any:
    """:class:`~widthscope.stats.Moments` of the rows of ``X`` on all ranks: dual (gathered rows) when the total
    ``n <= d``, else primal (one ``all_reduce``); ``method`` forces one.

    Example::

        >>> import torch
        >>> m = gather_or_reduce(torch.randn(40, 6, dtype=torch.float64) + 1)
        >>> m.n, m.method
        (40, 'primal')
    """
    if method not in ("auto", "dual", "primal"):
        raise WidthscopeError(f"unknown method {method!r}; use 'auto', 'dual' or 'primal'")
    X = as_matrix(X, "X")
    if not is_distributed():
        return moments(X, estimator, method)
    n_total = int(all_gather_rows(torch.tensor([X.shape[0]])).sum())
    d = X.shape[1]
    if method == "auto":
        method = "dual" if n_total <= d else "primal"
    if method == "dual":
        return moments(all_gather_rows(X), estimator, "dual")
    pm = all_reduce_moments(PrimalMoments(d, device=X.device).update(X))
    return pm.finalize(estimator)


def merge_cross_gram(Xa: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
    """The full cross-Gram ``C_ab = X_a X_bᵀ`` from row shards (each rank's rows times all held-out rows).

    Example::

        >>> import torch
        >>> a, b = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
        >>> bool(torch.allclose(merge_cross_gram(a, b), a @ b.T))
        True
    """
    A, B = as_matrix(Xa, "train"), as_matrix(Xb, "test")
    if A.shape[1] != B.shape[1]:
        raise WidthscopeError(f"merge_cross_gram: train has d={A.shape[1]} but test has d={B.shape[1]}")
    B_all = all_gather_rows(B.to(A.device))
    return all_gather_rows(A @ B_all.T)


def distributed_misalignment(Xa: torch.Tensor, Xb: torch.Tensor, **kwargs: Any) -> Any:
    """:func:`widthscope.stats.misalignment_from_gram` on the merged cross-Gram, drawn on rank 0."""
    C = merge_cross_gram(Xa, Xb)
    out = misalignment_from_gram(C, **kwargs) if is_main() else None
    return broadcast_object(out)


def distributed_ntk(
    model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor:
    """:func:`widthscope.linear.ntk` with the rows of ``x1`` split across ranks and gathered in order.

    Example::

        >>> import torch
        >>> net = torch.nn.Linear(3, 2)
        >>> distributed_ntk(net, torch.randn(4, 3), trace=True).shape
        torch.Size([4, 4])
    """
    if not isinstance(x1, torch.Tensor) or x1.dim() < 1:
        raise WidthscopeError("distributed_ntk: x1 must be a batched tensor (n1, ...) of inputs")
    if not is_distributed():
        return ntk(model, x1, x2, **kwargs)
    x2_full = x1 if x2 is None else x2
    local = x1[shard_slice(x1.shape[0])]
    if local.shape[0] == 0:  # more ranks than rows: contribute an empty block of the right shape
        probe = ntk(model, x1[:1], x2_full[:1], **kwargs)
        K = torch.empty((0, x2_full.shape[0], *probe.shape[2:]), dtype=probe.dtype, device=probe.device)
    else:
        K = ntk(model, local, x2_full, **kwargs)
    return all_gather_rows(K)


# ----------------------------------------------------------------------------- failure handling
@contextlib.contextmanager
def rank_guard(what: str = "job") -> Iterator[None]:
    """Leave the block only if every rank finished it (each posts ``ok`` or its error to the rendezvous store;
    a failed or silent peer raises :class:`RankFailure`).

    Example::

        >>> with rank_guard("probe"):
        ...     x = 1 + 1
    """
    global _guard_calls
    if not is_distributed():
        yield
        return
    _guard_calls += 1
    W, r = world_size(), rank()
    key = f"widthscope/guard/{_guard_calls}/"
    store = dist.distributed_c10d._get_default_store()  # torchrun's: it outlives any worker
    try:
        yield
    except BaseException as exc:
        msg = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):  # the store itself may be gone; the exit code still tells torchrun
            store.set(key + str(r), "failed: " + msg)
        print(f"widthscope: rank {r} failed during {what}: {msg}", file=sys.stderr, flush=True)
        traceback.print_exc()
        raise
    store.set(key + str(r), "ok")
    timeout = datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    deadline = datetime.datetime.now() + timeout
    pending = [p for p in range(W) if p != r]
    failures: list[str] = []
    while pending and not failures:  # poll every peer with short waits: stop at the first failure
        for p in list(pending):
            try:
                store.wait([key + str(p)], datetime.timedelta(seconds=0.2))
            except Exception:  # not posted yet (timeout) - keep waiting
                continue
            pending.remove(p)
            if (status := store.get(key + str(p)).decode()) != "ok":
                failures.append(f"rank {p} {status}")
        if pending and not failures and datetime.datetime.now() > deadline:
            failures = [
                f"rank {p} did not finish {what} within {timeout.total_seconds():.0f} s (killed or hung?)"
                for p in pending
            ]
    if failures:
        raise RankFailure(
            f"distributed {what} failed on {len(failures)} rank(s): "
            + "; ".join(failures)
            + ". Nothing was written; fix the cause and rerun the same command."
        )


def run_rank_guarded(fn: Callable[..., T], *args: Any, what: str | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` under :func:`rank_guard`: its result only if all ranks succeeded.

    Example::

        >>> run_rank_guarded(sum, [1, 2, 3])
        6
    """
    with rank_guard(what or str(getattr(fn, "__name__", "job"))):
        return fn(*args, **kwargs)
