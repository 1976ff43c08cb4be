"""The size rules of the house (issue 30), read from the source: no module under src/widthscope
over ``MAX_MODULE_LINES`` lines, no function (or method, or nested function) over
``MAX_FUNCTION_LINES``. A failure lists every offender with its size. The functions over the
limit today are listed in ``KNOWN`` with their sizes: the list may only shrink, and a listed
function may not grow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "widthscope"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120

# Functions over MAX_FUNCTION_LINES when the rule was written ("path::qualname" -> lines, from the
# first decorator to the last line). Each is a function to split along its named steps; none may be
# added, none may grow, and an entry is removed once its function is within the limit (or gone).
KNOWN: dict[str, int] = {
    "probe/intervene.py::intervene": 227,
    "certification/pipeline.py::certify_dict": 219,
}


def module_sizes(root: Path = SRC) -> dict[str, int]:
    """Lines of every ``.py`` file under ``root`` ("sub/path.py" -> lines)."""
    return {
        p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(root.rglob("*.py"))
    }


def function_sizes(root: Path = SRC) -> dict[str, int]:
    """Lines of every function, method and nested function under ``root`` ("path::Outer.name" ->
    lines from its first decorator, or its ``def``, to its last line; a nested function counts in
    its parent's lines too)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                assert child.end_lineno is not None
                name = prefix + child.name
                out.setdefault(f"{path}::{name}", child.end_lineno - start + 1)  # first of a redefinition
                visit(child, path, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, prefix + child.name + ".")
            else:
                visit(child, path, prefix)  # functions under if/try blocks

    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        visit(ast.parse(p.read_text(encoding="utf-8"), filename=str(p)), rel, "")
    return out


def _listing(sizes: dict[str, int], limit: int) -> str:
    over = sorted(((n, k) for k, n in sizes.items() if n > limit), reverse=True)
    return "\n".join(f"  {k}: {n} lines" for n, k in over)


def test_no_module_over_the_limit():
    sizes = module_sizes()
    assert len(sizes) > 50  # the walk found the package
    over = {k: n for k, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, (
        f"modules over {MAX_MODULE_LINES} lines (split along their named steps, re-exporting the public "
        f"names from the old path):\n{_listing(over, MAX_MODULE_LINES)}"
    )


def test_no_function_over_the_limit_beyond_the_known_list():
    sizes = function_sizes()
    over = {k: n for k, n in sizes.items() if n > MAX_FUNCTION_LINES and k not in KNOWN}
    assert not over, (
        f"functions over {MAX_FUNCTION_LINES} lines (split along their named steps):\n"
        f"{_listing(over, MAX_FUNCTION_LINES)}"
    )


def test_the_known_list_only_shrinks():
    sizes = function_sizes()
    grown = {k: sizes[k] for k, n in KNOWN.items() if k in sizes and sizes[k] > n}
    assert not grown, "listed functions that grew (they may only shrink): " + ", ".join(
        f"{k}: {n} lines, listed at {KNOWN[k]}" for k, n in sorted(grown.items())
    )
    stale = sorted(k for k in KNOWN if sizes.get(k, 0) <= MAX_FUNCTION_LINES)
    assert not stale, f"remove from KNOWN (now within {MAX_FUNCTION_LINES} lines, or gone): " + ", ".join(
        f"{k} ({sizes[k]} lines)" if k in sizes else f"{k} (gone)" for k in stale
    )


# ----------------------------------------------------------------------------- the measure itself
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return tmp_path


def test_the_measure_counts_lines_as_written(tmp_path):
    """Sizes against lines counted by hand: decorators, docstrings, methods, nested functions, a
    function under ``if``, a redefinition (the first is measured) and a module's lines."""
    body = "\n".join(f"    x{i} = {i}" for i in range(130))
    src = (
        "import functools\n"  # 1
        "\n"  # 2
        "@functools.lru_cache\n"  # 3  decorated: counted from here
        "def big():\n"  # 4
        '    """Doc."""\n'  # 5
        f"{body}\n"  # 6..135
        "    def inner():\n"  # 136
        "        return 1\n"  # 137
        "    return inner\n"  # 138
        "\n"  # 139
        "class C:\n"  # 140
        "    def m(self):\n"  # 141
        "        return 2\n"  # 142
        "if True:\n"  # 143
        "    def f():\n"  # 144
        "        pass\n"  # 145
        "    def f():\n"  # 146
        "        pass\n"  # 147
        "        pass\n"  # 148
    )
    root = _tree(tmp_path, {"pkg/a.py": src, "b.py": "x = 1\n"})
    assert function_sizes(root) == {
        "pkg/a.py::big": 136,
        "pkg/a.py::big.inner": 2,
        "pkg/a.py::C.m": 2,
        "pkg/a.py::f": 2,
    }
    assert module_sizes(root) == {"b.py": 1, "pkg/a.py": 148}


@pytest.mark.parametrize(
    "module_lines,function_lines,offender",
    [
        (MAX_MODULE_LINES, MAX_FUNCTION_LINES, None),
        (MAX_MODULE_LINES + 1, MAX_FUNCTION_LINES, "big.py: 601 lines"),
        (MAX_MODULE_LINES, MAX_FUNCTION_LINES + 1, "big.py::f: 121 lines"),
    ],
)
def test_the_listing_names_each_offender_with_its_size(tmp_path, module_lines, function_lines, offender):
    """At the limits nothing is listed; one line over, the offender is, with its size."""
    fn = "def f():\n" + "    pass\n" * (function_lines - 1)
    src = fn + "#\n" * (module_lines - function_lines)
    root = _tree(tmp_path, {"big.py": src})
    assert module_sizes(root)["big.py"] == module_lines
    assert function_sizes(root)["big.py::f"] == function_lines
    text = _listing(module_sizes(root), MAX_MODULE_LINES) + _listing(function_sizes(root), MAX_FUNCTION_LINES)
    assert text == ("" if offender is None else f"  {offender}")


LOCAL_IMPORT_REASONS = ("start-up time", "cycle", "call-time lookup", "optional")
NOQA = re.compile(r"#\s*noqa:\s*PLC0415\b(.*)$")


def unexplained_local_imports(root: Path = SRC) -> list[str]:
    """``file:line`` of every ``# noqa: PLC0415`` (a function-level import ruff lets through) whose
    comment does not start with one of :data:`LOCAL_IMPORT_REASONS`."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = NOQA.search(line)
            if m and not m.group(1).strip().startswith(LOCAL_IMPORT_REASONS):
                bad.append(f"{path.relative_to(root).as_posix()}:{i}")
    return bad


def test_every_local_import_says_why():
    """Imports sit at module level (ruff PLC0415, pyproject.toml); the heavy or optional libraries that
    TID253 bans there are local by rule; any other local import carries ``# noqa: PLC0415  <reason>``."""
    bad = unexplained_local_imports()
    assert not bad, "local imports without a reason (start-up time / cycle / call-time lookup / optional):\n  " + (
        "\n  ".join(bad)
    )


def test_an_unexplained_local_import_is_found(tmp_path):
    src = (
        "def f():\n"
        "    import os  # noqa: PLC0415\n"
        "    import json  # noqa: PLC0415  start-up time: json is slow here\n"
        "    import re  # noqa: PLC0415 because\n"
    )
    root = _tree(tmp_path, {"m.py": src})
    assert unexplained_local_imports(root) == ["m.py:2", "m.py:4"]
