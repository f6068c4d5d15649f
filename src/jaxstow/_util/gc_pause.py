"""Pausing Python's cyclic garbage collector while a save builds many small objects, when no other thread needs it.

Encoding and writing a tree of 10,000 leaves makes tens of thousands of short-lived dicts, tuples and arrays; the
collections they set off walk the objects of the process (jax has many) and double the CPU time of the save on
Python 3.11 (a quarter more on 3.13). A load gains nothing measurable, so loads never pause. Nothing jaxstow builds is
cyclic, so pausing the collector for that while is safe, but the switch is the whole process's: a pause is taken only
when every other thread is one of jaxstow's own (named ``jaxstow-...``), never while a thread of the user's, or of
another library, runs and could need the collector. Nested and overlapping pauses are counted; the collector's
original state comes back when the last one ends.

>>> import gc
>>> from jaxstow._util.gc_pause import gc_paused, pausable
>>> with gc_paused():
...     paused = not gc.isenabled()
>>> paused == pausable(), gc.isenabled()
(True, True)
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused", "pausable", "with_gc_paused"]

P = ParamSpec("P")
R = TypeVar("R")

#: The start of the names of jaxstow's own threads.
OWN_THREADS = "jaxstow-"

_lock = threading.Lock()
_depth = 0
_was_enabled = False


def pausable() -> bool:
    """Whether a pause would be taken now: every thread but the caller's is one of jaxstow's own."""
    caller = threading.current_thread()
    return all(thread is caller or thread.name.startswith(OWN_THREADS) for thread in threading.enumerate())


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block, if :func:`pausable` when it starts."""
    global _depth, _was_enabled
    with _lock:
        pausing = pausable()
        if pausing:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _depth += 1
    try:
        yield
    finally:
        if pausing:
            with _lock:
                _depth -= 1
                if _depth == 0 and _was_enabled:
                    gc.enable()


def with_gc_paused(function: Callable[P, R]) -> Callable[P, R]:
    """Decorate ``function`` so that it runs with the collector paused, as :func:`gc_paused` does."""

    @functools.wraps(function)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return function(*args, **kwargs)

    return paused
