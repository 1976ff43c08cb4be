"""The settings of ``widthscope report`` (:class:`ReportOptions`): the command line is generated from
them, a report records them in ``OUT/report.json`` and ``--config`` reads them back.

Example::

    >>> from widthscope.report.options import ReportOptions
    >>> ReportOptions(title="Pythia", strict=True).to_dict()["strict"]
    True
    >>> ReportOptions(strict="yes")
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeTypeError: --strict 'yes': must be true or false
"""

from __future__ import annotations

import dataclasses

from ..options import Options, option

__all__ = ["ReportOptions", "RECORD"]

RECORD = "report.json"  # beside report.html: the options and inputs of the report


@dataclasses.dataclass(frozen=True)
class ReportOptions(Options):
    """Where the report goes, its title, and how damaged input is treated."""

    out: str | None = option(
        None,
        kind="str",
        metavar="DIR",
        help="output folder (default: FIRST_RESULTS_DIR/report; for a certify .json first: its folder/report)",
    )
    title: str | None = option(None, kind="str", help="page title")
    open: bool = option(False, help="open the page in a browser afterwards")
    strict: bool = option(
        False,
        help="refuse damaged input (a torn or non-JSON line, a damaged cell file) with one error line, "
        "exit 2, instead of skipping it with a note",
    )
