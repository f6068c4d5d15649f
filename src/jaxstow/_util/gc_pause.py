"""Pausing Python's cyclic garbage collector while a save or a load builds many small objects.

A tree of 10,000 leaves makes tens of thousands of short-lived dicts, tuples and arrays; each full collection then
walks every object of the process (jax has many), which can double the time of a save. Nothing jaxstow builds is
cyclic, so pausing the collector for the duration is safe. Nested and concurrent pauses are counted; the collector's
original state comes back when the last one ends.

>>> import gc
>>> from jaxstow._util.gc_pause import gc_paused
>>> with gc_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused", "with_gc_paused"]

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def with_gc_paused(function: Callable[P, R]) -> Callable[P, R]:
    """Decorate ``function`` so that it runs with the collector paused."""

    @functools.wraps(function)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return function(*args, **kwargs)

    return paused
