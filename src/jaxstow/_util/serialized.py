"""Methods that one object runs one call at a time, whichever threads call them.

>>> import threading
>>> class Counter:
...     def __init__(self):
...         self._calls = threading.RLock()
...         self.value = 0
...     @serialized
...     def add(self, n):
...         self.value += n
...         return self.value
>>> counter = Counter()
>>> threads = [threading.Thread(target=counter.add, args=(1,)) for _ in range(8)]
>>> for thread in threads: thread.start()
>>> for thread in threads: thread.join()
>>> counter.value
8
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from jaxstow._util.arguments import checked_arguments

__all__ = ["serialized"]

Parameters = ParamSpec("Parameters")
Result = TypeVar("Result")


class HasCalls(Protocol):
    """An object whose serialized methods share its ``_calls`` lock (reentrant: one such method may call another)."""

    _calls: threading.RLock


Self = TypeVar("Self", bound=HasCalls)


def serialized(
    method: Callable[Concatenate[Self, Parameters], Result],
) -> Callable[Concatenate[Self, Parameters], Result]:
    """``method`` run while its object's ``_calls`` lock is held: its calls, and those of the object's other
    serialized methods, one at a time (arguments it does not take are an ``ArgumentError``, see
    :mod:`jaxstow._util.arguments`)."""
    checked = checked_arguments(method)

    @functools.wraps(method)
    def call(self: Self, /, *args: Parameters.args, **kwargs: Parameters.kwargs) -> Result:
        with self._calls:
            return checked(self, *args, **kwargs)

    return call
