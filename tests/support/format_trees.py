"""The tree that the golden files ``tests/data/format_v*.jxs`` and ``.npz`` hold, and how to compare a load with it.

Every golden file holds :func:`expected` (the ``.jxs`` files with ``sharded``), saved with :func:`metadata`. The
``.jxs`` files were saved from :func:`golden_tree`, whose ``sharded`` leaf is a jax array split over two devices, so
that the file stores it as two shards.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxstow

Pair = jaxstow.saveable(collections.namedtuple("Pair", "first second"), name="fixtures.Pair")


def expected(*, sharded: bool) -> dict[Any, Any]:
    """The tree of every golden file, as numpy arrays."""
    tree: dict[Any, Any] = {
        "params": {"w": np.arange(12.0, dtype=np.float32).reshape(3, 4), "b": np.arange(3, dtype=np.int16)},
        "bf16": np.ones((2, 3), ml_dtypes.bfloat16),
        "int4": np.arange(6).astype(ml_dtypes.int4).reshape(2, 3),
        "c128": np.array([1 + 2j, 3 - 4j]),
        "scalar": np.float32(2.5),
        "key": jax.random.key(7),
        "empty": np.zeros((0, 3), np.float32),
        "zero_d": np.array(5, np.uint8),
        "pair": Pair(1.5, "name"),
        "list": [None, 3, (True, jax.nn.relu)],
        "ints": {7: "int key", 2: np.int64(-3)},
    }
    if sharded:
        tree["sharded"] = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    return tree


def golden_tree(*, sharded: bool) -> dict[Any, Any]:
    """The tree a golden file was saved from: :func:`expected`, its ``sharded`` leaf split over two devices."""
    tree = expected(sharded=sharded)
    if sharded:
        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        tree["sharded"] = jax.device_put(tree["sharded"], NamedSharding(mesh, PartitionSpec("x")))
    return tree


def metadata(version: int) -> dict[str, Any]:
    """The metadata a golden file of format ``version`` was saved with."""
    return {"epoch": 3, "note": f"written by format version {version}"}


def assert_same(found: Any, wanted: Any) -> None:
    """``found`` has the structure, leaf types, dtypes, shapes and values of ``wanted``."""
    found_paths, found_leaves = zip(*jax.tree_util.tree_leaves_with_path(found), strict=True)
    wanted_paths, wanted_leaves = zip(*jax.tree_util.tree_leaves_with_path(wanted), strict=True)
    assert found_paths == wanted_paths
    assert jax.tree.structure(found) == jax.tree.structure(wanted)
    for path, a, b in zip(found_paths, found_leaves, wanted_leaves, strict=True):
        if isinstance(b, jax.Array) and jnp.issubdtype(b.dtype, jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b), err_msg=str(path))
        elif isinstance(b, np.ndarray | np.generic):
            assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape, path
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=str(path))
        else:
            assert a is b or (type(a) is type(b) and a == b), path
