"""Per-point statistics, the ranking and the terminal tables of a certify result.

Shared by :mod:`widthscope.certify` (which probes a model) and :mod:`widthscope.samples`
(``widthscope stats``, which recomputes from saved samples): both import this module, neither
imports the other's statistics (no import cycle). ``widthscope.certify`` re-exports the names.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .._io import format_table, to_jsonable
from ..errors import WidthscopeError

__all__ = ["statistics", "ranking", "tables"]


def _check_pool(n: int, need: int, what: str, flag: str, pool: str) -> None:
    unit = "positions" if pool == "token" else "examples"
    if n < 4:
        raise WidthscopeError(f"{what} pool has {n} {unit}; the unbiased estimators need at least 4: "
                              f"raise {flag}")
    if need > n:
        raise WidthscopeError(f"{'M' if 'train' in what else 'K'}={need} is larger than the {what} pool of "
                              f"{n} {unit} (draws pick without replacement): raise {flag} to >= {need} or "
                              f"lower {'--M' if 'train' in what else '--K'}")


def statistics(train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], *,
               pairs: Sequence[tuple[int, int]], draws: int = 1000, seed: int = 0,
               estimator: str = "unbiased", pool: str = "sum", project: int | None = None,
               dims: dict[str, int] | None = None, draw_scheme: str = "shared"
               ) -> tuple[list[dict[str, Any]], list[str]]:
    """Moments, certificates and misalignment per point from pooled samples (no model needed).

    ``train[point]``, ``test[point]``: ``(n, d)`` sample vectors (projected to ``project``
    dims when ``project`` is set, with ``dims[point]`` the original ``d``). Returns the
    ``points`` rows of :func:`certify` and its notes. ``widthscope stats`` reruns exactly this
    on saved samples.
    """
    from .. import stats

    results: list[dict[str, Any]] = []
    notes: list[str] = []
    for name in train:
        # Fresh contiguous float64 copies: the same memory layout whether the samples come from
        # the probe or from a file, so the sums (and every digit of the result) agree.
        a, b = train[name].to(torch.float64).contiguous().clone(), test[name].to(torch.float64).contiguous().clone()
        _check_pool(a.shape[0], max(m for m, _ in pairs), "train", "n_train", pool)
        _check_pool(b.shape[0], max(k for _, k in pairs), "held-out", "n_test", pool)
        if project:
            from ..stats.sketch import Projector, correct_projected_cross, finalize_projected

            P = Projector(int((dims or {})[name]), project, seed=seed)
            pa = finalize_projected(stats.PrimalMoments(P.k).update(a), P)
            pb = finalize_projected(stats.PrimalMoments(P.k).update(b), P)
            mom_a, mom_b = pa.as_moments(), pb.as_moments()
            cross = correct_projected_cross(stats.cross_moments(a, b, "unbiased"), pa.raw, pb.raw, P.k)
        else:
            mom_a = stats.moments(a, estimator)
            mom_b = stats.moments(b, estimator)
            cross = stats.cross_moments(a, b, estimator)
        gram = a @ b.T  # the cross-Gram, once: a misalignment draw is the mean of an M×K block
        mis_all = stats.misalignment_from_gram(gram, pairs=pairs, draws=draws, seed=seed, scheme=draw_scheme)
        certs = []
        for (m, k), mis in zip(pairs, mis_all):
            one = stats.certificate(mom_a, M=m, K=k, estimator=estimator, populations="one")
            two = stats.certificate(cross, M=m, K=k, estimator=estimator, populations="two")
            # The reporting rule: d_align of a vacuous certificate is missing, never a number.
            certs.append({"M": m, "K": k, "one": stats.vacuous_rule(to_jsonable(one)),
                          "two": stats.vacuous_rule(to_jsonable(two)), "misalignment": to_jsonable(mis)})
        results.append({"point": name, "n_train": int(a.shape[0]), "n_test": int(b.shape[0]),
                        "d": int((dims or {}).get(name, a.shape[1])),
                        "moments_train": to_jsonable(mom_a),
                        "moments_test": to_jsonable(mom_b), "cross_moments": to_jsonable(cross),
                        "certificates": certs})
    if project:
        notes.append(f"samples randomly projected to k={project} dims (seed {seed}): moments of both "
                     "populations bias-corrected (unbiased over the projection, unbiased estimator); "
                     "the empirical misalignment is computed in the projected space")
    return results, notes


def ranking(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points by two-population ``d_align`` at the first ``(M, K)``: certified first."""
    def key(r: dict[str, Any]) -> tuple[bool, float]:
        # Certified points first; vacuous ones (d_align missing) keep their order after them.
        two = r["certificates"][0]["two"]
        return (not two["vacuous"], float(two["d_align"] or 0.0))

    out = []
    for i, r in enumerate(sorted(results, key=key, reverse=True)):
        two, one = r["certificates"][0]["two"], r["certificates"][0]["one"]
        out.append({"rank": i + 1, "point": r["point"], "d": r["d"], "d_align": two["d_align"],
                    "d_par": two["d_par"], "d_2": two["d_2"], "expectation": two["expectation"],
                    "vacuous": two["vacuous"], "reason": two["reason"], "d_align_one": one["d_align"]})
    return out


def _v(cert: dict[str, Any]) -> float | None:
    vals = [v for v in (cert.get("e_dir_train"), cert.get("e_dir_test")) if v is not None]
    return max(vals) if vals else None


def tables(result: dict[str, Any]) -> str:
    """Terminal tables: one per point (two-population rows + a one-population row), then the ranking."""
    out = []
    for r in result["points"]:
        rows = []
        for c in r["certificates"]:
            for form in ("two", "one"):
                cert = c[form]
                row = {"form": form, "M": c["M"], "K": c["K"], "S": cert["expectation"],
                       "V": _v(cert), "T": cert.get("e_cov"),
                       "d_par": cert["d_par"], "d_2": cert["d_2"], "d_align": cert["d_align"],
                       "B_exact": cert["b_exact"], "B_align": cert["b_align"]}
                if form == "two":
                    mis = c["misalignment"]
                    row.update({"misalign": mis["probability"], "low": mis["low"], "high": mis["high"]})
                rows.append(row)
        vac = {f"{f}-population: {str(c[f]['reason']).split(';')[0]}"
               for c in r["certificates"] for f in ("two", "one") if c[f]["vacuous"]}
        title = (f"{r['point']}  (d={r['d']}, n_train={r['n_train']}, n_test={r['n_test']}; "
                 "S = E[A] (a.b; one: |mu|^2), V = max(b'S_a b, a'S_b a) (one: mu'S mu), "
                 "T = tr(S_a S_b) (one: tr S^2); misalign = empirical Pr(A<=0) [95% Wilson low, high])")
        table = format_table(rows, ["form", "M", "K", "S", "V", "T", "d_par", "d_2", "d_align", "B_exact",
                                    "B_align", "misalign", "low", "high"], title=title)
        if vac:
            table += ("\n  vacuous (bounds 1; d_align missing; d_par, d_2 per term, missing where its own estimate "
                      "failed): " + "; ".join(sorted(vac, reverse=True)))
        if r.get("interventions"):
            iv = r["interventions"]
            table += "\n\n" + format_table(
                [{"eta": x["eta"], "predicted dL": x["predicted"], "actual dL": x["actual"],
                  "retention": x["retention"], "sign ok": x["sign_agrees"]} for x in iv],
                title=f"  {iv[0]['probe']} intervention at {r['point']} (M={iv[0]['M']}, K={iv[0]['K']}): "
                      "held-out loss change, first-order prediction vs measured")
        out.append(table)
    out.append(format_table(result["ranking"], ["rank", "point", "d", "d_align", "d_par", "d_2",
                                                "expectation", "d_align_one"],
                            title="ranking by two-population d_align (largest first)"))
    for n in result["notes"]:
        out.append(f"note: {n}")
    return "\n\n".join(out)
