"""Calls with arguments a function does not take (a misspelt keyword) as a :class:`~jaxstow.errors.ArgumentError`
that lists what it takes, not Python's bare ``TypeError`` (an ``ArgumentError`` is a ``TypeError`` too).

>>> @checked_arguments
... def save(path, tree, *, metadata=None, progress=False):
...     return path
>>> save("model.jxs", {}, metdata={})
Traceback (most recent call last):
jaxstow.errors.ArgumentError: save() got an unexpected keyword argument 'metdata' (did you mean metadata=?); it takes path, tree, metadata=, progress=
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from jaxstow.errors import ArgumentError

__all__ = ["checked_arguments"]

Parameters = ParamSpec("Parameters")
Result = TypeVar("Result")


def checked_arguments(
    function: Callable[Parameters, Result], *, name: str | None = None
) -> Callable[Parameters, Result]:
    """``function``, whose calls are checked against its signature first; ``name`` is how errors call it."""
    signature = inspect.signature(function)
    shown = f"{name or function.__name__}()"
    named = [
        (p.name, p.kind is inspect.Parameter.KEYWORD_ONLY)
        for p in signature.parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]

    @functools.wraps(function)
    def checked(*args: Parameters.args, **kwargs: Parameters.kwargs) -> Result:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as error:
            problem = str(error).split(". Did you mean")[0]
            close = [
                f"{match}=" for word in kwargs for match in difflib.get_close_matches(word, [n for n, _ in named], 1)
            ]
            hint = f" (did you mean {', '.join(close)}?)" if close and "keyword" in problem else ""
            takes = ", ".join(f"{n}=" if keyword else n for n, keyword in named)
            raise ArgumentError(
                f"{shown} {problem.removeprefix(function.__name__ + '() ')}{hint}; it takes {takes}"
            ) from None
        return function(*args, **kwargs)

    return checked
