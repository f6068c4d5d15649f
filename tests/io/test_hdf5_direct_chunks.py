"""Raw chunks are written and read holding h5py's lock: h5py before 3.16 calls ``H5DOwrite_chunk`` and
``H5DOread_chunk`` without it (and without the GIL), so that another thread's h5py call (a callback asking a
collector for its checkpoint path) ran inside HDF5, a library not built for threads, at the same time: "Unspecified
error in H5DOwrite_chunk", or memory corrupted."""

from __future__ import annotations

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from h5py._objects import phil  # noqa: E402

from jaxstow.io.hdf5_layout import DIRECT_CHUNK_BYTES, read_whole, write_block  # noqa: E402


class _Watched:
    """A dataset whose raw chunk calls note whether h5py's lock is held."""

    def __init__(self, dataset, held: list[bool]) -> None:
        self._dataset, self._held = dataset, held

    def __getattr__(self, name):
        return getattr(self._dataset, name)

    def __len__(self) -> int:
        return len(self._dataset)

    @property
    def id(self):
        return _WatchedId(self._dataset.id, self._held)


class _WatchedId:
    def __init__(self, identifier, held: list[bool]) -> None:
        self._id, self._held = identifier, held

    def __getattr__(self, name):
        return getattr(self._id, name)

    def write_direct_chunk(self, *args, **kwargs):
        self._held.append(phil._is_owned())
        return self._id.write_direct_chunk(*args, **kwargs)

    def read_direct_chunk(self, *args, **kwargs):
        self._held.append(phil._is_owned())
        return self._id.read_direct_chunk(*args, **kwargs)


def test_raw_chunks_are_written_and_read_holding_h5pys_lock(tmp_path):
    width = DIRECT_CHUNK_BYTES // 16  # a chunk of four rows of float32 is DIRECT_CHUNK_BYTES: read raw too
    values = np.arange(20 * width, dtype=np.float32).reshape(20, width)
    held: list[bool] = []
    with h5py.File(tmp_path / "rows.h5", "w") as file:
        made = file.create_dataset("x", shape=(0, width), maxshape=(None, width), chunks=(4, width), dtype="f4")
        dataset = _Watched(made, held)
        write_block([dataset], 0, 20, [values])
        assert held == [True] * 5  # five whole chunks of four rows
        held.clear()
        np.testing.assert_array_equal(read_whole(dataset), values)
    assert held == [True] * 5
