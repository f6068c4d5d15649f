"""Checksums of a tensor's bytes block by block, so that a part of it can be verified without reading the rest.

A tensor of more than :data:`BLOCK_BYTES` bytes has, besides the checksum of all its bytes, the checksum of each
block of :data:`BLOCK_BYTES` (the last one shorter), written as one string of 16 hex digits per block (its entry's
``blocks``). A reader of a slice reads the blocks the slice touches whole and compares each with its checksum.

>>> import numpy as np
>>> from jaxstow._format.block_checksums import BLOCK_BYTES, Checksums, block_span
>>> data = np.arange(3 * BLOCK_BYTES // 4 + 1, dtype=np.float32)
>>> whole, blocks = Checksums.of(data.data.cast("B"))
>>> len(whole), len(blocks), len(blocks[3])
(16, 4, 16)
>>> block_span(BLOCK_BYTES + 5, 2 * BLOCK_BYTES + 1, data.nbytes)
(1, 3)
"""

from __future__ import annotations

import re

import xxhash

from jaxstow.errors import FormatError, excerpt

__all__ = ["BLOCK_BYTES", "Checksums", "block_count", "block_span", "checked_blocks"]

#: The size of a block: 1 MiB.
BLOCK_BYTES = 1 << 20
#: Bytes hashed at a time, both into the whole tensor's checksum and its block's, while they are still in cache.
_CHUNK = 256 << 10
_HEX = re.compile(r"[0-9a-f]*")


def block_count(nbytes: int) -> int:
    """How many checksums the ``blocks`` of a tensor of ``nbytes`` hold: 0 for one of at most one block."""
    return 0 if nbytes <= BLOCK_BYTES else -(-nbytes // BLOCK_BYTES)


def block_span(start: int, stop: int, nbytes: int) -> tuple[int, int]:
    """The blocks (first, past the last) that bytes ``start`` to ``stop`` of a tensor of ``nbytes`` lie in."""
    return start // BLOCK_BYTES, min(-(-stop // BLOCK_BYTES), -(-nbytes // BLOCK_BYTES))


def checked_blocks(blocks: object, nbytes: int, *, file: str | None, path: str) -> str:
    """A tensor's ``blocks`` member, as a reader may trust it: a :class:`FormatError` unless it is a string of 16 hex
    digits for each block of its ``nbytes``."""
    count = block_count(nbytes)
    if not (isinstance(blocks, str) and len(blocks) == 16 * count and count and _HEX.fullmatch(blocks)):
        raise FormatError(
            f"malformed block checksums {excerpt(blocks)}: expected 16 hex digits for each of the {count} blocks of "
            f"{BLOCK_BYTES} bytes of its {nbytes} bytes",
            file=file,
            path=path,
        )
    return blocks


class Checksums:
    """The checksum of a tensor's bytes and of each of its blocks, fed in order in pieces of any size.

    The blocks' checksums go into ``blocks`` (a list of one item per block, made beforehand: a list grown while
    pieces of tensors come and go would take memory from among them), or a list of its own.
    """

    def __init__(self, nbytes: int, blocks: list[str] | None = None) -> None:
        self._whole = xxhash.xxh3_64()
        self._blocks = blocks if blocks is not None or not block_count(nbytes) else [""] * block_count(nbytes)
        self._block = xxhash.xxh3_64()
        self._done = 0  # blocks hashed whole so far
        self._filled = 0  # bytes of the current block hashed so far

    @classmethod
    def of(cls, data: memoryview, blocks: list[str] | None = None) -> tuple[str, list[str] | None]:
        """The checksums of ``data``, a flat byte buffer: see :meth:`result`."""
        if len(data) <= BLOCK_BYTES:
            return xxhash.xxh3_64_hexdigest(data), None
        checksums = cls(len(data), blocks)
        checksums.update(data)
        return checksums.result()

    def update(self, data: memoryview) -> None:
        """Hash the next bytes, ``data`` (a flat byte buffer)."""
        blocks = self._blocks
        if blocks is None:
            self._whole.update(data)
            return
        for at in range(0, len(data), _CHUNK):
            chunk = data[at : at + _CHUNK]
            self._whole.update(chunk)
            while chunk:
                taken = chunk[: BLOCK_BYTES - self._filled]
                self._block.update(taken)
                self._filled += len(taken)
                chunk = chunk[len(taken) :]
                if self._filled == BLOCK_BYTES:
                    self._finish_block(blocks)

    def _finish_block(self, blocks: list[str]) -> None:
        blocks[self._done] = self._block.hexdigest()
        self._block.reset()
        self._done += 1
        self._filled = 0

    def result(self) -> tuple[str, list[str] | None]:
        """The checksum of all the bytes fed, and the blocks' checksums, one per block (``None`` for one block): the
        ``blocks`` of a manifest are them joined."""
        if self._blocks is not None and self._filled:
            self._finish_block(self._blocks)
        return self._whole.hexdigest(), self._blocks
