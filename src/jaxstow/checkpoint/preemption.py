"""A preemption notice in one process: the signals a scheduler sends before it stops a job, caught and remembered.

While a :class:`PreemptionNotice` is open, a signal it names only records its arrival (:attr:`received`); the
manager saves at the next step and then calls :func:`end_process`, once every open notice's manager has saved
(:meth:`PreemptionNotice.settle`). Handlers are shared between the notices of a process, and closing the last one
puts them back.

>>> import os, signal
>>> from jaxstow.checkpoint.preemption import PreemptionNotice
>>> notice = PreemptionNotice([signal.SIGUSR1])
>>> notice.received is None
True
>>> os.kill(os.getpid(), signal.SIGUSR1)
>>> notice.received == signal.SIGUSR1
True
>>> notice.close()
"""

from __future__ import annotations

import atexit
import collections
import logging
import signal
import threading
import weakref
from collections.abc import Iterable
from types import FrameType
from typing import Any

from jaxstow._write import at_exit
from jaxstow.errors import ArgumentError

__all__ = ["PreemptionNotice", "end_process"]

logger = logging.getLogger(__name__)

_received: signal.Signals | None = None
_previous: dict[signal.Signals, Any] = {}  # the handler each caught signal had before
_users: collections.Counter[signal.Signals] = collections.Counter()
_open: weakref.WeakSet[PreemptionNotice] = weakref.WeakSet()  # a notice dropped unclosed (its manager too) is gone
_leaving: int | None = None  # the exit status end_process raised SystemExit with


class PreemptionNotice:
    """Catches ``signals`` (from the main thread) until :meth:`close`; :attr:`received` is the first that arrived."""

    def __init__(self, signals: Iterable[int | signal.Signals]) -> None:
        wanted = _check(signals)
        if threading.current_thread() is not threading.main_thread():
            raise ArgumentError(
                "preemption_signals needs the checkpoint manager to be made in the main thread, where Python runs "
                "signal handlers"
            )
        for number in wanted:
            if not _users[number] and (previous := signal.signal(number, _record)) is not _record:
                _previous[number] = previous  # else put there by a notice closed off the main thread: kept
            _users[number] += 1
        self.signals = wanted
        self.settled = False  # whether its manager has saved since the signal
        _open.add(self)
        atexit.unregister(_at_exit)  # registered once
        atexit.register(_at_exit)

    @property
    def received(self) -> signal.Signals | None:
        """The first of the caught signals that arrived, or ``None``."""
        return _received

    def settle(self) -> bool:
        """Record that this notice's manager has saved the step of the preemption; return whether every open notice's
        manager has (a model's and a data pipeline's managers both hold that step): the process may end."""
        self.settled = True
        return all(notice.settled for notice in _open)

    def close(self) -> None:
        """Stop catching the signals: each gets back the handler it had, once no open notice names it (idempotent).

        A handler the program set meanwhile stays. Off the main thread, where no handler can be set, the signals'
        catcher stays until one of them comes: it then puts the handler back and raises the signal again.
        """
        global _received
        main = threading.current_thread() is threading.main_thread()
        for number in self.signals:
            _users[number] -= 1
            if not _users[number]:
                del _users[number]
                if main:
                    previous = _previous.pop(number)
                    if signal.getsignal(number) is _record:
                        signal.signal(number, previous)
        self.signals = []
        _open.discard(self)
        if not _users:
            _received = None


def end_process(number: signal.Signals, *, failure: str | None = None, exiting: bool = False) -> None:
    """End the process as signal ``number`` ends it by default, once every write in flight has finished (see
    :func:`jaxstow._write.at_exit.finish_all`, which prints any that failed) and every exit handler has run; with exit
    status :data:`~jaxstow._write.at_exit.FAILED_EXIT` instead where the checkpoint was not saved (``failure`` says
    why, or a write failed or did not finish), so that no scheduler or script takes it for a preemption that went well.

    The process leaves as a script that ends does: a ``SystemExit`` in this thread and, from another thread, in the
    main thread too (sent the signal, which the catcher turns into one); an exit handler (``exiting``) returns.
    """
    global _leaving
    outcome = at_exit.finish_all()
    if outcome == "abandoned":  # a Ctrl-C stopped the wait
        status = -signal.SIGINT
    elif outcome == "done" and failure is None:
        logger.warning("%s: ending the process, as the signal asked, now that its checkpoint is saved", number.name)
        _program_handler(number)
        status = -number
    else:
        logger.error(
            "%s: ending the process, as the signal asked, but its checkpoint was NOT saved (exit status %d): %s",
            number.name,
            at_exit.FAILED_EXIT,
            failure or "see above",
        )
        status = at_exit.FAILED_EXIT
    at_exit.end_later(status)
    if exiting:
        return
    _leaving = 128 - status if status < 0 else status  # the shell's status, should the stand-ins be replaced
    main = threading.main_thread()
    if threading.current_thread() is not main and main.is_alive() and main.ident is not None:
        signal.pthread_kill(main.ident, number)
    raise SystemExit(_leaving)


def _at_exit() -> None:
    """At the interpreter's exit, a caught signal that no save or close of its manager followed ends the process as
    it asked (once the writes in flight are done), not with the status of a run that went well."""
    if _received is not None and _open:
        logger.warning("%s was caught, but no save or close followed it: the process ends as it asked", _received.name)
        end_process(_received, exiting=True)


def _program_handler(number: signal.Signals) -> None:
    """Run the handler the program had set for signal ``number`` before it was caught, if it had one: the signal
    then does what the program made it do (a handler that returns lets the process end as the signal ends it)."""
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(number)  # the notice, closed, has put it back
        if callable(handler) and handler is not _record:
            signal.raise_signal(number)


def _check(signals: Iterable[int | signal.Signals]) -> list[signal.Signals]:
    try:
        wanted = [signal.Signals(number) for number in signals]
    except (TypeError, ValueError) as error:
        raise ArgumentError(
            f"preemption_signals must be signals such as [signal.SIGTERM], not {signals!r} ({error})"
        ) from None
    uncatchable = [number.name for number in wanted if number in (signal.SIGKILL, signal.SIGSTOP)]
    if uncatchable:
        raise ArgumentError(f"preemption_signals cannot hold {', '.join(uncatchable)}: no process can catch it")
    return list(dict.fromkeys(wanted))


def _record(number: int, frame: FrameType | None) -> None:
    global _received
    if _leaving is not None:  # sent by end_process from another thread: the main thread leaves too
        raise SystemExit(_leaving)
    caught = signal.Signals(number)
    if not any(caught in notice.signals for notice in _open):  # every manager that caught it was dropped unclosed
        _users.pop(caught, None)
        signal.signal(caught, _previous.pop(caught, signal.SIG_DFL))
        signal.raise_signal(caught)  # as if it had never been caught
        return
    if _received is None:
        _received = signal.Signals(number)
        logger.warning("%s received: the next step is saved, then the process ends", _received.name)
