"""Tensors whose bytes come to the host in pieces while they are written, so that a file needs no whole copy of them.

A :class:`Deferred` tensor has its dtype and shape now and its bytes later: :meth:`Deferred.written` yields them piece
by piece (each released once written) and checksums them on the way.

>>> import numpy as np
>>> from jaxstow._format.checksum import checksum
>>> from jaxstow._format.pieces import Deferred
>>> class Halves(Deferred):
...     def __init__(self, array):
...         super().__init__(array.dtype, array.shape)
...         self.array = array
...     def pieces(self, *, final=True):
...         yield from np.array_split(self.array, 2)
>>> tensor = Halves(np.arange(6.0))
>>> b"".join(piece.tobytes() for piece in tensor.written()) == np.arange(6.0).tobytes()
True
>>> tensor.digest() == checksum(np.arange(6.0))
True
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxstow._format.block_checksums import Checksums, block_count
from jaxstow._format.checksum import as_bytes

__all__ = ["Deferred", "HostArray"]


class Deferred(abc.ABC):
    """A C-contiguous tensor of ``dtype`` and ``shape`` whose bytes :meth:`pieces` brings to the host in order."""

    def __init__(self, dtype: Any, shape: tuple[int, ...]) -> None:
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.ndim = len(self.shape)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self._checksums: tuple[str, list[str] | None] | None = None
        self._blocks = [""] * block_count(self.nbytes) or None  # made now, before any piece: see Checksums

    @abc.abstractmethod
    def pieces(self, *, final: bool = True) -> Iterator[np.ndarray]:
        """The tensor's bytes as flat C-contiguous pieces, in order; ``final`` marks the pass that writes them."""

    def written(self) -> Iterator[np.ndarray]:
        """The pieces of the pass that writes the tensor, checksummed as they pass."""
        checksums = Checksums(self.nbytes, self._blocks)
        for piece in self.pieces():
            checksums.update(as_bytes(piece))
            yield piece
        self._checksums = checksums.result()

    def digest(self) -> str:
        """The xxh3-64 of the tensor's bytes: the written pass's, or a pass of its own before one."""
        return self.checksums()[0]

    def checksums(self) -> tuple[str, list[str] | None]:
        """The xxh3-64 of the tensor's bytes and its blocks' (:mod:`~jaxstow._format.block_checksums`): the written
        pass's, or a pass of its own before one."""
        if self._checksums is None:
            checksums = Checksums(self.nbytes, self._blocks)
            for piece in self.pieces(final=False):
                checksums.update(as_bytes(piece))
            self._checksums = checksums.result()
        return self._checksums


#: A tensor to write: its bytes on the host now, or in pieces later.
HostArray = np.ndarray | Deferred
