"""Writes in flight when the interpreter exits are finished before the process ends, or reported with a non-zero status.

Importing jaxstow registers nothing. The first :func:`track`-ed write (a background save, a checkpoint step, a
collector's queued blocks) registers an :mod:`atexit` handler, and each later one registers it again, so that it runs
before every handler registered before that write began (``atexit`` runs the last registered first). At exit the
handler waits for every tracked write at most ``JAXSTOW_EXIT_WAIT`` seconds (:data:`EXIT_WAIT` by default); a Ctrl-C
stops the wait. A write begun in the main thread's exit handlers runs on that thread, before it returns; a process
that :mod:`multiprocessing` started waits at its finalizers too (a forked one never runs :mod:`atexit`'s handlers).
A failure no caller collected, or a write still running, is printed naming what it was (one of
jaxstow's errors in one line, another with its traceback), and the exit status becomes 120.

How the process ends is set by :func:`end_later`, and carried out once every other exit handler has run, by the
interpreter's final flush of ``sys.stdout`` and ``sys.stderr``: stand-ins left there end it then, and only then, by
a signal or with status 120 (Python gives that status when that flush fails, see :func:`sys.exit`). Nothing ends
the process early: every exit handler of every library runs, on every way out.

>>> from jaxstow._write.at_exit import EXIT_WAIT, exit_wait
>>> exit_wait() == EXIT_WAIT
True
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TextIO

from jaxstow.errors import JaxstowError

__all__ = [
    "EXIT_WAIT",
    "FAILED_EXIT",
    "InFlight",
    "end_later",
    "exit_wait",
    "exiting",
    "finish_all",
    "track",
    "untrack",
]

logger = logging.getLogger(__name__)

#: The exit status of a process whose writes in flight did not all end well.
FAILED_EXIT = 120
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
#: Whether :func:`_hook_multiprocessing_child` ran in this process.
_child_hooked = False
#: How the process ends after its exit handlers, once :func:`end_later` has said: a status, or minus a signal.
_ending: int | None = None


def _forked() -> None:
    """In a child forked meanwhile: its parent's writes go on in the parent, whose threads the child lacks; the child
    waits for none of them at its exit (nor for a lock a thread of the parent held)."""
    global _lock, _child_hooked
    _lock = threading.Lock()
    _in_flight.clear()
    _child_hooked = False


os.register_at_fork(after_in_child=_forked)


def track(item: InFlight) -> bool:
    """Wait for ``item`` at exit (until :func:`untrack`).

    ``False`` once the exit has begun: nothing waits for it then, so the caller runs its work on its own thread. That
    is so in the exit handlers of the main thread too (a program's own that saves, run before this module's: one
    registered meanwhile would never run), which the main thread, no longer alive to :mod:`threading`, runs.
    """
    main = threading.main_thread()
    with _lock:
        if _exiting or (threading.current_thread() is main and not main.is_alive()):
            return False
        _in_flight[id(item)] = item
        if not _child_hooked:
            _hook_multiprocessing_child()
        atexit.unregister(_at_exit)  # registered again: it runs before the handlers registered until now
        atexit.register(_at_exit)
        return True


def _hook_multiprocessing_child() -> None:
    """In a process that :mod:`multiprocessing` started, wait at its finalizers too: one it forked ends with
    ``os._exit`` after them, and never runs :mod:`atexit`'s handlers."""
    global _child_hooked
    _child_hooked = True
    started = sys.modules.get("multiprocessing")
    # From Python 3.13 a forked process runs its atexit handlers (this module's among them), too late to set its code
    if started is not None and started.parent_process() is not None and sys.version_info < (3, 13):
        from multiprocessing import util

        util.Finalize(None, _at_worker_exit, exitpriority=-100)  # the last: its SystemExit is the exit code


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
        seconds = math.nan
    if not seconds >= 0:  # text, nan or a negative number: the default, not "do not wait" (a save would be lost)
        if value:
            logger.warning(
                "JAXSTOW_EXIT_WAIT=%r is not a number of seconds (0 or more); waiting %g s", value, EXIT_WAIT
            )
        return EXIT_WAIT
    return seconds


def finish_all() -> Literal["done", "failed", "unfinished", "abandoned"]:
    """Wait for every tracked write, at most :func:`exit_wait` seconds; print each that failed or is still running.

    Returns ``"done"`` when all ended well, ``"failed"`` when one failed, ``"unfinished"`` when one still runs, and
    ``"abandoned"`` when a Ctrl-C stopped the wait (this is the wait of a signal that ends the process).
    """
    waited = _wait()
    return "abandoned" if waited.abandoned else waited.outcome


def end_later(status: int) -> None:
    """End the process with ``status`` once every exit handler has run: :data:`FAILED_EXIT`, or minus a signal's
    number to end it as that signal ends it by default (a scheduler sees it killed by that signal). The first status
    set is kept. The caller then leaves as its thread can (a ``SystemExit``, or returning from an exit handler)."""
    global _ending
    with _lock:
        if _ending is None:
            _ending = status
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _EndingFlush):
            setattr(sys, name, _EndingFlush(stream, last=name == "stderr"))


@dataclass
class _Waited:
    """What a wait for the writes in flight found."""

    unfinished: list[InFlight] = field(default_factory=list)
    failed: list[tuple[InFlight, BaseException]] = field(default_factory=list)
    abandoned: bool = False  # stopped by Ctrl-C

    @property
    def outcome(self) -> Literal["done", "failed", "unfinished"]:
        return "unfinished" if self.unfinished else "failed" if self.failed else "done"


#: Set by Ctrl-C during the exit's wait. Python drops the ``KeyboardInterrupt`` of a Ctrl-C that lands while the main
#: thread runs a garbage-collection callback (jax has one) or a ``__del__``: the wait then ends by this flag.
_ctrl_c = threading.Event()
_SLICE = 0.25  # seconds between two looks at the flag


@contextlib.contextmanager
def _ctrl_c_noted() -> Iterator[None]:
    """Meanwhile, Ctrl-C sets :data:`_ctrl_c` before it raises, where Python's own handler is in place."""
    _ctrl_c.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:  # a handler of the program's own: left as it is
        yield
        return

    def noted(number: int, frame: object) -> None:
        _ctrl_c.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _finished(item: InFlight, deadline: float) -> bool:
    """Wait for ``item`` until ``deadline``; ``KeyboardInterrupt`` once Ctrl-C was pressed, even if Python lost it."""
    while True:
        left = deadline - time.monotonic()
        if item.finish(max(0.0, min(_SLICE, left))):
            return True
        if _ctrl_c.is_set():
            raise KeyboardInterrupt
        if left <= _SLICE:
            return False


def _wait() -> _Waited:
    """Wait for every tracked write, at most :func:`exit_wait` seconds, or until Ctrl-C; print what did not end well."""
    with _lock:
        pending = list(_in_flight.values())
    waited = _Waited()
    if not pending:
        return waited
    seconds = exit_wait()
    deadline = time.monotonic() + seconds
    try:
        with _ctrl_c_noted():
            if not all(item.finish(0) for item in pending):
                logger.warning(
                    "waiting up to %g s for %s to finish before the process ends (Ctrl-C again to abandon it)",
                    seconds,
                    "; ".join(item.what for item in pending),
                )
            for item in pending:
                if not _finished(item, deadline):
                    waited.unfinished.append(item)
                elif (error := item.uncollected_error()) is not None:
                    waited.failed.append((item, error))
    except KeyboardInterrupt:
        waited.abandoned = True
        waited.unfinished = [item for item in pending if not item.finish(0)]
        _print([f"{item.what}: abandoned by Ctrl-C, unfinished" for item in waited.unfinished])
        return waited
    for item, error in waited.failed:
        untrack(item)
        _print([f"{item.what}: failed before the process ended:"], error)
    _print([f"{item.what}: not finished within {seconds:g} s (JAXSTOW_EXIT_WAIT)" for item in waited.unfinished])
    return waited


def _print(lines: list[str], error: BaseException | None = None) -> None:
    """Print ``lines``, then ``error``: one of jaxstow's in one line (it names its file), another with its traceback."""
    if isinstance(error, JaxstowError):
        lines, error = [*lines[:-1], f"{lines[-1]} {' '.join(str(error).splitlines())}"], None
    for line in lines:
        print(f"jaxstow: {line}", file=sys.stderr)
    if error is not None:
        print("".join(traceback.format_exception(error)).rstrip(), file=sys.stderr)


class _EndingFlush:
    """Stands for ``sys.stdout`` or ``sys.stderr`` once the process is to end otherwise than as it is exiting; only
    the interpreter's final flush is changed: it ends the process (``last``: flushed last; the other leaves it to this
    one unless it was replaced meanwhile, say by a library that put the stream back at exit).

    Python flushes both after every exit handler has run: a signal ends the process there, and a flush that fails
    makes the status 120 (silently for ``sys.stderr``); every other use goes to the stream it stands for.
    """

    def __init__(self, stream: TextIO | None, *, last: bool) -> None:
        self._stream, self._last = stream, last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        return len(text) if self._stream is None else self._stream.write(text)

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()
        replaced = not isinstance(sys.stderr, _EndingFlush)
        if sys.is_finalizing() and _ending is not None and (self._last or replaced):
            if _ending < 0:
                if replaced:
                    with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or not a stream
                        sys.stderr.flush()
                signal.signal(-_ending, signal.SIG_DFL)
                signal.raise_signal(-_ending)
            if replaced:  # the interpreter reports a failed flush of sys.stdout: said above already
                sys.unraisablehook = _quiet_about(_FAILED_FLUSH, sys.unraisablehook)
            raise _FAILED_FLUSH


_FAILED_FLUSH = OSError("a write of jaxstow failed or did not finish before the process ended")


def _quiet_about(error: BaseException, hook: Any) -> Any:
    """``sys.unraisablehook`` that says nothing of ``error`` and passes anything else to ``hook``."""
    return lambda unraisable: None if unraisable.exc_value is error else hook(unraisable)


def _at_worker_exit() -> None:
    """:func:`_at_exit` in a process of :mod:`multiprocessing`, after its other finalizers: a failed write makes its
    exit code :data:`FAILED_EXIT` (a ``SystemExit`` raised here is, where Python's last flush is skipped)."""
    _at_exit()
    if _ending is not None:
        raise SystemExit(FAILED_EXIT if _ending > 0 else 128 - _ending)


def _at_exit() -> None:
    """The exit handler: wait for the writes in flight, and make the exit status non-zero if one did not end well."""
    global _exiting
    with _lock:
        _exiting = True
    if _wait().outcome != "done":
        end_later(FAILED_EXIT)
