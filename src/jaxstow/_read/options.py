"""The options of a restore, defined once for :func:`jaxstow.load`, :meth:`jaxstow.Reader.load` and
:meth:`jaxstow.CheckpointManager.restore`.

>>> from jaxstow._read.options import LoadOptions
>>> sorted(LoadOptions.__annotations__)
['as_numpy', 'cast', 'partial', 'progress', 'select', 'sharding']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from jaxstow._read.placement import ShardingSpec
from jaxstow.errors import ArgumentError

__all__ = ["LoadOptions", "check_options"]


class LoadOptions(TypedDict, total=False):
    """How a file's leaves are restored; every option may be left out.

    - ``as_numpy`` (``False``): numpy arrays instead of ``jax.Array``.
    - ``sharding`` (``None``): where arrays land: one ``jax.sharding.Sharding`` or device for all, a pytree prefix of
      them (``None`` for the default), a function ``(path, shape, dtype) -> sharding``, or ``"saved"`` for the
      sharding each sharded leaf was saved with; it overrides ``like``'s shardings.
    - ``partial`` (``False``): with ``like``, leave the file's leaves that ``like`` lacks unread.
    - ``select`` (``None``): without ``like``, restore only the leaves whose paths match these patterns (``*`` within a
      segment, ``**`` across segments, a path selects everything below it); the others are never read.
    - ``cast`` (``False``): with ``like``, convert each leaf to its target's dtype where no value is lost between
      kinds (float to float, int widening, int to a float that holds every value).
    - ``progress`` (``False``): draw a progress bar of the bytes read on stderr (needs ``tqdm``).
    """

    as_numpy: bool
    sharding: ShardingSpec
    partial: bool
    select: str | Sequence[str] | None
    cast: bool
    progress: bool


def check_options(options: dict[str, object]) -> None:
    """Refuse an option that :class:`LoadOptions` does not define (a misspelt one would be ignored otherwise).

    >>> from jaxstow._read.options import check_options
    >>> check_options({"as_nunpy": True})
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: unknown load option 'as_nunpy'; the options are as_numpy, cast, partial, progress, select, sharding
    """
    for name in options:
        if name not in LoadOptions.__annotations__:
            known = ", ".join(sorted(LoadOptions.__annotations__))
            raise ArgumentError(f"unknown load option {name!r}; the options are {known}")
