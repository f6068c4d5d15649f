"""An array saved sharded over a mesh of several axes comes back with ``sharding="saved"`` on the same layout, on
every jax the project supports: jax before 0.5 gives a mesh's axis types as a dict of each type's axes, and has no
``jax.sharding.AxisType`` to make a mesh's axes with. Its shards land on the devices they were saved on, whatever
their order in the mesh."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxstow
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import FormatError


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


def _placed(array):
    """Where each shard of ``array`` lies: its device's id, its index, its values."""
    return sorted(
        (shard.device.id, str(shard.index), np.asarray(shard.data).tolist()) for shard in array.addressable_shards
    )


def test_a_mesh_of_devices_in_another_order_comes_back_on_the_same_devices(tmp_path):
    # The mesh came back on the first devices in their default order: the same values, each shard on another device.
    mesh = Mesh(np.array(jax.devices()[:4][::-1]).reshape(2, 2), ("a", "b"))
    tree = {
        "both": jax.device_put(jnp.arange(16.0).reshape(4, 4), NamedSharding(mesh, PartitionSpec("a", "b"))),
        "rows": jax.device_put(jnp.arange(8).reshape(4, 2), NamedSharding(mesh, PartitionSpec("a"))),
        "copies": jax.device_put(jnp.ones(4), NamedSharding(mesh, PartitionSpec())),
    }
    jaxstow.save(tmp_path / "t.jxs", tree)
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": tree})
        from_step = manager.restore(1, sharding="saved")["params"]
    for restored in (jaxstow.load(tmp_path / "t.jxs", sharding="saved"), from_step):
        for name, array in tree.items():
            assert restored[name].sharding == array.sharding, name
            assert _placed(restored[name]) == _placed(array), name


def _with_devices(tree, ids, **changes) -> io.BytesIO:
    """``tree`` saved as a file whose first leaf's sharding names the devices ``ids`` (every checksum holds), with
    ``changes`` to its other members."""
    encoded = encode_tree(tree)
    encoded.manifest["leaves"][0]["sharding"].update(devices=ids, **changes)
    buffer = io.BytesIO()
    encoded.write(buffer)
    buffer.seek(0)
    return buffer


def test_a_file_saved_on_devices_this_process_lacks_comes_back_on_its_first_devices_in_the_saved_order():
    # Saved under jax.distributed (process 1's CPU devices have ids 2048 on), restored by one process of its own: the
    # mesh's device of the lowest id lands on the first device, and so on; a bad list of ids is a FormatError.
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    tree = {"w": jax.device_put(jnp.arange(4.0), NamedSharding(mesh, PartitionSpec("x")))}
    restored = jaxstow.load(_with_devices(tree, [2049, 2048]), sharding="saved")["w"]
    assert [device.id for device in restored.sharding.mesh.devices.flat] == [jax.devices()[1].id, jax.devices()[0].id]
    assert _placed(restored) == [
        (jax.devices()[0].id, "(slice(2, 4, None),)", [2.0, 3.0]),
        (jax.devices()[1].id, "(slice(0, 2, None),)", [0.0, 1.0]),
    ]
    np.testing.assert_array_equal(jaxstow.load(_with_devices(tree, [0, 9]))["w"], np.arange(4.0))  # placed by default
    for malformed in ([0, 0], [0], [0, -1], [0, True], [0, 1.0], "0, 1", None, list(range(10**6))):
        with pytest.raises(FormatError, match=r"names the devices .* its mesh \[2\] needs the ids of its 2 devices"):
            jaxstow.load(_with_devices(tree, malformed))


def test_a_file_whose_mesh_has_no_devices_is_refused_as_malformed():
    # jax aborted the process (a failed check in its C++) as the mesh of shape [2, 0] was made for sharding="saved".
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    tree = {"w": jax.device_put(jnp.arange(4.0), NamedSharding(mesh, PartitionSpec("x")))}
    for shape in ([2, 0], [0]):
        axes = {"axes": ["x", "y"][: len(shape)], "axis_types": ["Auto"] * len(shape)}
        with pytest.raises(FormatError, match="malformed sharding") as raised:
            jaxstow.load(_with_devices(tree, [], mesh=shape, **axes), sharding="saved")
        assert raised.value.path == "w"


def _on_one_device():
    """Arrays whole on one device each, as a pipeline's stages hold them: on a device put there, on a mesh of one
    device (its axis named), PRNG keys, and one on the first device, where arrays land by default."""
    stage = Mesh(np.array(jax.devices()[2:3]), ("stage",))
    return {
        "put": jax.device_put(jnp.arange(3.0), jax.devices()[3]),
        "stage": jax.device_put(jnp.arange(8.0).reshape(4, 2), NamedSharding(stage, PartitionSpec("stage"))),
        "key": jax.device_put(jax.random.key(1), jax.devices()[1]),
        "first": jax.device_put(jnp.ones(2), jax.devices()[0]),
    }


def _same(restored, saved):
    for name, array in saved.items():
        assert restored[name].sharding == array.sharding, name
    for name in ("put", "stage", "first"):
        assert _placed(restored[name]) == _placed(saved[name]), name
    assert restored["key"] == saved["key"]


def test_an_array_saved_whole_on_one_device_comes_back_on_that_device(tmp_path):
    # Each array came back on the first device: a model whose stages filled the devices landed on one.
    tree = _on_one_device()
    jaxstow.save(tmp_path / "t.jxs", tree)
    with jaxstow.open(tmp_path / "t.jxs") as reader:
        from_reader = reader.load(sharding="saved")
        stored = {name: reader.stored[name] for name in tree}
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": tree})  # held for a background write
        manager.save(2, {"params": tree}, copy=True)
        manager.wait()
        from_steps = [manager.restore(step, sharding="saved")["params"] for step in (1, 2)]
    for restored in (jaxstow.load(tmp_path / "t.jxs", sharding="saved"), from_reader, *from_steps):
        _same(restored, tree)
    for array in jaxstow.load(tmp_path / "t.jxs").values():  # without sharding=: the default device, as documented
        assert array.sharding.device_set == {jax.devices()[0]}
    assert stored["put"].sharding == {"device": jax.devices()[3].id}
    assert stored["stage"].sharding["devices"] == [jax.devices()[2].id]
    assert stored["first"].sharding is None  # nothing recorded: its file is as before


def test_an_array_saved_on_the_first_device_comes_back_there_under_another_default_device(tmp_path):
    # Its entry records no device (where arrays land by default): it landed on the device jax.default_device named.
    tree = _on_one_device()
    jaxstow.save(tmp_path / "t.jxs", tree)
    with jax.default_device(jax.devices()[2]):
        restored = jaxstow.load(tmp_path / "t.jxs", sharding="saved")
        assert restored["first"].sharding.device_set == {jax.devices()[0]}
        _same(restored, tree)
        for array in jaxstow.load(tmp_path / "t.jxs").values():  # without sharding=: the default device, as before
            assert array.sharding.device_set == {jax.devices()[2]}
    with jax.default_device("cpu"):  # a platform, not a device: where arrays land, the first device
        _same(jaxstow.load(tmp_path / "t.jxs", sharding="saved"), tree)


def test_prng_keys_laid_out_on_several_devices_come_back_on_their_layout(tmp_path):
    # Typed keys, stored whole, came back on one device with sharding="saved"; their raw data on its mesh.
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    tree = {
        "keys": jax.device_put(jax.random.split(jax.random.key(0), 8), NamedSharding(mesh, PartitionSpec("data"))),
        "grid": jax.device_put(
            jax.random.split(jax.random.key(1, impl="rbg"), 4).reshape(2, 2),
            NamedSharding(mesh, PartitionSpec("model", "data")),
        ),
        "one": jax.device_put(jax.random.key(2), NamedSharding(mesh, PartitionSpec())),
        "raw": jax.device_put(jax.random.split(jax.random.PRNGKey(3), 8), NamedSharding(mesh, PartitionSpec("data"))),
    }
    jaxstow.save(tmp_path / "keys.jxs", tree)
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"rng": tree})
        from_step = manager.restore(sharding="saved")["rng"]
    data = lambda keys: keys if keys.dtype == np.uint32 else jax.random.key_data(keys)  # noqa: E731
    for restored in (jaxstow.load(tmp_path / "keys.jxs", sharding="saved"), from_step):
        for name, saved in tree.items():
            assert restored[name].sharding == saved.sharding and restored[name].dtype == saved.dtype, name
            assert _placed(data(restored[name])) == _placed(data(saved)), name
    encoded = encode_tree({"k": tree["keys"]})
    encoded.manifest["leaves"][0]["keys_sharding"]["spec"] = ["data", "model"]  # two axes for keys of one
    buffer = io.BytesIO()
    encoded.write(buffer)
    buffer.seek(0)
    with pytest.raises(FormatError, match="malformed sharding") as raised:
        jaxstow.open(buffer)
    assert raised.value.path == "k"


def _whole_with(tree, path, sharding) -> io.BytesIO:
    """``tree`` saved as a file whose leaf ``path`` records ``sharding`` as where it lay (every checksum holds)."""
    encoded = encode_tree(tree)
    next(entry for entry in encoded.manifest["leaves"] if entry["path"] == path)["sharding"] = sharding
    buffer = io.BytesIO()
    encoded.write(buffer)
    buffer.seek(0)
    return buffer


def test_an_array_saved_on_a_device_this_process_lacks_comes_back_on_the_default_device():
    # Restarted on another host (other ids): the device of the id is not there, and the array lands where it would
    # without sharding=; a mesh of one device, on its first device (the rule for meshes).
    tree = {"w": jnp.arange(3.0)}
    restored = jaxstow.load(_whole_with(tree, "w", {"device": 2048}), sharding="saved")["w"]
    assert restored.sharding.device_set == {jax.devices()[0]}
    moved = {"mesh": [1], "axes": ["stage"], "axis_types": ["Auto"], "spec": ["stage"], "devices": [2048]}
    restored = jaxstow.load(_whole_with(tree, "w", moved), sharding="saved")["w"]
    assert restored.sharding == NamedSharding(Mesh(np.array(jax.devices()[:1]), ("stage",)), PartitionSpec("stage"))
    np.testing.assert_array_equal(restored, np.arange(3.0))


def test_a_malformed_record_of_the_device_an_array_lay_on_is_refused():
    tree = {"w": jnp.arange(3.0)}
    mesh = {"mesh": [1], "axes": ["x"], "axis_types": ["Auto"], "spec": ["x"]}
    for malformed, problem in [
        ({"device": -1}, "not the device an array stored whole lay on"),
        ({"device": True}, "not the device an array stored whole lay on"),
        ({"device": "3"}, "not the device an array stored whole lay on"),
        ({"device": 3, "spec": []}, "not the device an array stored whole lay on"),
        ([3], "malformed sharding"),
        ({**mesh, "spec": ["x", "x"]}, "malformed sharding"),
        ({**mesh, "devices": [1, 2]}, r"names the devices \[1, 2\] where its mesh \[1\] needs"),
        ({**mesh, "mesh": [2], "devices": [1, 2]}, r"a mesh \[2\] of 2 devices, not of one"),
    ]:
        with pytest.raises(FormatError, match=problem) as raised:
            jaxstow.load(_whole_with(tree, "w", malformed), sharding="saved")
        assert raised.value.path == "w", malformed
    # A single key's spec naming an axis: its data's axis [2] was taken for one, and only sharding="saved" failed.
    with pytest.raises(FormatError, match="malformed sharding") as raised:
        jaxstow.open(_whole_with({"k": jax.random.key(0)}, "k", {**mesh, "devices": [1]}))
    assert raised.value.path == "k"
