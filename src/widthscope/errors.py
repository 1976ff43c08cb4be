"""The one exception type widthscope raises for bad input.

The command line prints its message (no traceback) and exits with status 2, so every
message must name the offending thing and say how to fix it.
"""

from __future__ import annotations


class WidthscopeError(ValueError):
    """Bad input or an unrecoverable condition, with a message meant for the user."""


class WidthscopeTypeError(WidthscopeError, TypeError):
    """An argument of the wrong type to a public function. Also a :class:`WidthscopeError`, so the
    command line reports it the same way, and a ``TypeError``, so ``except TypeError`` catches it."""
