"""``widthscope certify``: the command line of :func:`widthscope.certification.pipeline.run_certify`
(``--plan``: :func:`widthscope.planning.plan_certify`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ..certification.pipeline import CertifyJob, list_points, run_certify
from ..data.sources import splits_of
from ..data.spec import InputSpec, is_all
from ..data.splits import dataset_splits
from ..errors import WidthscopeError
from ..options import (
    PROTOCOLS,
    CertifyOptions,
    CertifyRunOptions,
    InterventionOptions,
    check_steps,
    flag_name,
    given,
    num_list,
)
from ..planning import plan_certify
from ..validate import check_pools, pairs_of
from .args import add_options, add_plan, load_config
from .inputs import add_arguments as add_inputs
from .inputs import spec_from_args

# The input side of each --protocol (the statistics side: options.PROTOCOLS).
INPUT_PRESETS: dict[str, dict[str, Any]] = {
    "published": {"sequences": "concatenate", "first": True, "n_test": "all", "empty_docs": "skip"},
    "default": {"n_test": 256},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs(
        parser, model_default="builtin", n_train=256, n_test=None, n_test_help="256; all with --protocol published"
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--protocol",
        choices=tuple(PROTOCOLS),
        default="default",
        help="published: what the published scripts do (plug-in estimator, sum pooling, "
        "concatenated chunks, empty documents skipped, --first, every held-out chunk "
        "(--n-test all), M = K in 16,32,64,128, 1000 draws, no interventions); "
        "options you give explicitly override it",
    )
    run.add_argument(
        "--config",
        default=None,
        metavar="RESULTS_JSON",
        help="repeat a run: the options recorded in a certify results JSON (its 'options'); "
        "options given here override them",
    )
    add_options(run, CertifyRunOptions)
    points = parser.add_argument_group("insertion points")
    points.add_argument("--list-points", action="store_true", help="print the insertion points and exit")
    points.add_argument(
        "--all", action="store_true", help="with --list-points: every module path, not only the block outputs"
    )
    interventions = {f.name for f in dataclasses.fields(InterventionOptions)}
    add_options(points, CertifyOptions, skip=[f.name for f in dataclasses.fields(CertifyOptions) if f.name != "points"])
    add_options(parser.add_argument_group("statistics"), CertifyOptions, skip=interventions | {"points"})
    add_options(parser.add_argument_group("interventions"), InterventionOptions)
    out = parser.add_argument_group("output and plan")
    out.add_argument("--out", default="widthscope-results/certify.json", help="JSON output path")
    out.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run: points finished by an earlier run with the same settings "
        "(kept in OUT.parts/) are not probed again",
    )
    out.add_argument(
        "--save-samples",
        default=None,
        metavar="FILE",
        help="also write the pooled samples of every point (safetensors) for `widthscope stats`",
    )
    no_time = "--plan without loading the weights (a Hugging Face checkpoint is counted on the meta device)"
    add_plan(out, "one batch", "probed", no_time + ": no time is predicted")


# ----------------------------------------------------------------------------- presets and combinations
def _two_sources(args: argparse.Namespace) -> bool:
    """A held-out source of its own (--test-data, or a dataset's own validation/test split)."""
    if getattr(args, "test_data", None) is not None:
        return True
    data = getattr(args, "data", None)
    if isinstance(data, str) and data.startswith("hf:"):  # a Hugging Face dataset: its own splits
        return len(splits_of(data) or []) >= 2
    if not isinstance(data, str) or not Path(data).expanduser().is_dir():
        return False

    return len(dataset_splits(data) or []) >= 2  # a DatasetDict or a folder of split files


def input_preset(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The values ``--protocol`` gives the input options left unset, and the preset's notes."""
    preset: dict[str, Any] = {}
    for key, value in INPUT_PRESETS[args.protocol].items():
        if key == "n_test" and value == "all" and not _two_sources(args):
            value = INPUT_PRESETS["default"]["n_test"]  # one corpus to split: never read all of it by default
        if not given(args, key):
            preset[key] = value
    if args.protocol != "published":
        return preset, []
    sequences = args.sequences or preset.get("sequences")
    seqs = (
        "concatenated chunks (non-empty documents joined with EOS)"
        if sequences == "concatenate"
        else f"--sequences {sequences}"
    )
    return preset, [
        f"protocol 'published': plug-in estimators, sum pooling, {seqs}, the first sequences of each source, "
        "every chunk of a held-out source unless --n-test is given, M = K in 16,32,64,128, 1000 draws drawn as "
        "the flip script draws them; probed in eval mode (the alignment script probes in train mode: see "
        "docs/certify.md)"
    ]


def _check_combinations(
    args: argparse.Namespace, opts: CertifyOptions, named: set[str], preset: dict[str, Any]
) -> None:
    """Refuse options that mean nothing together (after --protocol filled the rest)."""
    words = " (--protocol published)" if args.protocol == "published" else ""
    none_run = opts.interventions == "none"
    for dest, what in (
        ("n_etas", "the size of the default step grid"),
        ("max_rel_step", "the largest step of the default grid"),
    ):
        if dest in named and "etas" in named:
            raise WidthscopeError(f"{flag_name(dest)} sets {what}, --etas replaces that grid: drop one of them")
    for dest, what in (
        ("max_rel_step", "the largest intervention step"),
        ("etas", "the step sizes of the interventions"),
        ("n_etas", "the number of intervention steps"),
    ):
        if dest in named and none_run:
            flag = flag_name(dest)
            raise WidthscopeError(
                f"{flag} sets {what}, but none run{words}: add --interventions bias (or block), or drop {flag}"
            )
    if args.all and not args.list_points:
        raise WidthscopeError(
            "--all only changes what --list-points prints (every module path): add --list-points or drop --all"
        )
    if opts.pool != "token":
        Ms, Ks = [m for m, _ in opts.pairs], [k for _, k in opts.pairs]
        # "all": the pool's size is known once the source is read (the run checks it then)
        n_train = args.n_train  # 256 unless given
        n_test = args.n_test if args.n_test is not None else preset["n_test"]
        check_pools(Ms, Ks, max(Ms) if is_all(n_train) else n_train, max(Ks) if is_all(n_test) else n_test)


# ----------------------------------------------------------------------------- the command
def _bases(args: argparse.Namespace) -> tuple[CertifyOptions, CertifyRunOptions, InputSpec | None]:
    """The base options: ``--config``'s recorded ones, else the ``--protocol`` preset's."""
    if args.config is None:
        base = CertifyOptions.published() if args.protocol == "published" else CertifyOptions()
        return base, CertifyRunOptions(), None
    block = load_config(args.config)
    if not isinstance(block.get("certify"), dict):
        raise WidthscopeError(
            f"--config {args.config!r} records no certify options (its 'certify' is not a mapping of settings): "
            "pass a results JSON written by widthscope certify"
        )
    for name in ("run", "inputs"):
        if block.get(name) is not None and not isinstance(block[name], dict):
            raise WidthscopeError(f"--config {args.config!r}: its {name!r} is not a mapping of settings")
    try:
        opts = CertifyOptions.from_dict(block["certify"])
        run = CertifyRunOptions.from_dict(block.get("run") or {})
        spec = InputSpec.from_dict(block["inputs"]) if block.get("inputs") else None
    except WidthscopeError as exc:
        raise type(exc)(f"--config {args.config!r}: {exc}") from None
    return opts, run, spec


def _spec(args: argparse.Namespace, recorded: InputSpec | None, preset: dict[str, Any], seed: int) -> InputSpec:
    spec = spec_from_args(args, "certify", preset=preset, seed=seed)  # validated before the model loads
    if recorded is None:
        return spec
    mine = set(spec.given or ())  # options given now win over the recorded run's
    changes = {k: getattr(spec, k) for k in mine} | {"given": tuple(sorted(mine | set(recorded.given or ())))}
    # --model defaults to builtin: left at that, the recorded run's model is meant
    changes["model"] = recorded.model if args.model == "builtin" else args.model
    return dataclasses.replace(recorded, **changes)


def run(args: argparse.Namespace) -> int:
    preset, notes = input_preset(args)
    # the command line's messages for sizes and step sizes (the options check the same values again)
    pairs_of(num_list(args.M or "1", "--M", int), None if args.K is None else num_list(args.K, "--K", int))
    if args.etas is not None:
        check_steps("--etas", args.etas, num_list(args.etas, "--etas", float))
    base, run_base, recorded = _bases(args)
    opts = CertifyOptions.from_args(args, base)  # --points too (a field of the Python API's)
    _check_combinations(args, opts, CertifyOptions.given(args), preset)
    run_opts = CertifyRunOptions.from_args(args, run_base)
    spec = _spec(args, recorded, preset, opts.seed)  # the inputs' seed (data subsets) is the run's
    if args.list_points:
        print("\n".join(list_points(spec, every_module=args.all)), flush=True)
        return 0
    if args.plan or args.plan_no_time:
        print(plan_certify(spec, opts, run_opts, time_run=not args.plan_no_time).table(), flush=True)
        return 0
    job = CertifyJob(
        spec=spec,
        options=opts,
        run=run_opts,
        out=args.out,
        save_samples=args.save_samples,
        resume=bool(args.resume),
        protocol=args.protocol,
    )
    run_certify(job, notes=notes)
    return 0
