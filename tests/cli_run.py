"""Running the command line in-process the way the bad-input tests do: status, stderr lines, capture."""
from __future__ import annotations

from widthscope.cli import main


def run_cli(argv, capsys):
    """``(exit status, non-empty stderr lines, capture)`` of ``widthscope ARGV``."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.strip().splitlines() if ln.strip()]
    return rc, lines, cap


def one_line(argv, capsys, msg):
    """The command is refused with exit status 2 and one stderr line (no traceback) containing ``msg``."""
    rc, lines, cap = run_cli(argv, capsys)
    assert rc == 2, cap.err
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    assert msg in lines[0], lines[0]
    return cap
