"""The layering of docs/architecture.md, read from the import graph (lazy imports included): no
import runs up (base -> maths -> inputs -> pipelines -> presentation -> command line), and no
module reaches another package's ``_private`` names. The lists of known exceptions may only shrink."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from test_input_spec import _graph, _modules

SRC = Path(__file__).resolve().parents[1] / "src" / "widthscope"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("widthscope.errors", "widthscope._args", "widthscope._io", "widthscope._env", "widthscope._version",
              "widthscope.options")),
    ("maths", ("widthscope.stats", "widthscope.probe", "widthscope.linear")),
    ("inputs", ("widthscope.models", "widthscope.data", "widthscope.checkpoint", "widthscope.train",
                "widthscope.distributed", "widthscope.validate", "widthscope.hub")),
    ("pipelines", ("widthscope.certify", "widthscope.grow", "widthscope.sweep", "widthscope.monitor",
                   "widthscope.repair", "widthscope.linearization", "widthscope.plan")),
    ("presentation", ("widthscope.report", "widthscope.demo")),
    ("command line", ("widthscope.cli", "widthscope.__main__", "widthscope")),
]

# Imports that run up today (module, what it imports). Each is a place to fix; none may be added.
KNOWN_CLIMBS: set[tuple[str, str]] = set()


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for i, (_, roots) in enumerate(LAYERS):
        for r in roots:
            if (module == r or module.startswith(r + ".")) and (best is None or len(r) > best[1]):
                best = (i, len(r))
    return None if best is None else best[0]


def _climbs(graph: dict[str, set[str]] | None = None) -> set[tuple[str, str]]:
    out = set()
    for m, targets in (_graph() if graph is None else graph).items():
        for t in targets:
            a, b = _layer(m), _layer(t)
            if a is not None and b is not None and b > a:
                out.add((m, t))
    return out


def test_every_module_has_a_layer():
    assert [m for m in _modules() if _layer(m) is None] == []


def test_no_import_runs_up_the_layers():
    climbs = _climbs()
    new = sorted(climbs - KNOWN_CLIMBS)
    assert not new, f"imports that run up the layers (docs/architecture.md): {new}"
    assert len(climbs) <= len(KNOWN_CLIMBS)


def test_the_check_sees_a_climb():
    assert _layer("widthscope.stats.bounds") < _layer("widthscope.certify.run") < _layer("widthscope.cli.certify")
    graph = {"widthscope.probe.points": {"widthscope.models.hf", "widthscope.stats"}}
    assert _climbs(graph) == {("widthscope.probe.points", "widthscope.models.hf")}


# ----------------------------------------------------------------------------- private names
def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def private_imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, name) for every ``from X import _name`` across packages."""
    out = []
    for module, (path, is_pkg) in _modules().items():
        base = module if is_pkg else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                parts = base.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("widthscope"):
                continue
            for alias in node.names:
                name = alias.name
                private = name.startswith("_") and not name.startswith("__")
                root_module = target == "widthscope" and (SRC / f"{name}.py").exists()  # a shared root module
                if private and not root_module and _package(target) != _package(module):
                    out.append((module, target, name))
    return sorted(out)


def test_no_private_name_is_reached_across_packages():
    assert private_imports() == []


@pytest.mark.parametrize("source,expected", [("from ..probe.intervene import _index", True),
                                             ("from .. import _args", False),
                                             ("from .per_point import _v", False)])
def test_the_private_name_reader(tmp_path, monkeypatch, source, expected):
    import test_layers as me

    pkg = tmp_path / "widthscope"
    (pkg / "certify").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_args.py").write_text("")
    (pkg / "certify" / "__init__.py").write_text("")
    (pkg / "certify" / "run.py").write_text(source + "\n")
    mods = {"widthscope": (pkg / "__init__.py", True), "widthscope.certify": (pkg / "certify" / "__init__.py", True),
            "widthscope.certify.run": (pkg / "certify" / "run.py", False)}
    monkeypatch.setattr(me, "_modules", lambda: mods)
    monkeypatch.setattr(me, "SRC", pkg)
    assert bool(me.private_imports()) == expected
