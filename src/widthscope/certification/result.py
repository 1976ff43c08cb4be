"""Typed certify results: :class:`CertifyResult` and its :class:`PointCertificate` rows.

They wrap the JSON a certify run writes without re-shaping it (:meth:`CertifyResult.to_dict`, ``from_dict``).

Example::

    >>> import torch, torch.nn as nn
    >>> import widthscope as ws
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 3))
    >>> x, y = torch.randn(96, 6), torch.randint(0, 3, (96,))
    >>> train = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    >>> res = ws.certify(net, train, [(x[64:], y[64:])], M=[8, 16], draws=100, progress=False)
    >>> [p.point for p in res.points], res.options.draws
    (['0', '1'], 100)
    >>> res.point("1").certificate(8).d_align == res.to_dict()["points"][1]["certificates"][0]["two"]["d_align"]
    True
    >>> list(res.to_pandas().columns[:4])
    ['point', 'M', 'K', 'd']
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import WidthscopeError, WidthscopeTypeError
from ..options import CertifyOptions

__all__ = ["CertifyResult", "PointCertificate", "Certificate"]


@dataclasses.dataclass(frozen=True)
class Certificate:
    """One ``(M, K)`` certificate: the two-population headline numbers and misalignment (``raw``: all)."""

    M: int
    K: int
    d_par: float | None
    d_2: float | None
    d_align: float | None
    b_exact: float | None
    b_align: float | None
    misalignment: float | None
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, c: Mapping[str, Any]) -> Certificate:
        two = c.get("two") or {}
        mis = c.get("misalignment") or {}
        return cls(
            M=int(c["M"]),
            K=int(c["K"]),
            misalignment=mis.get("probability"),
            **{k: two.get(k) for k in _HEADLINE[:-1]},
            raw=c,
        )


@dataclasses.dataclass(frozen=True)
class PointCertificate:
    """One insertion point's statistics: dimension, pool sizes, moments, certificates, interventions."""

    point: str
    d: int
    n_train: int
    n_test: int
    moments_train: Mapping[str, Any]
    moments_test: Mapping[str, Any]
    cross_moments: Mapping[str, Any]
    certificates: tuple[Certificate, ...]
    interventions: tuple[Mapping[str, Any], ...]
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, p: Mapping[str, Any]) -> PointCertificate:
        if not isinstance(p, Mapping) or "point" not in p:
            raise WidthscopeTypeError(
                f"PointCertificate.from_dict(p=...): p must be one 'points' entry of a certify "
                f"result (a mapping with 'point'), got {type(p).__name__}"
            )
        return cls(
            point=str(p["point"]),
            d=int(p.get("d") or 0),
            n_train=int(p.get("n_train") or 0),
            n_test=int(p.get("n_test") or 0),
            moments_train=p.get("moments_train") or {},
            moments_test=p.get("moments_test") or {},
            cross_moments=p.get("cross_moments") or {},
            certificates=tuple(Certificate.from_dict(c) for c in p.get("certificates") or []),
            interventions=tuple(p.get("interventions") or []),
            raw=p,
        )

    def certificate(self, M: int, K: int | None = None) -> Certificate:
        """The certificate at ``(M, K)`` (``K`` defaults to the first one recorded for ``M``)."""
        for c in self.certificates:
            if c.M == M and (K is None or c.K == K):
                return c
        have = ", ".join(f"({c.M}, {c.K})" for c in self.certificates)
        raise WidthscopeError(
            f"point {self.point!r} has no certificate at M={M}" + (f", K={K}" if K else "") + f"; it has {have}"
        )


@dataclasses.dataclass(frozen=True)
class CertifyResult:
    """A certify run's result: settings, one :class:`PointCertificate` per point, ranking, notes, timing, options."""

    settings: Mapping[str, Any]
    points: tuple[PointCertificate, ...]
    ranking: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...]
    timing: Mapping[str, Any]
    options: CertifyOptions | None
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, res: Mapping[str, Any]) -> CertifyResult:
        """From the dict :func:`widthscope.certification.certify_dict` returns or a certify results JSON."""
        if not isinstance(res, Mapping):
            raise WidthscopeTypeError(
                f"CertifyResult.from_dict(res=...): res must be a mapping (the JSON widthscope "
                f"certify writes), got {type(res).__name__}"
            )
        if not isinstance(res.get("points"), list):
            raise WidthscopeError(
                "CertifyResult.from_dict(res=...): a certify result has a 'points' list (the JSON "
                "widthscope certify writes)"
            )
        recorded = (res.get("options") or {}).get("certify")
        opts = CertifyOptions.from_dict(recorded) if recorded else _options_from_settings(res.get("settings") or {})
        return cls(
            settings=res.get("settings") or {},
            points=tuple(PointCertificate.from_dict(p) for p in res["points"]),
            ranking=tuple(res.get("ranking") or []),
            notes=tuple(res.get("notes") or []),
            timing=res.get("timing") or {},
            options=opts,
            raw=res,
        )

    @classmethod
    def load(cls, path: str | Path) -> CertifyResult:
        """Read a results JSON written by ``widthscope certify --out``."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise WidthscopeError(f"cannot read certify result {str(path)!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict, in the results file's format."""
        return dict(self.raw)

    def point(self, name: str) -> PointCertificate:
        for p in self.points:
            if p.point == name:
                return p
        raise WidthscopeError(
            f"no point {name!r} in this result; its points: {', '.join(p.point for p in self.points)}"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per point and ``(M, K)``: the headline numbers (two-population form)."""
        return [
            {"point": p.point, "M": c.M, "K": c.K, "d": p.d, "n_train": p.n_train, "n_test": p.n_test}
            | {k: getattr(c, k) for k in _HEADLINE}
            for p in self.points
            for c in p.certificates
        ]

    def to_pandas(self) -> Any:
        """:meth:`rows` as a ``pandas.DataFrame`` (pandas is imported here: an optional dependency)."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=["point", "M", "K", "d", "n_train", "n_test", *_HEADLINE])


_HEADLINE = ("d_par", "d_2", "d_align", "b_exact", "b_align", "misalignment")


def _options_from_settings(s: Mapping[str, Any]) -> CertifyOptions | None:
    """Options of an older result from its ``settings``; None where they do not determine valid options."""
    keys = {f.name for f in dataclasses.fields(CertifyOptions)}
    known = {k: v for k, v in s.items() if k in keys and v is not None and k not in ("points", "interventions")}
    known["interventions"] = s.get("interventions") or "none"
    if s.get("etas") is not None:
        known.pop("n_etas", None)
        known.pop("max_rel_step", None)
    try:
        return CertifyOptions(**known)
    except (WidthscopeError, TypeError):
        return None
