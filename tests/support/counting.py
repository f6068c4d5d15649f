"""A real source that counts the bytes read through it, to check that a restore reads only what it needs."""

from __future__ import annotations

import contextlib

from jaxstow._format.source import ReadSource


class CountingSource:
    """Wraps a :class:`~jaxstow._format.source.ReadSource` and adds up the bytes of every read."""

    def __init__(self, source: ReadSource) -> None:
        self.inner = source
        self.name = source.name
        self.size = source.size
        self.parallel = source.parallel
        self.bytes_read = 0

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.bytes_read += buffer.nbytes
        self.inner.read_into(offset, buffer)

    def read_scatter(self, offset: int, buffers) -> None:
        self.bytes_read += sum(buffer.nbytes for buffer in buffers)
        self.inner.read_scatter(offset, buffers)

    @contextlib.contextmanager
    def reading(self):
        with self.inner.reading() as read_into:

            def counted(offset: int, buffer: memoryview) -> None:
                self.bytes_read += buffer.nbytes
                read_into(offset, buffer)

            yield counted

    def read(self, offset: int, length: int) -> bytes:
        self.bytes_read += length
        return self.inner.read(offset, length)

    def close(self) -> None:
        self.inner.close()

    def describe_size(self) -> str:
        return self.inner.describe_size()
