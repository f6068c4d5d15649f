"""Every stored leaf of a file (and every process's value of a per-process leaf) read and compared with its recorded
checksums.

What ``jaxstow verify`` and the checkpoint manager's recovery helpers check.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow._read.verifying import verify_checksums
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.ones(1000), "b": jnp.zeros(3)})
>>> damaged = bytearray(buffer.getvalue())
>>> damaged[-5] ^= 1
>>> with jaxstow.open(io.BytesIO(bytes(damaged))) as reader:
...     checked, damage = verify_checksums(reader, lambda nbytes: None)
>>> checked, [error.path for error in damage]
(2, ['w'])
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from jaxstow._format.block_checksums import Checksums, checked_blocks
from jaxstow._format.shards import Box, ShardedLeaf, Stored
from jaxstow._read.opened import OpenedFile
from jaxstow._read.per_process import checked_value
from jaxstow._read.reader import read_again
from jaxstow.errors import CorruptFileError, FormatError

__all__ = ["verify_checksums", "verify_part"]


def verify_checksums(reader: OpenedFile, on_read: Callable[[int], None]) -> tuple[int, list[CorruptFileError]]:
    """Read every stored leaf and compare it with its recorded checksums; returns the count checked and the damage.

    ``on_read(nbytes)`` is called as each leaf is read. A file without a jaxstow manifest has no checksums. What came
    from a store damaged is read again, once (:func:`~jaxstow._read.reader.read_again`): only damage found twice is.
    """
    checked, damage = 0, []
    for path, values in reader.per_process.items():  # each process's value, a file of its own in a tensor
        for process, (_, entry) in sorted(values.items()):
            checked += entry.get("xxh3") is not None
            try:  # its bytes, then the file they are, as a load opens it
                on_read(read_again(reader, functools.partial(checked_value, reader, path, process)))
            except FormatError as error:
                damage.append(_as_damage(error, reader.file, path, process))
    for leaf in reader.stored.values():
        sums = [shard.checksum for shard in leaf.shards] if isinstance(leaf, ShardedLeaf) else [leaf.checksum]
        checked += sum(checksum is not None for checksum in sums)
        try:
            read_again(reader, functools.partial(_check_leaf, reader, leaf))
        except CorruptFileError as error:
            damage.append(error)
        on_read(leaf.nbytes)
    return checked, damage


def _as_damage(error: FormatError, file: str, path: str, process: int) -> CorruptFileError:
    """``error``, met reading ``process``'s value at ``path`` of ``file``, as damage to the file: the value is a
    file of its own, whose header the file's checksum covers, so a malformed one was changed after the save."""
    if isinstance(error, CorruptFileError) and error.file == file:
        return error
    return CorruptFileError(f"process {process}'s value, a file of its own, is damaged: {error}", file=file, path=path)


def _check_leaf(reader: OpenedFile, leaf: Stored) -> None:
    """Read a whole stored leaf, verified against its checksum, and check its tensors' block checksums."""
    whole = reader.read_arrays([leaf])[leaf.path]
    for blocks, box, source in _blocks_of(leaf):
        _check_blocks(
            np.ascontiguousarray(whole[tuple(slice(*axis) for axis in box)]), blocks, reader, leaf.path, source
        )


def verify_part(reader: OpenedFile, source: int) -> list[CorruptFileError]:
    """Read every tensor the ``source``-th of the files of ``reader`` (a tree saved by several processes, one file
    each) holds, and compare it with its recorded checksum; the damage found. The other files are not read."""
    wanted: dict[str, tuple[str, str | None]] = {}  # each tensor's leaf and checksum
    for path, values in reader.per_process.items():
        for held, entry in values.values():
            if held == source:  # the value of the process that wrote this file
                wanted[path] = (path, entry.get("xxh3"))
    for leaf in reader.stored.values():
        if isinstance(leaf, ShardedLeaf):
            wanted.update(
                {shard.tensor: (leaf.path, shard.checksum) for shard in leaf.shards if shard.source == source}
            )
        elif source == 0:
            wanted[leaf.path] = (leaf.path, leaf.checksum)
    blocks = {leaf.path: leaf.blocks for leaf in reader.stored.values() if not isinstance(leaf, ShardedLeaf)}
    for leaf in reader.stored.values():
        if isinstance(leaf, ShardedLeaf):
            blocks.update({shard.tensor: shard.blocks for shard in leaf.shards if shard.source == source})
    damage = []
    for tensor, (path, checksum) in wanted.items():
        check = functools.partial(_check, reader, path, checksum, source)
        try:
            data = reader.containers[source].read([tensor], check)[tensor]
            if blocks.get(tensor) is not None:
                _check_blocks(data, blocks[tensor], reader, path, source)
        except CorruptFileError as error:
            damage.append(error)
    return damage


def _check(reader: OpenedFile, path: str, checksum: str | None, source: int, tensor: str, found: str) -> None:
    del tensor
    reader.verify(path, found, checksum, source)


def _blocks_of(leaf: Stored) -> list[tuple[object, Box, int]]:
    """The block checksums a leaf's tensors have (a sharded leaf's: each shard's), with the box each tensor holds and
    the file (of the tree's files) that holds it."""
    if isinstance(leaf, ShardedLeaf):
        return [(shard.blocks, shard.box, shard.source) for shard in leaf.shards if shard.blocks is not None]
    return [] if leaf.blocks is None else [(leaf.blocks, tuple((0, n) for n in leaf.shape), 0)]


def _check_blocks(data: np.ndarray, blocks: object, reader: OpenedFile, path: str, source: int) -> None:
    """A :class:`CorruptFileError` unless ``data``, a tensor's bytes that its whole checksum found intact, match its
    block checksums too (which a slice of it is read against), and those are well formed."""
    file = reader.containers[source].file if source else reader.file
    try:
        wanted = checked_blocks(blocks, data.nbytes, file=file, path=path)
    except FormatError as error:
        raise CorruptFileError(
            f"its block checksums are malformed ({error}): the header is corrupt", file=file, path=path
        ) from None
    if "".join(Checksums.of(data.reshape(-1).view(np.uint8).data)[1] or []) != wanted:
        raise CorruptFileError(
            "its block checksums do not match its bytes: the header is corrupt", file=file, path=path
        )
