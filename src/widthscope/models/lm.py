"""Decoder-only language models from Hugging Face ``transformers`` configs (no hub access).

``llama`` and ``pythia`` of hidden size = width, with eager attention (jvp works through it).
Derived sizes and the presets: docs/models-data.md.

Example::

    >>> import torch
    >>> from widthscope.models import build
    >>> m = build("llama", 64, depth=2)
    >>> m(torch.randint(0, 256, (2, 16))).logits.shape
    torch.Size([2, 16, 256])
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..errors import WidthscopeError

PYTHIA_PRESETS: dict[str, tuple[int, int, int]] = {  # name -> (layers, width, heads)
    "70m": (6, 512, 8),
    "160m": (12, 768, 12),
    "410m": (24, 1024, 16),
    "1b": (16, 2048, 8),
    "1.4b": (24, 2048, 16),
    "2.8b": (32, 2560, 32),
    "6.9b": (32, 4096, 32),
    "12b": (36, 5120, 40),
}
# our option -> the transformers config field (the other options keep their names)
_HF_NAMES = {
    "width": "hidden_size",
    "depth": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "ffn": "intermediate_size",
    "max_seq_len": "max_position_embeddings",
}


def _check_sizes(family: str, width: Any, depth: int) -> int:
    if not isinstance(width, int) or isinstance(width, bool) or width < 2:
        raise WidthscopeError(f"{family} width (hidden size) must be an integer >= 2, got {width!r}")
    if depth < 1:
        raise WidthscopeError(f"{family} depth (layers) must be >= 1, got {depth}")
    return width


def _check_ids(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook refusing token ids that are not integers in ``[0, vocab_size)``."""
    ids = args[0] if args else kwargs.get("input_ids")
    if ids is None or not hasattr(ids, "dtype"):
        return
    config: Any = module.config  # a transformers config (fields per model type)
    vocab = config.vocab_size
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise WidthscopeError(
            f"this language model takes integer token ids (B, T), got {ids.dtype} of "
            f"shape {tuple(ids.shape)}: is the data a text dataset (e.g. --data text)?"
        )
    try:
        lo, hi = (int(ids.min()), int(ids.max())) if ids.numel() else (0, 0)
    except RuntimeError:  # inside torch.vmap & co. the values cannot be read: skip the range check
        return
    if lo < 0 or hi >= vocab:
        raise WidthscopeError(
            f"token ids must lie in 0..{vocab - 1} (vocab_size={vocab}), got "
            f"{lo}..{hi}; build the model with a larger vocab_size"
        )


def default_heads(width: int) -> int:
    return max(1, width // 64) if width >= 64 else max(1, width // 16)


def _model(model_cls: Any, cfg: Any, config: dict, layers_path: str) -> tuple[nn.Module, dict, list[str]]:
    model = model_cls(cfg)
    model.register_forward_pre_hook(_check_ids, with_kwargs=True)
    return model, config, [f"{layers_path}.{i}" for i in range(config["depth"])]


def _from_hf(config_cls: Any, model_cls: Any, family: str, layers_path: str, hf_config: dict) -> Any:
    """Rebuild a model from its own Hugging Face config dict (eager attention: jvp needs it)."""
    cfg = config_cls.from_dict(dict(hf_config))
    cfg._attn_implementation = "eager"
    return _model(model_cls, cfg, family_config(family, cfg), layers_path)


def family_config(family: str, cfg: Any) -> dict[str, Any]:
    """The ``widthscope_config`` of a llama/pythia model with the transformers config ``cfg``."""
    return {"family": family, "width": cfg.hidden_size, "depth": cfg.num_hidden_layers, "hf_config": cfg.to_dict()}


def _recorded(family: str, builder: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The ``widthscope_config`` of a built model: ``family`` and the builder's options from its ``locals()``."""
    return {"family": family} | {k: values[k] for k in inspect.signature(builder).parameters if k != "hf_config"}


def _build(config_cls: Any, model_cls: Any, layers_path: str, config: dict, **fixed: Any) -> Any:
    """The model of ``config`` (our option names), ``fixed`` settings added to its transformers config."""
    hf = {_HF_NAMES.get(k, k): v for k, v in config.items() if k not in ("family", "preset")}
    return _model(model_cls, config_cls(**hf, **fixed, attn_implementation="eager"), config, layers_path)


def build_llama(
    width: int | None,
    *,
    depth: int = 4,
    vocab_size: int = 256,
    max_seq_len: int = 512,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    ffn: int | None = None,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-6,
    initializer_range: float = 0.02,
    hf_config: dict | None = None,
) -> tuple[nn.Module, dict, list[str]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    if hf_config is not None:  # a model loaded from an HF directory, rebuilt from its own config
        return _from_hf(LlamaConfig, LlamaForCausalLM, "llama", "model.layers", hf_config)
    width = _check_sizes("llama", width, depth)
    heads = heads or default_heads(width)
    head_dim = head_dim or max(2, (width // heads) // 2 * 2)
    kv_heads = kv_heads or (heads // 2 if heads % 2 == 0 else heads)
    if heads % kv_heads:
        raise WidthscopeError(f"llama: heads={heads} must be a multiple of kv_heads={kv_heads}")
    ffn = ffn or max(32, 32 * round(8 * width / 3 / 32))
    config = _recorded("llama", build_llama, locals())
    fixed = dict(tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    return _build(LlamaConfig, LlamaForCausalLM, "model.layers", config, **fixed)


def build_pythia(
    width: int | None,
    *,
    depth: int | None = None,
    preset: str | None = None,
    vocab_size: int = 256,
    max_seq_len: int = 512,
    heads: int | None = None,
    ffn: int | None = None,
    rotary_pct: float = 0.25,
    layer_norm_eps: float = 1e-5,
    initializer_range: float = 0.02,
    hf_config: dict | None = None,
) -> tuple[nn.Module, dict, list[str]]:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    if hf_config is not None:
        return _from_hf(GPTNeoXConfig, GPTNeoXForCausalLM, "pythia", "gpt_neox.layers", hf_config)
    if preset is not None:
        if preset not in PYTHIA_PRESETS:
            raise WidthscopeError(f"unknown pythia preset {preset!r}; valid: {', '.join(PYTHIA_PRESETS)}")
        p_depth, p_width, p_heads = PYTHIA_PRESETS[preset]
        for name, given, own in (("width", width, p_width), ("depth", depth, p_depth)):
            if given is not None and given != own:
                raise WidthscopeError(f"pythia preset {preset} has {name} {own}; omit {name} or pass {own}")
        width, depth, heads = p_width, p_depth, heads or p_heads
    depth = 4 if depth is None else depth
    width = _check_sizes("pythia", width, depth)
    if heads is None:
        heads = default_heads(width)
        while width % heads:
            heads -= 1
    if width % heads:
        raise WidthscopeError(f"pythia: width {width} must be divisible by heads={heads}")
    ffn = ffn or 4 * width
    config = _recorded("pythia", build_pythia, locals())
    fixed = dict(use_parallel_residual=True, tie_word_embeddings=False)
    return _build(GPTNeoXConfig, GPTNeoXForCausalLM, "gpt_neox.layers", config, **fixed)
