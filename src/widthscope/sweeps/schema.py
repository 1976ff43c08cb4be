"""The shape of an alignment sweep: its config keys, the validated config, and its row columns.

:class:`SweepConfig` and :class:`FamilySpec` hold a config after :func:`widthscope.sweeps.config.load_config`
has checked it; the ``*_KEYS`` tables name (and describe) every key a sweep TOML may set, and the
column tuples name the row fields other code reads (:data:`CERT_FIELDS`, :data:`TIMING_COLUMNS`,
:data:`MONITOR_SUMMARY`). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .._io import to_jsonable
from ..options import ESTIMATORS as ESTIMATORS
from ..options import CertifyOptions, Estimator

__all__ = [
    "CERT_FIELDS",
    "TIMING_COLUMNS",
    "MONITOR_TIMING_COLUMNS",
    "MONITOR_SUMMARY",
    "SWEEP_KEYS",
    "PLACEMENT_KEYS",
    "FAMILY_KEYS",
    "PROBE_KEYS",
    "SHIFTS",
    "TRAIN_KEYS",
    "CERTIFY_KEYS",
    "MONITOR_KEYS",
    "OPTIMIZERS",
    "LM_DATASETS",
    "SCHEDULES",
    "EXAMPLE_FAMILY",
    "ESTIMATORS",
    "POOLS",
    "SWEEP_CERTIFY",
    "SWEEP_CERTIFY_KEYS",
    "CERTIFY_FROM_SWEEP",
    "FamilySpec",
    "SweepConfig",
]

# Fields of widthscope.stats.Certificate copied into each row, prefixed "one_" / "two_".
CERT_FIELDS = ("expectation", "variance", "d_par", "d_2", "d_align", "n_eff", "b_exact", "b_align", "vacuous", "reason")
# Columns that measure time and therefore differ between otherwise identical runs.
TIMING_COLUMNS = ("train_s", "probe_s", "stats_s", "intervene_s", "cell_seconds")
MONITOR_TIMING_COLUMNS = ("monitor_s", "monitor_probe_s", "monitor_stats_s")  # of monitored cells only
# Columns a monitored cell adds to its alignment rows (per point; docs/monitor.md §8).
MONITOR_SUMMARY = (
    "monitor_point",
    "monitor_first_cert_step",
    "monitor_first_cert_b_exact",
    "monitor_cert_from_step",
    "monitor_delta",
    "monitor_M",
    "monitor_K",
    "monitor_steps_total",
    "monitor_steps",
    "monitor_n_train",
    "monitor_n_test",
    "monitor_probe",
    "monitor_probe_seq_len",
)

# Big-model placement (widthscope.sweeps.placement): [sweep] and [[family]] keys, [suite]'s input options.
PLACEMENT_KEYS = {
    "device_map": "accelerate's placement while a cell probes: auto, balanced, balanced_low_0, sequential "
    "(docs/big-models.md); training stays on device",
    "max_memory": "per-device memory for device_map, e.g. 'cpu=2GB,0=10GiB,disk' ('disk' allows disk offload)",
    "offload_folder": "where disk-offloaded weights go (each cell its own subfolder; default: a temporary folder)",
}
SWEEP_KEYS = {
    "name": "label of the sweep (default: the config file's stem)",
    "out_dir": "results directory (default: widthscope-results/<name>)",
    "seeds": "list of seeds; each seeds model init, batch order and resampling (default [0])",
    "M": "list of training-sample counts M (default [16, 32])",
    "K": "list of held-out-sample counts K (default: K = M)",
    "paired": "true: pairs (M[i], K[i]); false: every M with every K (default true)",
    "draws": "resamples for the empirical misalignment probability (default 1000)",
    "estimator": "'unbiased' (default) or 'plugin'",
    "pool": "pooling of token/spatial gradients: 'sum' (default), 'mean', 'flatten'",
    "budgets": "optional list of training-set sizes n_train; adds a data-budget axis to the grid",
    "data_seed": "seed of the train/test split, shared by all cells (default 0)",
    "device": "torch device (default 'cpu')",
    "threads": "torch CPU threads while the sweep runs (default: torch's choice); 1 avoids "
    "oversubscription when other jobs share the cores",
    "interventions": "'bias' (default), 'block' or 'none': a direct zero-init residual intervention "
    "at every point (rows of kind 'intervention' + iv_* columns on alignment rows)",
    "etas": "intervention step sizes (default: a log grid scaled to each point)",
    **PLACEMENT_KEYS,
}
FAMILY_KEYS = {
    "name": "label of this family in results (required)",
    "model": "model family for widthscope.models.build (default: name): mlp, resnet20, llama, pythia",
    "widths": "positive, strictly increasing list of widths (required)",
    "model_options": "table of extra options for widthscope.models.build (depth, activation, ...)",
    "dataset": "dataset name for widthscope.data.load (required), e.g. digits, text, fashion-mnist",
    "data_options": "table of extra options for widthscope.data.load (root, seq_len, ...)",
    "n_train": "training examples (required unless [sweep].budgets is given)",
    "n_test": "held-out examples (default: n_probe_test)",
    "train": "table: steps, lr, optimizer, batch_size, warmup, clip, weight_decay, schedule, momentum, "
    "loss, eval_batch_size, train_eval_examples (options of widthscope.train.train)",
    "certify": "table: n_probe_train, n_probe_test, batch_size (the sweep's own) and every certify option "
    "(widthscope.options.CertifyOptions: points, M, K, draws, seed, estimator, pool, draw_scheme, "
    "train_mode, interventions, etas, n_etas, max_rel_step); a statistics option left out takes [sweep]'s",
    "monitor": "table: every, count, at, points, n_train, n_test, M, K, delta, probe, seq_len: alignment over "
    "training (widthscope.monitor at the listed optimizer steps; docs/monitor.md)",
    "probes": "list of probe conditions {name, data, test_data, data_options, shift, seq_len} (default: one "
    "'in-domain' condition, the training data's own train/held-out parts); each is a results column "
    "'probe_set'",
    "probe_seq_len": "list of probe sequence lengths for text (default: the training length); an axis of the rows",
    "probe_data": "dataset name of the train probe pool (one probe condition named 'probe'; see probes)",
    "probe_test_data": "dataset name of the held-out probe pool (default: probe_data's held-out part)",
    "probe_data_options": "table of options for probe_data/probe_test_data (seq_len, max_bytes, ...)",
    **{k: f"{v} (overrides [sweep]'s)" for k, v in PLACEMENT_KEYS.items()},
}
PROBE_KEYS = ("name", "data", "test_data", "data_options", "shift", "seq_len")
SHIFTS = ("noise:SIGMA", "contrast:FACTOR", "blur", "classes:A,B,...")
TRAIN_KEYS = (
    "steps",
    "lr",
    "optimizer",
    "batch_size",
    "warmup",
    "clip",
    "weight_decay",
    "schedule",
    "momentum",
    "loss",
    "eval_batch_size",
    "train_eval_examples",
)
# The [family.certify] keys: the sweep's own (probe pool sizes and batch) and every CertifyOptions field.
SWEEP_CERTIFY_KEYS = ("n_probe_train", "n_probe_test", "batch_size")
CERTIFY_KEYS = SWEEP_CERTIFY_KEYS + tuple(f.name for f in dataclasses.fields(CertifyOptions))
# [sweep] keys that are certify options (the defaults of every family's certify table).
CERTIFY_FROM_SWEEP = ("draws", "estimator", "pool", "interventions", "etas")
MONITOR_KEYS = ("every", "count", "at", "points", "n_train", "n_test", "M", "K", "delta", "probe", "seq_len")
OPTIMIZERS = ("adamw", "sgd")  # widthscope.train.train
LM_DATASETS = ("text", "prose")  # byte-level language modelling; every other dataset is classification
SCHEDULES = ("cosine", "constant")
EXAMPLE_FAMILY = (
    '[[family]] name = "mlp", widths = [32, 64], dataset = "digits", n_train = 512, train = { steps = 300, lr = 1e-3 }'
)
POOLS = ("sum", "mean", "flatten")  # CertifyOptions' pools but "token": a sweep cell pools per example
# A sweep's certify options where neither [sweep] nor [family.certify] sets a field: CertifyOptions'
# defaults but M = (16, 32) and the intervention grid sweeps have always used (nine half-decades up
# to the activation's own size: widthscope.probe.interventions.intervene's defaults).
SWEEP_CERTIFY = CertifyOptions(M=(16, 32), n_etas=9, max_rel_step=1.0)


@dataclass
class FamilySpec:
    """One ``[[family]]`` entry of a sweep config (validated)."""

    name: str
    model: str
    widths: list[float]
    dataset: str
    n_train: int | None
    n_test: int
    model_options: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    n_probe_train: int = 128
    n_probe_test: int = 128
    probe_batch_size: int = 32
    certify: CertifyOptions = SWEEP_CERTIFY  # the family's statistics (frozen, so a shared default is safe)
    probes: list[dict[str, Any]] | None = None
    probe_seq_len: list[int] | None = None
    monitor: dict[str, Any] | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # [sweep]'s device_map/max_memory/offload_folder + its own

    @property
    def points(self) -> list[str] | None:
        """``certify.points`` as the config gave them (None: not given; ``[]`` means the defaults too)."""
        return None if self.certify.points is None else list(self.certify.points)

    def legacy_dict(self) -> dict[str, Any]:
        """The family as sweeps recorded it before it held a :class:`CertifyOptions` (``points``)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "certify"}
        d["points"] = self.points
        if not self.placement:  # the layout of sweeps without placement stays as it was
            d.pop("placement")
        return to_jsonable(d)


@dataclass
class SweepConfig:
    """A validated sweep config: the ``[sweep]`` table and its families."""

    name: str
    out_dir: str
    families: list[FamilySpec]
    seeds: list[int] = field(default_factory=lambda: [0])
    certify: CertifyOptions = SWEEP_CERTIFY  # [sweep]'s statistics: the base of every family's
    budgets: list[int] | None = None
    data_seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # [sweep]'s device_map/max_memory/offload_folder

    # [sweep]'s statistics keys, read from its options
    @property
    def MK(self) -> list[tuple[int, int]]:
        return self.certify.pairs

    @property
    def draws(self) -> int:
        return self.certify.draws

    @property
    def estimator(self) -> Estimator:
        return self.certify.estimator

    @property
    def pool(self) -> str:
        return self.certify.pool

    @property
    def interventions(self) -> str:
        return self.certify.interventions

    @property
    def etas(self) -> list[float] | None:
        return None if self.certify.etas is None else list(self.certify.etas)

    def _legacy(self) -> dict[str, Any]:
        """The config in the layout sweeps recorded before it held :class:`CertifyOptions`
        (``placement`` only where [sweep] sets it)."""
        return ({"placement": dict(self.placement)} if self.placement else {}) | {
            "name": self.name,
            "out_dir": self.out_dir,
            "families": [f.legacy_dict() for f in self.families],
            "seeds": list(self.seeds),
            "MK": [list(mk) for mk in self.MK],
            "draws": self.draws,
            "estimator": self.estimator,
            "pool": self.pool,
            "budgets": self.budgets,
            "data_seed": self.data_seed,
            "device": self.device,
            "threads": self.threads,
            "interventions": self.interventions,
            "etas": self.etas,
        }

    def to_dict(self) -> dict[str, Any]:
        """The config as sweeps have always recorded it (``sweep.json``'s ``config``); the certify
        options of each family are :meth:`options_record`."""
        return to_jsonable(self._legacy())

    def options_record(self) -> dict[str, Any]:
        """The certify options, once: [sweep]'s (``sweep``) and each family's (``families``, by
        name), each ``CertifyOptions.to_dict()`` (``sweep.json``'s ``options``)."""
        return {
            "sweep": self.certify.to_dict(),
            "families": {f.name: f.certify.to_dict() for f in self.families},
        }

    def fingerprint(self) -> str:
        """Hash of everything that determines results (not where they go).

        Options at their defaults leave older fingerprints alone: a family's certify options enter
        only where they differ from what [sweep]'s keys and ``points`` give (``certify_changes``)."""
        d = to_jsonable(self._legacy())
        d.pop("placement", None)  # where the weights live changes no number (docs/sweeps.md)
        for fam, fd in zip(self.families, d.get("families", [])):
            fd.pop("placement", None)
            for key in ("probes", "probe_seq_len", "monitor"):
                if fd.get(key) is None:
                    fd.pop(key, None)
            implied = self.certify.replace(points=fam.certify.points).to_dict()
            changes = {k: v for k, v in fam.certify.to_dict().items() if implied[k] != v}
            if changes:
                fd["certify_changes"] = changes
        extra = {k: v for k, v in self.certify.to_dict().items() if k not in _LEGACY_SWEEP and SWEEP_DICT[k] != v}
        if extra:
            d["certify_changes"] = extra
        d.pop("out_dir", None)
        d.pop("device", None)
        d.pop("threads", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


SWEEP_DICT = SWEEP_CERTIFY.to_dict()
# CertifyOptions fields the legacy layout of a sweep records already (M, K as its MK pairs)
_LEGACY_SWEEP = ("M", "K", "draws", "estimator", "pool", "interventions", "etas", "points")
