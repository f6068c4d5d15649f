"""The named parts of a structure (a dict's keys, an object's attributes or fields, a partial's keywords), each named
once: a key named twice would keep only its last value, and the first (with any leaves under it) would be lost.

>>> from jaxstow._names.repeated_keys import refuse_repeated
>>> refuse_repeated(["w", "b"], file="model.jxs", path="layer")
>>> refuse_repeated(["w", "b", "w"], file="model.jxs", path="layer")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: ...
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from jaxstow.errors import FormatError, excerpt

__all__ = ["refuse_repeated"]


def refuse_repeated(keys: Sequence[Hashable], *, file: str | None, path: str) -> None:
    """Raise a :class:`FormatError` naming the first of ``keys`` named twice, if any."""
    if len(set(keys)) == len(keys):
        return
    seen: set[Hashable] = set()
    for key in keys:
        if key in seen:
            raise FormatError(
                f"{excerpt(key)} is named twice (a file jaxstow wrote names each once: this one was changed)",
                file=file,
                path=path,
            )
        seen.add(key)
