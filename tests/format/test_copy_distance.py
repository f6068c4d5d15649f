"""Memory read into from a file never starts 1 to 31 bytes past the file's bytes within a page, and a large write
never goes to the system from memory 1 to 31 bytes before them, where the kernel's copy runs several times slower on
AMD's cores: whatever the leaves before a leaf, read alone (into kept huge pages or the allocator's memory) or with
others, or saved, its values and checksum are those saved."""

from __future__ import annotations

import io
import json
import os
import threading

import jax
import numpy as np
import pytest

import jaxstow
from jaxstow._format import clear_writes
from jaxstow._format.clear_writes import write_clear
from jaxstow._format.tensor_reads import clear_shift
from jaxstow._util.buffers import leaf_buffer, release_kept


def _distance(array: np.ndarray, offset: int) -> int:
    return (array.ctypes.data - offset) % 4096


def _offset(path, name: str) -> int:
    """Where tensor ``name``'s bytes start in the safetensors file at ``path``."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    return 8 + length + json.loads(data[8 : 8 + length])[name]["data_offsets"][0]


@pytest.mark.parametrize("address", [0, 64, 4032, 4096 * 7 + 128])
def test_a_shifted_start_is_clear_of_the_slow_distances_and_stays_aligned(address):
    for offset in range(0, 8192, 4):
        start = address + clear_shift(address, offset)
        assert not 0 < (start - offset) % 4096 < 32, (address, offset)
        assert start % 64 == address % 64


@pytest.mark.parametrize("before", [4096, 4080, 4064, 4036, 4000, 52, 20])
@pytest.mark.parametrize("leaf_bytes", [3 << 20, 300_000])  # in huge pages of its own, or the allocator's memory
def test_a_leaf_after_any_leaves_is_read_where_the_copy_is_fast(tmp_path, before, leaf_bytes):
    rng = np.random.default_rng(before)
    tree = {"a": np.zeros(before // 4, np.float32), "b": rng.standard_normal(leaf_bytes // 4, dtype=np.float32)}
    path = tmp_path / "leaves.jxs"
    jaxstow.save(path, tree)
    offset = _offset(path, "b")
    assert offset % 4096 == before % 4096
    with jaxstow.open(path) as reader:
        for _ in range(2):  # a fresh buffer, then the one kept from the first read
            leaf = reader["b"]
            np.testing.assert_array_equal(leaf, tree["b"])
            assert not 0 < _distance(leaf, offset) < 32, _distance(leaf, offset)
            del leaf
    loaded = jaxstow.load(path)
    np.testing.assert_array_equal(loaded["b"], tree["b"])


def test_a_kept_buffer_taken_again_for_another_offset_is_shifted_for_it():
    release_kept()
    first = leaf_buffer(3 << 20, clear_shift(0, 4096 - 16))
    assert first is not None and _distance(first.array, 4096 - 16) == 80
    del first
    again = leaf_buffer(3 << 20, clear_shift(0, 0))
    assert again is not None and again.touched and _distance(again.array, 0) == 0
    assert again.array.ctypes.data % (2 << 20) == 0


class _SeenWrites(io.BufferedWriter):
    """A local file's buffered writer that notes, for each write, the distance from the memory to the file's bytes."""

    def __init__(self, path) -> None:
        super().__init__(io.FileIO(path, "wb"), buffer_size=1 << 20)
        self.distances: list[int] = []

    def write(self, data) -> int:
        view = memoryview(data)
        if view.nbytes >= 1 << 20:
            self.distances.append((self.tell() - np.frombuffer(view, np.uint8).ctypes.data) % 4096)
        return super().write(data)


@pytest.mark.parametrize("ahead", [0, 4, 16, 31, 32, 100])
@pytest.mark.parametrize(("nbytes", "pieces"), [((2 << 20) + 4, 1), ((5 << 20) + 12, 3), ((5 << 20) - 8, 2)])
def test_a_large_write_goes_to_the_file_from_memory_clear_of_the_slow_distances(tmp_path, ahead, nbytes, pieces):
    """Whatever lies before it in the file, an array's bytes reach the system from memory 0 or 32 to 4095 bytes
    before the file's bytes within a page (the thread's buffer where the array's own would be 1 to 31), every byte
    in its place."""
    backing = np.random.default_rng(ahead).integers(0, 255, nbytes + 8192, np.uint8)
    skip = (4096 - backing.ctypes.data % 4096) % 4096 + 64  # the array 64 bytes past a page's start
    data = backing[skip : skip + nbytes]
    before = (64 + ahead) % 4096
    sink = _SeenWrites(tmp_path / "data.bin")
    with sink:
        sink.write(b"h" * before)
        write_clear(sink, data.data)
    assert (tmp_path / "data.bin").read_bytes() == b"h" * before + data.tobytes()
    assert not any(0 < distance < 32 for distance in sink.distances), sink.distances
    slow = 0 < ahead < 32
    assert len(sink.distances) == (pieces if slow else 1)  # in pieces of 2 MiB, a last one under 1 MiB joined


@pytest.mark.parametrize("floats_before", [5, 8, 16, 1000])
def test_a_saved_array_after_a_tensor_of_any_size_is_loaded_as_it_was(tmp_path, monkeypatch, floats_before):
    """An array 16 bytes past a page's start, after 20 or 32 bytes of another in the file, is written through the
    thread's buffer (to a path and to the caller's open file), after 64 or 4000 as it is; loaded as it was."""
    staged: list[int] = []
    buffer = clear_writes._buffer
    monkeypatch.setattr(clear_writes, "_buffer", lambda: staged.append(1) or buffer())
    backing = np.random.default_rng(floats_before).standard_normal((6 << 20) // 4 + 4096, dtype=np.float32)
    skip = ((4096 - backing.ctypes.data % 4096) % 4096 + 16) // 4  # the array 16 bytes past a page's start
    weights = backing[skip : skip + (6 << 20) // 4 + 3]
    tree = {"bias": np.arange(floats_before, dtype=np.float32), "w": weights}
    jaxstow.save(tmp_path / "model.jxs", tree)
    with open(tmp_path / "own.jxs", "wb") as file:
        jaxstow.save(file, tree)
    assert len(staged) == (2 if floats_before * 4 - 16 < 32 else 0)
    for name in ("model.jxs", "own.jxs"):
        loaded = jaxstow.load(tmp_path / name)
        np.testing.assert_array_equal(loaded["w"], weights)
        np.testing.assert_array_equal(loaded["bias"], tree["bias"])


@pytest.mark.parametrize("buffering", [-1, 0])
def test_an_array_saved_into_a_pipe_arrives_whole(buffering):
    """A pipe is a raw file with no place in a file: its writes go as they are, whatever the array's address."""
    weights = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    read, write = os.pipe()
    got: list[bytes] = []
    drain = threading.Thread(target=lambda: got.append(os.fdopen(read, "rb").read()))
    drain.start()
    with os.fdopen(write, "wb", buffering=buffering) as sink:
        jaxstow.save(sink, {"bias": np.zeros(5, np.float32), "w": weights})
    drain.join()
    np.testing.assert_array_equal(jaxstow.load(io.BytesIO(got[0]))["w"], weights)


class _SeenReads:
    """``os.preadv`` noting, for each read of at least 64 KiB, the distance from the file's bytes to the memory."""

    def __init__(self) -> None:
        self.distances: list[int] = []
        self._preadv = os.preadv

    def __call__(self, descriptor, views, offset):
        if views and memoryview(views[0]).nbytes >= 64 << 10:
            self.distances.append((np.frombuffer(views[0], np.uint8).ctypes.data - offset) % 4096)
        return self._preadv(descriptor, views, offset)


@pytest.mark.parametrize("floats_before", [0, 13])
def test_slices_and_shards_are_read_where_the_copy_is_fast(tmp_path, monkeypatch, floats_before):
    """Rows of 12 bytes: a slice from each row of a page's worth (its first byte at every distance from the memory
    the allocator gives, 12 bytes apart), verified by its blocks or its bytes alone, and each device's rows of a
    sharded restore, land in memory clear of the slow distances, with the values saved."""
    rows = (3 << 20) // 12
    tree = {
        "a": np.zeros(floats_before, np.float32),
        "b": np.random.default_rng(floats_before).standard_normal((rows, 3), dtype=np.float32),
    }
    path = tmp_path / "rows.jxs"
    jaxstow.save(path, tree)
    seen = _SeenReads()
    monkeypatch.setattr(os, "preadv", seen)
    with jaxstow.open(path) as reader:
        for start in range(4096 // 12 + 1):
            for index in (np.s_[start:], np.s_[start : start + 6000]):  # verified; its bytes alone (72 KB)
                np.testing.assert_array_equal(reader.read("b", index), tree["b"][index])
    mesh = jax.make_mesh((4,), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", None))
    target = {name: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for name, leaf in tree.items()}
    loaded = jaxstow.load(path, like=target, sharding={"a": None, "b": sharding})
    np.testing.assert_array_equal(np.asarray(loaded["b"]), tree["b"])
    assert len(seen.distances) > 2 * (4096 // 12)
    assert not any(0 < distance < 32 for distance in seen.distances), sorted(seen.distances)[:8]
