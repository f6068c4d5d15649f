"""An array saved sharded over a mesh of several axes comes back with ``sharding="saved"`` on the same layout, on
every jax the project supports: jax before 0.5 gives a mesh's axis types as a dict of each type's axes, and has no
``jax.sharding.AxisType`` to make a mesh's axes with."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxstow


def test_an_array_on_a_mesh_of_two_axes_comes_back_on_its_saved_layout(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("model", "data"))
    saved = jax.device_put(jnp.arange(32.0).reshape(4, 8), sharding)
    jaxstow.save(tmp_path / "w.jxs", {"w": saved})
    with jaxstow.open(tmp_path / "w.jxs") as reader:
        description = reader.stored["w"].sharding
    assert description["mesh"] == [2, 2] and description["axes"] == ["data", "model"]
    assert len(description["axis_types"]) == 2  # one per axis
    restored = jaxstow.load(tmp_path / "w.jxs", sharding="saved")["w"]
    assert restored.sharding.spec == PartitionSpec("model", "data") and restored.sharding.mesh.shape == mesh.shape
    np.testing.assert_array_equal(np.asarray(restored), np.arange(32.0).reshape(4, 8))
