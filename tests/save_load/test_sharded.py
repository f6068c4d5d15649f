"""Sharded arrays in one process (four CPU devices): each distinct shard stored once, restored on any layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.errors import CheckpointError, FormatError, ShardingError


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 2), ("data", "model"))


@pytest.fixture
def tree(mesh):
    values = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    return {
        "w": jax.device_put(values, NamedSharding(mesh, P("data", "model"))),
        "b": jax.device_put(values[0], NamedSharding(mesh, P("model"))),
        "r": jax.device_put(values[:4, 0], NamedSharding(mesh, P())),
        "h": jax.device_put(values.astype(jnp.bfloat16), NamedSharding(mesh, P(None, ("data", "model")))),
    }


def _same(restored, tree):
    for name, array in tree.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(array))


def test_distinct_shards_are_stored_once_with_their_layout(tmp_path, tree):
    jaxstow.save(tmp_path / "t.jxs", tree)
    with jaxstow.open(tmp_path / "t.jxs") as reader:
        slots = reader.container.slots
        w = reader.stored["w"]
        assert sorted(name for name in slots if name.startswith("w@")) == [
            "w@0:16,0:8",
            "w@0:16,8:16",
            "w@16:32,0:8",
            "w@16:32,8:16",
        ]
        assert sorted(name for name in slots if name.startswith("b@")) == ["b@0:8", "b@8:16"]  # two replicas each
        assert [name for name in slots if name.startswith("r@")] == ["r@0:4"]
        assert w.sharding == {
            "mesh": [2, 2],
            "axes": ["data", "model"],
            "axis_types": ["Explicit", "Explicit"],
            "spec": ["data", "model"],
        }
        assert reader.stored["h"].sharding["spec"] == [None, ["data", "model"]]
        assert sum(slot.nbytes for slot in slots.values()) == sum(array.nbytes for array in tree.values())
        np.testing.assert_array_equal(reader.read("w", np.s_[14:18, 6:10]), np.asarray(tree["w"])[14:18, 6:10])


def test_restored_whole_on_one_device_by_default(tmp_path, tree):
    jaxstow.save(tmp_path / "t.jxs", tree)
    restored = jaxstow.load(tmp_path / "t.jxs")
    _same(restored, tree)
    assert all(array.devices() == {jax.devices()[0]} for array in restored.values())
    assert jaxstow.load(tmp_path / "t.jxs", as_numpy=True)["h"].dtype == jnp.bfloat16


def test_restored_on_the_saved_sharding(tmp_path, tree):
    jaxstow.save(tmp_path / "t.jxs", tree)
    restored = jaxstow.load(tmp_path / "t.jxs", sharding="saved")
    _same(restored, tree)
    for name, array in tree.items():
        assert restored[name].sharding.spec == array.sharding.spec
        assert restored[name].sharding.mesh.shape == array.sharding.mesh.shape


def test_restored_on_another_mesh_and_cast(tmp_path, tree):
    jaxstow.save(tmp_path / "t.jxs", tree)
    line = jax.make_mesh((4,), ("x",))
    like = {
        name: jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=NamedSharding(line, P("x")))
        for name, array in tree.items()
    }
    like["w"] = jax.ShapeDtypeStruct((32, 16), jnp.bfloat16, sharding=NamedSharding(line, P(None, "x")))
    restored = jaxstow.load(tmp_path / "t.jxs", like=like, cast=True)
    assert restored["w"].dtype == jnp.bfloat16 and restored["w"].sharding == like["w"].sharding
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(tree["w"]).astype(jnp.bfloat16))
    assert {shard.data.shape for shard in restored["b"].addressable_shards} == {(4,)}


def test_a_cast_onto_another_mesh_that_would_overflow_is_refused(tmp_path, mesh):
    values = np.full((8, 8), 1e5, np.float32)
    jaxstow.save(tmp_path / "t.jxs", {"w": jax.device_put(values, NamedSharding(mesh, P("data", "model")))})
    line = jax.make_mesh((4,), ("x",))
    like = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float16, sharding=NamedSharding(line, P(None, "x")))}
    with pytest.raises(jaxstow.errors.RequestError, match=r"from -65504\.0 to 65504\.0") as raised:
        jaxstow.load(tmp_path / "t.jxs", like=like, cast=True)
    assert raised.value.path == "w"


def test_a_damaged_shard_is_found_when_read(tmp_path, tree):
    jaxstow.save(tmp_path / "t.jxs", tree)
    with jaxstow.open(tmp_path / "t.jxs") as reader:
        offset = reader.container.slots["w@16:32,8:16"].offset
    with open(tmp_path / "t.jxs", "r+b") as file:
        file.seek(offset + 5)
        file.write(b"\x7f")
    with pytest.raises(jaxstow.errors.CorruptFileError, match="checksum mismatch") as raised:
        jaxstow.load(tmp_path / "t.jxs")
    assert raised.value.path == "w"


def test_the_saved_sharding_needs_its_devices(tmp_path):
    mesh = jax.make_mesh((4,), ("x",))
    jaxstow.save(tmp_path / "t.jxs", {"w": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))})
    with jaxstow.open(tmp_path / "t.jxs") as reader:
        leaf = reader.stored["w"]
    wide = leaf.sharding | {"mesh": [8]}
    from jaxstow._read.placement import saved_sharding

    with pytest.raises(ShardingError, match="of 8 devices, but this process sees 4"):
        saved_sharding(wide, file="t.jxs", path="w")


def test_shards_that_do_not_cover_the_array_are_refused(tmp_path, mesh):
    jaxstow.save(tmp_path / "t.jxs", {"w": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("data")))})
    with jaxstow.open(tmp_path / "t.jxs") as reader:
        container = reader.container
        entry = container.columns.entries[0]
        entry["shards"] = entry["shards"][:1]
        with pytest.raises(FormatError, match="do not cover the array of shape"):
            jaxstow.Reader(container)


def test_a_missing_file_of_a_step_is_named(tmp_path, tree):
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": tree})
    (tmp_path / "run" / "1" / "params.safetensors").unlink()
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(CheckpointError) as raised:
        manager.restore(1)
    assert "params.safetensors" in str(raised.value) and "step 1" in str(raised.value)


def test_checkpoints_keep_sharded_arrays_async(tmp_path, tree):
    with CheckpointManager(tmp_path / "run", keep=KeepPolicy(keep_last=1)) as manager:
        manager.save(1, {"params": tree})
        manager.save(2, {"params": tree})
        restored = manager.restore(sharding="saved")
    _same(restored["params"], tree)
    assert restored["params"]["w"].sharding.spec == P("data", "model")


def test_the_command_line_verifies_each_shard(tmp_path, tree):
    import subprocess
    import sys

    jaxstow.save(tmp_path / "t.jxs", tree)
    verify = [sys.executable, "-m", "jaxstow", "verify", str(tmp_path / "t.jxs")]
    assert subprocess.run(verify, capture_output=True, text=True).returncode == 0
    with jaxstow.open(tmp_path / "t.jxs") as reader:
        offset = reader.container.slots["b@8:16"].offset
    with open(tmp_path / "t.jxs", "r+b") as file:
        file.seek(offset)
        file.write(b"\x01")
    damaged = subprocess.run(verify, capture_output=True, text=True)
    assert damaged.returncode == 1 and "leaf 'b'" in damaged.stdout


@pytest.mark.parametrize(
    ("shape", "spec"), [((8, 0), P("data")), ((0, 4), P(None, "model")), ((0, 0), P()), ((4, 0), P("data", "model"))]
)
def test_an_empty_sharded_array_loads_back_whole_and_onto_a_sharding(tmp_path, mesh, shape, spec):
    empty = jax.device_put(jnp.zeros(shape, jnp.float32), NamedSharding(mesh, spec))
    jaxstow.save(tmp_path / "empty.jxs", {"w": jnp.arange(3.0), "empty": empty})
    restored = jaxstow.load(tmp_path / "empty.jxs")
    assert restored["empty"].shape == shape and restored["w"].tolist() == [0.0, 1.0, 2.0]
    onto = jaxstow.load(tmp_path / "empty.jxs", sharding={"w": None, "empty": NamedSharding(mesh, spec)})
    assert onto["empty"].shape == shape and onto["empty"].sharding == NamedSharding(mesh, spec)
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"empty": empty})
        manager.wait()
        assert manager.damaged_steps() == {} and manager.restore(1)["empty"].shape == shape


@pytest.mark.parametrize("name", ["t.jxs", "t.npz"])
def test_a_leaf_named_as_a_shard_is_kept_apart_from_the_shard(tmp_path, mesh, name):
    sharded = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("data")))
    tree = {"w": sharded, "w@0:4": np.full(4, 7.0, np.float32), "w@4:8": np.full(4, 9.0, np.float32)}
    jaxstow.save(tmp_path / name, tree)
    for restored in (jaxstow.load(tmp_path / name), jaxstow.load(tmp_path / name, sharding="saved")):
        _same(restored, tree)
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"state": tree})
        restored = manager.restore(sharding="saved")
    _same(restored["state"], tree)
