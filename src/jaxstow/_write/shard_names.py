"""Each tensor of a file under a name of its own: a shard whose conventional name is a leaf's path is renamed.

A sharded leaf's shards are named ``path@start:stop,...`` by convention (docs/format.md); the manifest records each
shard's tensor, so the name is free. A tree may hold a leaf whose path is that name (``{"w": sharded, "w@0:2": x}``):
the shard then takes the first free name ``path@start:stop#1``, ``#2``, ...

>>> import numpy as np
>>> from jaxstow._format.leaves import EncodedLeaf, EncodedShard
>>> from jaxstow._write.shard_names import rename_taken_shards
>>> shard = EncodedShard({"tensor": "w@0:2", "box": [[0, 2]]}, np.zeros(2))
>>> leaves = [EncodedLeaf({"path": "w", "kind": "sharded"}, None, (shard,)), EncodedLeaf({"path": "w@0:2"}, np.ones(2))]
>>> rename_taken_shards(leaves)
>>> [name for leaf in leaves for name, _, _ in leaf.tensors()]
['w@0:2#1', 'w@0:2']
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from jaxstow._format.leaves import EncodedLeaf

__all__ = ["rename_taken_shards"]


def rename_taken_shards(leaves: Sequence[EncodedLeaf]) -> None:
    """Rename, in their entries, the shards of ``leaves`` (the leaves of one file) whose tensor name another tensor of
    the file has."""
    paths = {leaf.entry["path"] for leaf in leaves if leaf.array is not None}
    shards = [shard.entry for leaf in leaves for shard in leaf.shards if shard.entry["tensor"] in paths]
    taken = paths | {shard.entry["tensor"] for leaf in leaves for shard in leaf.shards}
    for shard in shards:
        shard["tensor"] = next(name for n in itertools.count(1) if (name := f"{shard['tensor']}#{n}") not in taken)
        taken.add(shard["tensor"])
