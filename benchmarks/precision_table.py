"""Precision table: every headline number of ``certify`` in bfloat16/float16 against float32, and
float32 against float64, on two trained checkpoints, next to the float32 run's standard error.

Checkpoints (trained here, seeded): (a) a widthscope LLaMA (width 64, 4 blocks) trained 300 AdamW
steps on byte-level Python stdlib text and saved with :func:`widthscope.checkpoint.save`; (b) a
transformers ``GPT2LMHeadModel`` (width 64, 4 blocks, byte vocabulary) trained 300 steps on the
same bytes and saved with ``save_pretrained``. Each is certified as a user would
(:func:`widthscope.certification.pipeline.run_certify`, what ``widthscope certify`` runs; ``plan_certify`` is what
``certify --plan`` prints, and its assumed dtype is recorded) with ``--dtype`` float64, float32,
bfloat16 and float16 and otherwise identical settings: the same text file (three stdlib modules
not in the training bytes), pools, seeds, points, ``M = K``, draws and intervention grid.

Rows (one per headline number, per point, ``M`` and intervention step): the value in the dtype,
the reference's (float32 for bf16/fp16, float64 for float32), the relative difference, and the
standard error of the number at float32 (a grouped jackknife over the pooled train and held-out
samples: ``groups`` groups, the i-th group of both pools left out at once; for the intervention
changes the jackknife standard error of the predicted change ``−η μ_Mᵀg_K``, which to first order
in ``η`` is also that of the actual change; retention gets none). Verdicts: the sign of every
certificate's ``E[A]``, vacuity, the growth signal (two-population ``B_exact ≥ 0.5``, the default
certificate schedule of ``widthscope.growth``), the ranking, the intervention sign, and what the run
flagged (below resolution, within rounding of zero).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/precision_table.py --out benchmarks/results/precision-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from widthscope import checkpoint, data, models  # noqa: E402
from widthscope.certification import samples as saved  # noqa: E402
from widthscope.certification.per_point import statistics  # noqa: E402
from widthscope.certification.pipeline import CertifyJob, run_certify  # noqa: E402
from widthscope.data.spec import InputSpec  # noqa: E402
from widthscope.options import CertifyOptions, CertifyRunOptions  # noqa: E402
from widthscope.planning import plan_certify  # noqa: E402
from widthscope.train import train  # noqa: E402

DTYPES = ("float64", "float32", "bfloat16", "float16")
REFERENCE = {"float32": "float64", "bfloat16": "float32", "float16": "float32"}
# unit roundoff u = eps/2 of each compared dtype
UNIT = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# docs/performance.md §3 (tests/test_lowprec.py): tolerances relative to float32, in units of u
TOLERANCE_U = {"mu_sq": 8.0, "ab": 8.0, "d_align": 16.0, "b_exact": 16.0}
GROW_THRESHOLD = 0.5  # widthscope.growth.schedule.Schedule("certificate") default
CORPUS_FILES = ("textwrap.py", "tokenize.py", "uuid.py")  # after the first 2 MB of sorted stdlib: unseen
# table order: quantity -> the keys' last part that belong to it
QUANTITIES = {
    "‖μ‖²": ("mu_sq",),
    "aᵀb": ("ab",),
    "μᵀΣμ": ("mu_sigma_mu", "b_sigma_a_b", "a_sigma_b_a"),
    "tr(Σ²)": ("tr_sigma_sq", "tr_sigma_a_sigma_b"),
    "d_par": ("d_par",),
    "d_2": ("d_2",),
    "d_align": ("d_align",),
    "B_exact": ("b_exact",),
    "B_align": ("b_align",),
    "misalignment": ("misalignment",),
    "ΔL predicted": ("predicted",),
    "ΔL actual": ("actual",),
    "retention": ("retention",),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Sizes of one run of the benchmark (``FULL`` for the committed table, ``QUICK`` for the test)."""

    width: int = 64
    depth: int = 4
    steps: int = 300
    seq_len: int = 64
    n: int = 256  # train and held-out pool
    M: tuple[int, ...] = (16, 32, 64)
    draws: int = 1000
    groups: int = 16
    batch_size: int = 32
    max_bytes: int = 2_000_000
    checkpoints: tuple[str, ...] = ("llama", "gpt2")
    corpus: str = "stdlib"  # or "aligned": 70 % one letter, gradients clearly aligned (the test's case)


FULL = Setting()
QUICK = Setting(
    width=32,
    depth=2,
    steps=20,
    seq_len=32,
    n=64,
    M=(8, 16),
    draws=200,
    groups=8,
    max_bytes=200_000,
    checkpoints=("llama",),
    corpus="aligned",
)


# ----------------------------------------------------------------------------- checkpoints and data
def write_corpus(path: Path, kind: str = "stdlib") -> Path:
    """The probe text: three stdlib modules, or (``aligned``) seeded text that is 70 % the letter
    ``a``, whose shared target aligns the per-example gradients as in tests/test_lowprec.py."""
    if kind == "aligned":
        rng = random.Random(0)
        other = "bcdefghijklmnopqrstuvwxyz "
        path.write_text("".join("a" if rng.random() < 0.7 else rng.choice(other) for _ in range(60_000)))
        return path
    base = Path(sysconfig.get_paths()["stdlib"])
    path.write_text("\n\n".join((base / f).read_text(encoding="utf-8") for f in CORPUS_FILES), encoding="utf-8")
    return path


def train_llama(out: Path, s: Setting, split: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = models.build("llama", s.width, depth=s.depth, vocab_size=256, max_seq_len=s.seq_len)
    res = train(
        model,
        split,
        steps=s.steps,
        lr=3e-3,
        batch_size=16,
        warmup=0.1,
        clip=1.0,
        seed=0,
        progress=False,
        train_eval_examples=256,
    )
    checkpoint.save(model, out, extra={"dataset": "text", "data_options": {"seq_len": s.seq_len}})
    return {
        "test_loss": res.get("test_loss"),
        "train_loss": res.get("train_loss"),
        "parameters": int(models.count_parameters(model)),
    }


def train_gpt2(out: Path, s: Setting, split: Any) -> dict[str, Any]:
    import transformers as tf  # optional dependency: only this checkpoint needs it

    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=256,
        n_positions=s.seq_len,
        n_embd=s.width,
        n_layer=s.depth,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = tf.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    X = split.train[0]
    for _ in range(s.steps):
        ids = X[torch.randint(0, len(X), (16,), generator=g)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    with torch.no_grad():
        held = split.test[0][:256]
        test_loss = float(model(input_ids=held, labels=held).loss)
    model.save_pretrained(out)
    return {
        "test_loss": test_loss,
        "train_loss": float(loss.detach()),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


TRAINERS: dict[str, Callable[[Path, Setting, Any], dict[str, Any]]] = {"llama": train_llama, "gpt2": train_gpt2}


# ----------------------------------------------------------------------------- certify runs
def job(model: Path, corpus: Path, dtype: str, s: Setting, work: Path) -> CertifyJob:
    spec = InputSpec(
        model=str(model),
        dtype=dtype,
        data=str(corpus),
        tokenizer="bytes",
        seq_len=s.seq_len,
        n_train=s.n,
        n_test=s.n,
        test_fraction=0.5,
        seed=0,
    )
    opts = CertifyOptions(M=s.M, draws=s.draws, seed=0)
    stem = f"{model.name}-{dtype}"
    return CertifyJob(
        spec,
        opts,
        CertifyRunOptions(batch_size=s.batch_size),
        out=str(work / f"{stem}.json"),
        save_samples=str(work / f"{stem}.safetensors"),
    )


def certify_all(model: Path, corpus: Path, s: Setting, work: Path) -> dict[str, dict[str, Any]]:
    """Each dtype: the result, its samples file, the dtype ``--plan`` assumed, the seconds."""
    out = {}
    for dtype in DTYPES:
        j = job(model, corpus, dtype, s, work)
        plan = plan_certify(j.spec, j.options, j.run, time_run=False)
        t0 = time.perf_counter()
        res = run_certify(j, say=lambda _m: None)
        out[dtype] = {
            "result": res,
            "samples": j.save_samples,
            "plan_dtype": plan.dtype,
            "plan_dtype_source": "--dtype" if j.spec.dtype != "auto" else "the checkpoint",
            "seconds": time.perf_counter() - t0,
        }
    return out


# ----------------------------------------------------------------------------- headline numbers
def stats_numbers(points: list[dict[str, Any]]) -> dict[str, float | None]:
    """``point|part|name`` -> value of every statistical headline number of certify's point rows."""
    out: dict[str, float | None] = {}
    for r in points:
        p = r["point"]
        for part in ("moments_train", "moments_test"):
            for k in ("mu_sq", "mu_sigma_mu", "tr_sigma_sq"):
                out[f"{p}|{part}|{k}"] = r[part][k]
        for k in ("ab", "b_sigma_a_b", "a_sigma_b_a", "tr_sigma_a_sigma_b"):
            out[f"{p}|cross|{k}"] = r["cross_moments"][k]
        for c in r["certificates"]:
            for form in ("one", "two"):
                for k in ("d_par", "d_2", "d_align", "b_exact", "b_align"):
                    out[f"{p}|M={c['M']}|{form}|{k}"] = c[form][k]
            out[f"{p}|M={c['M']}|two|misalignment"] = c["misalignment"]["probability"]
    return out


def intervention_numbers(points: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for r in points:
        for x in r.get("interventions") or []:
            for k in ("predicted", "actual", "retention"):
                out[f"{r['point']}|rel={x['rel_step']:.0e}|iv|{k}"] = x[k]
    return out


def below_resolution(points: list[dict[str, Any]]) -> set[str]:
    """The intervention keys whose step the run marked below its dtype's resolution."""
    return {
        f"{r['point']}|rel={x['rel_step']:.0e}|iv|{k}"
        for r in points
        for x in r.get("interventions") or []
        if x.get("below_resolution")
        for k in ("predicted", "actual", "retention")
    }


def _jackknife(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < len(values) or len(v) < 2:
        return None
    g, m = len(v), sum(v) / len(v)
    return math.sqrt((g - 1) / g * sum((x - m) ** 2 for x in v))


def standard_errors(res: dict[str, Any], samples_file: str, s: Setting) -> dict[str, float | None]:
    """Grouped-jackknife standard error of every headline number of the float32 run."""
    train_s, test_s, _meta = saved.load(samples_file)
    n = min(next(iter(train_s.values())).shape[0], next(iter(test_s.values())).shape[0])
    leave: list[dict[str, float | None]] = []
    for i in range(s.groups):
        keep = torch.tensor([j for j in range(n) if j % s.groups != i])
        rows, _ = statistics(
            {p: x[keep] for p, x in train_s.items()},
            {p: x[keep] for p, x in test_s.items()},
            pairs=[(m, m) for m in s.M],
            draws=s.draws,
            seed=0,
        )
        vals = stats_numbers(rows)
        for r in res["points"]:  # the predicted change at each eta: -eta mu_M.g_K on the kept part of M and K
            iv = r.get("interventions") or []
            if not iv:
                continue
            m = iv[0]["M"]
            a, b = train_s[r["point"]][:m], test_s[r["point"]][: iv[0]["K"]]
            ka = [j for j in range(m) if j % s.groups != i]
            kb = [j for j in range(b.shape[0]) if j % s.groups != i]
            align = float(a[ka].mean(0) @ b[kb].mean(0))
            for x in iv:
                key = f"{r['point']}|rel={x['rel_step']:.0e}|iv|"
                vals[key + "predicted"] = vals[key + "actual"] = -x["eta"] * align
        leave.append(vals)
    return {k: _jackknife([v[k] for v in leave]) for k in leave[0]}


# ----------------------------------------------------------------------------- comparison
def quantity_of(key: str) -> str:
    last = key.rsplit("|", 1)[1]
    return next(q for q, names in QUANTITIES.items() if last in names)


def compare(
    ref: dict[str, Any], low: dict[str, Any], se: dict[str, float | None], dtype: str, checkpoint_name: str
) -> list[dict[str, Any]]:
    """One row per headline number of ``low`` (a certify result in ``dtype``) against ``ref``."""
    rv = {**stats_numbers(ref["points"]), **intervention_numbers(ref["points"])}
    lv = {**stats_numbers(low["points"]), **intervention_numbers(low["points"])}
    flagged = below_resolution(low["points"])
    rows = []
    for key, r in rv.items():
        v = lv.get(key)
        point, where, *_ = key.split("|")
        diff = rel = None
        if v is not None and r is not None:
            diff = abs(v - r)
            rel = diff / abs(r) if r != 0 else None
        s = se.get(key)
        rows.append(
            {
                "checkpoint": checkpoint_name,
                "dtype": dtype,
                "reference": REFERENCE[dtype],
                "key": key,
                "quantity": quantity_of(key),
                "point": point,
                "where": where,
                "value": v,
                "reference_value": r,
                "rel_diff": rel,
                "rel_diff_u": None if rel is None else rel / UNIT[dtype],
                "se": s,
                "diff_over_se": None if diff is None or not s else diff / s,
                "below_resolution": key in flagged,
            }
        )
    return rows


def verdicts(ref: dict[str, Any], low: dict[str, Any]) -> dict[str, Any]:
    """Agreement of the decisions a reader takes from the two results."""

    def certs(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {
            f"{r['point']}|M={c['M']}|{f}": c[f]
            for r in res["points"]
            for c in r["certificates"]
            for f in ("one", "two")
        }

    def signs(res: dict[str, Any]) -> dict[str, bool]:
        return {
            f"{r['point']}|{x['rel_step']:.0e}": bool(x["sign_agrees"])
            for r in res["points"]
            for x in r.get("interventions") or []
            if not x.get("below_resolution")
        }

    cr, cl = certs(ref), certs(low)
    sr, sl = signs(ref), signs(low)
    both = [k for k in sl if k in sr]
    grow = [k for k in cr if k.endswith("|two")]
    return {
        "certificates": len(cr),
        "sign_agrees": sum((cr[k]["expectation"] > 0) == (cl[k]["expectation"] > 0) for k in cr),
        "vacuous_agrees": sum(cr[k]["vacuous"] == cl[k]["vacuous"] for k in cr),
        "grow_signals": len(grow),
        "grow_agrees": sum((cr[k]["b_exact"] >= GROW_THRESHOLD) == (cl[k]["b_exact"] >= GROW_THRESHOLD) for k in grow),
        "ranking_agrees": [r["point"] for r in ref["ranking"]] == [r["point"] for r in low["ranking"]],
        "top_point_agrees": ref["ranking"][0]["point"] == low["ranking"][0]["point"],
        "intervention_steps": sum(len(r.get("interventions") or []) for r in low["points"]),
        "below_resolution": sum(
            bool(x.get("below_resolution")) for r in low["points"] for x in r.get("interventions") or []
        ),
        "intervention_sign_compared": len(both),
        "intervention_sign_agrees": sum(sr[k] == sl[k] for k in both),
        "within_rounding": sorted(
            f"{r['point']}: {w}" for r in low["points"] for w in (r.get("rounding") or {}).get("within_rounding", [])
        ),
        "alignment_within_rounding": sum(
            bool(x.get("alignment_within_rounding")) for r in low["points"] for x in r.get("interventions") or []
        ),
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per checkpoint, dtype and quantity: the largest relative difference and difference/SE
    (intervention steps the run marked below its resolution left out and counted)."""
    out = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["checkpoint"], r["dtype"], r["quantity"]), []).append(r)
    for (ck, dt, q), rs in groups.items():
        kept = [r for r in rs if not r["below_resolution"]]
        rel = [r["rel_diff"] for r in kept if r["rel_diff"] is not None]
        ose = [r["diff_over_se"] for r in kept if r["diff_over_se"] is not None]
        sev = [r["se"] / abs(r["reference_value"]) for r in kept if r["se"] and r["reference_value"]]
        out.append(
            {
                "checkpoint": ck,
                "dtype": dt,
                "quantity": q,
                "n": len(kept),
                "below_resolution": len(rs) - len(kept),
                "max_rel_diff": max(rel) if rel else None,
                "max_rel_diff_u": max(rel) / UNIT[dt] if rel else None,
                "max_diff_over_se": max(ose) if ose else None,
                "median_rel_se": sorted(sev)[len(sev) // 2] if sev else None,
            }
        )
    return out


def tolerance_failures(rows: list[dict[str, Any]]) -> list[str]:
    """The bf16/fp16 rows of ``TOLERANCE_U``'s quantities outside the documented tolerance."""
    bad = []
    for r in rows:
        last = r["key"].rsplit("|", 1)[1]
        if r["dtype"] in ("bfloat16", "float16") and last in TOLERANCE_U and r["rel_diff"] is not None:
            if "|one|" in r["key"] and last in ("d_align", "b_exact"):
                continue  # the documented bound is of the two-population certificate
            if r["rel_diff_u"] > TOLERANCE_U[last]:
                bad.append(
                    f"{r['checkpoint']} {r['dtype']} {r['key']}: {r['rel_diff_u']:.1f}u > {TOLERANCE_U[last]:g}u"
                )
    return bad


# ----------------------------------------------------------------------------- the benchmark
def run_checkpoint(name: str, s: Setting, work: Path, split: Any, corpus: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    trained = TRAINERS[name](work / name, s, split)
    train_s = time.perf_counter() - t0
    runs = certify_all(work / name, corpus, s, work)
    ref32 = runs["float32"]
    se = standard_errors(ref32["result"], ref32["samples"], s)
    rows, verdict = [], {}
    for dt, ref in REFERENCE.items():
        rows += compare(runs[ref]["result"], runs[dt]["result"], se, dt, name)
        verdict[dt] = verdicts(runs[ref]["result"], runs[dt]["result"])
    st = ref32["result"]["settings"]
    return {
        "checkpoint": name,
        "trained": {**trained, "steps": s.steps, "seconds": train_s},
        "architecture": st.get("architecture"),
        "points": st["points"],
        "plan": {dt: {"dtype": r["plan_dtype"], "source": r["plan_dtype_source"]} for dt, r in runs.items()},
        "settings_dtype": {dt: r["result"]["settings"].get("dtype") for dt, r in runs.items()},
        "certify_s": {dt: r["seconds"] for dt, r in runs.items()},
        "notes": {dt: r["result"]["notes"] for dt, r in runs.items()},
        "verdicts": verdict,
        "rows": rows,
        "results": {dt: r["result"] for dt, r in runs.items()},
    }


def run(s: Setting, work: Path) -> dict[str, Any]:
    """Train the checkpoints of ``s``, certify each in every dtype, compare; the result document."""
    t0 = time.perf_counter()
    split = data.load("text", n_train=2048, n_test=256, seed=0, seq_len=s.seq_len, max_bytes=s.max_bytes)
    corpus = write_corpus(work / "corpus.txt", s.corpus)
    cks = [run_checkpoint(name, s, work, split, corpus) for name in s.checkpoints]
    rows = [r for c in cks for r in c["rows"]]
    return {
        "setting": {
            **dataclasses.asdict(s),
            "corpus_files": list(CORPUS_FILES) if s.corpus == "stdlib" else None,
            "dtypes": list(DTYPES),
            "reference": REFERENCE,
            "unit_roundoff": UNIT,
            "tolerance_u": TOLERANCE_U,
            "grow_threshold": GROW_THRESHOLD,
        },
        "checkpoints": [{k: v for k, v in c.items() if k not in ("rows", "results")} for c in cks],
        "summary": summarize(rows),
        "tolerance_failures": tolerance_failures(rows),
        "rows": rows,
        "total_s": time.perf_counter() - t0,
        "machine": {
            "cores": os.cpu_count(),
            "load": list(os.getloadavg()),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "_results": {c["checkpoint"]: c["results"] for c in cks},
    }


def dumps(res: dict[str, Any]) -> str:
    """The result document as JSON, one row per line (a diff of a rerun reads row by row)."""
    head = json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1, default=str)
    rows = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in res["rows"])
    return head[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n"


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v:.2e}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default=None, help="write the result JSON here")
    p.add_argument("--quick", action="store_true", help="the tiny setting of the test (seconds)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="precision-") as tmp:
        res = run(QUICK if a.quick else FULL, Path(tmp))
    res.pop("_results")
    if a.out:
        Path(a.out).write_text(dumps(res))
    for r in res["summary"]:
        print(
            f"{r['checkpoint']:5s} {r['dtype']:9s} {r['quantity']:13s} max rel {_g(r['max_rel_diff'])} "
            f"({_g(r['max_rel_diff_u'])}u), max diff/SE {_g(r['max_diff_over_se'])}, "
            f"below resolution {r['below_resolution']}"
        )
    print("tolerance failures:", res["tolerance_failures"] or "none", f"; total {res['total_s']:.0f} s")
    return res


if __name__ == "__main__":
    main()
