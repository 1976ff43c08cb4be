"""Numbers as every report page reads and writes them: missing values as '–' (never ``nan``),
p-values floored at :data:`P_FLOOR`, and a natural sort key (w64 before w128)."""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

MISSING = "–"
P_FLOOR = 1e-6

_NAN = re.compile(r"(?<![\w.])[+-]?nan(?![\w])", re.IGNORECASE)
_TEXT = re.compile(r"(>)([^<]*)(<)")


def finite(v: Any) -> TypeGuard[float]:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def as_number(v: Any) -> float:
    """``v`` as a float; NaN when missing, not a number or not finite."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def num(v: Any, spec: str = ".3g") -> str:
    """``v`` formatted with ``spec``; '–' when missing or not finite."""
    return format(float(v), spec) if finite(v) else MISSING


def pval(p: Any) -> str:
    """'0.012', '< 1e-6' below the floor, '–' when missing."""
    if not finite(p):
        return MISSING
    return "< 1e-6" if p < P_FLOOR else f"{p:.2g}"


def p_eq(p: Any) -> str:
    """'= 0.012', '< 1e-6' or '–': a p-value after 'p '."""
    s = pval(p)
    return s if s.startswith("<") or s == MISSING else f"= {s}"


def interval(lo: Any, hi: Any, spec: str = ".3g") -> str:
    return f"[{num(lo, spec)}, {num(hi, spec)}]"


def no_nan(text: str, *, markup: bool = False) -> str:
    """Every stand-alone ``nan`` replaced by '–'. With ``markup``, only text between tags is touched
    (attributes such as base64 image data are left alone)."""
    if not markup:
        return _NAN.sub(MISSING, text)
    return _TEXT.sub(lambda m: m.group(1) + _NAN.sub(MISSING, m.group(2)) + m.group(3), text)


def natural_key(s: Any) -> tuple:
    """Sort key reading digit runs as numbers: 'w64' < 'w128' < 'w256', 'c9.json' < 'c10.json'."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(s))
    return tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts))
