"""Whole stored leaves read from a file's container and verified; a leaf read alone from a jaxstow file by the
checksums of its blocks, so that the halves it is read in are hashed on two threads at once.

>>> import io, numpy as np, jaxstow
>>> from jaxstow._read.whole_leaves import read_whole
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": np.arange(3.0)})
>>> with jaxstow.open(io.BytesIO(buffer.getvalue())) as reader:
...     read_whole(reader.container, [reader.stored["w"]], reader.verify)["w"]
array([0., 1., 2.])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jaxstow._format.header import NativeReader
from jaxstow._format.leaves import StoredLeaf
from jaxstow._format.native_or_npz import Container
from jaxstow._format.shards import Stored
from jaxstow._format.tensor_reads import read_slots

__all__ = ["read_whole"]


def read_whole(
    container: Container, leaves: Sequence[Stored], verify: Callable[[str, str, str | None], None]
) -> dict[str, np.ndarray]:
    """The stored arrays of ``leaves`` (none of them sharded), by path; ``verify(path, found, wanted)`` gets each one's
    xxh3 and checksum."""
    expected = {leaf.path: leaf.checksum for leaf in leaves}
    alone = leaves[0] if len(leaves) == 1 else None
    if isinstance(container, NativeReader) and isinstance(alone, StoredLeaf) and isinstance(alone.blocks, str):
        slot = container.slots[alone.path]._replace(blocks=alone.blocks)
        return read_slots(container.source, [slot], lambda path, found: verify(path, found, expected[path]))
    return container.read(list(expected), lambda path, found: verify(path, found, expected[path]))
