"""Timing, table and number-formatting helpers shared by the benchmark modules (not a benchmark itself)."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence


def median_time(
    fn: Callable[[], Any], repeats: int, *, warmup: bool = True, sync: Callable[[], None] | None = None
) -> float:
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


# ----------------------------------------------------------------------------- numbers in prose
MINUS = "−"  # prose uses the typographic minus; tables of slopes keep "-" (pass minus="-")


def fixed(v: float, digits: int = 2, minus: str = MINUS) -> str:
    """``v`` with ``digits`` decimals; negative zero printed as 0."""
    s = f"{v:.{digits}f}"
    if float(s) == 0:
        s = s.lstrip("-")
    return s.replace("-", minus)


def sci(v: float, n: int = 2) -> str:
    """``v`` as ``m·10⁻ᵏ`` (prose), e.g. 4.3·10⁻⁵."""
    e = math.floor(math.log10(abs(v)))
    m = round(v / 10**e, n - 1)
    if abs(m) >= 10:  # 9.97 rounds to 10.0: carry into the exponent
        m, e = round(m / 10, n - 1), e + 1
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return f"{fixed(m, n - 1)}·10{str(e).translate(sup)}"


def proc_status(key: str) -> int:
    """A byte count of this process from Linux ``/proc/self/status`` (``VmRSS``, ``VmHWM``); -1 elsewhere."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return -1
    for line in lines:
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1


def reset_peak() -> bool:
    """Reset ``VmHWM`` to the current RSS (``/proc/self/clear_refs``); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def sweep_in_fresh_folder(config: dict[str, Any], parent: str) -> None:
    """``run_sweep(config)`` into a new temporary folder under ``parent``, removed after: a work that can run
    twice (a finished sweep in the same folder would be skipped). Module-level, so it pickles."""
    import tempfile

    from widthscope.linearization.run import run_sweep

    with tempfile.TemporaryDirectory(dir=parent) as d:
        run_sweep(config, Path(d) / "sweep", quiet=True)


def machine(torch_threads: int = 1) -> dict[str, Any]:
    """What a result file records about the machine that made it (cores, load, versions)."""
    import os
    import platform

    import torch

    got: dict[str, Any] = {
        "cores": os.cpu_count(),
        "load": list(os.getloadavg()),
        "torch_threads": torch_threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import transformers

        got["transformers"] = transformers.__version__
    except ImportError:
        pass
    return got
