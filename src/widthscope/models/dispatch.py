"""Models larger than one device: accelerate's big-model dispatch, ready for the probe.

Details: docs/big-models.md.

Example::

    >>> from widthscope.models.dispatch import parse_max_memory
    >>> parse_max_memory("cpu=2MB,0=10GiB,disk")
    {'cpu': 2000000, 0: 10737418240, 'disk': None}
"""

from __future__ import annotations

import contextvars
import ctypes
import os
import platform
import re
import shutil
import tempfile
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from ..errors import WidthscopeError
from ..probe.offload import offloaded_modules, recompute_blocks
from ..probe.structure import main_stack

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
# unit -> bytes: "", B; KB..TB (powers of 1000); KiB..TiB (powers of 1024)
_UNITS = {f"{p}{i}b": base**n for i, base in (("", 1000), ("i", 1024)) for n, p in enumerate("kmgt", 1)}
_UNITS.update({"": 1, "b": 1})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_FORM = (
    "DEVICE=SIZE pairs joined by commas, e.g. cpu=2GB,0=10GiB,disk "
    "(DEVICE: cpu, a GPU index or cuda:N; disk alone allows offload to disk)"
)


def _size(text: str, where: str) -> int:
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise WidthscopeError(
            f"{where}: {text!r} is not a size; write a number with a unit "
            "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (e.g. 2GB)"
        )
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise WidthscopeError(f"{where}: {text!r} is not a positive size")
    return value


def _device_key(key: Any, where: str) -> str | int:
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    if isinstance(key, str):
        k = key.strip().lower()
        if k in ("cpu", "disk", "mps"):
            return k
        if k.removeprefix("cuda:").isdigit():
            return int(k.removeprefix("cuda:"))
    raise WidthscopeError(f"{where}: unknown device {key!r}; use cpu, disk, a GPU index (0, 1, ...) or cuda:N")


def parse_max_memory(text: str, *, name: str = "--max-memory") -> dict[str | int, int | None]:
    """``{device: bytes}`` of a text such as ``"cpu=2MB,0=10GiB,disk"`` (``disk`` alone: offload allowed)."""
    if not isinstance(text, str) or not text.strip():
        raise WidthscopeError(f"{name}: empty; give {_FORM}")
    entries: list[tuple[str, str | None]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise WidthscopeError(f"{name} {text!r}: an empty entry between commas; give {_FORM}")
        key, eq, value = part.partition("=")
        if not eq and _device_key(key, name) != "disk":
            raise WidthscopeError(f"{name} {text!r}: {part!r} has no size; write {part}=SIZE (e.g. {part}=2GB)")
        entries.append((key.strip(), value if eq else None))
    return _budget(entries, name)


def check_max_memory(value: Any, *, name: str = "max_memory") -> dict[str | int, int | None] | None:
    """``{device: bytes}`` (or None) of None, a :func:`parse_max_memory` text or a dict ``{device: size}``."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_max_memory(value, name=name)
    if not isinstance(value, Mapping) or not value:
        raise WidthscopeError(
            f"{name} must be None, a text such as 'cpu=2GB,disk' or a dict such as "
            f"{{'cpu': '2GB', 'disk': None}}; got {type(value).__name__} {value!r:.80}"
        )
    return _budget(value.items(), name)


def _budget(entries: Iterable[tuple[Any, Any]], name: str) -> dict[str | int, int | None]:
    """``{device: bytes}`` of ``(device, size)`` entries (size None: disk)."""
    out: dict[str | int, int | None] = {}
    for key, size in entries:
        dev = _device_key(key, name)
        if dev in out:
            raise WidthscopeError(f"{name}: device {key!r} is given twice; give each device once")
        if size is None and dev == "disk":
            out[dev] = None
        elif isinstance(size, str):
            out[dev] = _size(size, f"{name} {key}")
        elif isinstance(size, int) and not isinstance(size, bool) and size > 0:
            out[dev] = size
        else:
            raise WidthscopeError(
                f"{name} {key!r} must be a positive number of bytes or a size such as '2GB', got {size!r}"
            )
    return out


def check_visible(budget: Mapping[str | int, int | None] | None, *, name: str = "max_memory", text: Any = None) -> None:
    """Refuse a ``budget`` naming a GPU or ``mps`` this machine does not show."""
    if not budget:
        return
    what = name if text is None else f"{name} {text!r}"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for dev in budget:
        if isinstance(dev, int) and dev >= gpus:
            seen = "no GPU is visible" if gpus == 0 else f"only {gpus} GPU(s) are visible (0..{gpus - 1})"
            raise WidthscopeError(
                f"{what} names GPU {dev} but {seen}: give that memory to cpu= instead (e.g. cpu=2GB,disk), "
                f"or drop GPU {dev} from it"
            )
        if dev == "mps":
            mps = getattr(torch.backends, "mps", None)
            if mps is None or not mps.is_available():
                raise WidthscopeError(f"{what} names mps but MPS is not available here: use cpu= instead, or drop mps")


def check_device_map(value: Any, *, name: str = "device_map") -> str | dict[str, str | int] | None:
    """``None``, one of :data:`DEVICE_MAPS`, or a dict ``{module name: device}``; one error line else."""
    if value is None or (isinstance(value, str) and value in DEVICE_MAPS):
        return value
    if isinstance(value, Mapping) and value:
        for key in value:
            if not isinstance(key, str):
                raise WidthscopeError(f"{name}: keys are module names (str), got {key!r}")
        return {key: _device_key(dev, f"{name}[{key!r}]") for key, dev in value.items()}
    raise WidthscopeError(
        f"{name} must be None, one of {', '.join(DEVICE_MAPS)}, or a dict {{module name: device}}; got {value!r:.80}"
    )


def _accelerate_memory(budget: dict[str | int, int | None] | None) -> dict[str | int, int] | None:
    """The budget as accelerate takes it: ``disk`` dropped (it is always the last resort there)."""
    if budget is None:
        return None
    return {k: v for k, v in budget.items() if k != "disk" and v is not None}


class OffloadFolder:
    """A temporary offload folder, removed when this object (kept by the models reading it) is collected."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="widthscope-offload-")
        weakref.finalize(self, shutil.rmtree, self.path, True)


def make_offload_folder(given: str | Path | None, temporary: bool = True) -> tuple[str | None, OffloadFolder | None]:
    """``(path, temporary folder)``: ``given`` (created), else a new :class:`OffloadFolder` if ``temporary``."""
    if given is not None:
        Path(given).mkdir(parents=True, exist_ok=True)
        return str(given), None
    temp = OffloadFolder() if temporary else None
    return (None, None) if temp is None else (temp.path, temp)


def check_disk(device_map: Mapping[str, Any], budget: dict[str | int, int | None] | None, folder: Any) -> None:
    """Refuse a map that offloads to disk when neither the budget's ``disk`` nor a folder asked for it."""
    disk = [n for n, d in device_map.items() if d == "disk"]
    if disk and budget is not None and "disk" not in budget and folder is None:
        shown = ", ".join(f"{k}={'unlimited' if v is None else f'{v / 1e6:.2f} MB'}" for k, v in budget.items())
        raise WidthscopeError(
            f"the model does not fit max_memory ({shown}): {', '.join(disk[:3])}"
            f"{' ...' if len(disk) > 3 else ''} would go to disk; add disk to max_memory "
            "(e.g. cpu=2GB,disk) to allow offloading to disk, or raise the limits"
        )


def _no_split(model: nn.Module) -> list[str]:
    """Module classes accelerate keeps whole: ``_no_split_modules``, else the main stack's block classes."""
    named = getattr(model, "_no_split_modules", None)
    if named:
        return list(named)
    try:
        return sorted({type(model.get_submodule(n)).__name__ for n in main_stack(model)})
    except WidthscopeError:
        return []


def pretrained_kwargs(
    device_map: Any, max_memory: Any, offload_folder: str | Path | None
) -> tuple[dict[str, Any], dict[str | int, int | None] | None]:
    """The keyword arguments of ``from_pretrained`` for this dispatch, and the checked budget."""
    dmap = check_device_map(device_map)
    budget = check_max_memory(max_memory)
    check_visible(budget)
    if dmap is None:
        if budget is not None or offload_folder is not None:
            raise WidthscopeError(
                "max_memory / offload_folder need device_map ('auto' to let accelerate place the modules)"
            )
        return {}, None
    kw: dict[str, Any] = {"device_map": dmap}
    mem = _accelerate_memory(budget)
    if mem:
        kw["max_memory"] = mem
    return kw, budget


def dispatch(
    model: nn.Module,
    device_map: Any = "auto",
    *,
    max_memory: Any = None,
    offload_folder: str | Path | None = None,
    release_memory: bool | None = None,
) -> nn.Module:
    """Dispatch a model in memory over devices / disk; ``offload_folder`` defaults to a temporary one."""
    import accelerate  # optional dependency (the "hf" extra)
    from accelerate.utils import get_balanced_memory, get_max_memory

    if not isinstance(model, nn.Module):
        raise WidthscopeError(f"dispatch(model=...) must be an nn.Module, got {type(model).__name__}")
    if device_map is None:
        raise WidthscopeError("dispatch(device_map=None): give 'auto' or a dict {module name: device}")
    if release_memory is not None and not isinstance(release_memory, bool):
        raise WidthscopeError(f"dispatch(release_memory=...) must be True, False or None, got {release_memory!r}")
    if getattr(model, "hf_device_map", None) is not None or hasattr(model, "_hf_hook"):
        raise WidthscopeError("dispatch(): the model is already dispatched (it has a device map); dispatch it once")
    dmap = check_device_map(device_map)
    budget = check_max_memory(max_memory)
    check_visible(budget)
    if isinstance(dmap, str):
        no_split = _no_split(model)
        mem = _accelerate_memory(budget) or None
        if dmap == "sequential":
            mem = get_max_memory(mem)
        else:
            mem = get_balanced_memory(
                model, max_memory=mem, no_split_module_classes=no_split, low_zero=dmap == "balanced_low_0"
            )
        dmap = accelerate.infer_auto_device_map(model, max_memory=mem, no_split_module_classes=no_split)
    assert isinstance(dmap, dict)  # a strategy became a map above
    if dmap and all(d == "disk" for d in dmap.values()):  # accelerate needs a device to compute on
        raise WidthscopeError(
            "dispatch(): max_memory leaves no module on a device (everything would go to disk); raise the cpu "
            "(or GPU) size: accelerate keeps room there for the largest block as well"
        )
    check_disk(dmap, budget, offload_folder)
    folder, temp = make_offload_folder(offload_folder) if "disk" in dmap.values() else (None, None)
    if temp is not None:
        model._widthscope_offload_folder = temp  # type: ignore[assignment]
    model.eval()
    try:
        accelerate.dispatch_model(model, device_map=dmap, offload_dir=folder, force_hooks=True)
    except (ValueError, KeyError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WidthscopeError(f"dispatch(): accelerate could not dispatch the model ({first[:300]})") from None
    model.hf_device_map = dict(dmap)  # type: ignore[assignment]
    return finish(model, budget, folder, release_memory=release_memory)


MMAP_THRESHOLD = 65536  # bytes: larger allocations get their own mapping, unmapped when freed
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


_FIXED: list[int] = []  # the threshold fix_mmap_threshold set in this process, if it did
# whether widthscope may fix the threshold for a model it offloads (releasing_memory)
_RELEASE: contextvars.ContextVar[bool] = contextvars.ContextVar("_RELEASE", default=False)


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` so dropped offloaded weights are freed; True if it did."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        done = bool(libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD)))
    except (OSError, AttributeError):
        return False
    if done and not _FIXED:
        _FIXED.append(MMAP_THRESHOLD)
    return done


def mmap_threshold() -> int | None:
    """The environment's ``MALLOC_MMAP_THRESHOLD_``, else the one :func:`fix_mmap_threshold` set, else None."""
    env = os.environ.get("MALLOC_MMAP_THRESHOLD_", "").strip()
    if env.isdigit():
        return int(env)
    return _FIXED[0] if _FIXED else None


@contextmanager
def releasing_memory(allow: bool = True) -> Iterator[None]:
    """Within the block :func:`finish` fixes the mmap threshold for offloaded models by default."""
    token = _RELEASE.set(bool(allow))
    try:
        yield
    finally:
        _RELEASE.reset(token)


def finish(
    model: nn.Module,
    budget: dict[str | int, int | None] | None,
    folder: str | None,
    *,
    release_memory: bool | None = None,
) -> nn.Module:
    """After the dispatch: with offloaded modules, recompute blocks, drop the key/value cache and (``release_memory``)
    fix the mmap threshold; record the placement in ``widthscope_dispatch`` (and ``widthscope_hf``)."""
    dmap = dict(getattr(model, "hf_device_map", None) or {})
    offloaded = offloaded_modules(model)
    blocks: list[str] = []
    if offloaded:
        try:
            blocks = recompute_blocks(model)
        except WidthscopeError:
            blocks = []  # no repeated blocks: the probe still runs, with every weight kept for the backward
        cfg = getattr(model, "config", None)
        if getattr(cfg, "use_cache", None):
            cfg.use_cache = False  # type: ignore[union-attr]
    release = _RELEASE.get() if release_memory is None else bool(release_memory)
    if offloaded and release:
        fix_mmap_threshold()
    record = {
        "device_map": {k: (v if isinstance(v, (int, str)) else str(v)) for k, v in dmap.items()},
        "max_memory": None if budget is None else {str(k): v for k, v in budget.items()},
        "offload_folder": folder,
        "offloaded": offloaded,
        "recompute_blocks": len(blocks),
        "release_memory": bool(offloaded and release),
        "malloc_mmap_threshold": mmap_threshold(),
    }
    model.widthscope_dispatch = record  # type: ignore[assignment]
    hf = getattr(model, "widthscope_hf", None)
    if isinstance(hf, dict):
        hf.update(record)
    return model
