"""Arrays offloaded to host memory (``memory_kind="pinned_host"``) come back there under ``sharding="saved"``: sharded,
on one device, PRNG keys, from a file and from a checkpoint; a memory this process's devices lack is named in a
warning, and the array lands in their default memory."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.errors import FormatError
from reliability.forge import forge_native, split_native

_DEVICE = jax.devices()[0]
_KINDS = {memory.kind for memory in _DEVICE.addressable_memories()}
needs_host_memories = pytest.mark.skipif(
    not {"pinned_host", "unpinned_host"} <= _KINDS, reason=f"this jax's CPU devices address {sorted(_KINDS)} alone"
)


def _offloaded():
    assert len(jax.devices()) >= 4, "tests/conftest.py asks for four CPU devices"
    mesh = jax.make_mesh((4,), ("x",))
    values = np.arange(8.0, dtype=np.float32)
    return {
        "sharded": jax.device_put(values, NamedSharding(mesh, P("x"), memory_kind="pinned_host")),
        "second": jax.device_put(values, SingleDeviceSharding(jax.devices()[1], memory_kind="pinned_host")),
        "first": jax.device_put(values, SingleDeviceSharding(jax.devices()[0], memory_kind="unpinned_host")),
        "keys": jax.device_put(jax.random.split(jax.random.key(0), 4), NamedSharding(mesh, P("x"), "pinned_host")),
        "resident": jax.device_put(values, jax.devices()[2]),
        "usual": jax.numpy.asarray(values * 2),
    }


def _renamed(file: bytes, kind: str) -> bytes:
    """``file`` with every ``"pinned_host"`` of its manifest ``kind``, its header checksummed again."""
    tensors, manifest, data = split_native(file)
    assert manifest is not None and '"pinned_host"' in manifest
    return forge_native(tensors, manifest.replace('"pinned_host"', kind), data)


def _same(restored, saved):
    assert restored.keys() == saved.keys()
    for name, array in saved.items():
        assert restored[name].sharding == array.sharding, name
        if jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key):
            assert restored[name].dtype == array.dtype
            np.testing.assert_array_equal(jax.random.key_data(restored[name]), jax.random.key_data(array))
        else:
            np.testing.assert_array_equal(restored[name], array)


@needs_host_memories
def test_arrays_in_host_memory_come_back_there_from_a_file(tmp_path):
    tree = _offloaded()
    jaxstow.save(tmp_path / "state.jxs", tree)
    restored = jaxstow.load(tmp_path / "state.jxs", sharding="saved")
    _same(restored, tree)
    assert {name: array.sharding.memory_kind for name, array in restored.items()} == {
        "sharded": "pinned_host",
        "second": "pinned_host",
        "first": "unpinned_host",
        "keys": "pinned_host",
        "resident": "device",
        "usual": "device",
    }


@needs_host_memories
def test_arrays_in_host_memory_come_back_there_from_a_checkpoint(tmp_path):
    tree = _offloaded()
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"state": tree})
    with CheckpointManager(tmp_path / "run") as manager:
        _same(manager.restore(sharding="saved")["state"], tree)


@needs_host_memories
def test_arrays_in_the_default_memory_record_none(tmp_path):
    jaxstow.save(
        tmp_path / "plain.jxs", {"usual": np.ones(2, np.float32), "there": jax.device_put(np.ones(2), _DEVICE)}
    )
    _, manifest, _ = split_native((tmp_path / "plain.jxs").read_bytes())
    assert manifest is not None and "memory_kind" not in manifest


@needs_host_memories
def test_a_memory_the_devices_lack_is_a_warning_and_the_default_memory(tmp_path, caplog):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, _offloaded())
    (tmp_path / "other.jxs").write_bytes(_renamed(path.read_bytes(), '"far_memory1"'))  # saved where it was
    with caplog.at_level(logging.WARNING, logger="jaxstow"):
        restored = jaxstow.load(tmp_path / "other.jxs", sharding="saved")
    assert restored["sharded"].sharding.memory_kind == "device" and restored["sharded"].sharding.spec == P("x")
    assert restored["second"].sharding.device_set == {jax.devices()[1]}
    assert restored["first"].sharding.memory_kind == "unpinned_host"
    np.testing.assert_array_equal(restored["sharded"], np.arange(8.0))
    warned = " ".join(record.getMessage() for record in caplog.records)
    for leaf in ("'sharded'", "'second'", "'keys'"):
        assert f"leaf {leaf} was saved in 'far_memory1' memory" in warned
    assert "pinned_host" in warned and "restored in its default memory" in warned


@pytest.mark.parametrize("kind", ['"Pinned Host"', "7", '""'])
def test_a_malformed_memory_kind_is_a_damaged_header(tmp_path, kind):
    if not {"pinned_host"} <= _KINDS:
        pytest.skip(f"this jax's CPU devices address {sorted(_KINDS)} alone")
    path = tmp_path / "state.jxs"
    jaxstow.save(
        path, {"w": jax.device_put(np.ones(2), SingleDeviceSharding(jax.devices()[1], memory_kind="pinned_host"))}
    )
    (tmp_path / "forged.jxs").write_bytes(_renamed(path.read_bytes(), kind))
    with pytest.raises(FormatError, match="leaf 'w'"):
        jaxstow.load(tmp_path / "forged.jxs", sharding="saved")
