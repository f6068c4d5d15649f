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

from jaxstow._format.shards import ShardedLeaf
from jaxstow._read.opened import OpenedFile
from jaxstow._read.per_process import stored_bytes
from jaxstow.errors import CorruptFileError

__all__ = ["verify_checksums", "verify_part"]


def verify_checksums(reader: OpenedFile, on_read: Callable[[int], None]) -> tuple[int, list[CorruptFileError]]:
    """Read every stored leaf and compare it with its recorded checksums; returns the count checked and the damage.

    ``on_read(nbytes)`` is called as each leaf is read. A file without a jaxstow manifest has no checksums.
    """
    checked, damage = 0, []
    for path, values in reader.per_process.items():  # each process's value, a file of its own in a tensor
        for process, (_, entry) in sorted(values.items()):
            checked += entry.get("xxh3") is not None
            try:
                on_read(stored_bytes(reader, path, process).nbytes)
            except CorruptFileError as error:
                damage.append(error)
    for leaf in reader.stored.values():
        sums = [shard.checksum for shard in leaf.shards] if isinstance(leaf, ShardedLeaf) else [leaf.checksum]
        checked += sum(checksum is not None for checksum in sums)
        try:
            reader.read_arrays([leaf])
        except CorruptFileError as error:
            damage.append(error)
        on_read(leaf.nbytes)
    return checked, damage


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
    damage = []
    for tensor, (path, checksum) in wanted.items():
        check = functools.partial(_check, reader, path, checksum, source)
        try:
            reader.containers[source].read([tensor], check)
        except CorruptFileError as error:
            damage.append(error)
    return damage


def _check(reader: OpenedFile, path: str, checksum: str | None, source: int, tensor: str, found: str) -> None:
    del tensor
    reader.verify(path, found, checksum, source)
