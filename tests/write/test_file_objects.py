"""Saving to a caller's file object writes every byte or raises a StorageError naming it.

A raw stream (an unbuffered file, a pipe, a socket's ``makefile(buffering=0)``) may write fewer bytes than it is
given; the rest is written until none is left. One that would block, one that writes nothing and one whose disk is
full are errors naming the file object, with the cause chained.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import socket
import threading

import numpy as np
import pytest
from tmpfs import small_tmpfs

import jaxstow
from jaxstow.errors import ArgumentError, StorageError

TREE = {
    "w": np.arange(100_000, dtype=np.float32),
    "b": np.ones(7, np.int64),
    "many": [np.full(3, i) for i in range(50)],
}


def _assert_same(loaded, tree=TREE):
    np.testing.assert_array_equal(loaded["w"], tree["w"])
    np.testing.assert_array_equal(loaded["b"], tree["b"])
    for got, want in zip(loaded["many"], tree["many"], strict=True):
        np.testing.assert_array_equal(got, want)


class _Short(io.RawIOBase):
    """A raw stream that writes at most ``most`` bytes a call and says how many, as a pipe or a socket may."""

    def __init__(self, most: int = 1000, name: str | None = None) -> None:
        self.data = bytearray()
        self.most = most
        self.calls = 0
        if name is not None:
            self.name = name

    def writable(self) -> bool:
        return True

    def write(self, b) -> int | None:
        self.calls += 1
        part = memoryview(b).cast("B")[: self.most]
        self.data += part
        return len(part)


@pytest.mark.parametrize("name", [None, "model.npz"])
def test_a_raw_stream_writing_part_of_each_buffer_gets_every_byte(name):
    short = _Short(name=name)
    jaxstow.save(short, TREE)
    whole = io.BytesIO()
    if name is not None:
        whole.name = name
    jaxstow.save(whole, TREE)
    if name is None:  # an npz archive written where it cannot seek back has its sizes after each member instead
        assert bytes(short.data) == whole.getvalue()
    assert short.calls > len(whole.getvalue()) // 1000  # it was written a part at a time
    _assert_same(jaxstow.load(io.BytesIO(bytes(short.data)), as_numpy=True))


def test_an_unbuffered_socket_file_with_a_timeout_gets_every_byte():
    sender, receiver = socket.socketpair()
    sender.settimeout(30)  # non-blocking underneath: send() may send part of what it is given
    received: list[bytes] = []

    def read() -> None:
        while chunk := receiver.recv(1 << 16):
            received.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    tree = {"w": np.arange(4_000_000, dtype=np.float32)}
    try:
        with sender.makefile("wb", buffering=0) as file:
            jaxstow.save(file, tree)
    finally:
        sender.shutdown(socket.SHUT_WR)
        sender.close()
        reader.join()
        receiver.close()
    np.testing.assert_array_equal(jaxstow.load(io.BytesIO(b"".join(received)), as_numpy=True)["w"], tree["w"])


def test_a_non_blocking_pipe_that_would_block_is_an_error_naming_it():
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        blocked = pytest.raises(StorageError, match=rf"<FileIO of file descriptor {write_end}>: .*would block")
        with os.fdopen(write_end, "wb", buffering=0) as file, blocked:  # nobody reads: the pipe fills
            jaxstow.save(file, {"w": np.zeros(1 << 20, np.uint8)})
    finally:
        os.close(read_end)


class _Stuck(_Short):
    def write(self, b) -> int:
        return 0


def test_a_stream_that_writes_nothing_is_an_error_naming_it():
    with pytest.raises(StorageError, match=r"stream\.bin: cannot write it: its write\(\) wrote 0 bytes"):
        jaxstow.save(_Stuck(name="stream.bin"), TREE)


def test_a_full_device_is_a_storage_error_naming_the_file_object():
    for buffering in (-1, 0):
        full = pytest.raises(StorageError, match="/dev/full: cannot write it: no space left")
        with open("/dev/full", "wb", buffering=buffering) as file, full as raised:
            jaxstow.save(file, TREE)
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == "/dev/full"
        assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.errno == errno.ENOSPC


class _Failing(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_an_os_error_of_a_nameless_file_object_names_its_type():
    with pytest.raises(StorageError, match=r"<_Failing>: cannot write it: input/output error") as raised:
        jaxstow.save(_Failing(), TREE)
    assert raised.value.errno == errno.EIO and raised.value.__cause__ is not None


@pytest.mark.parametrize("name", ["model.jxs", "model.npz"])
def test_a_file_object_on_a_full_disk_names_its_file(tmp_path, name):
    """Was, for npz (and a native file filled by a small write): the file's close at the end of the block failing
    again on the bytes its buffer still held, a bare OSError in place of the StorageError."""
    trees = [{"w": np.ones(1 << 19, np.float32)}, {f"k{i}": np.ones(3000 + 7 * i, np.float32) for i in range(40)}]
    with small_tmpfs(tmp_path / "small", size="1m") as folder:
        path, filler = folder / name, folder / "filler"
        for tree, free in [(trees[0], 1 << 20), *((trees[1], kept) for kept in range(0, 440_000, 40_000))]:
            disk = os.statvfs(folder)
            filler.write_bytes(bytes(max(disk.f_bavail * disk.f_frsize - free, 0)))
            full = pytest.raises(
                StorageError, match=f"{path}: cannot write it: no space left on the device holding {folder}"
            )
            with full, open(path, "wb") as file:  # its close at the end of the block raises no bare OSError either
                jaxstow.save(file, tree)  # 2 MB on 1 MB; 500 kB on what is left
            os.remove(filler)
            os.remove(path)


@pytest.mark.parametrize("name", ["model.jxs", "model.npz"])
def test_a_buffered_file_object_stands_where_the_save_ended_between_the_callers_own_writes(tmp_path, name):
    path, buffer = tmp_path / name, io.BytesIO()
    buffer.name = name
    with open(path, "w+b") as file:
        for written in (file, buffer):
            written.write(b"head")  # in the file, still in its buffer when the save starts
            jaxstow.save(written, SMALL)
            written.write(b"tail")
        assert file.tell() == buffer.tell()
    assert path.read_bytes() == buffer.getvalue()
    np.testing.assert_array_equal(jaxstow.load(io.BytesIO(buffer.getvalue()[4:-4]), as_numpy=True)["w"], SMALL["w"])


SMALL = {"w": np.arange(10, dtype=np.float32)}


def _saved(tree, name: str) -> bytes:
    fresh = io.BytesIO()
    fresh.name = name
    jaxstow.save(fresh, tree)
    return fresh.getvalue()


@pytest.mark.parametrize("name", ["model.jxs", "model.npz"])
def test_a_file_object_holding_a_longer_earlier_save_holds_exactly_the_new_one(tmp_path, name):
    path = tmp_path / name
    jaxstow.save(path, TREE)
    with open(path, "r+b") as file:  # was: the old save's tail left after the new one, a CorruptFileError to load
        jaxstow.save(file, SMALL)
    assert path.read_bytes() == _saved(SMALL, name)
    np.testing.assert_array_equal(jaxstow.load(path, as_numpy=True)["w"], SMALL["w"])
    buffer = io.BytesIO(b"kept" + _saved(TREE, name))
    buffer.name = name
    buffer.seek(4)  # saved at the position it stands, as objax.io.save_var_collection documents
    jaxstow.save(buffer, SMALL)
    assert buffer.getvalue()[:4] == b"kept" and buffer.tell() == len(buffer.getvalue()) == 4 + len(_saved(SMALL, name))
    buffer.seek(4)
    np.testing.assert_array_equal(jaxstow.load(buffer, as_numpy=True)["w"], SMALL["w"])


class _Uncuttable(io.BytesIO):
    """A seekable file object that cannot be truncated (a fixed-size region, say)."""

    def truncate(self, size=None):
        raise io.UnsupportedOperation("truncate")


def test_a_file_object_holding_more_that_cannot_be_cut_is_refused_before_anything_is_written():
    earlier = _saved(TREE, "model.jxs")
    held = _Uncuttable(earlier)
    with pytest.raises(ArgumentError, match=r"holds \d+ bytes after its position 0 .*nothing was written"):
        jaxstow.save(held, SMALL)
    assert held.getvalue() == earlier and held.tell() == 0
    held.seek(0, io.SEEK_END)  # nothing after its position: saved as it is
    jaxstow.save(held, SMALL)
    np.testing.assert_array_equal(
        jaxstow.load(io.BytesIO(held.getvalue()[len(earlier) :]), as_numpy=True)["w"], SMALL["w"]
    )


@pytest.mark.parametrize("name", ["model.jxs.gz", "model.npz"])
def test_a_gzip_stream_is_saved_into_and_loads_back(tmp_path, name):
    path = tmp_path / name
    with gzip.open(path, "wb") as file:  # says it is seekable, yet seeks only forward: was a ValueError of gzip's
        jaxstow.save(file, TREE, metadata={"epoch": 3})
    with gzip.open(path, "rb") as file:
        _assert_same(jaxstow.load(file, as_numpy=True))
        assert jaxstow.load_metadata(file) == {"epoch": 3}


@pytest.mark.parametrize("mode", ["ab", "a+b"])
def test_a_file_opened_to_append_is_saved_into_as_a_stream_and_loads_back(tmp_path, mode):
    path = tmp_path / "model.npz"
    with open(path, mode) as file:  # its writes all land at its end: a seek back to complete the archive appended
        jaxstow.save(file, TREE)
    _assert_same(jaxstow.load(path, as_numpy=True))
    with np.load(path) as archive:  # an archive numpy reads too
        np.testing.assert_array_equal(archive["w"], TREE["w"])
