"""Write docs/api.md, the API reference, from the docstrings and the options dataclasses.

    python docs/gen_api.py           # rewrite docs/api.md
    python docs/gen_api.py --check   # exit 1 if docs/api.md is not what the code says

``tests/test_api_doc.py`` runs the check, so the page cannot drift from the code; the examples in
the docstrings run as doctests (pytest ``--doctest-modules``).
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "api.md"

GROUPS = [
    ("The pipelines", ["certify", "grow", "AlignmentMonitor", "sweep"]),
    ("Settings and results", ["CertifyOptions", "InterventionOptions", "GrowOptions", "MonitorOptions",
                              "ReportOptions", "CertifyResult", "PointCertificate"]),
    ("Inputs", ["InputSpec", "load_inputs"]),
    ("Statistics", ["moments", "certificate", "misalignment", "plan"]),
    ("Probes and interventions", ["collect", "insertion_points", "insert", "intervene"]),
    ("Linearization", ["linearize", "ntk", "nngp", "kernel_predict", "correlation", "train_side_by_side"]),
]


def _first_paragraph(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""


def _options_table(cls: type) -> list[str]:
    rows = ["| field | command line | default | range / choices | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "kind" not in meta:
            continue
        rng = (", ".join(map(str, meta["choices"])) if meta["choices"] else
               f"{meta['lo'] if meta['lo'] is not None else ''}..{meta['hi'] if meta['hi'] is not None else ''}"
               if meta["lo"] is not None or meta["hi"] is not None else "")
        flag = cls.flag(f.name) if meta.get("cli", True) else "(Python only)"
        default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        text = " ".join(meta["help"].split()).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{flag}` | `{default}` | {rng} | {text} |")
    return rows


def render() -> str:
    import widthscope as ws

    lines = ["# API reference", "",
             "Generated from the docstrings by `python docs/gen_api.py` (a test checks it is current); the",
             "examples in the docstrings run as doctests in CI. `import widthscope as ws`: every name below is",
             "`ws.<name>`.", ""]
    listed = set()
    for title, names in GROUPS:
        lines += [f"## {title}", ""]
        for name in names:
            obj = getattr(ws, name)
            listed.add(name)
            lines += [f"### `ws.{name}{_signature(obj)}`", "", _first_paragraph(obj), ""]
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and name.endswith("Options"):
                lines += _options_table(obj) + [""]
    missing = sorted(n for n in ws.__all__ if n not in listed and callable(getattr(ws, n))
                     and not (inspect.isclass(getattr(ws, n)) and issubclass(getattr(ws, n), BaseException)))
    if missing:
        raise SystemExit(f"docs/gen_api.py: public names without a section: {missing} (add them to GROUPS)")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print("docs/api.md is not current: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
