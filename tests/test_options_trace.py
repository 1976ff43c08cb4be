"""Following certify's options from the command line to the maths (issue 30's measure).

``widthscope certify`` runs in-process under a profiler that records every widthscope function
called with the run's settings among its arguments or locals: the ``argparse.Namespace`` or an
options dataclass (:class:`widthscope.options.Options`). In call order, the settings *stay* in a
module from the first such function there until one in another module holds them: a run of
consecutive such calls in one module is one stay (the functions are listed too). A call from one
such function to another whose module sits in a higher layer (docs/architecture.md, the table of
tests/test_layers.py) is a *climb*. The options' own methods (``self`` is the options) are not
counted: they are the data, not a place it passes through; nor are comprehensions apart from their
function, nor dataclass-generated methods. The goal: at most 15 stays, 3 climbs.
"""
from __future__ import annotations

import argparse
import inspect
import re
import sys

from test_layers import _layer
from widthscope.cli import main
from widthscope.options import Options

FAST = ["--train-steps", "2", "--n-train", "16", "--n-test", "16", "--M", "4", "--draws", "10"]
MAX_STAYS, MAX_CLIMBS = 15, 3
COMPREHENSION = re.compile(r"(\.<locals>)?\.<(genexpr|listcomp|dictcomp|setcomp|lambda)>$")


def _holds_settings(frame) -> bool:
    for name, v in frame.f_locals.items():
        if isinstance(v, (argparse.Namespace, Options)) and name not in ("self", "cls"):
            return True
    return False


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "?")


def trace(argv: list[str]) -> tuple[list[tuple[str, list[str]]], list[tuple[str, str]], int]:
    """(stays: (module, its functions) in call order, climbs: (caller, callee), exit status) of
    ``widthscope ARGV``."""
    stays: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    climbs: list[tuple[str, str]] = []

    def name(frame) -> str:  # a comprehension is a stay of the function it is written in
        return f"{_module(frame)}:{COMPREHENSION.sub('', frame.f_code.co_qualname)}"

    def profile(frame, event, _arg):
        if event != "call" or not _module(frame).startswith("widthscope") or frame.f_code.co_filename == "<string>":
            return  # "<string>": dataclass-generated methods (a job's __init__ storing its options)
        if not _holds_settings(frame):
            return
        here, module = name(frame), _module(frame)
        if not stays or stays[-1][0] != module:
            stays.append((module, []))
        function = here.split(":", 1)[1]
        if function not in stays[-1][1]:
            stays[-1][1].append(function)
        seen.add(here)
        back = frame.f_back
        while back is not None and not _module(back).startswith("widthscope"):
            back = back.f_back
        if back is not None and name(back) in seen:
            a, b = _layer(_module(back)), _layer(_module(frame))
            if a is not None and b is not None and b > a:
                climbs.append((name(back), here))

    sys.setprofile(profile)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
    return stays, sorted(set(climbs)), rc


def test_certify_options_take_few_stays_and_climbs(tmp_path, capsys):
    stays, climbs, rc = trace(["certify", *FAST, "--out", str(tmp_path / "c.json")])
    assert rc == 0, capsys.readouterr().err
    functions = {f"{m}:{f}" for m, fs in stays for f in fs}
    modules = {m for m, _ in stays}
    print(f"{len(stays)} stays ({len(functions)} functions) in {len(modules)} modules, {len(climbs)} climbs")
    for module, fs in stays:
        print("  stay", module, ", ".join(fs))
    for c in climbs:
        print("  climb", *c)
    assert stays[0][0].startswith("widthscope.cli") and any(m.startswith("widthscope.certification") for m in modules)
    assert len(stays) <= MAX_STAYS, stays
    assert len(climbs) <= MAX_CLIMBS, climbs
    first = next(i for i, (m, _) in enumerate(stays) if m.startswith("widthscope.certification"))
    assert not any(m.startswith("widthscope.cli") for m, _ in stays[first:]), "the pipeline called back into the CLI"


def test_the_trace_sees_a_stay_and_a_climb():
    """The profiler finds a function holding options and a call that climbs a layer."""
    seen: list[str] = []

    def probe(frame, event, _arg):
        if event == "call" and _holds_settings(frame):
            seen.append(frame.f_code.co_name)

    def takes(opts):  # noqa: ARG001 - only its argument matters
        return None

    sys.setprofile(probe)
    try:
        takes(argparse.Namespace(M=4))
        takes(3)
    finally:
        sys.setprofile(None)
    assert seen == ["takes"]
    assert _layer("widthscope.stats.bounds") < _layer("widthscope.cli.certify")
    assert inspect.isfunction(trace)
