"""Restores read straight into page-locked (``pinned_host``) buffers, run on CPU devices taken as an accelerator's
(they have ``pinned_host`` memory too): the same arrays as the default path, buffers handed round by dtype and shape
and bounded in number, the checks of the bytes kept, and the copy path taken wherever writes through a buffer's view
would not reach the device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow._read import pinned_pieces, pipeline
from jaxstow._util import pinned
from jaxstow.errors import CorruptFileError


@pytest.fixture
def pinned_cpu(monkeypatch):
    """CPU devices taken as devices with page-locked memory, leaves of 1 KiB and more streamed; every buffer made is
    counted."""
    monkeypatch.setattr(pinned, "PINNED_PLATFORMS", pinned.PINNED_PLATFORMS | {"cpu"})
    monkeypatch.setattr(pinned_pieces, "_CHECKED", {})
    monkeypatch.setattr(pipeline, "_PIECE_BYTES", 64 * 1024)  # leaves of 1 KiB and more are streamed
    assert pinned_pieces.writes_reach_the_device(jax.devices()[0])  # checked once, before the count starts
    made: list[tuple[np.dtype, tuple[int, ...]]] = []
    real = pinned_pieces._made

    def counted(device, dtype, shape):
        piece = real(device, dtype, shape)
        if piece is not None:
            made.append((dtype, shape))
        return piece

    monkeypatch.setattr(pinned_pieces, "_made", counted)
    return made


def _layers(count: int) -> dict[str, np.ndarray]:
    """``count`` layers of two shapes and dtypes in turn, each of its own values."""
    rng = np.random.default_rng(0)
    return {
        f"layer{i:02d}": rng.normal(size=(64, 32)).astype(ml_dtypes.bfloat16)
        if i % 2
        else rng.normal(size=(16, 64)).astype(np.float32)
        for i in range(count)
    }


def test_leaves_read_into_pinned_buffers_come_back_as_saved_and_the_buffers_are_reused(tmp_path, pinned_cpu):
    tree = _layers(80)
    path = tmp_path / "layers.jxs"
    jaxstow.save(path, tree)
    restored = jaxstow.load(path, pipeline=True)
    for name, value in tree.items():
        assert restored[name].dtype == value.dtype and restored[name].shape == value.shape
        np.testing.assert_array_equal(np.asarray(restored[name]), value)
    assert 0 < len(pinned_cpu) <= 2 * pipeline._READERS < len(tree)  # handed round, not one a leaf


def test_a_leaf_of_several_pieces_is_read_piece_by_piece_into_pinned_buffers(tmp_path, pinned_cpu, monkeypatch):
    monkeypatch.setattr(pipeline, "_PIECE_BYTES", 1024)
    tree = {"w": np.arange(1000, dtype=np.float32).reshape(10, 100)}  # 4,000 bytes: pieces of 256, 256, 256, 232
    path = tmp_path / "long.jxs"
    jaxstow.save(path, tree)
    np.testing.assert_array_equal(np.asarray(jaxstow.load(path, pipeline=True)["w"]), tree["w"])
    assert set(pinned_cpu) == {(np.dtype(np.float32), (256,)), (np.dtype(np.float32), (232,))}


def test_a_corrupt_leaf_read_into_a_pinned_buffer_is_refused_naming_it(tmp_path, pinned_cpu):
    tree = _layers(6)
    path = tmp_path / "layers.jxs"
    jaxstow.save(path, tree)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # inside the last layer
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="checksum") as caught:
        jaxstow.load(path, pipeline=True)
    assert caught.value.path == "layer05" and pinned_cpu


def test_bools_read_into_a_pinned_buffer_are_checked(tmp_path, pinned_cpu):
    raw = np.zeros(4096, np.uint8)
    raw[4000] = 2  # a byte no bool has, saved with its checksum, as a hand-made file would be
    path = tmp_path / "mask.jxs"
    jaxstow.save(path, {"mask": raw.view(bool)})
    with pytest.raises(CorruptFileError, match="bool") as caught:
        jaxstow.load(path, pipeline=True)
    assert caught.value.path == "mask" and pinned_cpu


def test_where_writes_through_a_view_do_not_reach_the_device_the_copy_path_is_taken(tmp_path, pinned_cpu, monkeypatch):
    """A jax whose ``pinned_host`` arrays are not the memory their pointer shows (a view of a copy, here): the check
    finds it once per device and no leaf is read into such a buffer, so none comes back as zeros."""
    real = pinned_pieces._made

    def elsewhere(device, dtype, shape):
        piece = real(device, dtype, shape)
        return None if piece is None else pinned_pieces.PinnedPiece(piece.array, np.zeros(shape, dtype))

    monkeypatch.setattr(pinned_pieces, "_made", elsewhere)
    monkeypatch.setattr(pinned_pieces, "_CHECKED", {})  # to be checked again, with such buffers
    tree = _layers(4)
    path = tmp_path / "layers.jxs"
    jaxstow.save(path, tree)
    restored = jaxstow.load(path, pipeline=True)
    for name, value in tree.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), value)
    assert not pinned_pieces.writes_reach_the_device(jax.devices()[0])


def test_leaves_restored_into_pinned_host_memory_are_not_the_buffers_handed_round(tmp_path, pinned_cpu):
    """Arrays asked for in ``pinned_host`` memory are copies of their own: a buffer handed round would be
    overwritten by the next leaf read into it."""
    tree = _layers(8)
    path = tmp_path / "layers.jxs"
    jaxstow.save(path, tree)
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    restored = jaxstow.load(path, sharding=host, pipeline=True)
    for name, value in tree.items():
        assert restored[name].sharding.memory_kind == "pinned_host"
        np.testing.assert_array_equal(np.asarray(restored[name]), value)
    assert not pinned_cpu


def test_the_buffers_held_stay_within_the_limit_and_another_kind_makes_room(pinned_cpu):
    device = jax.devices()[0]
    pieces = pinned_pieces.PinnedPieces(limit=2)
    f32, i8 = np.dtype(np.float32), np.dtype(np.int8)
    first, second = pieces.take(device, f32, (8,)), pieces.take(device, f32, (8,))
    assert first is not None and second is not None and first.array is not second.array
    assert pieces.take(device, i8, (3,)) is None  # two held, none free: the caller copies instead
    pieces.give(first)
    third = pieces.take(device, i8, (3,))  # the free float32 buffer let go to make room
    assert third is not None and third.view.dtype == i8 and third.view.shape == (3,)
    pieces.give(second)
    assert pieces.take(device, f32, (8,)) is second
    assert pieces.take(device, np.dtype(ml_dtypes.int4), (16,)) is None  # elements narrower than a byte


def test_a_jax_array_bound_for_the_device_is_moved_as_it_is(pinned_cpu):
    device = jax.devices()[0]
    piece = pinned_pieces.PinnedPieces(limit=1).take(device, np.dtype(np.float32), (4,))
    assert piece is not None
    piece.view[:] = [1, 2, 3, 4]
    moved = pipeline._transfer(piece.array, jax.sharding.SingleDeviceSharding(device))
    piece.view[:] = 0
    np.testing.assert_array_equal(np.asarray(moved), jnp.arange(1.0, 5.0))


@pytest.mark.parametrize("dtype", [ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.int4])
def test_a_leaf_of_elements_narrower_than_a_byte_over_a_piece_comes_back(tmp_path, monkeypatch, dtype):
    """Joining the pieces of a 2-bit leaf on a CPU device aborted the process inside XLA: such leaves over a piece
    are read by the path without the pipeline."""
    monkeypatch.setattr(pipeline, "_PIECE_BYTES", 1024)
    tree = {"w": (np.arange(4096) % 2).astype(dtype)}
    path = tmp_path / "narrow.jxs"
    jaxstow.save(path, tree)
    restored = jaxstow.load(path, pipeline=True)["w"]
    assert restored.dtype == tree["w"].dtype
    np.testing.assert_array_equal(np.asarray(restored).astype(np.int8), tree["w"].astype(np.int8))
