"""The typed input spec (issue 20): one spec, built by the command line, by a sweep and by a
Python script, resolves to the same probe pools; it validates itself, survives JSON and is
recorded in results. Plus the layering of the package: no import cycles, no argparse in data/
or models/, no edge from the maths packages up to pipelines or presentation."""
from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest
import torch

import widthscope as ws
from widthscope import checkpoint, models
from widthscope.cli import main
from widthscope.cli.inputs import add_arguments, spec_from_args
from widthscope.data.inputs import resolve
from widthscope.data.spec import InputSpec
from widthscope.errors import WidthscopeError

SRC = Path(ws.__file__).resolve().parent


# ----------------------------------------------------------------------------- import graph
def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (f, pkg)
    return out


def _imports(f: Path) -> list[ast.stmt]:
    return [n for n in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
            if isinstance(n, (ast.Import, ast.ImportFrom))]


def _graph() -> dict[str, set[str]]:
    """module -> widthscope modules it imports (at any level: lazy imports count). A package's
    edges to its own submodules are left out: they re-export, they do not layer."""
    mods = _modules()
    edges: dict[str, set[str]] = {}
    for m, (f, pkg) in mods.items():
        es = set()
        for n in _imports(f):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            else:
                base = m.split(".") if pkg else m.split(".")[:-1]
                if n.level:
                    base = base[:len(base) - (n.level - 1)]
                    target = ".".join(base + ([n.module] if n.module else []))
                else:
                    target = n.module or ""
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in n.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m and not (pkg and t.startswith(m + ".")):
                    es.add(t)
        edges[m] = es
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


# Allowed cycles (none now; issue 20 removed linear.model <-> linear.structured). Add one only with an issue.
KNOWN_CYCLES: set[frozenset[str]] = set()
MATHS = ("widthscope.stats", "widthscope.probe", "widthscope.linear")
PIPELINES = ("widthscope.certification", "widthscope.certification.per_point", "widthscope.growth",
             "widthscope.growth.bench",
             "widthscope.growth.compare", "widthscope.monitor",
             "widthscope.certification.samples", "widthscope.sweeps", "widthscope.demo", "widthscope.train",
             "widthscope.linearization")
PRESENTATION = ("widthscope.report", "widthscope.cli", "widthscope.cli.inputs", "widthscope.validate")
# issue 30: empty — the linearization sweep moved from linear/ to widthscope.linearization (a pipeline).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _under(m: str, roots: tuple[str, ...]) -> bool:
    return any(m == r or m.startswith(r + ".") for r in roots)


def test_graph_reader_sees_lazy_imports():
    edges = _graph()
    assert "widthscope.certification.per_point" in edges["widthscope.certification.samples"]  # a function-level import
    assert "widthscope.data.spec" in edges["widthscope.data.inputs"]  # a module-level one
    assert "widthscope.data.text" not in edges["widthscope.data"]  # package -> own submodule: left out


def test_no_import_cycles_but_the_known_ones():
    cycles = set(_cycles(_graph()))
    assert cycles <= KNOWN_CYCLES, sorted(map(sorted, cycles - KNOWN_CYCLES))
    assert frozenset({"widthscope.certification", "widthscope.certification.samples"}) not in cycles


def test_maths_packages_do_not_import_pipelines_or_presentation():
    edges = _graph()
    bad = sorted((m, t) for m, ts in edges.items() if _under(m, MATHS) for t in ts
                 if _under(t, PIPELINES + PRESENTATION) and (m, t) not in KNOWN_UPWARD)
    assert not bad, bad
    inputs = ("widthscope.data", "widthscope.models", "widthscope.checkpoint")
    bad = sorted((m, t) for m, ts in edges.items() if _under(m, inputs) for t in ts if _under(t, PIPELINES))
    assert not bad, bad
    # the input layer reads no command-line module (add_arguments moved to widthscope.cli.inputs)
    bad = sorted((m, t) for m, ts in edges.items() if _under(m, inputs) for t in ts if _under(t, PRESENTATION))
    assert not bad, bad


def test_no_argparse_under_data_or_models():
    for m, (f, _) in _modules().items():
        if _under(m, ("widthscope.data", "widthscope.models")):
            names = {a.name for n in _imports(f) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in _imports(f) if isinstance(n, ast.ImportFrom) and n.module}
            assert "argparse" not in names, m


def test_the_deprecation_shims_are_gone_and_certify_exports_public_names():
    import importlib

    for old in ("widthscope.certify_tables", "widthscope.samples", "widthscope.grow_bench", "widthscope.grow_compare",
                "widthscope._moved", "widthscope.cli_inputs"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    from widthscope import certification as certify
    from widthscope.certification import per_point

    assert certify.tables is per_point.tables and certify.statistics is per_point.statistics
    assert not hasattr(certify, "_int_list")  # no private name is re-exported


# Modules below the command-line package that still define a command's argparse options (each one
# moves to widthscope.cli as certify did; the list may only shrink).
ARGPARSE_NOT_YET_MOVED: set[str] = set()


def test_argparse_only_in_the_command_line_package():
    users = set()
    for m, (f, _) in _modules().items():
        names = {a.name for n in _imports(f) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in _imports(f) if isinstance(n, ast.ImportFrom) and n.module}
        if "argparse" in names and not _under(m, ("widthscope.cli",)):
            users.add(m)
    assert users <= ARGPARSE_NOT_YET_MOVED, sorted(users - ARGPARSE_NOT_YET_MOVED)
    for done in ("widthscope.certification.pipeline", "widthscope.certification.run", "widthscope.options",
                 "widthscope.data.inputs", "widthscope.monitor.core"):
        assert done not in users, done


# ----------------------------------------------------------------------------- one spec, three ways
SWEEP = {"sweep": {"name": "spec", "seeds": [0], "M": [4], "draws": 20, "interventions": "none", "data_seed": 3},
         "family": [{"name": "mlp", "widths": [8], "dataset": "digits", "n_train": 96, "n_test": 40,
                     "model_options": {"depth": 2}, "train": {"steps": 3, "lr": 1e-2, "batch_size": 32},
                     "certify": {"n_probe_train": 24, "n_probe_test": 16, "batch_size": 32}}]}


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """One sweep cell trained and saved (as ``widthscope sweep`` does), and its config."""
    from widthscope.sweeps.alignment import load_config, plan_cells
    from widthscope.sweeps.cell import run_cell

    root = tmp_path_factory.mktemp("sweep")
    cfg = load_config(SWEEP, out_dir=root)
    c = plan_cells(cfg)[0]
    run_cell(cfg, c, root / "cell", show_progress=False)
    return cfg, c, root / "cell"


def _cli_spec(argv):
    from widthscope.cli import certify
    from widthscope.cli.checks import check_args

    p = argparse.ArgumentParser()
    certify.add_arguments(p)
    args = p.parse_args(argv)
    check_args(args, "certify")
    preset, _ = certify.input_preset(args)
    seed = 0 if args.seed is None else args.seed  # the command takes it from its options
    return spec_from_args(args, "certify", preset=preset, seed=seed)


def _same_pools(a, b):
    for x, y in ((a.train, b.train), (a.test, b.test)):
        assert all(torch.equal(u, v) for u, v in zip(x, y))


def test_sweep_certify_and_python_reach_the_same_pools_through_one_spec(cell, tmp_path):
    from widthscope.sweeps import pools as sweep_pools

    cfg, c, ck = cell
    python = InputSpec(model=str(ck), n_train=24, n_test=16, seed=3)
    from_sweep = sweep_pools.cell_input_spec(cfg, c, ck)
    recorded = InputSpec.from_dict(json.loads((ck / "input_spec.json").read_text())["input_spec"])
    cli = _cli_spec(["--model", str(ck), "--n-train", "24", "--n-test", "16", "--seed", "3"])
    assert python == from_sweep == recorded == cli
    out = tmp_path / "c.json"
    assert main(["certify", "--model", str(ck), "--n-train", "24", "--n-test", "16", "--seed", "3", "--M", "4",
                 "--draws", "20", "--interventions", "none", "--points", "blocks.0", "--out", str(out)]) == 0
    in_certify = InputSpec.from_dict(json.loads(out.read_text())["settings"]["input_spec"])
    assert in_certify == python
    pools = [resolve(s, show_progress=False) for s in (python, from_sweep, cli, in_certify)]
    assert pools[0].info["train_pool"].startswith("a seeded sample of the 96 examples the model was fitted on")
    for p in pools[1:]:
        _same_pools(pools[0], p)
    # the sweep's own in-domain train pool is the spec's train pool (same fitted examples, same rule)
    fam = cfg.families[0]
    split = sweep_pools.load_split(fam, int(c["budget"]), cfg)
    pa, pb, _, _ = sweep_pools.probe_pools(fam, {"name": "in-domain", "data": "digits"}, None, split, cfg)
    assert all(torch.equal(u, v) for u, v in zip(pa, pools[0].train))
    assert len(pb[0]) == len(pools[0].test[0]) == 16


def test_load_inputs_is_the_python_entry(cell):
    _, _, ck = cell
    a = ws.load_inputs(ws.InputSpec(model=str(ck), n_train=8, n_test=8))
    b = ws.load_inputs(ws.InputSpec.from_dict(a.spec.to_dict()), show_progress=False)
    _same_pools(a, b)
    assert a.spec == ws.InputSpec(model=str(ck), n_train=8, n_test=8)


def test_python_certify_on_the_spec_pools_is_the_cli_result(cell, tmp_path):
    """docs/certify.md: certify_dict() on load_inputs(spec) pools = `widthscope certify` with those options."""
    from widthscope.certification import certify_dict
    from widthscope.probe.batches import to_batches

    _, _, ck = cell
    out = tmp_path / "c.json"
    argv = ["--model", str(ck), "--n-train", "32", "--n-test", "16", "--seed", "3", "--M", "8", "--draws", "30",
            "--interventions", "none"]
    assert main(["certify", *argv, "--out", str(out)]) == 0
    inp = ws.load_inputs(ws.InputSpec(model=str(ck), n_train=32, n_test=16, seed=3), show_progress=False)
    res = certify_dict(inp.model, to_batches(inp.train, 32), to_batches(inp.test, 32), M=[8], seed=3, draws=30,
                  interventions=None, progress=False)
    cli = json.loads(out.read_text())
    # the identical code path on identical pools and batches: equal to the last bit
    assert [p["certificates"] for p in res["points"]] == [p["certificates"] for p in cli["points"]]


def test_pools_of_all(cell):
    _, _, ck = cell
    inp = resolve(InputSpec(model=str(ck), n_train="all", n_test="all"), show_progress=False)
    assert len(inp.train[0]) == 96  # every fitted example
    assert len(inp.test[0]) == inp.info["n_test_examples"] > 16  # the whole held-out part
    assert torch.equal(inp.train[1], resolve(InputSpec(model=str(ck), n_train="all", n_test=8),
                                             show_progress=False).train[1])


def test_pools_of_all_from_a_text_file(tmp_path):
    """``"all"`` on a text source: every chunk of the whole file (no token window)."""
    net = models.build("llama", 16, vocab_size=259, max_seq_len=64, depth=1)
    ck = checkpoint.save(net, tmp_path / "lm", extra={"dataset": "text", "data_options": {"seq_len": 8}})
    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i} of a small corpus.\n" for i in range(200)))
    inp = resolve(InputSpec(model=str(ck), data=str(text), seq_len=8, n_train="all", n_test="all"),
                  show_progress=False)
    n_chunks = len(text.read_bytes()) // 8
    assert inp.info["train"]["corpus_exhausted"]
    # one corpus split by the held-out fraction (0.1); a few bytes may go to separators
    assert abs(len(inp.train) + len(inp.test) - n_chunks) <= 2 and len(inp.test) == round(0.1 * (len(inp.train)
                                                                                                + len(inp.test)))


# ----------------------------------------------------------------------------- validation, JSON
@pytest.mark.parametrize("kw, field", [
    ({"n_train": 3}, "n_train"), ({"n_test": "some"}, "n_test"), ({"n_train": True}, "n_train"),
    ({"seed": -1}, "seed"), ({"seed": 2.0}, "seed"), ({"dtype": "float8"}, "dtype"), ({"task": "lm"}, "task"),
    ({"sequences": "chunks"}, "sequences"), ({"train_pool": "all"}, "train_pool"), ({"seq_len": 1}, "seq_len"),
    ({"max_tokens": 0}, "max_tokens"), ({"test_fraction": 1.0}, "test_fraction"), ({"first": "yes"}, "first"),
    ({"data": ""}, "data"), ({"tokenizer": 3}, "tokenizer"), ({"model": None}, "model"),
    ({"given": ("n_train",)}, "given"), ({"given": "data"}, "given")])
def test_bad_fields_get_one_line_naming_the_field(kw, field):
    with pytest.raises(WidthscopeError) as e:
        InputSpec(**{"model": "ck", **kw})
    msg = str(e.value)
    assert "\n" not in msg and f"input spec field {field})" in msg and ": " in msg


def test_json_round_trip_and_bad_dicts():
    s = InputSpec(model="ck", data="digits", n_train="all", n_test=8, seed=7, first=True, test_fraction=0.3,
                  given=("data", "first"))
    again = InputSpec.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s and again.given == ("data", "first")
    assert InputSpec(model="ck", data="digits").given == ("data",)  # derived: the fields set
    with pytest.raises(WidthscopeError, match="unknown field 'n_pool'"):
        InputSpec.from_dict({"model": "ck", "n_pool": 3})
    with pytest.raises(WidthscopeError, match="no 'model'"):
        InputSpec.from_dict({"data": "digits"})


def test_resolve_takes_a_spec_not_a_namespace():
    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(WidthscopeError, match="takes an InputSpec"):
        resolve(p.parse_args(["--model", "x"]))


def test_spec_from_args_does_not_change_the_namespace_and_knows_grow_defaults():
    p = argparse.ArgumentParser()
    add_arguments(p, n_train=None, n_test=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(["--model", "ck", "--n-test", "64", "--seq-len", "16"])
    before = dict(vars(args))
    s = spec_from_args(args, "grow")
    assert vars(args) == before
    assert (s.n_train, s.n_test, s.cap_pools, s.given) == (2048, 64, True, ("seq_len",))
    args.n_train = 32
    assert spec_from_args(args, "inputs").cap_pools is False  # only grow's defaults are caps


def test_docstring_example_runs_and_the_entry_is_exported():
    import doctest
    import importlib

    res = doctest.testmod(importlib.import_module("widthscope.data.spec"), verbose=False)
    assert res.attempted > 0 and res.failed == 0
    assert ws.InputSpec is InputSpec and ws.load_inputs is resolve
    assert {"InputSpec", "load_inputs"} <= set(dir(ws))
