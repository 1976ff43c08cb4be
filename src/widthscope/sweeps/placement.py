"""Big-model placement in sweeps: ``device_map``, ``max_memory``, ``offload_folder`` (from ``[sweep]``,
overridden per ``[[family]]``, or ``[suite]`` input options): where the weights live while a cell
probes; offloaded weights go to a folder per cell (``offload_folder/<cell id>``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from ..errors import WidthscopeError
from ..models.dispatch import check_device_map, check_max_memory, dispatch

__all__ = ["PLACEMENT_KEYS", "check_placement", "place_model", "release", "placement_text", "cell_folder"]

# [sweep] and [[family]] keys, and [suite]'s input options.
PLACEMENT_KEYS = ("device_map", "max_memory", "offload_folder")


def check_placement(table: Mapping[str, Any], where: str, *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The placement keys of ``table`` over ``base`` (the ``[sweep]`` ones), checked; only the keys set."""
    out = {k: v for k, v in dict(base or {}).items() if v is not None}
    out.update({k: table[k] for k in PLACEMENT_KEYS if k in table})
    dmap = out.get("device_map")
    if dmap is not None:
        try:
            check_device_map(dmap, name=f"{where} device_map")
        except WidthscopeError as exc:
            raise WidthscopeError(f'{exc} (e.g. device_map = "auto")') from None
    if "max_memory" in out:
        if dmap is None:
            raise WidthscopeError(
                f'{where} max_memory needs device_map (add device_map = "auto" to let accelerate place the modules)'
            )
        check_max_memory(out["max_memory"], name=f"{where} max_memory")
    folder = out.get("offload_folder")
    if folder is not None:
        if not isinstance(folder, str) or not folder:
            raise WidthscopeError(f"{where} offload_folder must be a folder path (a non-empty string), got {folder!r}")
        if dmap is None:
            raise WidthscopeError(f'{where} offload_folder needs device_map (add device_map = "auto")')
    return out


def cell_folder(placement: Mapping[str, Any], cell_key: str) -> str | None:
    """The cell's own offload folder (``offload_folder/<cell_key>``), or None (a temporary one)."""
    folder = placement.get("offload_folder")
    return None if folder is None else str(Path(folder) / cell_key)


def place_model(model: nn.Module, placement: Mapping[str, Any], cell_key: str) -> dict[str, Any]:
    """Dispatch a trained cell model in place for its probe; returns where it went (the folder left out)."""
    model.to("cpu")  # accelerate moves each module from here to its device; disk modules are written out
    folder = cell_folder(placement, cell_key)
    try:
        dispatch(model, placement["device_map"], max_memory=placement.get("max_memory"), offload_folder=folder)
    except FileNotFoundError:  # accelerate put the whole model on disk: nothing is left to run it
        raise WidthscopeError(
            f"max_memory {placement.get('max_memory')!r} holds no block of this model (accelerate keeps room for "
            "the largest one besides what stays resident): raise max_memory"
        ) from None
    record = dict(getattr(model, "widthscope_dispatch", {}) or {})
    record.pop("offload_folder", None)
    return record


def release(placement: Mapping[str, Any], cell_key: str) -> None:
    """Remove the cell's own offload folder (the weights are in its checkpoint)."""
    folder = cell_folder(placement, cell_key)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def placement_text(placement: Mapping[str, Any], record: Mapping[str, Any] | None = None) -> str | None:
    """The rows' ``placement`` column: the settings and how many modules went off the device."""
    if not placement:
        return None
    mem = placement.get("max_memory")
    if isinstance(mem, Mapping):
        mem = ",".join(f"{k}={v}" if v is not None else str(k) for k, v in mem.items())
    parts = [f"device_map={placement['device_map']}"] + ([f"max_memory={mem}"] if mem else [])
    if record is not None:
        parts.append(f"offloaded={len(record.get('offloaded') or [])}")
    return " ".join(parts)
