r"""The compute-to-target benchmark at other sizes: suites from a TOML file, and their predicted cost.

A suite file (``configs/grow-target-paper.toml``: the widths of the alignment paper, 512–3072) is
what ``widthscope grow-target --suite-file FILE`` runs unchanged on a machine with a GPU::

    device = "cuda"              # where every run trains
    seeds = [0, 1, 2, 3, 4]
    sustained_flops = 1.0e14     # assumed FLOP/s of the device (only for the cost prediction)
    [defaults]                   # any setting of the built-in suite (widthscope.growth.target)
    head_dim = 64
    [[suite]]                    # one target size per entry (its settings override the defaults)
    width = 512
    small_width = 256
    steps = 15000

:func:`plan_cost` predicts the FLOPs and GPU-hours of such a file before anything runs: one training
step of every model is counted by ``FlopCounterMode`` on the ``meta`` device (no memory, no
arithmetic), the budget is ``B = steps ×`` the target's step FLOPs, and each run of a seed costs
``B ×`` the fraction of ``B`` the same run spent in the CPU suite's committed rows (growth runs stop
at the target, so this is what they are expected to spend), with the upper bound ``cap · B`` per
run beside it. GPU-hours divide by ``sustained_flops`` (an assumption, stated in the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from .._io import read_toml
from ..errors import WidthscopeError
from ..models import build
from .schedule import SCHEDULES
from .target import DECAYS, OPERATORS, TARGET_SUITES, budget_steps, ffn_width

__all__ = ["read_suite_file", "plan_cost", "meta_step_flops", "meta_llama", "spent_fractions"]

_KNOWN = set(TARGET_SUITES["full"]) | {"device"}
_TOP = {"device", "seeds", "sustained_flops", "defaults", "suite", "note"}
_HINT = "see configs/grow-target-paper.toml"


def _check_settings(s: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(s) - _KNOWN)
    if unknown:
        raise WidthscopeError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    for key in ("width", "depth", "head_dim", "small_depth", "small_width", "seq_len", "batch_size", "steps", "evals"):
        v = s[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise WidthscopeError(f"{where}: {key} = {v!r} must be a whole number >= 1")
    hd = s["head_dim"]
    if s["width"] % hd or s["small_width"] % hd or s["small_width"] >= s["width"]:
        raise WidthscopeError(
            f"{where}: width {s['width']} and small_width {s['small_width']} must be multiples of head_dim {hd}, "
            "small_width below width"
        )
    if not s["small_depth"] < s["depth"]:
        raise WidthscopeError(f"{where}: need small_depth < depth, got {s['small_depth']} and {s['depth']}")
    tpp = s["tokens_per_param"]
    if tpp is not None and (isinstance(tpp, bool) or not isinstance(tpp, (int, float)) or not 0 < tpp < 1e6):
        raise WidthscopeError(f"{where}: tokens_per_param = {tpp!r} must be a positive number")
    if s["decay"] not in DECAYS:
        raise WidthscopeError(f"{where}: decay = {s['decay']!r}; choose one of {', '.join(DECAYS)}")
    if isinstance(s["final_lr"], bool) or not isinstance(s["final_lr"], (int, float)) or not 0 <= s["final_lr"] <= 1:
        raise WidthscopeError(f"{where}: final_lr = {s['final_lr']!r} must be a number in [0, 1]")
    bad = [o for o in s["operators"] if o not in OPERATORS] + [c for c in s["schedules"] if c not in SCHEDULES]
    if bad:
        raise WidthscopeError(f"{where}: unknown operator/schedule {bad}; known {list(OPERATORS)}, {list(SCHEDULES)}")


def read_suite_file(path: str | Path) -> dict[str, Any]:
    """``{"suites": [settings, ...], "seeds": (...), "sustained_flops": float | None, "path": str}``
    from a suite file (see the module docstring); every problem is one line naming the file."""
    raw = read_toml(path, "grow-target suite file", _HINT)
    where = f"grow-target suite file {str(path)!r}"
    extra = sorted(set(raw) - _TOP)
    if extra:
        raise WidthscopeError(f"{where}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(_TOP))}")
    entries = raw.get("suite")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise WidthscopeError(f"{where}: give at least one [[suite]] table; {_HINT}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise WidthscopeError(f"{where}: [defaults] must be a table")
    device = raw.get("device", "cpu")
    suites = []
    for i, e in enumerate(entries):
        given = {**defaults, **e}
        s = {**TARGET_SUITES["full"], "device": device, **given}
        if "steps" in given and "tokens_per_param" not in given:
            s["tokens_per_param"] = None  # a suite that gives steps sets its budget in steps
        for key in ("operators", "schedules"):
            s[key] = tuple(s[key])
        _check_settings(s, f"{where} [[suite]] {i + 1}")
        suites.append(s)
    seeds = raw.get("seeds", [0, 1, 2, 3, 4])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(v, int) and v >= 0 for v in seeds):
        raise WidthscopeError(f"{where}: seeds must be a list of whole numbers >= 0")
    flops = raw.get("sustained_flops")
    if flops is not None and not (isinstance(flops, (int, float)) and flops > 0):
        raise WidthscopeError(f"{where}: sustained_flops must be a positive number (FLOP/s)")
    return {"suites": suites, "seeds": tuple(seeds), "sustained_flops": flops, "path": str(path)}


def meta_llama(settings: Mapping[str, Any], width: int, depth: int) -> torch.nn.Module:
    """The suite's model at ``width`` x ``depth`` on the ``meta`` device (as ``growth.target.target_model``)."""
    hd = int(settings["head_dim"])
    with torch.device("meta"):
        return build(
            "llama",
            width,
            depth=depth,
            max_seq_len=settings["seq_len"],
            heads=width // hd,
            kv_heads=width // hd,
            head_dim=hd,
            ffn=ffn_width(width),
        )


def meta_step_flops(settings: Mapping[str, Any], width: int, depth: int) -> tuple[int, int]:
    """(FLOPs of one training step, parameters) of the suite's model at ``width`` × ``depth``,
    counted on the ``meta`` device."""
    m = meta_llama(settings, width, depth)
    with torch.device("meta"):
        x = torch.zeros(int(settings["batch_size"]), int(settings["seq_len"]), dtype=torch.long)
    fc = FlopCounterMode(display=False)
    with fc:
        m(x, labels=x).loss.backward()
    return int(fc.get_total_flops()), sum(p.numel() for p in m.parameters())


def spent_fractions(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per run label, the mean over seeds of the FLOPs a run spent as a fraction of its budget ``B``."""
    acc: dict[str, list[float]] = {}
    for r in rows:
        if r.get("kind") == "grow_target":
            acc.setdefault(str(r["run"]), []).append(float(r["flops"]) / float(r["budget_flops"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def plan_cost(plan: Mapping[str, Any], fractions: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per suite of ``plan`` (:func:`read_suite_file`): parameters, step FLOPs, budget,
    tokens, predicted and upper-bound FLOPs and GPU-hours of all its seeds (``fractions``:
    :func:`spent_fractions` of the CPU suite; a run label it lacks is counted at ``cap · B``)."""
    out = []
    for s in plan["suites"]:
        f_t, p_t = meta_step_flops(s, s["width"], s["depth"])
        _, p_d = meta_step_flops(s, s["width"], s["small_depth"])
        _, p_w = meta_step_flops(s, s["small_width"], s["depth"])
        steps = budget_steps(s, p_t)
        budget = float(steps) * f_t
        labels = ["scratch"]
        labels += [f"continue-{k}" for k in sorted({OPERATORS[o] for o in s["operators"]})]
        labels += [f"{o}/{c}" for o in s["operators"] for c in s["schedules"]]
        cap = float(s["cap"])
        predicted = sum(fractions.get(lab, 1.0 if lab == "scratch" else cap) for lab in labels) * budget
        upper = (1.0 + cap * (len(labels) - 1)) * budget
        n = len(plan["seeds"])
        sus = plan.get("sustained_flops")
        out.append(
            {
                "width": s["width"],
                "depth": s["depth"],
                "small_width": s["small_width"],
                "small_depth": s["small_depth"],
                "parameters": p_t,
                "parameters_small_depth": p_d,
                "parameters_small_width": p_w,
                "step_flops": f_t,
                "steps": steps,
                "tokens": steps * s["batch_size"] * s["seq_len"],
                "budget_flops": budget,
                "runs_per_seed": len(labels),
                "seeds": n,
                "flops_predicted": n * predicted,
                "flops_upper": n * upper,
                "gpu_hours_predicted": None if sus is None else n * predicted / sus / 3600,
                "gpu_hours_upper": None if sus is None else n * upper / sus / 3600,
            }
        )
    return out
