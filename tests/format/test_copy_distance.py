"""Memory read into from a file never starts 1 to 31 bytes past the file's bytes within a page, where the kernel's
copy runs several times slower on AMD's cores: whatever the leaves before a leaf, read alone (into kept huge pages or
the allocator's memory) or with others, its values and checksum are those saved."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jaxstow
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
