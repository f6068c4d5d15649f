"""What the format layer reads from: random-access bytes with a name and a size.

The storage layer provides the sources (local files, file objects, objects in a store); the containers, readers and
record checks of this layer only ever see this protocol.

>>> import io
>>> from jaxstow._format.source import ReadSource
>>> from jaxstow._storage.opening import open_source
>>> isinstance(open_source(io.BytesIO(b"abc")), ReadSource)
True
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ReadSource"]


@runtime_checkable
class ReadSource(Protocol):
    """Random-access bytes: a local file, a file object or an object in a store."""

    name: str
    size: int
    parallel: bool  # whether several threads may read at once

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset``; raise :class:`~jaxstow.errors.TruncatedFileError` if the source ends first."""

    def read(self, offset: int, length: int) -> bytes:
        """The ``length`` bytes at ``offset``."""

    def close(self) -> None:
        """Release the source."""

    def describe_size(self) -> str:
        """The size in words, for error messages."""
