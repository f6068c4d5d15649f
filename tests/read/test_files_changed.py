"""A file written in place by another program while ``jaxstow.open`` has it open: an error at the next read, never
its new bytes under the header read before."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import jaxstow
from jaxstow.errors import StorageError, TruncatedFileError

OLD = {"a": np.arange(1000, dtype=np.float32), "b": np.arange(1000, dtype=np.float32) * 2}
NEW = {"a": np.full(1000, 7, np.float32), "b": np.full(1000, 9, np.float32)}
CHANGED = r"the file changed since it was opened \(it was modified\).*open it again to read what it holds now"


def _written_earlier(path, tree, plain: bool) -> None:
    """``tree`` saved at ``path`` a minute ago, as a file a reader opens usually was."""
    if plain:
        save_file(tree, str(path))
    else:
        jaxstow.save(path, tree)
    then = os.stat(path).st_mtime_ns - 60 * 10**9
    os.utime(path, ns=(then, then))


def _rewrite_in_place(path, data: bytes, *, truncate: bool) -> None:
    """Write ``data`` into the file at ``path`` itself (same inode): over its bytes, or truncated first."""
    with open(path, "wb" if truncate else "r+b") as file:
        file.write(data)


@pytest.mark.parametrize("plain", [True, False], ids=["safetensors", "jaxstow"])
@pytest.mark.parametrize("mmap", [False, True], ids=["pread", "mmap"])
@pytest.mark.parametrize("truncate", [False, True], ids=["r+b", "truncated"])
def test_a_file_written_in_place_after_it_was_opened_is_an_error_at_every_read(tmp_path, plain, mmap, truncate):
    path, other = tmp_path / "model.safetensors", tmp_path / "other.safetensors"
    _written_earlier(path, OLD, plain)
    _written_earlier(other, NEW, plain)  # the same layout, other values
    with jaxstow.open(path, mmap=mmap) as reader:
        np.testing.assert_array_equal(reader["a"], OLD["a"])
        _rewrite_in_place(path, other.read_bytes(), truncate=truncate)
        for read in (lambda: reader["b"], lambda: reader.read("b", np.s_[10:20]), lambda: reader.load(as_numpy=True)):
            with pytest.raises(StorageError, match=CHANGED) as caught:
                read()  # was NEW's 9s for a plain file, and for a slice of jaxstow's (its checksum covers whole leaves)
            assert caught.value.file == str(path)
    with jaxstow.open(path, mmap=mmap) as reader:  # opened again: what it holds now
        np.testing.assert_array_equal(reader["b"], NEW["b"])


@pytest.mark.parametrize("mmap", [False, True], ids=["pread", "mmap"])
def test_a_file_grown_or_cut_short_in_place_is_told_by_its_size(tmp_path, mmap):
    path = tmp_path / "model.safetensors"
    _written_earlier(path, OLD, plain=True)
    size = os.path.getsize(path)
    with jaxstow.open(path, mmap=mmap) as reader:
        with open(path, "ab") as file:
            file.write(b"\0" * 8)
        with pytest.raises(StorageError, match=rf"changed since it was opened \(it now has {size + 8} bytes of the"):
            reader["a"]
        os.truncate(path, size - 100)  # leaf a's bytes are still there, but no longer what the header describes
        with pytest.raises(TruncatedFileError, match=rf"was cut short since it was opened \(it now has {size - 100}"):
            reader["a"]


@pytest.mark.parametrize("mmap", [False, True], ids=["pread", "mmap"])
def test_a_file_replaced_by_renaming_another_over_its_name_is_read_as_it_was_opened(tmp_path, mmap):
    path, other = tmp_path / "model.safetensors", tmp_path / "other.safetensors"
    _written_earlier(path, OLD, plain=True)
    _written_earlier(other, NEW, plain=True)
    with jaxstow.open(path, mmap=mmap) as reader:
        os.replace(other, path)  # as jaxstow.save replaces a file: the file open keeps its bytes (not its ctime)
        np.testing.assert_array_equal(reader["b"], OLD["b"])
