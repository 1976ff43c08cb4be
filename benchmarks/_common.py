"""Timing and table helpers shared by the benchmark modules (not a benchmark itself)."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterable, Sequence


def median_time(fn: Callable[[], Any], repeats: int, *, warmup: bool = True,
                sync: Callable[[], None] | None = None) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (after one warm-up call by default).

    ``sync`` (e.g. ``torch.cuda.synchronize``) runs after each call, so asynchronous device
    work is inside the timed interval.
    """
    if warmup:
        fn()
        if sync:
            sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def markdown_table(rows: Iterable[dict[str, Any]], cols: Sequence[str] | None = None, note: str = "") -> str:
    """Rows as a markdown table (floats to 3 significant digits), with an optional note below."""
    rows = list(rows)
    cols = list(cols or (rows[0].keys() if rows else []))
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + (f"\n\n{note}" if note else "")
