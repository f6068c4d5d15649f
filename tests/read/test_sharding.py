"""Restored arrays placed on shardings over four CPU devices: one for all, a tree of them, or a function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.errors import ShardingError


@pytest.fixture(scope="module")
def mesh():
    assert len(jax.devices()) >= 4, "tests/conftest.py asks for four CPU devices"
    return jax.make_mesh((2, 2), ("data", "model"))


def _state():
    return {
        "params": {"w": jnp.arange(64.0).reshape(8, 8), "b": jnp.arange(8.0)},
        "opt": {"mu": jnp.ones((4, 6)), "count": jnp.array(3)},
        "odd": jnp.arange(3.0),
        "step": 5,
    }


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, _state())
    return path


def _check(restored, expected=None):
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected or _state()), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_one_sharding_for_every_array(saved, mesh):
    replicated = NamedSharding(mesh, P())
    restored = jaxstow.load(saved, sharding=replicated)
    _check(restored)
    assert all(leaf.sharding == replicated for leaf in jax.tree.leaves(restored) if isinstance(leaf, jax.Array))


@pytest.mark.parametrize("shape", [(1, 1), (4, 1)])
def test_a_spec_longer_than_a_leaf_is_named_on_a_mesh_of_one_device_along_it_too(tmp_path, shape):
    # A restart on a host with one device: jax checks no partition spec there, and device_put failed with a bare
    # AssertionError on the step counter.
    saved = tmp_path / "state.jxs"
    jaxstow.save(saved, {"w": jnp.arange(4.0), "step": jnp.int32(7)})
    small = jax.make_mesh(shape, ("data", "model"), devices=jax.devices()[: shape[0] * shape[1]])
    with pytest.raises(
        ShardingError, match=r"shape \[\] cannot be laid out on .* spec names 1 axes, and the array has 0"
    ) as raised:
        jaxstow.load(saved, sharding=NamedSharding(small, P("model")))
    assert raised.value.path == "step"
    with pytest.raises(ShardingError, match=r"shape \[4\] cannot .* names 2 axes, and the array has 1"):
        jaxstow.load(saved, sharding={"w": NamedSharding(small, P(None, "model")), "step": None})


def test_a_leaf_its_sharding_cannot_hold_is_named(saved, mesh):
    rows = NamedSharding(mesh, P("data", "model"))
    with pytest.raises(ShardingError) as raised:
        jaxstow.load(saved, sharding=rows)
    message = str(raised.value)
    assert raised.value.path in ("odd", "opt/count", "params/b") and raised.value.file == str(saved)
    assert "cannot be laid out on NamedSharding" in message


def test_a_tree_prefix_of_shardings(saved, mesh):
    by_rows = NamedSharding(mesh, P("data"))
    spec = {
        "params": {"w": NamedSharding(mesh, P("data", "model")), "b": by_rows},
        "opt": by_rows,
        "odd": None,
        "step": None,
    }
    spec["opt"] = {"mu": by_rows, "count": NamedSharding(mesh, P())}
    restored = jaxstow.load(saved, sharding=spec)
    _check(restored)
    assert restored["params"]["w"].sharding == spec["params"]["w"]
    assert {shard.data.shape for shard in restored["params"]["w"].addressable_shards} == {(4, 4)}
    assert restored["opt"]["mu"].sharding == by_rows and restored["odd"].devices() == {jax.devices()[0]}


def test_a_sharding_function_of_path_shape_and_dtype(saved, mesh):
    seen = []

    def choose(path, shape, dtype):
        seen.append((path, shape, dtype))
        return NamedSharding(mesh, P("data")) if shape and shape[0] % 2 == 0 else None

    restored = jaxstow.load(saved, sharding=choose)
    _check(restored)
    assert sorted(seen) == [
        ("odd", (3,), np.dtype(np.float32)),
        ("opt/count", (), np.dtype(np.int32)),
        ("opt/mu", (4, 6), np.dtype(np.float32)),
        ("params/b", (8,), np.dtype(np.float32)),
        ("params/w", (8, 8), np.dtype(np.float32)),
    ]
    assert restored["params"]["b"].sharding == NamedSharding(mesh, P("data"))


def test_not_a_prefix_or_not_a_sharding(saved, mesh):
    with pytest.raises(ShardingError, match="not a prefix of the restored tree"):
        jaxstow.load(saved, sharding={"params": None})
    with pytest.raises(ShardingError, match="not a jax sharding, a device or None") as raised:
        jaxstow.load(saved, sharding=lambda path, shape, dtype: "gpu:0")
    assert raised.value.path is not None


def test_like_leaves_bring_their_shardings(saved, mesh):
    sharded = NamedSharding(mesh, P(None, "model"))
    like = jax.tree.map(lambda x: x, _state())
    like["params"]["w"] = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=sharded)
    like["opt"]["mu"] = jax.device_put(jnp.zeros((4, 6)), NamedSharding(mesh, P("data")))
    restored = jaxstow.load(saved, like=like)
    _check(restored)
    assert restored["params"]["w"].sharding == sharded
    assert restored["opt"]["mu"].sharding == NamedSharding(mesh, P("data"))
    override = jaxstow.load(saved, like=like, sharding=NamedSharding(mesh, P()))
    assert override["params"]["w"].sharding == NamedSharding(mesh, P())


def test_checkpoint_items_with_their_own_shardings(tmp_path, mesh):
    state = _state()
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": state["params"], "opt": state["opt"]})
        restored = manager.restore(
            sharding={"params": NamedSharding(mesh, P("data")), "opt": None}, select=["params/**"]
        )
        chosen = manager.restore(
            sharding=lambda path, shape, dtype: NamedSharding(mesh, P()) if path.startswith("opt/") else None
        )
    assert list(restored) == ["params"] and restored["params"]["w"].sharding == NamedSharding(mesh, P("data"))
    _check(restored["params"], state["params"])
    assert chosen["opt"]["mu"].sharding == NamedSharding(mesh, P())
    assert chosen["params"]["w"].devices() == {jax.devices()[0]}


def test_a_mesh_or_a_failing_function_given_as_sharding_is_a_sharding_error(saved, mesh):
    with pytest.raises(ShardingError, match=r"got a Mesh.*NamedSharding\(mesh, PartitionSpec"):
        jaxstow.load(saved, sharding=mesh)
    with CheckpointManager(saved.parent / "run") as manager:  # a manager's items once took it for a function
        manager.save(1, {"state": _state()})
        manager.wait()
        with pytest.raises(ShardingError, match=r"got a Mesh.*NamedSharding\(mesh, PartitionSpec"):
            manager.restore(sharding=mesh)

    def wrong_signature(path):  # a function of one argument where three are passed
        return None

    with pytest.raises(ShardingError, match=r"the sharding function .* failed") as raised:
        jaxstow.load(saved, sharding=wrong_signature)
    assert raised.value.path is not None and raised.value.file is not None
