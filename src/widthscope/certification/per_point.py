"""Per-point statistics, the ranking and the terminal tables of a certify result (certify and ``widthscope stats``)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import stats
from .._io import format_table, to_jsonable
from ..errors import WidthscopeError
from ..probe.resolution import precision_note, projected_rounding
from ..stats.estimators import Estimator
from ..stats.sketch import Projector, correct_projected_cross, finalize_projected

__all__ = ["statistics", "ranking", "tables", "rounding_bounds", "precision_notes", "SAMPLE_REL_ERROR"]

# default relative error of one sample vector from a bfloat16/float16 model, in units of the unit roundoff
SAMPLE_REL_ERROR = 4.0
_LOW = (torch.bfloat16, torch.float16)


def rounding_bounds(
    a: torch.Tensor,
    b: torch.Tensor,
    dtype: Any,
    estimator: str = "unbiased",
    rho: float | None = None,
    errors: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, Any] | None:
    r"""How far rounding moves the first-order statistics of samples from a bfloat16/float16 model
    (None for other dtypes): measured from ``errors`` (``δ(ā·b̄) ≈ δā·b̄ + ā·δb̄``, ``δ‖μ‖² ≈ 2 δs̄·s̄``), else
    the worst case of samples off by ``ρ`` of their norm: with ``N1 = Σ‖s_i‖``, ``N2 = Σ‖s_i‖²``, ``m = N1/n``,
    ``δ‖μ‖² ≤ (2ρ‖Σs‖N1 + ρ²N1² + (2ρ + ρ²)N2) / n(n−1)`` and ``δ(ā·b̄) ≤ ρ(m_a‖b̄‖ + m_b‖ā‖) + ρ²m_a m_b``.
    """
    dt = getattr(torch, str(dtype).replace("torch.", ""), None)  # a torch.dtype, its name or None
    if dt not in _LOW:
        return None
    if errors is not None:
        ea, eb = errors
        avg_a, avg_b = a.mean(0), b.mean(0)
        method, rho = f"measured on {len(ea)}+{len(eb)} samples", None
        bounds = {
            "mu_sq_train": 2 * projected_rounding(ea, avg_a),
            "mu_sq_test": 2 * projected_rounding(eb, avg_b),
            "ab": projected_rounding(ea, avg_b) + projected_rounding(eb, avg_a),
        }
    else:
        method, rho = "worst case", SAMPLE_REL_ERROR * torch.finfo(dt).eps / 2 if rho is None else float(rho)

        def mu_sq(X: torch.Tensor) -> tuple[float, float]:
            n = X.shape[0]
            norms = X.norm(dim=1) / (1 - rho)
            N1, N2 = float(norms.sum()), float(norms.pow(2).sum())
            tot = float(X.sum(0).norm()) + rho * N1
            if estimator == "plugin":
                m = N1 / n
                return 2 * rho * (tot / n) * m + rho**2 * m**2, N1 / n
            return (2 * rho * tot * N1 + rho**2 * N1**2 + (2 * rho + rho**2) * N2) / (n * (n - 1)), N1 / n

        (ba, ma), (bb, mb) = mu_sq(a), mu_sq(b)
        mean_a = float(a.mean(0).norm()) + rho * ma
        mean_b = float(b.mean(0).norm()) + rho * mb
        bounds = {"mu_sq_train": ba, "mu_sq_test": bb, "ab": rho * (ma * mean_b + mb * mean_a) + rho**2 * ma * mb}
    dtype_name = str(dt).replace("torch.", "")
    return {"dtype": dtype_name, "method": method, "rho": rho, "bounds": bounds, "within_rounding": []}


def check_pool(n: int, need: int, what: str, flag: str, pool: str) -> None:
    unit = "positions" if pool == "token" else "examples"
    if n < 4:
        raise WidthscopeError(f"{what} pool has {n} {unit}; the unbiased estimators need at least 4: raise {flag}")
    if need > n:
        raise WidthscopeError(
            f"{'M' if 'train' in what else 'K'}={need} is larger than the {what} pool of "
            f"{n} {unit} (draws pick without replacement): raise {flag} to >= {need} or "
            f"lower {'--M' if 'train' in what else '--K'}"
        )


def statistics(
    train: dict[str, torch.Tensor],
    test: dict[str, torch.Tensor],
    *,
    pairs: Sequence[tuple[int, int]],
    draws: int = 1000,
    seed: int = 0,
    estimator: Estimator = "unbiased",
    pool: str = "sum",
    project: int | None = None,
    dims: dict[str, int] | None = None,
    draw_scheme: str = "shared",
    sample_dtype: Any = None,
    sample_rel_error: float | dict[str, float] | None = None,
    sample_errors: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``points`` rows of a certify result and its notes from pooled ``(n, d)`` samples (a
    bfloat16/float16 ``sample_dtype`` adds each row's ``rounding``)."""
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    for name in train:
        # fresh contiguous copies: the same sums whether the samples come from the probe or a file
        a, b = train[name].to(torch.float64).contiguous().clone(), test[name].to(torch.float64).contiguous().clone()
        check_pool(a.shape[0], max(m for m, _ in pairs), "train", "n_train", pool)
        check_pool(b.shape[0], max(k for _, k in pairs), "held-out", "n_test", pool)
        if project:
            P = Projector(int((dims or {})[name]), project, seed=seed)
            pa, pb = (finalize_projected(stats.PrimalMoments(P.k).update(x), P) for x in (a, b))
            mom_a, mom_b = pa.as_moments(), pb.as_moments()
            cross = correct_projected_cross(stats.cross_moments(a, b, "unbiased"), pa.raw, pb.raw, P.k)
        else:
            mom_a, mom_b = stats.moments(a, estimator), stats.moments(b, estimator)
            cross = stats.cross_moments(a, b, estimator)
        rho = sample_rel_error.get(name) if isinstance(sample_rel_error, dict) else sample_rel_error
        rounding = rounding_bounds(a, b, sample_dtype, estimator, rho, (sample_errors or {}).get(name))
        if rounding is not None:
            est = {"mu_sq_train": mom_a.mu_sq, "mu_sq_test": mom_b.mu_sq, "ab": cross.ab}
            rounding["within_rounding"] = [k for k, v in est.items() if abs(v) <= rounding["bounds"][k]]
            if rounding["within_rounding"]:
                how = (
                    f"samples each off by {rounding['rho']:.2g} of their norm, worst case"
                    if rounding["rho"]
                    else f"rounding {rounding['method']}"
                )
                notes.append(
                    f"{name}: {', '.join(rounding['within_rounding'])} within rounding of zero of "
                    f"{rounding['dtype']} samples (|estimate| <= the error the rounding could make, {how}): "
                    "its sign, and the certificate's, is not resolved by the model's dtype"
                )
        gram = a @ b.T  # the cross-Gram, once: a misalignment draw is the mean of an M×K block
        mis_all = stats.misalignment_from_gram(gram, pairs=pairs, draws=draws, seed=seed, scheme=draw_scheme)
        assert isinstance(mis_all, list)  # pairs given: one result per pair
        certs = []
        for (m, k), mis in zip(pairs, mis_all):
            one = stats.certificate(mom_a, M=m, K=k, estimator=estimator, populations="one")
            two = stats.certificate(cross, M=m, K=k, estimator=estimator, populations="two")
            certs.append(
                {
                    "M": m,
                    "K": k,
                    "one": stats.vacuous_rule(to_jsonable(one)),
                    "two": stats.vacuous_rule(to_jsonable(two)),
                    "misalignment": to_jsonable(mis),
                }
            )
        results.append(
            {
                "point": name,
                "n_train": int(a.shape[0]),
                "n_test": int(b.shape[0]),
                "d": int((dims or {}).get(name, a.shape[1])),
                "moments_train": to_jsonable(mom_a),
                "moments_test": to_jsonable(mom_b),
                "cross_moments": to_jsonable(cross),
                "certificates": certs,
                **({"rounding": rounding} if rounding is not None else {}),
            }
        )
    if project:
        notes.append(
            f"samples randomly projected to k={project} dims (seed {seed}): moments of both "
            "populations bias-corrected (unbiased over the projection, unbiased estimator); "
            "the empirical misalignment is computed in the projected space"
        )
    return results, notes


def ranking(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points by two-population ``d_align`` at the first ``(M, K)``: certified first."""

    def key(r: dict[str, Any]) -> tuple[bool, float]:
        two = r["certificates"][0]["two"]
        return (not two["vacuous"], float(two["d_align"] or 0.0))

    out = []
    for i, r in enumerate(sorted(results, key=key, reverse=True)):
        two, one = r["certificates"][0]["two"], r["certificates"][0]["one"]
        out.append(
            {"rank": i + 1, "point": r["point"], "d": r["d"]}
            | {k: two[k] for k in ("d_align", "d_par", "d_2", "expectation", "vacuous", "reason")}
            | {"d_align_one": one["d_align"]}
        )
    return out


_TERMS = (("d_par", "d_par"), ("d_2", "d_2"), ("d_align", "d_align"), ("B_exact", "b_exact"), ("B_align", "b_align"))


def tables(result: dict[str, Any]) -> str:
    """Terminal tables: one per point (two-population rows + a one-population row), then the ranking."""
    out = []
    for r in result["points"]:
        rows = []
        for c in r["certificates"]:
            for form in ("two", "one"):
                cert = c[form]
                dirs = [v for v in (cert.get("e_dir_train"), cert.get("e_dir_test")) if v is not None]
                row = {"form": form, "M": c["M"], "K": c["K"], "S": cert["expectation"]}
                row |= {"V": max(dirs) if dirs else None, "T": cert.get("e_cov")}
                row |= {col: cert[key] for col, key in _TERMS}
                if form == "two":
                    mis = c["misalignment"]
                    row.update({"misalign": mis["probability"], "low": mis["low"], "high": mis["high"]})
                rows.append(row)
        vac = {
            f"{f}-population: {str(c[f]['reason']).split(';')[0]}"
            for c in r["certificates"]
            for f in ("two", "one")
            if c[f]["vacuous"]
        }
        title = (
            f"{r['point']}  (d={r['d']}, n_train={r['n_train']}, n_test={r['n_test']}; "
            "S = E[A] (a.b; one: |mu|^2), V = max(b'S_a b, a'S_b a) (one: mu'S mu), "
            "T = tr(S_a S_b) (one: tr S^2); misalign = empirical Pr(A<=0) [95% Wilson low, high])"
        )
        table = format_table(
            rows,
            "form M K S V T d_par d_2 d_align B_exact B_align misalign low high".split(),
            title=title,
        )
        if vac:
            table += (
                "\n  vacuous (bounds 1; d_align missing; d_par, d_2 per term, missing where its own estimate "
                "failed): " + "; ".join(sorted(vac, reverse=True))
            )
        if (r.get("rounding") or {}).get("within_rounding"):
            rd = r["rounding"]
            table += f"\n  within rounding of zero in {rd['dtype']} (sign not resolved): " + ", ".join(
                f"{k} (bound {rd['bounds'][k]:.3g})" for k in rd["within_rounding"]
            )
        if r.get("interventions"):
            iv = r["interventions"]
            # the precision column only where the dtype left a step unresolved or float32 re-measured it
            flagged = any(
                x.get("below_resolution") or x.get("evaluated_in", x.get("dtype")) != x.get("dtype") for x in iv
            )
            table += "\n\n" + format_table(
                [
                    {
                        "eta": x["eta"],
                        "predicted dL": x["predicted"],
                        "actual dL": x["actual"],
                        "retention": x["retention"],
                        "sign ok": x["sign_agrees"],
                        **({"precision": _precision_cell(x)} if flagged else {}),
                    }
                    for x in iv
                ],
                title=f"  {iv[0]['probe']} intervention at {r['point']} (M={iv[0]['M']}, K={iv[0]['K']}): "
                "held-out loss change, first-order prediction vs measured",
            )
        out.append(table)
    out.append(
        format_table(
            result["ranking"],
            ["rank", "point", "d", "d_align", "d_par", "d_2", "expectation", "d_align_one"],
            title="ranking by two-population d_align (largest first)",
        )
    )
    notes = list(result["notes"])
    notes += [n for n in precision_notes(result["points"]) if n not in notes]
    for n in notes:
        out.append(f"note: {n}")
    return "\n\n".join(out)


def _precision_cell(x: dict[str, Any]) -> str:
    if x.get("below_resolution"):
        return f"below {x.get('dtype')} resolution"
    if x.get("evaluated_in") != x.get("dtype"):
        return f"in {x.get('evaluated_in')}"
    return ""


def precision_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """A note naming the intervention steps below the model dtype's resolution (or re-measured in float32)."""
    note = precision_note([x for r in results for x in (r.get("interventions") or []) if isinstance(x, dict)])
    return [note] if note else []
