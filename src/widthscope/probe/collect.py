r"""Per-example activation gradients at insertion points, from one backward per batch.

For each example the probe returns ``q = ∂ℓ/∂z`` at an insertion point's output ``z``, pooled
(``sum``: the gradient of a zero-initialised shared bias, ``mean``, ``flatten``, ``token``). A
forward hook adds a zero leaf ``b`` to each hooked output and ``torch.autograd.grad`` is taken
with respect to those only (parameters frozen, model unchanged); one backward of the summed loss is
exact while examples do not interact. Details: docs/certify.md §1, docs/maths-alignment.md.

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

import inspect
import warnings
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Sequence

import torch
import torch.nn as nn

from .. import _args
from .._io import progress as _progress
from ..errors import WidthscopeError
from .insert import channel_dim
from .losses import causal_lm_loss, default_loss, logits_of, masked_lm_loss
from .offload import input_device
from .points import resolve_points

__all__ = [
    "collect",
    "ProbeResult",
    "batched",
    "causal_lm_loss",
    "masked_lm_loss",
    "default_loss",
    "POOLS",
    "coupling_layers",
]

POOLS = ("sum", "mean", "flatten", "token")
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
    """``{point: Tensor (n, d)}`` plus what the caller should know about the run.

    Attributes: ``notes`` (list of sentences, e.g. that BatchNorm ran in eval mode),
    ``n_examples`` (examples seen; with ``pool="token"`` rows are positions), ``pool``,
    ``losses`` (per-example losses of the forward pass), ``act_sq`` (point -> per-example sum of
    squared output entries and their count, for :func:`activation_rms` over any subset) and
    ``widths``, so interventions need not run those passes again.
    """

    def __init__(
        self,
        *args: Any,
        notes: list[str] | None = None,
        n_examples: int = 0,
        pool: str = "sum",
        losses: torch.Tensor | None = None,
        act_sq: dict[str, torch.Tensor] | None = None,
        widths: dict[str, int] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.notes = list(notes or [])
        self.n_examples = n_examples
        self.pool = pool
        self.losses = losses  # per-example losses (n,), float64: what the forward pass measured
        self.act_sq = dict(act_sq or {})  # point -> (n, 2): per example Σ z², number of entries
        self.widths = dict(widths or {})  # point -> channel width of its output

    @property
    def act_rms(self) -> dict[str, tuple[float, int]]:
        """point -> (RMS entry of its output over all examples, channel width)."""
        return {p: (activation_rms(v), self.widths.get(p, 0)) for p, v in self.act_sq.items()}


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
    n = x.shape[0]
    if y is not None and y.shape[0] != n:
        raise WidthscopeError(f"x has {n} examples but y has {y.shape[0]}")
    out = []
    for i in range(0, n, batch_size):
        out.append(x[i : i + batch_size] if y is None else (x[i : i + batch_size], y[i : i + batch_size]))
    return out


def _accepts(model: nn.Module, kw: str) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return kw in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def float_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's floating parameters (inputs are cast to it), or None."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def to_device(obj: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move a batch to ``device``; floating tensors (images, features) also to ``dtype``, so a
    model run in bfloat16 or float64 (``--dtype``) takes the same data. Token ids stay integers."""
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


def run_batch(
    model: nn.Module, batch: Any, loss_fn: Callable | None, bi: int
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Forward one batch; returns (per-example losses (B,), attention mask or None, B).

    A torch error inside the model or the loss (wrong input size, class index out of range,
    x/y batch mismatch) becomes one WidthscopeError naming the batch and its shapes.
    """
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
    mask = None
    if isinstance(batch, Mapping) or (isinstance(batch, torch.Tensor) and not batch.is_floating_point()):
        # Causal LM: LongTensor ids, or {"input_ids", optional "attention_mask", "labels"}.
        if isinstance(batch, Mapping):
            if "input_ids" not in batch:
                raise WidthscopeError(f"batch {bi} is a dict without 'input_ids' (keys: {sorted(batch)})")
            ids = batch["input_ids"]
            mask = batch.get("attention_mask")
            labels = batch.get("labels")
        else:
            ids, labels = batch, None
        if ids.ndim != 2:
            raise WidthscopeError(f"batch {bi}: input_ids must be (B, T), got shape {tuple(ids.shape)}")
        kwargs = {}
        if mask is not None:
            if _accepts(model, "attention_mask"):
                kwargs["attention_mask"] = mask
            else:
                # Without a mask argument only right padding is exact for a causal model.
                m = mask.bool()
                if bool((m[:, 1:] & ~m[:, :-1]).any()):
                    raise WidthscopeError(
                        f"batch {bi}: {type(model).__name__}.forward takes no attention_mask and the "
                        "padding is not on the right; pad sequences on the right"
                    )
        output = model(ids, **kwargs)
        if loss_fn is not None:
            losses = loss_fn(output, batch)
        else:
            losses = causal_lm_loss(logits_of(output), ids, mask, labels)
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


# ----------------------------------------------------------------------------- pooling
def _feature_dim(module: nn.Module, z: torch.Tensor) -> int:
    if z.ndim <= 2:
        return 1
    if z.ndim == 3 and not isinstance(module, _CHANNELS_FIRST_1D):
        return 2  # sequences: (B, T, N)
    return 1  # conv maps: (B, C, ...)


def _pool(q: torch.Tensor, fdim: int, pool: str, mask: torch.Tensor | None) -> torch.Tensor:
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


# ----------------------------------------------------------------------------- collect
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

    Args:
        model: any ``nn.Module`` (our models, HF ``LlamaForCausalLM``/``GPTNeoXForCausalLM``, ...).
        batches: iterable of ``(x, y)`` pairs, LongTensors of token ids ``(B, T)``, or dicts with
            ``input_ids`` (and optionally ``attention_mask``, ``labels``).
        points: module names (list or comma string); ``None`` -> :func:`insertion_points`.
        loss_fn: ``loss_fn(output, y) -> (B,)`` per-example losses (for LM batches ``y`` is the
            batch). Default: cross-entropy / summed squared error / causal-LM mean token loss.
        pool: ``"sum"`` | ``"mean"`` | ``"flatten"`` | ``"token"`` (see the module docstring).
        train_mode: ``"eval"`` runs the whole model in eval mode (BatchNorm uses running
            statistics, dropout is off) and says so; ``"keep"`` keeps the current modes and
            refuses BatchNorm in training mode (it couples the examples of a batch).
        progress: show a progress bar over batches.
        dtype: dtype of the returned samples (accumulated on the CPU).
        transform: ``transform(point, samples) -> samples`` applied to each batch's pooled
            ``(B, d)`` samples before they are kept, e.g. a random projection
            (:class:`widthscope.stats.sketch.Projector`) so memory is ``O(n·k)`` not ``O(n·d)``.

    Returns:
        :class:`ProbeResult`: ``{point: Tensor (n, d)}`` with ``.notes`` and ``.n_examples``.
        The model's modes and ``requires_grad`` flags are restored; no parameter ``.grad`` is
        created or changed.
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
    if pool not in POOLS:
        raise WidthscopeError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
    if train_mode not in TRAIN_MODES:
        raise WidthscopeError(f"unknown train_mode {train_mode!r}; choose 'eval' or 'keep'")
    names = resolve_points(model, points)
    modules = dict(model.named_modules())
    notes = _mode_notes(model, modules, train_mode)

    modes = {m: m.training for m in model.modules()}
    flags = [(p, p.requires_grad) for p in model.parameters()]
    device = input_device(model)  # a dispatched model's inputs go where its first block runs

    state: dict[str, tuple[torch.Tensor, nn.Module]] = {}
    out: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    sumsq: dict[str, list[torch.Tensor]] = {}
    widths: dict[str, int] = {}
    all_losses: list[torch.Tensor] = []
    handles = []
    n_examples = 0
    n_batches = 0
    try:
        if train_mode == "eval":
            model.eval()
        for p, _ in flags:
            p.requires_grad_(False)
        for n in names:
            handles.append(modules[n].register_forward_hook(_make_hook(n, state, sumsq, widths)))
        total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
        for bi, batch in enumerate(_progress(batches, total=total, desc="probe", disable=None if progress else True)):
            n_examples += _probe_batch(
                model,
                batch,
                bi,
                names,
                state,
                device,
                loss_fn=loss_fn,
                pool=pool,
                dtype=dtype,
                transform=transform,
                out=out,
                all_losses=all_losses,
            )
            n_batches += 1
            state.clear()
    finally:
        for h in handles:
            h.remove()
        for p, flag in flags:
            p.requires_grad_(flag)
        for m, mode in modes.items():
            m.training = mode
        state.clear()
    if n_examples == 0:
        raise WidthscopeError("no examples: the batches were empty; check the data (n_train/n_test)")
    return ProbeResult(
        {n: torch.cat(v, 0) for n, v in out.items()},
        notes=notes,
        n_examples=n_examples,
        pool=pool,
        losses=torch.cat(all_losses),
        act_sq={n: torch.cat(v, 0) for n, v in sumsq.items()},
        widths=widths,
    )


def _mode_notes(model: nn.Module, modules: dict[str, nn.Module], train_mode: str) -> list[str]:
    """Refuse batch-coupling layers under ``train_mode='keep'``; under ``'eval'`` the notes
    (and a warning) saying which BatchNorm / dropout layers run in eval mode."""
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


def _make_hook(
    name: str,
    state: dict[str, tuple[torch.Tensor, nn.Module]],
    sumsq: dict[str, list[torch.Tensor]],
    widths: dict[str, int],
) -> Callable:
    """Forward hook at point ``name``: adds a zero leaf ``b`` to its output (kept in ``state``)
    and records the activations' per-example sum of squares and the point's width."""

    def hook(module: nn.Module, inputs: Any, output: Any) -> Any:
        if name in state:
            raise WidthscopeError(
                f"insertion point {name!r} ran twice in one forward pass (a shared module); "
                "its per-example gradient is ambiguous: choose a module that runs once"
            )
        z, put = split_output(output, name)
        # Zero bias of z's shape: d(loss)/d(bias) == d(loss)/dz; a leaf, so later in-place
        # ops on the output cannot alter it, and it lets grads flow with frozen parameters.
        b = torch.zeros_like(z, requires_grad=True)
        state[name] = (b, module)
        zd = z.detach()

        per = zd.double().pow(2).reshape(zd.shape[0], -1)
        sumsq.setdefault(name, []).append(
            torch.stack([per.sum(1), torch.full((zd.shape[0],), per.shape[1], dtype=torch.float64)], 1).cpu()
        )
        widths[name] = int(zd.shape[channel_dim(zd)]) if zd.ndim > 1 else 1
        return put(z + b)

    return hook


def _probe_batch(
    model: nn.Module,
    batch: Any,
    bi: int,
    names: list[str],
    state: dict[str, tuple[torch.Tensor, nn.Module]],
    device: torch.device,
    *,
    loss_fn: Callable | None,
    pool: str,
    dtype: torch.dtype,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None,
    out: dict[str, list[torch.Tensor]],
    all_losses: list[torch.Tensor],
) -> int:
    """One batch: forward, per-example losses, one backward to the leaves, pooled gradients
    appended to ``out`` and the losses to ``all_losses``; returns the batch size."""
    state.clear()
    batch = to_device(batch, device, float_dtype(model))
    with torch.enable_grad():
        losses, mask, B = run_batch(model, batch, loss_fn, bi)
    missing = [n for n in names if n not in state]
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
    leaves = [state[n][0] for n in names]
    all_losses.append(losses.detach().to("cpu", torch.float64))
    grads = torch.autograd.grad(losses.sum(), leaves, allow_unused=True)
    bad_loss = not bool(torch.isfinite(losses.detach()).all())
    for n, b, g in zip(names, leaves, grads):
        if g is None:
            g = torch.zeros_like(b)
        if not bool(torch.isfinite(g).all()):
            raise WidthscopeError(
                f"non-finite (NaN/Inf) activation gradient at insertion point {n!r} in batch {bi}"
                f"{' (the loss itself is not finite)' if bad_loss else ''}; check the inputs "
                "and the model (e.g. run in float32/float64 instead of float16)"
            )
        fdim = _feature_dim(state[n][1], g)
        pooled = _pool(g.detach(), fdim, pool, mask).to("cpu", dtype)
        out[n].append(pooled if transform is None else transform(n, pooled))
    return B
