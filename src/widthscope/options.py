"""Options as data: one frozen dataclass per command; each field (:func:`option`) carries what validation,
the command line (:func:`widthscope.cli.args.add_options`) and the records (:meth:`Options.to_dict`) need.

Example::

    >>> from widthscope.options import CertifyOptions
    >>> opts = CertifyOptions(M=(16, 32), draws=200)
    >>> opts.pairs
    [(16, 16), (32, 32)]
    >>> CertifyOptions(draws=0)
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --draws 0: must be a whole number in 1..1000000 (resamples)
    >>> CertifyOptions.from_dict(opts.to_dict()) == opts
    True
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ClassVar, Literal, TypeVar

from .errors import WidthscopeError, WidthscopeTypeError
from .registry import INTERVENTION_KINDS as _INTERVENTION_REGISTRY

T = TypeVar("T", bound="Options")
Estimator = Literal["unbiased", "plugin"]  # the same as widthscope.stats.Estimator (options import no torch)

DEFAULT_M = (16, 32, 64, 128)
DEFAULT_N_ETAS = 4  # the decades 1e-4 .. 1e-1 of the activation's RMS (docs/interventions.md §2)
DEFAULT_MAX_REL_STEP = 0.1
ESTIMATORS = ("unbiased", "plugin")
POOLS = ("sum", "mean", "flatten", "token")
# the built-in intervention kinds (widthscope.registry.INTERVENTION_KINDS)
INTERVENTION_KINDS = _INTERVENTION_REGISTRY.names()
INTERVENTIONS = (*INTERVENTION_KINDS, "none")
DRAW_SCHEMES = ("shared", "per-pair")
MAX_ETAS = 100  # each step evaluates the held-out pool at every point
MAX_POOL = 10**7
SEED_MAX = 2**32 - 1  # every seed option: a whole number in 0..SEED_MAX


def option(
    default: Any = None,
    *,
    help: str,
    flag: str | None = None,
    choices: Sequence[Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    unit: str = "",
    kind: str | None = None,
    metavar: str | None = None,
    cli: bool = True,
    above: tuple[float, str] | None = None,
    positive: bool = False,
    fallback: Any = None,
    applies: str | None = None,
    unknown: str | None = None,
) -> Any:
    """A dataclass field with what the command line, validation and the docs need. ``kind``: ``int``,
    ``float``, ``bool``, ``str``, ``strs``, ``ints``/``floats`` (comma lists; None: the default's type);
    ``lo``/``hi``: inclusive range; ``above=(bound, words)``: exclusive lower bound; ``fallback``: what
    ``None`` stands for; ``applies``: a :data:`widthscope.validate.GROUPS` name."""
    if kind is None:
        kind = {bool: "bool", int: "int", float: "float", tuple: "ints"}.get(type(default), "str")
    meta = {k: v for k, v in locals().items() if k != "default"}
    meta["choices"] = tuple(choices) if choices is not None else None
    return dataclasses.field(default=default, metadata=meta)


def check_keywords(
    fn: str,
    cls: type[Options],
    keywords: Mapping[str, Any],
    *,
    also: Sequence[str] = (),
    words: str = "unknown setting {key!r}",
    hints: Mapping[str, str] | None = None,
) -> None:
    """Refuse the first keyword of ``fn`` that is neither a field of ``cls`` nor in ``also``, with a hint."""
    names = [f.name for f in dataclasses.fields(cls)]
    known = [*names, *also]
    for key in keywords:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1)
        hint = (hints or {}).get(key) or (f"did you mean {close[0]}? " if close else "")
        tail = f"; also {', '.join(also)}" if also else ""
        raise WidthscopeTypeError(
            f"{fn}({key}=...): {words.format(key=key)}; {hint}the settings are {', '.join(names)}{tail}"
        )


def with_keywords(
    fn: str,
    options: T | None,
    cls: type[T],
    keywords: Mapping[str, Any],
    *,
    also: Sequence[str] = (),
    words: str = "unknown setting {key!r}",
) -> T:
    """``options`` (default ``cls()``) with ``fn``'s keywords applied one by one, each validated."""
    if options is not None and not isinstance(options, cls):
        raise WidthscopeTypeError(f"{fn}(options=...): options must be a {cls.__name__}, got {type(options).__name__}")
    check_keywords(fn, cls, keywords, also=also, words=words)
    base = options if options is not None else cls()
    for key, value in keywords.items():
        try:
            base = dataclasses.replace(base, **{key: value})
        except WidthscopeError as exc:
            raise type(exc)(f"{fn}({key}=...): {exc}") from None
    return base


def flag_name(name: str) -> str:
    """The command-line flag of an argparse dest: ``n_train`` -> ``--n-train``."""
    return "--" + name.replace("_", "-")


def given(args: Any, dest: str) -> bool:
    """Was ``dest`` given on the command line (its argument defaults to ``None``, a switch to ``False``)?"""
    v = getattr(args, dest, None)
    return v is not None and v is not False


def num_list(text: str, flag: str, cast: Callable[[str], Any]) -> list:
    """``"16,32,64"`` -> ``[16, 32, 64]`` (empty items dropped), one error line naming ``flag``."""
    words = "whole numbers, e.g. 16,32,64" if cast is int else "numbers, e.g. 1e-3,1e-2"
    try:
        return [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise WidthscopeTypeError(f"{flag} {text!r}: expected comma-separated {words}") from None


def check_steps(flag: str, text: str, steps: Sequence[float]) -> None:
    """Intervention step sizes: positive, finite, at most :data:`MAX_ETAS`."""
    if any(not (v > 0 and math.isfinite(v)) for v in steps):
        raise WidthscopeError(f"{flag} {text!r}: step sizes must be positive finite numbers")
    if len(steps) > MAX_ETAS:
        raise WidthscopeError(
            f"{flag}: {len(steps)} step sizes; at most {MAX_ETAS} (each one evaluates the held-out pool at every point)"
        )


SHARED: list[type[Options]] = []  # the classes of the shared range table, in import order


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1e6:
        return str(int(v))
    return str(v)


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of every options class: validation from the fields' metadata, dict round trip."""

    # True (in the class itself): its whole-number fields are rows of widthscope.validate.RANGES
    SHARED_RANGES: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("SHARED_RANGES") and cls not in SHARED:
            SHARED.append(cls)

    @classmethod
    def flag(cls, name: str) -> str:
        f = {f.name: f for f in dataclasses.fields(cls)}[name]
        return f.metadata.get("flag") or flag_name(name)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "kind" in f.metadata and value is not None:
                norm = self._normalise(f.name, f.metadata, value)
                if norm is not value:
                    object.__setattr__(self, f.name, norm)
        self.check()

    def _normalise(self, name: str, meta: Mapping[str, Any], value: Any) -> Any:
        """Type and range of one field; lists become tuples (hashable, frozen)."""
        flag, kind, lo, hi, what = self.flag(name), meta["kind"], meta["lo"], meta["hi"], meta["unit"]
        tail = f" ({what})" if what else ""
        if meta.get("positive"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise WidthscopeTypeError(
                    f"{flag} {value!r}: must be a positive finite number, not {type(value).__name__}"
                )
            if not (math.isfinite(value) and value > 0):
                raise WidthscopeError(f"{flag} {value}: must be a positive finite number")
            return float(value)
        if kind == "bool":
            if not isinstance(value, bool):
                raise WidthscopeTypeError(f"{flag} {value!r}: must be true or false")
            return value
        if kind == "strs":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
                raise WidthscopeTypeError(f"{flag} {value!r}: expected a list of names (or one comma-separated string)")
            names = tuple(v.strip() for v in items if v.strip())
            if not names and isinstance(value, str):  # '--points ,': a typo, not a request for the defaults
                raise WidthscopeError(
                    f"{flag} is empty ({value!r} names nothing): give comma-separated names, or drop {flag}"
                )
            return names or None  # an empty list (a config's points = []): the defaults
        if kind in ("ints", "floats"):
            items = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            if isinstance(items, str):
                items = num_list(items, flag, int if kind == "ints" else float)
            try:
                seq = list(items)
            except TypeError:
                raise WidthscopeTypeError(f"{flag} {value!r}: expected a list of numbers") from None
            if not seq:
                raise WidthscopeError(f"{flag} is empty; give comma-separated numbers")
            shown = repr(value) if isinstance(value, str) else None  # command-line text: named as typed
            return tuple(self._number(flag, kind[:-1], v, lo, hi, tail, listed=True, shown=shown) for v in seq)
        above = meta.get("above")
        if kind == "float" and above is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not (math.isfinite(value) and value > above[0]):
                raise WidthscopeError(f"{flag} {value:g}: must be a finite number above {above[1]}{tail}")
        if kind in ("int", "float"):
            return self._number(flag, kind, value, lo, hi, tail)
        if kind == "str" and not isinstance(value, str):
            raise WidthscopeTypeError(f"{flag} {value!r}: must be a string")
        if meta["choices"] is not None and value not in meta["choices"]:
            named = f" ({meta['unknown']} {value!r})" if meta.get("unknown") else ""
            raise WidthscopeError(f"{flag} {value!r}: choose one of {', '.join(map(str, meta['choices']))}{named}")
        return value

    @staticmethod
    def _number(
        flag: str,
        kind: str,
        v: Any,
        lo: float | None,
        hi: float | None,
        tail: str,
        listed: bool = False,
        shown: str | None = None,
    ) -> Any:
        """``v`` checked against its kind and range; an error names ``shown`` (the typed text) or ``v``."""
        if isinstance(v, str) and listed:  # an entry of a list given as text (a config file)
            try:
                v = int(v) if kind == "int" else float(v)
            except ValueError:
                raise WidthscopeTypeError(
                    f"{flag} {v!r}: expected {'whole numbers' if kind == 'int' else 'numbers'}"
                ) from None
        whole = "a whole number" if kind == "int" else "a finite number"
        real = isinstance(v, (int, float)) and not isinstance(v, bool)
        ok_type = real and (isinstance(v, int) if kind == "int" else math.isfinite(v))
        rng = (
            f" in {_fmt(lo)}..{_fmt(hi)}"
            if lo is not None and hi is not None
            else f" >= {_fmt(lo)}"
            if lo is not None
            else f" <= {_fmt(hi)}"
            if hi is not None
            else ""
        )
        what = "every entry " if listed else ""
        if not ok_type and not (kind == "float" and isinstance(v, float)):  # nan/inf: a float, a bad value
            raise WidthscopeTypeError(
                f"{flag} {shown or repr(v)}: {what}must be {whole}{rng}{tail}, not {type(v).__name__}"
            )
        if not ok_type or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise WidthscopeError(f"{flag} {shown or v}: {what}must be {whole}{rng}{tail}")
        return float(v) if kind == "float" else v

    def check(self) -> None:
        """Relations between fields (overridden by the classes that have some)."""

    # ------------------------------------------------------------------ records
    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tuples as lists)."""
        return {
            f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in dataclasses.fields(self)
        }

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any], *, strict: bool = True) -> T:
        """The options a :meth:`to_dict` recorded; unknown keys are refused (``strict``)."""
        if not isinstance(data, Mapping):
            raise WidthscopeTypeError(
                f"{cls.__name__}.from_dict: expected a mapping of settings (what to_dict() returns), "
                f"got {type(data).__name__}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(map(str, set(data) - names))
        if unknown and strict:
            raise WidthscopeError(
                f"{cls.__name__}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self: T, **changes: Any) -> T:
        return dataclasses.replace(self, **changes)

    @classmethod
    def given(cls, args: Any) -> set[str]:
        """The fields of ``cls`` given in the parsed command line ``args``."""
        return {f.name for f in dataclasses.fields(cls) if given(args, f.name)}

    @classmethod
    def from_args(cls: type[T], args: Any, base: T | None = None) -> T:
        """``base`` (default ``cls()``) with every option given in ``args``, validated once."""
        values = {name: getattr(args, name) for name in cls.given(args)}
        return cls(**values) if base is None else dataclasses.replace(base, **values)

    @classmethod
    def fields_help(cls) -> list[tuple[str, str, Any, str]]:
        """(flag, kind, default, help) of every command-line field: the reference table of the docs."""
        return [
            (cls.flag(f.name), f.metadata["kind"], f.default, f.metadata["help"])
            for f in dataclasses.fields(cls)
            if f.metadata.get("cli", True) and "kind" in f.metadata
        ]


@dataclasses.dataclass(frozen=True)
class InterventionOptions(Options):
    """Zero-init residual interventions at every point: predicted vs actual held-out loss change."""

    interventions: str = option(
        "bias",
        choices=INTERVENTIONS,
        help="direct zero-init residual intervention at every point: predicted vs actual "
        "held-out loss change (none: skip)",
    )
    etas: tuple[float, ...] | None = option(
        None,
        kind="floats",
        lo=0.0,
        metavar="E1,E2,...",
        help="intervention step sizes, comma list (default: --n-etas steps scaled to the point)",
    )
    n_etas: int = option(
        DEFAULT_N_ETAS,
        lo=1,
        hi=MAX_ETAS,
        unit="step sizes",
        metavar="E",
        help=f"steps of the default intervention grid: step RMS 1e-4..--max-rel-step of the "
        f"activation's, log-spaced (default {DEFAULT_N_ETAS}: the decades up to "
        f"{DEFAULT_MAX_REL_STEP:g}; --n-etas 9 --max-rel-step 1 gives the half-decades up to "
        "1, 9/4 the cost)",
    )
    max_rel_step: float = option(
        DEFAULT_MAX_REL_STEP,
        above=(1e-4, "the smallest step (1e-4)"),
        metavar="R",
        help=f"largest step of the default grid, its RMS entry over the activation's "
        f"(default {DEFAULT_MAX_REL_STEP:g}; 1 moves the stream by its own size)",
    )

    def check(self) -> None:
        if self.etas is not None:
            check_steps("--etas", ",".join(map(str, self.etas)), self.etas)

    @property
    def kind(self) -> str | None:
        """The intervention run (``None`` for none), as :func:`widthscope.probe.interventions.intervene` takes it."""
        return None if self.interventions == "none" else self.interventions


@dataclasses.dataclass(frozen=True)
class CertifyOptions(InterventionOptions):
    """The settings of a certify run; ``M``/``K``: the certificates' sample sizes (``K=None``: ``K = M``;
    one ``K`` for every ``M``; or one per ``M``)."""

    SHARED_RANGES = True

    M: tuple[int, ...] = option(
        DEFAULT_M,
        kind="ints",
        lo=1,
        hi=MAX_POOL,
        metavar="M1,M2,...",
        help="train sample sizes, comma list (default 16,32,64,128)",
    )
    K: tuple[int, ...] | None = option(
        None,
        kind="ints",
        lo=1,
        hi=MAX_POOL,
        metavar="K1,K2,...",
        help="held-out sample sizes, comma list (default: K = M)",
    )
    draws: int = option(
        1000, lo=1, hi=10**6, unit="resamples", help="resamples for empirical misalignment (default 1000)"
    )
    seed: int = option(0, lo=0, hi=SEED_MAX, help="seed for data subsets and resampling")
    estimator: Estimator = option("unbiased", choices=ESTIMATORS, help="unbiased (default) or plugin")
    pool: str = option("sum", choices=POOLS, help="pooling of positions into a sample vector (default sum)")
    draw_scheme: str = option(
        "shared",
        choices=DRAW_SCHEMES,
        help="misalignment draws: shared (one subset per draw for every (M, K); default) or "
        "per-pair (the published flip script's draws: the same --seed gives its subsets)",
    )
    project: int | None = option(
        None,
        kind="int",
        lo=2,
        metavar="K",
        unit="projected dimensions",
        help="randomly project sample vectors to K dims while collecting (memory O(n*K) "
        "instead of O(n*d)); see docs/performance.md",
    )
    points: tuple[str, ...] | None = option(
        None, kind="strs", help="comma-separated insertion points (default: every block output)"
    )
    train_mode: str = option(
        "eval",
        choices=("eval", "keep"),
        cli=False,
        help="the mode the model is probed in (eval: dropout off, BatchNorm running stats; keep: the model's own mode)",
    )

    def check(self) -> None:
        super().check()
        if self.K is not None and len(self.K) not in (1, len(self.M)):
            raise WidthscopeError(
                f"K has {len(self.K)} values but M has {len(self.M)}: give one K, or one per M "
                "(pairs (M[i], K[i])), or none for K = M"
            )
        if self.project is not None and self.estimator != "unbiased":
            raise WidthscopeError(
                f"--project corrects the unbiased estimators only, not --estimator "
                f"{self.estimator}: add --estimator unbiased, or drop --project"
            )

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The ``(M, K)`` pairs the certificates are computed at."""
        Ks = self.M if self.K is None else self.K * len(self.M) if len(self.K) == 1 else self.K
        return list(zip(self.M, Ks))

    @classmethod
    def published(cls, **changes: Any) -> CertifyOptions:
        """The published scripts' protocol (plug-in estimators, sum pooling, M = K, per-pair draws)."""
        return cls(**{**PROTOCOLS["published"], **changes})


@dataclasses.dataclass(frozen=True)
class CertifyRunOptions(Options):
    """How a certify run executes: probe batches, device, the built-in model's training."""

    SHARED_RANGES = True

    batch_size: int = option(32, lo=1, hi=10**6, unit="examples per batch", help="probe batch size")
    device: str = option("cpu", help="torch device, e.g. cpu, cuda, cuda:1")
    train_steps: int = option(
        60, lo=1, hi=10**8, unit="steps", help="optimizer steps for --model builtin (default 60, a few seconds)"
    )


# The certify settings of each --protocol (its input settings: data.spec); options given override them.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "published": {
        "estimator": "plugin",
        "pool": "sum",
        "M": DEFAULT_M,
        "K": None,
        "draws": 1000,
        "interventions": "none",
        "draw_scheme": "per-pair",
    },
    "default": {},
}
