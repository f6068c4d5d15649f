"""The most bytes a folder's marker (a step's ``checkpoint.json``) may take: every reader reads it whole, so a larger
one (a record made huge, a sparse file of gigabytes in its place) is refused before it is read, naming it.

>>> from jaxstow._storage.marker_limit import MAX_MARKER_BYTES, refuse_large_marker
>>> refuse_large_marker(MAX_MARKER_BYTES, "run/3/checkpoint.json")
>>> refuse_large_marker(3 << 30, "run/3/checkpoint.json")
Traceback (most recent call last):
...
jaxstow.errors.CorruptFileError: run/3/checkpoint.json: is larger than the 67108864 bytes (64 MiB) a step's record may take: it is no record jaxstow wrote, and was not read
"""

from __future__ import annotations

from jaxstow.errors import CorruptFileError

__all__ = ["MAX_MARKER_BYTES", "refuse_large_marker"]

#: What a reader reads of a marker at most (and what a process fetches of a record from a peer).
MAX_MARKER_BYTES = 64 << 20


def refuse_large_marker(size: int, url: str) -> None:
    """Raise a :class:`~jaxstow.errors.CorruptFileError` naming ``url`` if a marker of ``size`` bytes is too large."""
    if size > MAX_MARKER_BYTES:
        raise CorruptFileError(
            f"is larger than the {MAX_MARKER_BYTES} bytes (64 MiB) a step's record may take: it is no record jaxstow "
            "wrote, and was not read",
            file=url,
        )
