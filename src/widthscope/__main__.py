import signal

# Before anything imports: a SIGINT/SIGTERM now is only recorded, and widthscope.cli.main acts on it
# once its imports are done (one line, 130/143). Raised inside an import, a KeyboardInterrupt can be
# swallowed by a library's import fallback, and the run would go on.
_early: list[int] = []
signal.signal(signal.SIGTERM, lambda signum, frame: _early.append(signum))
signal.signal(signal.SIGINT, lambda signum, frame: _early.append(signum))

from . import cli  # noqa: E402  (after the handlers: the import is the window they cover)

# Hand over without a gap: cli's own recorder first, then what came so far (a signal after the
# extend would otherwise land in _early, read by no one, and the run would go on to the end).
signal.signal(signal.SIGTERM, cli.defer_signal)
signal.signal(signal.SIGINT, cli.defer_signal)
cli.PENDING_SIGNALS.extend(_early)
cli.console()
