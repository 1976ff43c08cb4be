"""Per-example losses of the probe (:func:`widthscope.probe.collect`): the causal-LM and masked-LM
losses of token batches, the default loss of ``(x, y)`` batches, and :func:`logits_of`, which finds the
output tensor in what a model returns (a tensor, an HF ``ModelOutput``, a dict or a tuple).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ..errors import WidthscopeError

__all__ = ["logits_of", "causal_lm_loss", "masked_lm_loss", "default_loss"]


def logits_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits") and isinstance(output.logits, torch.Tensor):
        return output.logits
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise WidthscopeError(
        f"cannot find the model output tensor in a {type(output).__name__}; pass loss_fn=... that takes the raw output"
    )


def causal_lm_loss(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Per-sequence causal-LM loss: mean over its predicted tokens of the shifted cross-entropy.

    :math:`\ell_i = \frac{1}{|P_i|}\sum_{t\in P_i} -\log p(x_{i,t+1}\mid x_{i,\le t})` where
    :math:`P_i` are the positions whose *target* is a real token (``attention_mask == 1`` and,
    with ``labels``, ``labels != -100``). Returns shape ``(B,)``.
    """
    logits = logits_of(logits)
    if logits.ndim != 3:
        raise WidthscopeError(f"causal-LM loss expects logits (B, T, V), got shape {tuple(logits.shape)}")
    targets = (labels if labels is not None else input_ids)[:, 1:]
    valid = targets != -100
    if attention_mask is not None:
        valid = valid & attention_mask[:, 1:].bool()
    B, T, V = logits.shape
    ce = F.cross_entropy(
        logits[:, :-1].reshape(-1, V).float()
        if logits.dtype in (torch.float16, torch.bfloat16)
        else logits[:, :-1].reshape(-1, V),
        targets.clamp_min(0).reshape(-1),
        reduction="none",
    ).view(B, T - 1)
    count = valid.sum(1)
    if bool((count == 0).any()):
        i = int((count == 0).nonzero()[0, 0])
        raise WidthscopeError(
            f"sequence {i} of the batch has no predicted token (needs >= 2 "
            "unmasked tokens); drop empty/one-token sequences"
        )
    return (ce * valid.to(ce.dtype)).sum(1) / count.to(ce.dtype)


def masked_lm_loss(output: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    r"""Per-sequence masked-LM loss: mean cross-entropy over the masked positions.

    ``batch["labels"]`` holds the original token at each masked position and ``-100`` elsewhere
    (unshifted, as BERT-style models predict the token in place). Returns shape ``(B,)``.
    """
    logits = logits_of(output)
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    if labels is None:
        raise WidthscopeError(
            "masked-LM batches need 'labels' (-100 where nothing is predicted); "
            "widthscope's input layer makes them with --task masked-lm"
        )
    if logits.ndim != 3 or logits.shape[:2] != labels.shape:
        raise WidthscopeError(
            f"masked-LM loss expects logits (B, T, V) matching labels {tuple(labels.shape)}, got {tuple(logits.shape)}"
        )
    B, T, V = logits.shape
    valid = labels != -100
    count = valid.sum(1)
    if bool((count == 0).any()):
        i = int((count == 0).nonzero()[0, 0])
        raise WidthscopeError(f"sequence {i} of the batch has no masked token to predict")
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    ce = F.cross_entropy(x.reshape(-1, V), labels.clamp_min(0).reshape(-1), reduction="none").view(B, T)
    return (ce * valid.to(ce.dtype)).sum(1) / count.to(ce.dtype)


def default_loss(output: Any, y: torch.Tensor) -> torch.Tensor:
    """Per-example loss for ``(x, y)`` batches.

    Integer ``y``: cross-entropy (averaged over any extra target dims per example).
    Float ``y``: squared error summed over the outputs, :math:`\\sum_k (f_k - y_k)^2`.
    """
    out = logits_of(output)
    B = out.shape[0]
    if y.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        x = out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
        ce = F.cross_entropy(x, y.long(), reduction="none")
        return ce.reshape(B, -1).mean(1)
    if y.is_floating_point():
        if y.shape != out.shape and y.numel() == out.numel():
            y = y.reshape(out.shape)
        if y.shape != out.shape:
            raise WidthscopeError(
                f"regression targets have shape {tuple(y.shape)} but the model "
                f"output has shape {tuple(out.shape)}; pass loss_fn=..."
            )
        return (out - y.to(out.dtype)).pow(2).reshape(B, -1).sum(1)
    raise WidthscopeError(f"targets of dtype {y.dtype} are neither class labels nor floats; pass loss_fn=...")
