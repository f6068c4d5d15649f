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
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from jaxstow.errors import ArgumentError, excerpt

__all__ = ["checked_arguments", "optional_path"]

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
        if p.name not in ("self", "cls") and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
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


def optional_path(value: object, *, what: str) -> str | None:
    """``value``, a path (``str`` or ``os.PathLike``) or ``None``, as a ``str`` or ``None``; anything else is an
    :class:`~jaxstow.errors.ArgumentError` naming ``what`` it is for.

    >>> optional_path(None, what="save_dir") is None
    True
    >>> optional_path(3, what="MemoryCollector's save_dir")
    Traceback (most recent call last):
    jaxstow.errors.ArgumentError: MemoryCollector's save_dir is a folder's path (a str or os.PathLike) or None, not 3
    """
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ArgumentError(f"{what} is a folder's path (a str or os.PathLike) or None, not {excerpt(value)}")
    return os.fspath(value)
