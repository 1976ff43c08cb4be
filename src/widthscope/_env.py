"""What else, beyond a cell's own settings and seeds, could make a rerun on another machine differ:
recorded in every sweep and benchmark row (``env_*`` columns), so a mismatch can be traced."""

from __future__ import annotations

import contextlib
import platform
from importlib.metadata import version
from typing import Any, Iterator

__all__ = ["environment", "torch_threads"]


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to ``n`` meanwhile, then restored (``None``: left as they are, torch not imported)."""
    if n is None:
        yield
        return
    import torch  # noqa: PLC0415  start-up time: `widthscope --help` loads no torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def environment() -> dict[str, Any]:
    """``env_*`` fields: torch's CPU kernel family, library versions, threads, determinism."""
    import numpy as np  # noqa: PLC0415  start-up time: numpy
    import torch  # noqa: PLC0415  start-up time: torch

    return {
        "env_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env_torch": torch.__version__,
        "env_numpy": np.__version__,
        "env_transformers": version("transformers"),
        "env_python": platform.python_version(),
        "env_threads": torch.get_num_threads(),
        "env_deterministic": torch.are_deterministic_algorithms_enabled(),
    }
