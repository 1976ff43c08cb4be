"""Save and load models without executing code from the checkpoint (docs/models-data.md).

Our format: ``model.safetensors`` and ``config.json`` (rebuilt by :func:`widthscope.models.build`); :func:`load`
also takes hub ids, Hugging Face directories and weight files with a ``config.json`` beside them.

Example::

    >>> from widthscope.models import build
    >>> from widthscope import checkpoint
    >>> m = build("mlp", 32, in_dim=4, out_dim=2)
    >>> _ = checkpoint.save(m, "/tmp/ckpt", extra={"dataset": "toy"})
    >>> m2 = checkpoint.load("/tmp/ckpt")
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from ._io import atomic_write, atomic_write_json, to_jsonable
from .errors import WidthscopeError
from .hub import attach, resolve_model
from .models import build, count_parameters
from .models.hf import DTYPES, WIDTHSCOPE_FAMILY, auto_classes, check_model_type, hf_task, load_hf
from .probe.insert import apply_insertions
from .probe.structure import main_stack

FORMAT_VERSION = 1
HF_RENAMES = {"embed_out.weight": "lm_head.weight"}  # original GPT-NeoX/Pythia name of the read-out
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def _dedupe(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one name per shared storage (safetensors refuses aliases); return alias -> kept name."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_key: dict[tuple, str] = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in by_key:
            aliases[name] = by_key[key]
            continue
        if t.numel():
            by_key[key] = name
        kept[name] = t.detach().cpu().contiguous()
    return kept, aliases


def save(model: nn.Module, directory: str | os.PathLike, *, extra: dict | None = None) -> Path:
    """Write ``model`` (built by :func:`widthscope.models.build`) to ``directory``; returns it."""
    from safetensors.torch import save_file

    config = getattr(model, "widthscope_config", None)
    if not isinstance(config, dict):
        raise WidthscopeError(
            "checkpoint.save needs a model built by widthscope.models.build "
            "(it carries widthscope_config); for other models use their own save"
        )
    if str(config.get("activation", "")).startswith("<callable"):
        raise WidthscopeError(
            f"cannot save an mlp with a custom activation {config['activation']}: it cannot "
            "be rebuilt from JSON; use one of the named activations"
        )
    try:
        json.dumps(to_jsonable(config))
    except TypeError as exc:
        raise WidthscopeError(f"model config is not JSON-serialisable: {exc}") from None

    directory = Path(directory)
    tensors, aliases = _dedupe(model.state_dict())

    def write(tmp: str) -> None:
        try:
            save_file(tensors, tmp, metadata={"format": "pt", "widthscope_aliases": json.dumps(aliases)})
        except Exception as exc:  # safetensors reports a full disk as its own error type
            if type(exc).__name__ != "SafetensorError":
                raise
            raise OSError(f"{exc} (disk full?)") from None

    atomic_write(directory / "model.safetensors", write)
    atomic_write_json(
        directory / "config.json",
        {
            "widthscope_format": FORMAT_VERSION,
            "model": config,
            "dtype": next((str(p.dtype)[6:] for p in model.parameters() if p.is_floating_point()), "float32"),
            "parameters": count_parameters(model),
            "extra": extra or {},
        },
    )
    return directory


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint (directory or weights file with a sidecar)."""
    path = Path(path)
    cfg_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    if not cfg_path.is_file():
        raise WidthscopeError(
            f"no config.json at {cfg_path}: a checkpoint needs a config.json describing the "
            "architecture (widthscope.checkpoint.save writes one; HF directories have one)"
        )
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WidthscopeError(f"{cfg_path} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise WidthscopeError(f"{cfg_path} must hold a JSON object")
    return cfg


def _read_safetensors(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise WidthscopeError(
            f"{file} is not a readable safetensors file ({exc}); expected weights written by safetensors"
        ) from None
    try:
        aliases = json.loads(meta.get("widthscope_aliases", "{}"))
    except json.JSONDecodeError:
        aliases = {}
    return state, aliases


def _read_torch(file: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WidthscopeError(
            f"{file} could not be read as a PyTorch state dict with weights_only=True ({exc}); "
            "only plain tensors are loaded, never pickled code — re-save it as safetensors"
        ) from None
    if isinstance(obj, dict):  # a training checkpoint: its model's state dict
        obj = next((obj[k] for k in ("state_dict", "model", "model_state_dict") if isinstance(obj.get(k), dict)), obj)
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise WidthscopeError(f"{file} does not hold a state dict (a mapping of names to tensors)")
    return obj


def _fill(model: nn.Module, state: dict[str, torch.Tensor], aliases: dict[str, str], where: Path) -> None:
    state = dict(state)
    for alias, name in aliases.items():
        if alias not in state and name in state:
            state[alias] = state[name]
    own = model.state_dict()
    # Tied tensors a foreign writer stored once: fill the missing name from its twin.
    by_ptr: dict[int, list[str]] = {}
    for k, t in own.items():
        by_ptr.setdefault(t.data_ptr(), []).append(k)
    for names in by_ptr.values():
        present = [n for n in names if n in state]
        for n in names:
            if n not in state and present:
                state[n] = state[present[0]]
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    parts = [
        f"{label} {', '.join(xs[:5])}" + (f" (+{len(xs) - 5} more)" if len(xs) > 5 else "")
        for label, xs in (("missing", sorted(set(own) - set(state))), ("unexpected", sorted(set(state) - set(own))))
        if xs
    ]
    if wrong:
        parts.append(
            "shape mismatch " + ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in wrong[:5])
        )
    if parts:
        raise WidthscopeError(
            f"weights in {where} do not match the architecture in its config.json: " + "; ".join(parts)
        )
    model.load_state_dict(state, strict=True)


def _find_weights(directory: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth", "model.safetensors.index.json"):
        if (directory / name).is_file():
            return directory / name
    raise WidthscopeError(
        f"no weights in {directory}: expected model.safetensors (or a sharded "
        "model.safetensors.index.json, or pytorch_model.bin / model.pt)"
    )


def _read_any(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    if file.name.endswith(".index.json"):
        index = json.loads(file.read_text(encoding="utf-8"))
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index.get("weight_map", {}).values())):
            part, _ = _read_safetensors(file.parent / shard)
            state.update(part)
        return state, {}
    return _read_safetensors(file) if file.suffix == ".safetensors" else (_read_torch(file), {})


def _to_dtype(model: nn.Module, option: str, recorded: Any) -> None:
    """``option`` ``auto``: the checkpoint's recorded dtype; else the named torch dtype."""
    if option not in DTYPES:
        raise WidthscopeError(f"--dtype {option!r}: choose one of {', '.join(DTYPES)}")
    name = str(recorded) if option == "auto" else option
    dt = getattr(torch, name, None) if name else None
    if isinstance(dt, torch.dtype):
        model.to(dt)


def _hf_from_file(directory: Path, cfg: dict[str, Any], task: str | None) -> nn.Module:
    """The architecture of an HF config dict, freshly initialised (weights are filled next)."""
    family = WIDTHSCOPE_FAMILY.get(cfg["model_type"])
    check_model_type(cfg, directory / "config.json")
    task = task or hf_task(cfg, str(directory / "config.json"))
    if family is not None and task == "causal-lm":
        model = build(family, hf_config=cfg)
    else:
        from transformers import AutoConfig

        conf = {k: v for k, v in cfg.items() if k != "model_type"}
        hf_cfg = AutoConfig.for_model(cfg["model_type"], **conf)
        model = auto_classes()[task].from_config(hf_cfg)
        model.widthscope_points = main_stack(model)
    # torch types Module.__setattr__ for tensors and modules only; a plain attribute is fine at runtime
    model.widthscope_task = task  # type: ignore[assignment]
    return model


def load(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: str = "auto",
    task: str | None = None,
    revision: str | None = None,
    placement: Mapping[str, Any] | None = None,
) -> nn.Module:
    """Load a checkpoint (or hub id at ``revision``) in eval mode. ``dtype``: ``auto`` (the checkpoint's)
    or a torch dtype name; ``task`` overrides the HF task; ``placement``: ``device_map`` /
    ``max_memory`` / ``offload_folder`` of a Hugging Face directory."""
    path, hub = resolve_model(str(Path(path)), revision, flag="checkpoint")
    if not path.exists():
        raise WidthscopeError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        weights = _find_weights(path)
    elif path.suffix in WEIGHT_SUFFIXES:
        weights = path
    else:
        raise WidthscopeError(
            f"{path} is not a checkpoint: expected a directory with config.json + "
            "model.safetensors, or a .safetensors/.pt/.pth file with a config.json beside it"
        )
    cfg = read_config(path)
    if placement and not ("model_type" in cfg and path.is_dir()):
        raise WidthscopeError(
            f"--device-map/--max-memory (input spec fields device_map, max_memory, offload_folder) apply to "
            f"Hugging Face checkpoint directories; {path} is a widthscope checkpoint: drop them"
        )
    if "widthscope_format" in cfg:
        if task is not None:
            raise WidthscopeError(
                f"--task applies to Hugging Face checkpoints; {path} is a widthscope checkpoint "
                "whose task is fixed by its family: drop --task"
            )
        if not isinstance(cfg.get("model"), dict) or "family" not in cfg["model"]:
            raise WidthscopeError(f"config.json of {path} has no model description ('model' with a 'family')")
        model_cfg = dict(cfg["model"])
        insertions = model_cfg.pop("insertions", None) or []
        try:
            model = build(**model_cfg)
        except WidthscopeError as exc:
            raise WidthscopeError(f"config.json of {path} does not describe a buildable model: {exc}") from None
        if insertions:  # a grown model: its inserted parameters, before the weights load
            apply_insertions(model, insertions)
        model.widthscope_extra = cfg.get("extra") or {}  # type: ignore[assignment]  # plain attribute (cf. _hf_from_file)
        recorded = cfg.get("dtype", "float32")
    elif "model_type" in cfg:
        if path.is_dir():  # any architecture transformers knows, through its Auto class
            return attach(load_hf(path, task=task, dtype=dtype, device=device, **(placement or {})), hub)
        model = _hf_from_file(path.parent, cfg, task)
        recorded = cfg.get("dtype") or cfg.get("torch_dtype")
    else:
        raise WidthscopeError(
            f"config.json of {path} is neither a widthscope checkpoint config "
            "('widthscope_format') nor a Hugging Face config ('model_type')"
        )
    _to_dtype(model, dtype, recorded)
    state, aliases = _read_any(weights)
    if "model_type" in cfg:
        state = {HF_RENAMES.get(k, k): v for k, v in state.items()}
    _fill(model, state, aliases, weights)
    model.to(device)
    model.eval()
    return attach(model, hub)


def recorded_data(model: nn.Module) -> dict[str, Any]:
    """What a loaded checkpoint recorded about its training data (dataset, options, seed)."""
    extra = getattr(model, "widthscope_extra", None)
    if not isinstance(extra, dict):
        return {}
    keys = (("dataset", "dataset", str), ("options", "data_options", dict), ("seed", "data_seed", int))
    return {key: copy.copy(extra[name]) for key, name, kind in keys if isinstance(extra.get(name), kind)}
