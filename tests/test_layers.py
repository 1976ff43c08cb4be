"""The layering of docs/architecture.md, read from the import graph (lazy imports included): no
import runs up (base -> maths -> inputs -> pipelines -> presentation -> command line), and no
module reaches another module's ``_private`` names. The lists of known exceptions may only shrink."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from test_input_spec import _graph, _modules

SRC = Path(__file__).resolve().parents[1] / "src" / "widthscope"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("widthscope.errors", "widthscope._args", "widthscope._io", "widthscope._env", "widthscope._version",
              "widthscope.options", "widthscope.registry")),
    ("maths", ("widthscope.stats", "widthscope.probe", "widthscope.linear")),
    ("inputs", ("widthscope.models", "widthscope.data", "widthscope.checkpoint", "widthscope.train",
                "widthscope.distributed", "widthscope.validate", "widthscope.hub")),
    ("pipelines", ("widthscope.api", "widthscope.certification", "widthscope.growth", "widthscope.sweeps",
                   "widthscope.monitor", "widthscope.repair", "widthscope.linearization", "widthscope.planning")),
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
    assert _layer("widthscope.stats.bounds") < _layer("widthscope.certification.pipeline") < _layer("widthscope.cli.certify")
    graph = {"widthscope.probe.points": {"widthscope.models.hf", "widthscope.stats"}}
    assert _climbs(graph) == {("widthscope.probe.points", "widthscope.models.hf")}


# ----------------------------------------------------------------------------- private names
# Modules that still import a sibling's private name. May only shrink.
KNOWN_PRIVATE_IMPORTERS: set[str] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, name) for every private name a module takes from another
    widthscope module: ``from .x import _name`` or ``x._name`` on a module ``x`` it imported. A private
    *module* (``from .. import _io``, ``from . import _core``) is a package's shared helper: not counted."""
    mods = _modules()
    out = []
    for module, (path, is_pkg) in mods.items():
        base = module if is_pkg else module.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    parts = parts[:len(parts) - (node.level - 1)]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("widthscope"):
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
                    elif _private(alias.name) and target != module:
                        out.append((module, target, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("widthscope") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = aliases[node.value.id]
                if _private(node.attr) and target != module and f"{target}.{node.attr}" not in mods:
                    out.append((module, target, node.attr))
    return sorted(set(out))


def test_no_module_reaches_another_modules_private_name():
    found = private_imports()
    new = [f for f in found if f[0] not in KNOWN_PRIVATE_IMPORTERS]
    assert not new, "private names taken from another module (make the name public, or merge the modules):\n  " + (
        "\n  ".join(f"{m} <- {t}.{n}" for m, t, n in new))
    stale = KNOWN_PRIVATE_IMPORTERS - {f[0] for f in found}
    assert not stale, f"remove from KNOWN_PRIVATE_IMPORTERS: {sorted(stale)}"


@pytest.mark.parametrize("source,expected", [("from ..probe.interventions import _index", True),
                                             ("from .pipeline import _helper", True),
                                             ("from . import pipeline\nx = pipeline._helper", True),
                                             ("from .. import _args", False),
                                             ("from . import pipeline\nx = pipeline.helper", False),
                                             ("_own = 1\nfrom .run import public", False)])
def test_the_private_name_reader(tmp_path, monkeypatch, source, expected):
    import test_layers as me

    pkg = tmp_path / "widthscope"
    (pkg / "certify").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_args.py").write_text("")
    (pkg / "certify" / "__init__.py").write_text("")
    (pkg / "certify" / "pipeline.py").write_text("")
    (pkg / "certify" / "run.py").write_text(source + "\n")
    mods = {"widthscope": (pkg / "__init__.py", True), "widthscope._args": (pkg / "_args.py", False),
            "widthscope.certify": (pkg / "certify" / "__init__.py", True),
            "widthscope.certify.pipeline": (pkg / "certify" / "pipeline.py", False),
            "widthscope.certify.run": (pkg / "certify" / "run.py", False)}
    monkeypatch.setattr(me, "_modules", lambda: mods)
    monkeypatch.setattr(me, "SRC", pkg)
    assert bool(me.private_imports()) == expected
