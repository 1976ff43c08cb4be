"""The house rule no linter states: a function-level import says why (ruff PLC0415 lets a
``# noqa: PLC0415`` through; the comment must give the reason). There is no size rule: modules and
functions are cut along their named steps, not to fit a line count (issue 44)."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "widthscope"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return tmp_path


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
