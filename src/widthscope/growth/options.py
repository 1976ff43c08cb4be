"""The settings of ``grow``, ``grow-bench`` and ``grow-target``: one typed field per option
(:func:`widthscope.options.option`).

Example::

    >>> from widthscope.growth.options import GrowOptions
    >>> opts = GrowOptions(M=16, steps=50)
    >>> opts.eta_or_lr
    0.001
    >>> GrowOptions(steps=0)
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeError: --steps 0: must be a whole number in 1..100000000 (steps)
    >>> GrowOptions.from_dict(opts.to_dict()) == opts
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import WidthscopeError
from ..options import MAX_POOL, SEED_MAX, Options, option, with_keywords
from ..probe.growth import CRITERIA
from ..registry import GROWTH_OPERATORS

__all__ = ["GrowOptions", "GrowBenchOptions", "GrowTargetOptions", "DEFAULT_CRITERION", "GROW_POOLS", "with_keywords"]

DEFAULT_CRITERION = "line_search"
# a checkpoint's (train, held-out) pool sizes when not given, capped at what the data has
GROW_POOLS = (2048, 512)


def _seeds(text: str) -> Any:
    return option(None, kind="ints", lo=0, hi=SEED_MAX, metavar="S1,S2,...", help=text)


@dataclasses.dataclass(frozen=True)
class GrowOptions(Options):
    """The settings of a growth decision (:func:`widthscope.growth.grow`, ``widthscope grow``)."""

    SHARED_RANGES = True

    points: tuple[str, ...] | None = option(
        None, kind="strs", help="comma-separated candidate points (default: all block outputs)"
    )
    M: int = option(32, lo=1, hi=MAX_POOL, unit="examples", help="train samples of the certificate (default 32)")
    K: int = option(32, lo=1, hi=MAX_POOL, unit="examples", help="held-out samples of the certificate (default 32)")
    steps: int = option(200, lo=1, hi=10**8, unit="steps", help="training steps of the new block (default 200)")
    lr: float = option(1e-3, positive=True, help="AdamW learning rate (default 1e-3)")
    eta: float | None = option(None, kind="float", positive=True, help="step size of the predicted gain (default --lr)")
    block_width: int | None = option(
        None, kind="int", lo=1, hi=10**6, unit="hidden units", help="hidden width of the block (default: point width)"
    )
    train_all: bool = option(False, help="train every parameter, not only the new block")
    compare: bool = option(
        False,
        help="also grow at the worst-ranked and a random point, and train the original model for the "
        "same FLOPs (is growing better than training longer?)",
    )
    criterion: str = option(
        DEFAULT_CRITERION,
        choices=tuple(CRITERIA),
        unknown="unknown growth criterion",
        help=f"what ranks the points (default {DEFAULT_CRITERION}: unvalidated, no criterion beats random, last "
        "or middle in grow-bench's rows; bias = the old first-order gain of a bias step)",
    )
    n_rank: int | None = option(
        None,
        kind="int",
        lo=4,
        hi=MAX_POOL,
        unit="examples",
        cli=False,
        help="held-out examples that rank the points (default: half of the held-out pool; the rest "
        "measure the loss before and after)",
    )
    batch_size: int = option(
        64, lo=1, hi=10**6, unit="examples per batch", help="mini-batch size of probing and training (default 64)"
    )
    seed: int = option(0, lo=0, hi=SEED_MAX, help="seed of the pools' split, the new block and the batches (default 0)")

    @property
    def eta_or_lr(self) -> float:
        """The step size of the predicted gains: ``eta``, else ``lr``."""
        return self.lr if self.eta is None else self.eta


@dataclasses.dataclass(frozen=True)
class GrowBenchOptions(Options):
    """The settings of the growth benchmark (``widthscope grow-bench``)."""

    quick: bool = option(False, help="the small suite (under a minute on one core: docs/big-models.md)")
    seeds: tuple[int, ...] | None = _seeds("comma-separated model seeds (default 0,1,2,3,4; 0,1,2 with --quick)")
    M: int = option(32, hi=MAX_POOL, help="train samples of the certificates (default 32)")
    K: int = option(32, hi=MAX_POOL, help="held-out samples of the certificates (default 32)")

    def check(self) -> None:
        for name in ("M", "K"):
            if getattr(self, name) < 4:
                raise WidthscopeError(f"--{name} {getattr(self, name)}: must be >= 4 (the unbiased estimators need 4)")

    @property
    def suite(self) -> str:
        return "quick" if self.quick else "full"


# growth.schedule.SCHEDULES' names, without importing torch
TARGET_SCHEDULES = (
    "fixed@0.1",
    "fixed@0.25",
    "fixed@0.5",
    "fixed@0.15+0.35",
    "plateau<0.01",
    "certificate>0.5",
    "misalignment>0.1",
)


@dataclasses.dataclass(frozen=True)
class GrowTargetOptions(Options):
    """The settings of the compute-to-target benchmark (``widthscope grow-target``)."""

    quick: bool = option(False, help="the tiny suite (seconds per seed on one core: docs/big-models.md)")
    seeds: tuple[int, ...] | None = _seeds("comma-separated seeds (default 0,1,2,3,4; 0,1 with --quick)")
    steps: int | None = option(
        None,
        kind="int",
        lo=2,
        hi=10_000_000,
        unit="steps",
        help="training steps of the from-scratch target, which set the budget B (default: the suite's)",
    )
    tokens_per_param: float | None = option(
        None,
        kind="float",
        lo=0.01,
        hi=1e6,
        unit="tokens",
        flag="--tokens-per-param",
        help="the budget B in training tokens per parameter of the target (about 20 is compute-optimal; "
        "default: the suite's, 20 in the full suite); --steps sets B in steps instead",
    )
    decay: str | None = option(
        None,
        kind="str",
        choices=("none", "cosine", "linear"),
        help="learning-rate decay after warm-up, to 0.1 x lr at the end of each run's compute "
        "(default: the suite's, cosine in the full suite)",
    )
    operators: tuple[str, ...] | None = option(
        None, kind="strs", help=f"comma-separated growth operators (default all: {','.join(GROWTH_OPERATORS.names())})"
    )
    schedules: tuple[str, ...] | None = option(
        None, kind="strs", help=f"comma-separated schedules (default the suite's; all: {','.join(TARGET_SCHEDULES)})"
    )
    suite_file: str | None = option(
        None,
        kind="str",
        metavar="TOML",
        help="run the suites of this file instead (e.g. configs/grow-target-paper.toml: widths 512-3072 on a GPU)",
    )

    def check(self) -> None:
        if self.steps is not None and self.tokens_per_param is not None:
            raise WidthscopeError("--steps and --tokens-per-param both set the budget: give one")
        if self.quick and self.suite_file is not None:
            raise WidthscopeError("--quick and --suite-file: choose one (the quick suite, or the suites of the file)")
        for name, known in (("operators", GROWTH_OPERATORS.names()), ("schedules", TARGET_SCHEDULES)):
            value = getattr(self, name)
            if value is None:
                continue
            bad = [v for v in value if v not in known]
            if bad or not value:
                raise WidthscopeError(f"{self.flag(name)} {','.join(value)!r}: choose from {', '.join(known)}")

    @property
    def suite(self) -> str:
        return "quick" if self.quick else "full"
