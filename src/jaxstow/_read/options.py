"""The options of a restore, defined once.

:func:`jaxstow.load`, :meth:`jaxstow.Reader.load` and :meth:`jaxstow.CheckpointManager.restore` take them as keyword
arguments, typed by :class:`LoadOptions`; :func:`jaxstow._read.restore.restore` refuses any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

from jaxstow._read.placement import ShardingSpec

__all__ = ["LoadOptions"]


class LoadOptions(TypedDict, total=False):
    """How a file's leaves are restored; every option may be left out. See docs/restoring.md.

    Attributes:
        as_numpy: numpy arrays instead of ``jax.Array`` (``False``).
        sharding: where arrays land: a ``jax.sharding.Sharding`` or device for all, a pytree prefix of them, a function
            ``(path, shape, dtype) -> sharding``, or ``"saved"``, each leaf's saved sharding; overrides ``like``'s.
        partial: with ``like``, leave the file's leaves that ``like`` lacks unread (``False``).
        select: without ``like``, restore only the leaves whose paths match these patterns (``*`` within a segment,
            ``**`` across segments; a path selects everything below it); the others are never read.
        cast: with ``like``, convert each leaf to its target's dtype where no value is lost (``False``).
        progress: draw a progress bar of the bytes read on stderr, with ``tqdm`` (``False``).
        per_process: ``"own"`` restores each process its own value of every :func:`jaxstow.per_process` leaf (the
            default; the process count must be the saving one's), ``"all"`` a list of every process's value.
        pipeline: read whole arrays through a pool of host buffers, many leaves at once, each piece's transfer to
            its device overlapping the other reads (default: on GPU and TPU; on CPU, host buffers are adopted).

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
    pipeline: bool
