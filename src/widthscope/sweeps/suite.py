"""A suite of existing checkpoints as a sweep: one ``widthscope certify`` run per (model, revision).

A ``[suite]`` table names checkpoints (hub ids, hub cache folders, local paths), their revisions, the
input options of ``widthscope certify`` and a ``[suite.certify]`` table (docs/sweeps.md). A cell's id
hashes (model, revision) and the settings that determine its numbers, so cells added later reuse
finished ones; rows carry the commit and ``step`` parsed from the revision's name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .._io import format_table, to_jsonable
from ..certification.pipeline import CertifyJob, run_certify
from ..data.spec import InputSpec
from ..errors import WidthscopeError
from ..hub import resolve_model
from ..options import CertifyOptions, CertifyRunOptions
from .config import certify_options, check_keys, config_int, config_table
from .grid import GridResult, cell_id, cell_path, cell_state, claim_out_dir, run_grid, shard_cells
from .placement import PLACEMENT_KEYS, cell_folder, placement_text, release
from .results import certify_rows

__all__ = [
    "SUITE_KEYS",
    "SuiteConfig",
    "load_suite",
    "plan_suite",
    "run_suite",
    "step_of",
    "print_suite_plan",
    "parameters",
]

SUITE_KEYS = ("name", "label", "out_dir", "models", "revisions", "batch_size", "device", "threads", "certify")
# Every input option of `widthscope certify` but the model, its revision and the seed (certify.seed).
INPUT_KEYS = tuple(
    f.name for f in dataclasses.fields(InputSpec) if f.name not in ("model", "revision", "given", "seed", "cap_pools")
)
_STEP = re.compile(r"^(?:step|global_step|checkpoint-)(\d+)$")


def step_of(revision: str | None) -> int | None:
    """The step a revision's name gives (``step1000``, ``global_step1000``, ``checkpoint-1000``), else None."""
    m = _STEP.match(revision or "")
    return int(m.group(1)) if m else None


@dataclass
class SuiteConfig:
    """A validated ``[suite]`` table."""

    name: str
    out_dir: str
    models: list[str]
    revisions: list[str | None]
    inputs: dict[str, Any] = field(default_factory=dict)
    certify: CertifyOptions = CertifyOptions()
    label: str = ""
    batch_size: int = 8
    device: str = "cpu"
    threads: int | None = None

    def spec(self, model: str, revision: str | None, cell_key: str | None = None) -> InputSpec:
        """The :class:`~widthscope.data.spec.InputSpec` of one cell; with ``cell_key``, its own offload folder."""
        inputs = dict(self.inputs)
        if cell_key is not None and inputs.get("offload_folder"):
            inputs["offload_folder"] = cell_folder(inputs, cell_key)
        return InputSpec(model=model, revision=revision, seed=self.certify.seed, **inputs)

    @property
    def placement(self) -> dict[str, Any]:
        """The input options that only place the weights (not part of the fingerprint)."""
        return {k: v for k, v in self.inputs.items() if k in PLACEMENT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["certify"] = self.certify.to_dict()
        return to_jsonable(d)

    def fingerprint(self) -> str:
        """Hash of the settings that determine a cell's numbers (not which cells, nor where, nor placement)."""
        inputs = {k: v for k, v in self.inputs.items() if k not in PLACEMENT_KEYS}
        d = {"inputs": inputs, "certify": self.certify.to_dict(), "batch_size": self.batch_size}
        return hashlib.sha256(json.dumps(to_jsonable(d), sort_keys=True).encode()).hexdigest()[:12]


def _names(v: Any, what: str, *, optional: bool = False) -> list[str]:
    if v is None and optional:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() for x in v):
        raise WidthscopeError(f"sweep config [suite] {what} must be a non-empty list of names, got {v!r}")
    dup = sorted({x for x in v if v.count(x) > 1})
    if dup:
        raise WidthscopeError(f"sweep config [suite] {what} lists {', '.join(map(repr, dup))} twice: drop the repeat")
    return list(v)


def load_suite(raw: Mapping[str, Any], *, stem: str = "suite", out_dir: str | os.PathLike | None = None) -> SuiteConfig:
    """Check a parsed sweep TOML holding ``[suite]``; every problem is one line naming the key."""
    check_keys(raw, ["suite"], "top level (a [suite] config takes no [sweep] or [[family]])")
    su = config_table(raw.get("suite"), "[suite]", SUITE_KEYS + INPUT_KEYS)
    if "models" not in su:
        raise WidthscopeError(
            "sweep config [suite]: missing required key 'models' (list of checkpoints (required): hub ids "
            "org/name, hub cache folders models--org--name, or local paths)"
        )
    name = su.get("name", stem)
    label = su.get("label", name)
    for key, v in (("name", name), ("label", label)):
        if not isinstance(v, str) or not v:
            raise WidthscopeError(f"sweep config [suite]: {key} must be a non-empty string")
    models = _names(su["models"], "models")
    revisions: list[str | None] = list(_names(su.get("revisions"), "revisions", optional=True)) or [None]
    cert_keys = [f.name for f in dataclasses.fields(CertifyOptions)]
    cert = config_table(su.get("certify"), "[suite] certify", cert_keys, "[suite.certify]")
    device = su.get("device", "cpu")
    if not isinstance(device, str) or not device:
        raise WidthscopeError("sweep config [suite] device must be a string such as 'cpu' or 'cuda'")
    cfg = SuiteConfig(
        name=name,
        out_dir=str(out_dir) if out_dir is not None else str(su.get("out_dir", f"widthscope-results/{name}")),
        models=models,
        revisions=revisions,
        inputs={k: su[k] for k in INPUT_KEYS if k in su},
        certify=certify_options(CertifyOptions(), cert, "sweep config [suite.certify]: "),
        label=label,
        batch_size=config_int(su.get("batch_size", 8), "sweep config [suite] batch_size"),
        device=device,
        threads=config_int(su["threads"], "sweep config [suite] threads") if "threads" in su else None,
    )
    for model in models:
        for rev in revisions:
            try:
                cfg.spec(model, rev)  # every field's check, before anything loads
            except WidthscopeError as exc:
                raise WidthscopeError(f"sweep config [suite] model {model!r} revision {rev!r}: {exc}") from None
            where = Path(model).expanduser()
            if rev is not None and where.exists() and not where.name.startswith("models--"):
                raise WidthscopeError(
                    f"sweep config [suite]: revisions apply to hub ids (org/name) and hub cache folders "
                    f"(models--org--name); {model!r} is a local path: list it in a suite without revisions"
                )
    return cfg


def plan_suite(cfg: SuiteConfig) -> list[dict[str, Any]]:
    """One cell per (model, revision), models outermost, in the config's order."""
    fp = cfg.fingerprint()
    return [
        {"sweep": cfg.name, "kind": "suite", "model": m, "revision": r, "config": fp}
        for m in cfg.models
        for r in cfg.revisions
    ]


def _resolve(cell: Mapping[str, Any], *, local_only: bool | None) -> tuple[Any, str | None]:
    """(HubModel or None, why it cannot be had) of a cell's model, without raising."""
    try:
        return resolve_model(cell["model"], cell["revision"], flag="[suite] models", local_only=local_only)[1], None
    except WidthscopeError as exc:
        return None, str(exc)


def _rows(cfg: SuiteConfig, cell: Mapping[str, Any], res: Mapping[str, Any], path: Path) -> list[dict[str, Any]]:
    st = res["settings"]
    hub = (st.get("inputs") or {}).get("hub") or {}
    width = st.get("width")
    if not isinstance(width, (int, float)) or isinstance(width, bool) or width <= 0:
        width = max(int(p["d"]) for p in res["points"])  # a model whose config names no width: its widest point
    revision = cell["revision"] or hub.get("revision")
    tags = {
        "sweep": cfg.name,
        "family": f"{cfg.label} @ {revision or 'local'}",  # one width series per revision
        "suite": cfg.label,
        "width": width,
        "seed": cfg.certify.seed,
        "model": cell["model"],
        "model_id": hub.get("repo_id") or cell["model"],
        "revision": revision,
        "commit": hub.get("commit"),
        "step": step_of(revision),
        "dataset": st.get("data"),
        "depth": st.get("depth"),
        "n_params": st.get("parameters"),
        "data_description": st.get("data_description"),
        "certify_json": str(path),
    }
    placed = st.get("placement")
    if placed:  # where the weights went (settings.placement of the certify result)
        tags["placement"] = placement_text(cfg.placement, placed if isinstance(placed, dict) else None)
    return certify_rows(res, tags)


def run_suite(
    cfg: SuiteConfig, out_dir: str | os.PathLike, shard: tuple[int, int] = (1, 1), *, show_progress: bool = True
) -> GridResult:
    """Certify this shard's unfinished cells into ``out_dir``, every cell's model resolved (downloaded
    unless ``HF_HUB_OFFLINE``) before the first one runs."""
    out = Path(out_dir)
    cells = plan_suite(cfg)
    for c in shard_cells(cells, *shard):
        if (why := _resolve(c, local_only=None)[1]) is not None:
            raise WidthscopeError(why)
    run = CertifyRunOptions(batch_size=cfg.batch_size, device=cfg.device)
    results: dict[str, dict[str, Any]] = {}

    def one(cell: Mapping[str, Any], cell_dir: Path) -> list[dict[str, Any]]:
        path = cell_dir / "certify.json"
        job = CertifyJob(
            spec=cfg.spec(cell["model"], cell["revision"], cell_id(cell)),
            options=cfg.certify,
            run=run,
            out=str(path),
            resume=True,
        )
        try:
            res = run_certify(job, say=(lambda msg: print(msg, flush=True)) if show_progress else (lambda msg: None))
        finally:
            release(cfg.inputs, cell_id(cell))  # the cell's own offload folder
        results[cell_id(cell)] = res
        return _rows(cfg, cell, res, cell_path(out, cell_id(cell)))

    claim = {"fingerprint": cfg.fingerprint(), "config": cfg.to_dict(), "kind": "suite"}
    with claim_out_dir(out, claim, "a suite", shard, cfg.threads):  # cell file: the certify result + rows
        return run_grid(
            cells, one, out, shard=shard, desc=f"suite {cfg.name}", record=lambda c: results.pop(cell_id(c))
        )


def parameters(directory: Path) -> int | None:
    """Parameters of a checkpoint folder from its safetensors headers (None: no or a damaged file)."""
    total, seen = 0, False
    for f in sorted(Path(directory).glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > f.stat().st_size:  # a damaged file: its "header length" is any number
                    return None
                header = json.loads(fh.read(n))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        except (OSError, ValueError, struct.error, TypeError, KeyError, AttributeError):
            return None
        seen = True
    return total if seen else None


def print_suite_plan(
    cfg: SuiteConfig,
    mine: list[tuple[int, dict[str, Any]]],
    n_cells: int,
    out: Path,
    shard: tuple[int, int],
    *,
    timed: bool = False,
) -> None:
    """``--dry-run``: this shard's cells, the commit each revision resolves to in the local cache
    (nothing is downloaded), which are finished, and the compute (6 x parameters x probe tokens)."""
    sizes = [cfg.inputs.get("n_train", 256), cfg.inputs.get("n_test", 256), cfg.inputs.get("seq_len")]
    tokens = (sizes[0] + sizes[1]) * sizes[2] if all(type(v) is int for v in sizes) else None
    rows = []
    flops: list[float | None] = []
    hubs = {cell_id(c): _resolve(c, local_only=True)[0] for _, c in mine}
    done = {cell_id(c): cell_state(out, c) for _, c in mine}
    for i, c in mine:
        hub = hubs[cell_id(c)]
        n = parameters(hub.directory) if hub is not None else None
        flops.append(6.0 * n * tokens if n is not None and tokens is not None else None)
        rows.append(
            {
                "parameters": f"{n:,}" if n is not None else "?",
                "#": i,
                "model": c["model"],
                "revision": c["revision"] or "(default)",
                "step": step_of(c["revision"]),
                "commit": hub.commit[:12] if hub is not None else "not cached",
                "cell_id": cell_id(c),
                "done": done[cell_id(c)],
            }
        )
    k, n = shard
    print(format_table(rows, title=f"suite {cfg.name}: {len(mine)} of {n_cells} cells in shard {k}/{n}"))
    print(f"certify options: {json.dumps(cfg.certify.to_dict())}; results dir: {out}")
    known = [f for f in flops if f is not None]
    if known:
        print(
            f"estimated compute: {sum(known):.3g} FLOPs over {len(known)} cached cell(s) (6 x parameters x probe "
            f"tokens, an estimate; e.g. {sum(known) / 1e11 / 3600:.3g} h at 1e11 FLOP/s (a CPU), "
            f"{sum(known) / 3e13 / 60:.3g} min at 3e13 FLOP/s (a GPU))"
            + (f"; {len(flops) - len(known)} cell(s) not cached: not counted" if len(known) < len(flops) else "")
        )
    if cfg.inputs.get("device_map"):
        print(f"placement: {placement_text(cfg.placement)}")
    from ..planning import plan_suite_models, print_cell_plans  # noqa: PLC0415  cycle: widthscope.planning imports the sweeps

    costs = plan_suite_models(
        cfg,
        [c for _, c in mine],
        lambda c: done[cell_id(c)] is True,
        lambda c: None if (hub := hubs[cell_id(c)]) is None else Path(hub.directory),
        timed_run=timed,
    )
    print_cell_plans(costs, shard, cfg.device)
