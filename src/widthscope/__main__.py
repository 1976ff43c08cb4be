import signal
import sys


def _terminated_early(signum: int, frame: object) -> None:
    # SIGTERM before widthscope.cli.main installs its own handler (which replaces this one): the same line.
    name = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    print(f"widthscope{' ' + name if name else ''}: terminated (SIGTERM); no finished results were written",
          file=sys.stderr)
    sys.exit(143)


signal.signal(signal.SIGTERM, _terminated_early)

from .cli import main  # noqa: E402  (after the handler: the import is the window it covers)

sys.exit(main())
