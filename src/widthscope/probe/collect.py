r"""Per-example activation gradients at insertion points, from one backward per batch.

For each example ``q = ∂ℓ/∂z`` at an insertion point's output ``z``, pooled over positions: a forward
hook adds a zero leaf to each output and one backward of the summed loss reaches only those leaves
(exact while examples do not interact). Details: docs/certify.md §1.

Example::

    >>> import torch, torch.nn as nn
    >>> from widthscope.probe import collect
    >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    >>> x, y = torch.randn(10, 4, dtype=torch.float64), torch.randint(0, 3, (10,))
    >>> q = collect(mlp, [(x, y)], points=["1"], progress=False)
    >>> q["1"].shape
    torch.Size([10, 8])
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _args
from .._io import progress as _progress
from ..errors import WidthscopeError
from ..options import POOLS
from .batches import to_batches
from .insert import channel_dim
from .offload import input_device
from .points import resolve_points

__all__ = [
    "collect",
    "ProbeResult",
    "batched",
    "causal_lm_loss",
    "masked_lm_loss",
    "default_loss",
    "coupling_layers",
]

TRAIN_MODES = ("eval", "keep")

# Modules whose *training-mode* output for one example depends on the other examples.
_COUPLING = (nn.modules.batchnorm._BatchNorm,)
# 1-D "channels first" layers: for their 3-D outputs (B, C, L) the feature dim is 1, not -1.
_CHANNELS_FIRST_1D = (
    nn.Conv1d,
    nn.ConvTranspose1d,
    nn.BatchNorm1d,
    nn.InstanceNorm1d,
    nn.MaxPool1d,
    nn.AvgPool1d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveMaxPool1d,
)


class ProbeResult(dict):
    """``{point: Tensor (n, d)}`` with the run's notes, n_examples, pool, losses, act_sq and widths."""

    notes: list[str]
    n_examples: int
    pool: str
    losses: torch.Tensor  # (n,), float64
    act_sq: dict[str, torch.Tensor]  # point -> (n, 2): per example Σ z² and the number of entries
    widths: dict[str, int]  # point -> channel width of its output

    def __init__(self, samples: dict[str, torch.Tensor], **info: Any) -> None:
        super().__init__(samples)
        self.__dict__.update(info)


def activation_rms(act_sq: torch.Tensor, n: int | None = None) -> float:
    """RMS entry of a point's output over its first ``n`` examples (all when None)."""
    part = act_sq if n is None else act_sq[:n]
    return float((part[:, 0].sum() / part[:, 1].sum().clamp_min(1)).sqrt())


def coupling_layers(model: nn.Module) -> list[str]:
    """Names of submodules whose training-mode output couples the examples of a batch."""
    return [n for n, m in model.named_modules() if isinstance(m, _COUPLING)]


def batched(x: torch.Tensor, y: torch.Tensor | None = None, *, batch_size: int = 64) -> list[Any]:
    """Split full tensors into probe batches: ``(x, y)`` pairs, or LM id tensors if ``y`` is None."""
    if batch_size < 1:
        raise WidthscopeError(f"batch_size must be >= 1, got {batch_size}")
    if y is not None and y.shape[0] != x.shape[0]:
        raise WidthscopeError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    return to_batches(x if y is None else (x, y), batch_size)


def _accepts(model: nn.Module, kw: str) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return kw in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def float_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's floating parameters (inputs are cast to it), or None."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


@contextmanager
def EvalMode(model: nn.Module) -> Iterator[nn.Module]:
    """Run the model in eval mode (BatchNorm running statistics, no dropout), then restore its modes."""
    modes = {m: m.training for m in model.modules()}
    try:
        yield model.eval()
    finally:
        for m, mode in modes.items():
            m.training = mode


@contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """The parameters' ``requires_grad`` off within the block, restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextmanager
def hooked(
    hooks: Iterable[tuple[nn.Module, Callable]], pre: Iterable[tuple[nn.Module, Callable]] = ()
) -> Iterator[None]:
    """Forward hooks (and forward pre-hooks ``pre``) on their modules within the block, removed on exit."""
    handles = [m.register_forward_pre_hook(h) for m, h in pre] + [m.register_forward_hook(h) for m, h in hooks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def to_device(obj: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move a batch to ``device``, its floating tensors also to ``dtype`` (token ids stay integers)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, dtype) if dtype is not None and obj.is_floating_point() else obj.to(device)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device, dtype) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(v, device, dtype) for v in obj)
    return obj


def _shapes(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"{tuple(obj.shape)} {str(obj.dtype).replace('torch.', '')}"
    if isinstance(obj, Mapping):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (tuple, list)):
        return "(" + ", ".join(_shapes(v) for v in obj) + ")"
    return type(obj).__name__


def _wide(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 for the cross-entropy."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def logits_of(output: Any) -> torch.Tensor:
    """The output tensor in what a model returns (a tensor, an HF ``ModelOutput``, a dict or a tuple)."""
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
    r"""Per-sequence causal-LM loss ``(B,)``, over the positions ``P_i`` whose target is a real token:

    :math:`\ell_i = \frac{1}{|P_i|}\sum_{t\in P_i} -\log p(x_{i,t+1}\mid x_{i,\le t})`
    """
    logits = logits_of(logits)
    if logits.ndim != 3:
        raise WidthscopeError(f"causal-LM loss expects logits (B, T, V), got shape {tuple(logits.shape)}")
    targets = (labels if labels is not None else input_ids)[:, 1:]
    valid = targets != -100
    if attention_mask is not None:
        valid = valid & attention_mask[:, 1:].bool()
    what = "predicted token (needs >= 2 unmasked tokens); drop empty/one-token sequences"
    return _token_mean(logits[:, :-1], targets, valid, what)


def masked_lm_loss(output: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per-sequence masked-LM loss ``(B,)`` over the positions where ``batch["labels"]`` is not -100."""
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
    return _token_mean(logits, labels, labels != -100, "masked token to predict")


def _token_mean(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, what: str) -> torch.Tensor:
    """Per sequence, the mean cross-entropy of ``logits`` (B, T, V) against ``targets`` over the ``valid`` tokens."""
    count = valid.sum(1)
    if bool((count == 0).any()):
        raise WidthscopeError(f"sequence {int((count == 0).nonzero()[0, 0])} of the batch has no {what}")
    B, T, V = logits.shape
    ce = F.cross_entropy(_wide(logits).reshape(-1, V), targets.clamp_min(0).reshape(-1), reduction="none").view(B, T)
    return (ce * valid.to(ce.dtype)).sum(1) / count.to(ce.dtype)


def default_loss(output: Any, y: torch.Tensor) -> torch.Tensor:
    """Per-example loss for ``(x, y)`` batches: cross-entropy for integer ``y`` (averaged over extra
    target dims), else the summed squared error :math:`\\sum_k (f_k - y_k)^2`."""
    out = logits_of(output)
    B = out.shape[0]
    if y.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        ce = F.cross_entropy(_wide(out), y.long(), reduction="none")
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


def run_batch(
    model: nn.Module, batch: Any, loss_fn: Callable | None, bi: int
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Forward one batch: (per-example losses (B,), attention mask or None, B); torch errors become WidthscopeError."""
    try:
        return _forward_loss(model, batch, loss_fn, bi)
    except WidthscopeError:
        raise
    except (RuntimeError, IndexError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WidthscopeError(
            f"batch {bi}: the model's forward pass or the loss failed ({type(exc).__name__}: {first}); "
            f"batch shapes {_shapes(batch)}. Check that the data matches the model (input size, number "
            "of classes / targets, equal batch sizes of inputs and targets)"
        ) from exc


def _forward_loss(
    model: nn.Module, batch: Any, loss_fn: Callable | None, bi: int
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    if isinstance(batch, Mapping) or (isinstance(batch, torch.Tensor) and not batch.is_floating_point()):
        # Causal LM: LongTensor ids, or {"input_ids", optional "attention_mask", "labels"}.
        mask = labels = None
        if isinstance(batch, Mapping):
            if "input_ids" not in batch:
                raise WidthscopeError(f"batch {bi} is a dict without 'input_ids' (keys: {sorted(batch)})")
            mask, labels = batch.get("attention_mask"), batch.get("labels")
        ids = batch["input_ids"] if isinstance(batch, Mapping) else batch
        if ids.ndim != 2:
            raise WidthscopeError(f"batch {bi}: input_ids must be (B, T), got shape {tuple(ids.shape)}")
        kwargs = {}
        if mask is not None and _accepts(model, "attention_mask"):
            kwargs["attention_mask"] = mask
        elif mask is not None and bool((mask.bool()[:, 1:] & ~mask.bool()[:, :-1]).any()):
            # without a mask argument only right padding is exact for a causal model
            raise WidthscopeError(
                f"batch {bi}: {type(model).__name__}.forward takes no attention_mask and the "
                "padding is not on the right; pad sequences on the right"
            )
        output = model(ids, **kwargs)
        losses = loss_fn(output, batch) if loss_fn is not None else causal_lm_loss(logits_of(output), ids, mask, labels)
        return losses, mask, ids.shape[0]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        output = model(**x) if isinstance(x, Mapping) else model(x)
        B = (next(iter(x.values())) if isinstance(x, Mapping) else x).shape[0]
        if loss_fn is not None:
            losses = loss_fn(output, y)
        elif (
            isinstance(x, torch.Tensor)
            and not x.is_floating_point()
            and x.ndim == 2
            and isinstance(y, torch.Tensor)
            and y.shape == x.shape
            and torch.equal(x, y)
        ):
            # (ids, ids) pairs, as widthscope.data.load("text") yields: causal LM.
            losses = causal_lm_loss(logits_of(output), x)
        else:
            losses = default_loss(output, y)
        return losses, None, B
    raise WidthscopeError(
        f"batch {bi} is a {type(batch).__name__}: expected (x, y), a LongTensor of token ids, "
        "or a dict with 'input_ids'. Tip: widthscope.probe.batched(X, y, batch_size=64)"
    )


def _pool(q: torch.Tensor, module: nn.Module, pool: str, mask: torch.Tensor | None) -> torch.Tensor:
    """Pool ``module``'s output gradient per example (a 1-D channels-first layer's features are dim 1)."""
    fdim = 1 if q.ndim <= 2 or isinstance(module, _CHANNELS_FIRST_1D) else channel_dim(q)
    B = q.shape[0]
    if q.ndim == 1:
        q = q.unsqueeze(1)
    if pool == "flatten":
        return q.reshape(B, -1)
    q = q.movedim(fdim, -1)  # (B, positions..., d)
    d = q.shape[-1]
    q = q.reshape(B, -1, d)
    if pool == "sum":
        return q.sum(1)
    if pool == "mean":
        return q.mean(1)
    # token: every position its own sample; drop padded positions of a sequence batch.
    if mask is not None and q.shape[1] == mask.shape[1] and fdim == q.ndim - 1:
        return q[mask.bool()]
    return q.reshape(-1, d)


def split_output(output: Any, name: str) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """The hidden-state tensor of a module output, and a function putting a replacement back."""
    if isinstance(output, torch.Tensor):
        return output, lambda z: z
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        rest = list(output[1:])
        return output[0], (lambda z: (z, *rest)) if isinstance(output, tuple) else (lambda z: [z, *rest])
    if isinstance(output, MutableMapping):  # put writes the replacement back (dict, HF ModelOutput)
        for key in ("last_hidden_state", "hidden_states"):
            if isinstance(output.get(key), torch.Tensor):

                def put(z: torch.Tensor, key: str = key) -> Any:
                    output[key] = z
                    return output

                return output[key], put
    raise WidthscopeError(
        f"insertion point {name!r} outputs a {type(output).__name__}, not a tensor "
        "or a tuple starting with the hidden states; choose another point"
    )


def collect(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    points: str | Sequence[str] | None = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    pool: str = "sum",
    train_mode: str = "eval",
    progress: bool = True,
    dtype: torch.dtype = torch.float64,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> ProbeResult:
    """Per-example activation gradients ``q = ∂ℓ/∂z`` at each insertion point, pooled.

    ``loss_fn(output, y) -> (B,)`` (``y`` is the batch for LM batches); ``train_mode="keep"`` keeps the
    modules' modes; ``transform(point, samples)`` maps each batch's pooled samples before they are kept.
    """
    fn = "collect"
    _args.module(fn, "model", model)
    _args.batches(fn, "batches", batches)
    _args.points(fn, "points", points)
    _args.function(fn, "loss_fn", loss_fn, accepts="a function loss_fn(output, y) -> (B,) losses or None")
    _args.choice(fn, "pool", pool, POOLS)
    _args.choice(fn, "train_mode", train_mode, TRAIN_MODES)
    _args.boolean(fn, "progress", progress)
    _args.dtype(fn, "dtype", dtype, optional=False)
    _args.function(fn, "transform", transform, accepts="a function transform(point, samples) -> samples or None")
    names = resolve_points(model, points)
    modules = dict(model.named_modules())
    notes = _mode_notes(model, modules, train_mode)
    probe = _Probe(model, names, loss_fn, pool, dtype, transform)
    hooks = [(modules[n], probe.hook(n)) for n in names]
    try:
        with EvalMode(model) if train_mode == "eval" else contextlib.nullcontext(), frozen(model), hooked(hooks):
            total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
            for bi, batch in enumerate(
                _progress(batches, total=total, desc="probe", disable=None if progress else True)
            ):
                probe.batch(batch, bi)
    finally:
        probe.leaves.clear()
    if probe.n == 0:
        raise WidthscopeError("no examples: the batches were empty; check the data (n_train/n_test)")
    return ProbeResult(
        {n: torch.cat(v, 0) for n, v in probe.out.items()},
        notes=notes,
        n_examples=probe.n,
        pool=pool,
        losses=torch.cat(probe.losses),
        act_sq={n: torch.cat(v, 0) for n, v in probe.sumsq.items()},
        widths=probe.widths,
    )


def _mode_notes(model: nn.Module, modules: dict[str, nn.Module], train_mode: str) -> list[str]:
    """Refuse training-mode BatchNorm under ``'keep'``; under ``'eval'``, notes on the layers switched to eval."""
    notes: list[str] = []
    coupling = [n for n in coupling_layers(model) if modules[n].training]
    dropouts = [
        n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]
    if train_mode == "keep" and coupling:
        raise WidthscopeError(
            f"train_mode='keep' but {', '.join(coupling[:5])} {'is' if len(coupling) == 1 else 'are'} "
            "BatchNorm in training mode: its output for one example depends on the whole batch, so "
            "per-example gradients from one batched backward would be wrong. Use train_mode='eval' "
            "(running statistics) or call model.eval() first"
        )
    if train_mode == "eval":
        if coupling:
            msg = (
                f"ran {len(coupling)} BatchNorm layer(s) ({', '.join(coupling[:3])}"
                f"{', ...' if len(coupling) > 3 else ''}) in eval mode (running statistics): in "
                "training mode they couple the examples of a batch"
            )
            warnings.warn(msg, stacklevel=3)  # at collect()'s caller
            notes.append(msg)
        if dropouts:
            notes.append(f"dropout disabled (eval mode) in {len(dropouts)} layer(s)")
    return notes


class _Probe:
    """The state of one :func:`collect`: the batch's leaves, pooled gradients, activation sums of squares, losses."""

    def __init__(
        self,
        model: nn.Module,
        names: list[str],
        loss_fn: Callable | None,
        pool: str,
        dtype: torch.dtype,
        transform: Callable[[str, torch.Tensor], torch.Tensor] | None,
    ):
        self.model, self.names, self.loss_fn = model, names, loss_fn
        self.pool, self.dtype, self.transform = pool, dtype, transform
        self.device = input_device(model)  # a dispatched model's inputs go where its first block runs
        self.leaves: dict[str, tuple[torch.Tensor, nn.Module]] = {}
        self.out: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self.sumsq: dict[str, list[torch.Tensor]] = {}
        self.widths: dict[str, int] = {}
        self.losses: list[torch.Tensor] = []
        self.n = 0

    def hook(self, name: str) -> Callable:
        """Forward hook at ``name``: adds a zero leaf to the output, records its sums of squares and width."""

        def hook(module: nn.Module, inputs: Any, output: Any) -> Any:
            if name in self.leaves:
                raise WidthscopeError(
                    f"insertion point {name!r} ran twice in one forward pass (a shared module); "
                    "its per-example gradient is ambiguous: choose a module that runs once"
                )
            z, put = split_output(output, name)
            b = torch.zeros_like(z, requires_grad=True)  # a leaf: later in-place ops cannot alter it
            self.leaves[name] = (b, module)
            zd = z.detach()
            per = zd.double().pow(2).reshape(zd.shape[0], -1)
            count = torch.full((zd.shape[0],), per.shape[1], dtype=torch.float64)
            self.sumsq.setdefault(name, []).append(torch.stack([per.sum(1), count], 1).cpu())
            self.widths[name] = int(zd.shape[channel_dim(zd)]) if zd.ndim > 1 else 1
            return put(z + b)

        return hook

    def batch(self, batch: Any, bi: int) -> None:
        """Forward, per-example losses, one backward to the leaves, the pooled gradients kept."""
        names = self.names
        self.leaves.clear()
        batch = to_device(batch, self.device, float_dtype(self.model))
        with torch.enable_grad():
            losses, mask, B = run_batch(self.model, batch, self.loss_fn, bi)
        missing = [n for n in names if n not in self.leaves]
        if missing:
            raise WidthscopeError(
                f"insertion point(s) {', '.join(missing)} did not run in the forward "
                f"pass of batch {bi}; choose modules on the path to the loss"
            )
        if not isinstance(losses, torch.Tensor) or losses.shape != (B,):
            raise WidthscopeError(
                f"loss_fn must return one loss per example, shape ({B},); got "
                f"{tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__}"
            )
        if not losses.requires_grad:
            raise WidthscopeError(f"the loss of batch {bi} does not depend on the insertion points {', '.join(names)}")
        leaves = [self.leaves[n][0] for n in names]
        self.losses.append(losses.detach().to("cpu", torch.float64))
        grads = torch.autograd.grad(losses.sum(), leaves, allow_unused=True)
        bad_loss = not bool(torch.isfinite(losses.detach()).all())
        for n, b, g in zip(names, leaves, grads):
            g = torch.zeros_like(b) if g is None else g
            if not bool(torch.isfinite(g).all()):
                raise WidthscopeError(
                    f"non-finite (NaN/Inf) activation gradient at insertion point {n!r} in batch {bi}"
                    f"{' (the loss itself is not finite)' if bad_loss else ''}; check the inputs "
                    "and the model (e.g. run in float32/float64 instead of float16)"
                )
            pooled = _pool(g.detach(), self.leaves[n][1], self.pool, mask).to("cpu", self.dtype)
            self.out[n].append(pooled if self.transform is None else self.transform(n, pooled))
        self.n += B
        self.leaves.clear()
