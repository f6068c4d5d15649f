"""Writes in flight when the interpreter exits are finished before the process ends, or reported with a non-zero status.

A threading exit hook, which runs before ``concurrent.futures`` refuses new work, waits for every :func:`track`-ed
write (a background save, a checkpoint step, a collector's queued blocks) at most ``JAXSTOW_EXIT_WAIT`` seconds
(:data:`EXIT_WAIT` by default). A failure no caller collected, or a write still running at the deadline, is printed
naming what it was (one of jaxstow's errors in one line, another with its traceback), and the process exits with
status 1; a second Ctrl-C stops the wait.

>>> from jaxstow._write.at_exit import EXIT_WAIT, exit_wait
>>> exit_wait() == EXIT_WAIT
True
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  its exit hook is registered first, so that this module's runs before it
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Literal, Protocol

from jaxstow.errors import JaxstowError

__all__ = ["EXIT_WAIT", "InFlight", "end_by_signal", "exit_wait", "exiting", "finish_all", "track", "untrack"]

logger = logging.getLogger(__name__)

#: Seconds the exit waits for writes in flight unless ``JAXSTOW_EXIT_WAIT`` says otherwise.
EXIT_WAIT = 600.0


class InFlight(Protocol):
    """A write that may be running: what it is, a bounded wait for its end, and its error that no caller collected."""

    @property
    def what(self) -> str: ...

    def finish(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; whether it has ended."""
        ...

    def uncollected_error(self) -> BaseException | None:
        """After it ended: its error, if it failed and no caller has been given the error."""
        ...


_lock = threading.Lock()
_in_flight: dict[int, InFlight] = {}
_exiting = False
_failed = False


def track(item: InFlight) -> bool:
    """Wait for ``item`` at exit (until :func:`untrack`).

    ``False`` once the exit has begun: nothing waits for it then, so the caller runs its work on its own thread.
    """
    with _lock:
        if _exiting:
            return False
        _in_flight[id(item)] = item
        return True


def exiting() -> bool:
    """Whether the exit's wait has begun (a write that fails from now on is printed by it)."""
    return _exiting


def untrack(item: InFlight) -> None:
    """Stop waiting for ``item`` at exit: it ended well, or its error reached a caller."""
    with _lock:
        _in_flight.pop(id(item), None)


def exit_wait() -> float:
    """The seconds the exit waits for writes in flight: ``JAXSTOW_EXIT_WAIT`` or :data:`EXIT_WAIT`."""
    value = os.environ.get("JAXSTOW_EXIT_WAIT", "")
    try:
        seconds = float(value)
    except ValueError:
        if value:
            logger.warning("JAXSTOW_EXIT_WAIT=%r is not a number of seconds; waiting %g s", value, EXIT_WAIT)
        return EXIT_WAIT
    return max(0.0, seconds)


def finish_all() -> Literal["done", "failed", "unfinished"]:
    """Wait for every tracked write, at most :func:`exit_wait` seconds; print each that failed or is still running.

    Returns ``"done"`` when all ended well, ``"failed"`` when one failed, ``"unfinished"`` when one still runs. A
    ``KeyboardInterrupt`` during the wait ends the process as Ctrl-C does.
    """
    with _lock:
        pending = list(_in_flight.values())
    if not pending:
        return "done"
    seconds = exit_wait()
    deadline = time.monotonic() + seconds
    unfinished: list[InFlight] = []
    failed: list[tuple[InFlight, BaseException]] = []
    try:
        if not all(item.finish(0) for item in pending):
            logger.warning(
                "waiting up to %g s for %s to finish before the process ends (Ctrl-C again to abandon it)",
                seconds,
                "; ".join(item.what for item in pending),
            )
        for item in pending:
            if not item.finish(max(0.0, deadline - time.monotonic())):
                unfinished.append(item)
            elif (error := item.uncollected_error()) is not None:
                failed.append((item, error))
    except KeyboardInterrupt:
        _print([f"{item.what}: abandoned by Ctrl-C, unfinished" for item in pending if not item.finish(0)])
        end_by_signal(signal.SIGINT)
    for item, error in failed:
        untrack(item)
        _print([f"{item.what}: failed before the process ended:"], error)
    _print([f"{item.what}: not finished within {seconds:g} s (JAXSTOW_EXIT_WAIT)" for item in unfinished])
    return "unfinished" if unfinished else "failed" if failed else "done"


def end_by_signal(number: int) -> None:
    """End the process as signal ``number`` ends it by default (a scheduler sees it killed by that signal)."""
    _flush()
    signal.signal(number, signal.SIG_DFL)
    signal.raise_signal(number)
    _end(128 + number)  # reached only if the signal did not end the process


def _print(lines: list[str], error: BaseException | None = None) -> None:
    """Print ``lines``, then ``error``: one of jaxstow's in one line (it names its file), another with its traceback."""
    if isinstance(error, JaxstowError):
        lines, error = [*lines[:-1], f"{lines[-1]} {' '.join(str(error).splitlines())}"], None
    for line in lines:
        print(f"jaxstow: {line}", file=sys.stderr)
    if error is not None:
        print("".join(traceback.format_exception(error)).rstrip(), file=sys.stderr)


def _flush() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or replaced by a non-stream
            stream.flush()


def _end(status: int) -> None:
    _flush()
    os._exit(status)


def _before_threads_are_joined() -> None:
    global _exiting, _failed
    with _lock:
        _exiting = True
    outcome = finish_all()
    if outcome == "unfinished":  # its thread is still writing: end before the interpreter tears down under it
        _end(1)
    _failed = outcome == "failed"


def _after_everything_else() -> None:
    if _failed:
        _end(1)


# Registered now, at import: the atexit hook runs after those registered later (atexit runs its hooks last in, first
# out), and the threading hook before concurrent.futures' (imported above), which refuses new work once it has run.
atexit.register(_after_everything_else)
getattr(threading, "_register_atexit", atexit.register)(_before_threads_are_joined)
