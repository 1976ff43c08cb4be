"""Any local Hugging Face checkpoint, through the ``transformers`` Auto classes.

:func:`load_hf` picks the task from ``config.json``'s architecture and loads local files only, never
with ``trust_remote_code``. Tasks, losses and safety: docs/certify.md §6.

Example::

    >>> import tempfile, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from widthscope.models.hf import load_hf
    >>> d = tempfile.mkdtemp()
    >>> GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50)).save_pretrained(d)
    >>> m = load_hf(d)
    >>> m.widthscope_task, m.widthscope_points
    ('causal-lm', ['transformer.h.0', 'transformer.h.1'])
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import WidthscopeError
from ..hub import attach, resolve_model
from ..probe.structure import main_stack
from . import count_parameters
from .dispatch import check_disk, finish, make_offload_folder, pretrained_kwargs
from .lm import family_config

_HEADS = {  # task -> its head in transformers' names: AutoModelFor<Head>, MODEL_FOR_<HEAD>_MAPPING_NAMES
    "causal-lm": ("CausalLM", "CAUSAL_LM"),
    "masked-lm": ("MaskedLM", "MASKED_LM"),
    "sequence-classification": ("SequenceClassification", "SEQUENCE_CLASSIFICATION"),
    "image-classification": ("ImageClassification", "IMAGE_CLASSIFICATION"),
}
TASKS = tuple(_HEADS)
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
WIDTHSCOPE_FAMILY = {"llama": "llama", "gpt_neox": "pythia"}  # HF model_type -> our LM family (same classes)


def auto_classes() -> dict[str, Any]:
    import transformers as tf

    return {task: getattr(tf, f"AutoModelFor{head}") for task, (head, _) in _HEADS.items()}


def hf_task(cfg: dict[str, Any], where: str = "config.json") -> str:
    """The task of an HF config dict, from the architecture class it names."""
    archs = cfg.get("architectures") or []
    if not archs:
        raise WidthscopeError(
            f"{where} names no architecture ('architectures' is empty): pass --task "
            f"({', '.join(TASKS)}) to say which head the weights belong to"
        )
    from transformers.models.auto import modeling_auto as ma

    for task, (_, head) in _HEADS.items():
        mapping = getattr(ma, f"MODEL_FOR_{head}_MAPPING_NAMES")  # architecture names, one or a tuple per type
        if any(archs[0] == v or (isinstance(v, (tuple, list)) and archs[0] in v) for v in mapping.values()):
            return task
    raise WidthscopeError(
        f"{where}: architecture {archs[0]!r} is not a causal LM, masked LM, sequence "
        f"classifier or image classifier that transformers knows; supported tasks: "
        f"{', '.join(TASKS)}"
    )


def _read_cfg(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WidthscopeError(
            f"no config.json in {directory}: a Hugging Face checkpoint directory needs one "
            "(model.save_pretrained(DIR) writes it)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WidthscopeError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise WidthscopeError(f"{path} has no 'model_type': not a Hugging Face config")
    return cfg


def check_model_type(cfg: dict[str, Any], where: Path) -> None:
    import transformers
    from transformers import CONFIG_MAPPING

    if cfg["model_type"] not in CONFIG_MAPPING:
        raise WidthscopeError(
            f"{where}: model_type {cfg['model_type']!r} is not known to transformers "
            f"{transformers.__version__} (models that need trust_remote_code are never "
            "loaded); upgrade transformers or convert the checkpoint"
        )


def _weights(directory: Path) -> tuple[bool, str]:
    """(use_safetensors, description) for the weights in ``directory``."""
    if (directory / "model.safetensors").is_file():
        return True, "model.safetensors"
    if (directory / "model.safetensors.index.json").is_file():
        index = json.loads((directory / "model.safetensors.index.json").read_text(encoding="utf-8"))
        shards = sorted(set((index.get("weight_map") or {}).values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if not shards or missing:
            raise WidthscopeError(
                f"{directory}/model.safetensors.index.json lists shards that are missing: "
                f"{', '.join(missing[:5]) or '(no weight_map)'}"
            )
        return True, f"{len(shards)} safetensors shards"
    if (directory / "pytorch_model.bin").is_file() or (directory / "pytorch_model.bin.index.json").is_file():
        return False, "pytorch_model.bin (weights_only=True)"
    raise WidthscopeError(
        f"no weights in {directory}: expected model.safetensors, a sharded "
        "model.safetensors.index.json, or pytorch_model.bin"
    )


def vocab_size(model: nn.Module) -> int | None:
    """Rows of the input embedding (the ids the model can look up), or None."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, nn.Embedding):
            return int(emb.num_embeddings)
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(v) if isinstance(v, int) else None


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence the model's position embeddings allow, or None (e.g. RoPE without limit)."""
    cfg = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def model_info(model: nn.Module) -> dict[str, Any]:
    """Architecture, width (hidden size), depth, dtype, attention implementation, parameters."""
    cfg = getattr(model, "config", None)
    info: dict[str, Any] = {"architecture": type(model).__name__}
    if cfg is not None:
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        for key, names in (
            ("width", ("hidden_size", "n_embd", "d_model", "dim")),
            ("depth", ("num_hidden_layers", "n_layer", "num_layers")),
        ):
            found = [v for n in names if isinstance(v := getattr(text, n, None), int)]
            info.update({key: found[0]} if found else {})
        info["model_type"] = getattr(cfg, "model_type", None)
        info["attn_implementation"] = getattr(cfg, "_attn_implementation", None)
    else:
        wc = getattr(model, "widthscope_config", None) or {}
        info.update({k: wc[k] for k in ("width", "depth") if k in wc})
        info["architecture"] = wc.get("family", info["architecture"])
    if (first := next(model.parameters(), None)) is not None:
        info["dtype"] = str(first.dtype).removeprefix("torch.")
    info["parameters"] = count_parameters(model)
    if placed := getattr(model, "widthscope_dispatch", None):  # accelerate's placement: docs/big-models.md
        info["placement"] = placed
    return info


def load_hf(
    directory: str | Path,
    *,
    task: str | None = None,
    dtype: str = "auto",
    device: str | torch.device = "cpu",
    revision: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[Any, Any] | None = None,
    offload_folder: str | Path | None = None,
) -> nn.Module:
    """Load the checkpoint in ``directory`` (or a hub id) in eval mode with its task's Auto class, marked
    (:func:`_mark`); ``device_map``/``max_memory``/``offload_folder`` place it with accelerate."""
    directory, hub = resolve_model(str(directory), revision)
    cfg = _read_cfg(directory)
    check_model_type(cfg, directory / "config.json")
    if task is not None and task not in TASKS:
        raise WidthscopeError(f"--task {task!r}: choose one of {', '.join(TASKS)}")
    named = hf_task(cfg, str(directory / "config.json")) if task is None or cfg.get("architectures") else task
    if task not in (None, named):
        raise WidthscopeError(
            f"--task {task} but {directory}/config.json names {cfg['architectures'][0]} "
            f"({named}): its weights belong to that head; drop --task"
        )
    task = named
    if dtype not in DTYPES:
        raise WidthscopeError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    use_safetensors, weights = _weights(directory)
    placement, budget = pretrained_kwargs(device_map, max_memory, offload_folder)
    if placement and str(device) != "cpu":
        raise WidthscopeError(f"load_hf: device={device!r} and device_map both given; the device map places the model")
    if placement and not use_safetensors:
        raise WidthscopeError(
            f"device_map needs safetensors weights; {directory} has {weights}: convert it "
            "(model.save_pretrained(DIR) writes safetensors)"
        )
    # converted weights offload to the folder given, else (disk allowed) a temporary one
    allowed = budget is None or "disk" in budget
    folder, temp = make_offload_folder(offload_folder, allowed) if placement else (None, None)
    auto = auto_classes()[task]

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a mismatch becomes our one error line, not a table
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, loading = auto.from_pretrained(
                str(directory),
                local_files_only=True,
                trust_remote_code=False,
                use_safetensors=use_safetensors,
                weights_only=True,
                dtype="auto" if dtype == "auto" else getattr(torch, dtype),
                ignore_mismatched_sizes=True,  # refused below, in one line
                output_loading_info=True,
                **placement,
                **({"offload_folder": folder} if folder is not None else {}),
            )
    except WidthscopeError:
        raise
    except Exception as exc:  # transformers/safetensors raise many types for bad files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WidthscopeError(
            f"could not load the {task} checkpoint in {directory} ({type(exc).__name__}: {first[:300]})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_loading(loading, directory, cfg)
    model.eval()
    if not placement:
        model.to(device)
    _mark(model, task, directory, model_type=cfg["model_type"], weights=weights, dtype_option=dtype)
    if placement:  # refuse disk offload the budget did not allow; keep a temporary folder in use
        dmap = getattr(model, "hf_device_map", None) or {}
        disk = "disk" in dmap.values()
        check_disk(dmap, budget, folder if temp is None else None)
        if disk and temp is not None:
            model._widthscope_offload_folder = temp
        finish(model, budget, folder if disk else None)
    family = WIDTHSCOPE_FAMILY.get(cfg["model_type"])
    if family is not None and task == "causal-lm":
        model.widthscope_config = family_config(family, model.config)  # rebuildable (grow, save)
    return attach(model, hub)


def _check_loading(loading: dict[str, Any], directory: Path, cfg: dict[str, Any]) -> None:
    """Refuse weights that do not fit the config (missing keys, shape mismatches), naming the first few."""

    def first(what: str, items: list[str], n: int) -> list[str]:
        more = f" (+{len(items) - n} more)" if len(items) > n else ""
        return [f"{what} {', '.join(items[:n])}{more}"] if items else []

    def one(m: Any) -> str:
        if isinstance(m, (tuple, list)) and len(m) == 3:
            return f"{m[0]} {tuple(m[1])} in the file vs {tuple(m[2])} in the config"
        return str(m[0] if isinstance(m, (tuple, list)) else m)

    missing = sorted(k for k in loading.get("missing_keys", []) if k)
    mismatched = [one(m) for m in sorted(loading.get("mismatched_keys", []) or [], key=str)]
    parts = first("missing", missing, 5) + first("shape mismatch", mismatched, 3)
    if parts:
        raise WidthscopeError(
            f"weights in {directory} do not match the {cfg.get('architectures', ['?'])[0]} "
            f"architecture of its config.json: {'; '.join(parts)} (freshly initialised "
            "weights would give meaningless certificates)"
        )


def meta_checkpoint(
    model: Any, revision: str | None = None, task: str | None = None, dtype: str = "auto"
) -> nn.Module | None:
    """A Hugging Face checkpoint's architecture on the meta device (no weight read), else ``None``."""
    if not isinstance(model, str) or model == "builtin":
        return None
    path, hub = resolve_model(model, revision)
    cfg_file = Path(path) / "config.json"
    try:
        raw = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or "model_type" not in raw:
        return None
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    check_model_type(raw, cfg_file)
    task = task or hf_task(raw, str(cfg_file))
    config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    named = raw.get("dtype") or raw.get("torch_dtype")
    dt = getattr(torch, dtype) if dtype != "auto" else getattr(torch, str(named or "float32"), None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        dt = torch.float32
    with init_empty_weights(include_buffers=True):
        built = auto_classes()[task].from_config(config, dtype=dt)
    built.eval()
    _mark(built, task, path)
    return attach(built, hub)


def _mark(model: Any, task: str, directory: Any, **hf: Any) -> None:
    """Set ``widthscope_task``, ``widthscope_points`` and ``widthscope_hf`` (where the model came from, ``hf``)."""
    model.widthscope_task = task
    model.widthscope_points = main_stack(model)
    model.widthscope_hf = {"directory": str(directory), "architecture": type(model).__name__, **hf}
