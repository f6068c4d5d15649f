"""jaxstow's own threads, born with every asynchronous signal blocked: a signal sent to the process reaches the
program's threads, never one of jaxstow's.

A signal sent to a process (a scheduler's SIGTERM, a Ctrl-C) is taken by any one of its threads that does not block
it, and Python runs the handler only in the main thread. When another thread takes it, the main thread is told by a
flag that it reads only between bytecodes: waiting in ``thread.join()`` for a training loop on another thread, it
runs no handler until that wait ends, and a preemption notice is never seen. A jaxstow thread that a save left ending
took such a signal (one run in five, on two busy cores). So each thread jaxstow starts is started while its starter
blocks those signals, which the new thread inherits from its first instruction; the starter's own mask is put back
at once. Signals a thread raises on itself (a segfault, ``abort``) are not blocked: they still end the process.

>>> import signal, threading
>>> from jaxstow._util.signal_free import start_thread
>>> masks = []
>>> thread = threading.Thread(target=lambda: masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
>>> start_thread(thread)
>>> thread.join()
>>> signal.SIGTERM in masks[0], signal.SIGSEGV in masks[0], signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
(True, False, False)
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

__all__ = ["ThreadPool", "blocked_signals", "start_thread"]

#: The signals a thread raises on itself, through what it runs: blocked, they would end the process unreported.
_OWN = frozenset(
    int(getattr(signal, name))
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS")
    if hasattr(signal, name)
)
#: ``signal.pthread_sigmask`` without the wrapper that turns the mask it returns into enum members (``_signal``'s, which
#: ``signal`` wraps): 3 us a block and its end against 100 us, paid each time a pool is handed work. ``None`` on
#: Windows, which has no signal masks: signals reach the main thread only there.
_set_mask: Callable[[int, Iterable[int]], set[int]] | None = getattr(
    importlib.import_module("_signal"), "pthread_sigmask", None
)
#: The signals blocked, as numbers.
_BLOCKED = frozenset(int(number) for number in signal.valid_signals()) - _OWN


@contextlib.contextmanager
def blocked_signals() -> Iterator[None]:
    """Within the block this thread blocks every asynchronous signal (none where the platform has no signal masks);
    a thread started within it is born so. The mask it had is put back when the block ends."""
    if _set_mask is None:
        yield
        return
    before = _set_mask(signal.SIG_BLOCK, _BLOCKED)
    try:
        yield
    finally:
        _set_mask(signal.SIG_SETMASK, before)


def start_thread(thread: threading.Thread) -> None:
    """Start ``thread`` with every asynchronous signal blocked in it, from its first instruction."""
    with blocked_signals():
        thread.start()


class ThreadPool(ThreadPoolExecutor):
    """A :class:`~concurrent.futures.ThreadPoolExecutor` whose threads are born with every asynchronous signal
    blocked, as :func:`start_thread` starts them."""

    def _adjust_thread_count(self) -> None:  # where the executor starts its threads
        with blocked_signals():
            super()._adjust_thread_count()
