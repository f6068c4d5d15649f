"""Errors that other libraries' threads report after a command's own error, kept off its output.

An orbax restore that fails leaves tensorstore's reads in flight; their answers come back to an event loop that
orbax has closed already, and each is reported as an unraisable ``RuntimeError: Event loop is closed`` with its
traceback. The command's error already names the failure, so these reports are dropped. Every other unraisable error
is reported as before.

>>> import sys
>>> from jaxstow.cli.stray_errors import ignore_closed_event_loops
>>> ignore_closed_event_loops(); ignore_closed_event_loops()  # installed once
>>> type(sys.unraisablehook).__name__, type(sys.unraisablehook.previous).__name__ == "WithoutClosedLoops"
('WithoutClosedLoops', False)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["WithoutClosedLoops", "ignore_closed_event_loops"]

_CLOSED_LOOP = "Event loop is closed"


class WithoutClosedLoops:
    """An unraisable-error hook that drops the reports of a closed event loop and passes the rest to ``previous``."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == _CLOSED_LOOP:
            return
        self.previous(unraisable)


def ignore_closed_event_loops() -> None:
    """Drop the unraisable ``RuntimeError: Event loop is closed`` reports for the rest of the process."""
    if not isinstance(sys.unraisablehook, WithoutClosedLoops):
        sys.unraisablehook = WithoutClosedLoops(sys.unraisablehook)
