"""A tensor of a file holds one leaf or one shard: a header that gives one tensor's bytes to two is damaged."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow.errors import CorruptFileError
from reliability.forge import forge_native, split_native


def _aliased(tmp_path, *, to_leaf: bool):
    """A file whose last shard of ``w`` (by its bytes' place) names another shard's tensor, or the leaf ``u``'s, its
    own tensor gone from the file: every checksum holds."""
    mesh = jax.make_mesh((4,), ("x",))
    w = jax.device_put(np.arange(16.0, dtype=np.float32).reshape(8, 2), NamedSharding(mesh, P("x")))
    jaxstow.save(tmp_path / "model.jxs", {"u": np.full((2, 2), 7.0, np.float32), "w": w})
    tensors, text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(text or "")
    (shards,) = [detail["shards"] for detail in manifest["details"].values() if "shards" in detail]
    last = max(shards, key=lambda shard: tensors[shard["tensor"]]["data_offsets"][0])
    del tensors[last["tensor"]]
    if to_leaf:
        last["tensor"], last["xxh3"] = "u", manifest["xxh3"][manifest["paths"].index("u")]
    else:
        other = next(shard for shard in shards if shard is not last)
        last["tensor"], last["xxh3"] = other["tensor"], other["xxh3"]
    end = max(entry["data_offsets"][1] for entry in tensors.values())
    forged = tmp_path / "forged.jxs"
    forged.write_bytes(forge_native(tensors, json.dumps(manifest), data[:end]))
    return forged


@pytest.mark.parametrize("to_leaf", [False, True], ids=["two-shards", "a-shard-and-a-leaf"])
def test_one_tensor_named_by_two_shards_or_a_shard_and_a_leaf_is_damage(tmp_path, to_leaf):
    forged = _aliased(tmp_path, to_leaf=to_leaf)
    with pytest.raises(CorruptFileError, match=r"forged\.jxs.*two leaves or shards are stored in the tensor"):
        jaxstow.load(forged, as_numpy=True)
    with pytest.raises(CorruptFileError, match="two leaves or shards"):
        jaxstow.open(forged)
    verified = subprocess.run(
        [sys.executable, "-m", "jaxstow", "verify", str(forged)], capture_output=True, text=True, timeout=120
    )
    assert verified.returncode == 1 and "two leaves or shards" in verified.stdout + verified.stderr
