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

__all__ = ["LoadOptions"]


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
