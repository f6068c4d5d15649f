"""The options of a restore, defined once.

:func:`jaxstow.load`, :meth:`jaxstow.Reader.load` and :meth:`jaxstow.CheckpointManager.restore` take them as keyword
arguments, typed by :class:`LoadOptions`; :func:`jaxstow._read.restore.restore` refuses any other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

import numpy as np

from jaxstow._read.placement import ShardingSpec
from jaxstow.errors import ArgumentError, excerpt

__all__ = ["LoadOptions", "check_options"]


class LoadOptions(TypedDict, total=False):
    """How a file's leaves are restored; every option may be left out. See docs/restoring.md.

    Attributes:
        as_numpy: numpy arrays instead of ``jax.Array`` (``False``).
        sharding: where arrays land: a ``jax.sharding.Sharding`` or device for all, a pytree prefix of them, a function
            ``(path, shape, dtype) -> sharding``, or ``"saved"``, each leaf's saved sharding; overrides ``like``'s, and
            places its numpy leaves too (as jax arrays).
        partial: with ``like``, leave the file's leaves that ``like`` lacks unread (``False``).
        select: without ``like``, restore only the leaves whose paths match these patterns (``*`` within a segment,
            ``**`` across segments; a path selects everything below it); the others are never read.
        cast: with ``like``, convert each leaf to its target's dtype where no value is lost (``False``).
        progress: draw a progress bar of the bytes read on stderr, with ``tqdm`` (``False``).
        per_process: ``"own"`` restores each process its own value of every :func:`jaxstow.per_process` leaf (the
            default; the process count must be the saving one's), ``"all"`` a list of every process's value.
        pipeline: read whole arrays through a pool of host buffers, many leaves at once, each piece's transfer to
            its device overlapping the other reads (``None``, the default: on GPU and TPU; on CPU, host buffers are
            adopted).

    >>> import io, numpy as np, jaxstow
    >>> options = jaxstow.LoadOptions(as_numpy=True, select="w")
    >>> buffer = io.BytesIO(); jaxstow.save(buffer, {"w": np.ones(2), "b": np.zeros(1)}); _ = buffer.seek(0)
    >>> jaxstow.load(buffer, **options)
    {'w': array([1., 1.])}
    """

    as_numpy: bool
    sharding: ShardingSpec
    partial: bool
    select: str | Sequence[str] | None
    cast: bool
    progress: bool
    per_process: Literal["own", "all"]
    pipeline: bool | None


#: The options that are True or False (``pipeline`` also ``None``: its default).
_SWITCHES = ("as_numpy", "partial", "cast", "progress", "pipeline")


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse an option :class:`LoadOptions` does not define (a misspelt one would be ignored otherwise), and a value
    an option does not take, each with an :class:`~jaxstow.errors.ArgumentError`.

    >>> check_options({"as_numpy": "no"})
    Traceback (most recent call last):
    jaxstow.errors.ArgumentError: as_numpy= takes True or False, not 'no'
    """
    unknown = [name for name in options if name not in LoadOptions.__annotations__]
    if unknown:
        known = ", ".join(sorted(LoadOptions.__annotations__))
        raise ArgumentError(f"unknown load option {unknown[0]!r}; the options are {known}")
    if options.get("per_process", "own") not in ("own", "all"):
        raise ArgumentError(f"per_process= takes 'own' or 'all', not {options['per_process']!r}")
    for name in _SWITCHES:
        value = options.get(name, False)
        if not isinstance(value, bool | np.bool_) and not (name == "pipeline" and value is None):
            raise ArgumentError(f"{name}= takes True or False, not {excerpt(value)}")
