"""Where bytes come from and go to: local files read with ``pread``, file objects read from where they stood, and
files written all or nothing at a local path or an fsspec URL."""

from __future__ import annotations

import io
import os
import threading
import uuid

import fsspec
import pytest

from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sinks import atomic_sink
from jaxstow._storage.sources import FileObject, LocalFile
from jaxstow.errors import ArgumentError, PathNotFoundError, StorageError, TruncatedFileError

DATA = bytes(range(256)) * 64  # 16 KiB, every byte value


@pytest.fixture
def local_file(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(DATA)
    source = LocalFile(str(path))
    yield source
    source.close()


def test_a_local_file_reads_any_range_and_scatters_one_range_over_several_buffers(local_file):
    assert local_file.size == len(DATA)
    assert local_file.read(1000, 3000) == DATA[1000:4000]
    buffers = [bytearray(n) for n in (1, 0, 4095, 2000)]
    local_file.read_scatter(10, [memoryview(buffer) for buffer in buffers])
    assert b"".join(buffers) == DATA[10 : 10 + 6096]


def test_threads_share_a_local_file(local_file):
    wrong = []

    def read(start: int) -> None:
        for offset in range(start, len(DATA) - 512, 997):
            if local_file.read(offset, 512) != DATA[offset : offset + 512]:
                wrong.append(offset)

    threads = [threading.Thread(target=read, args=(start,)) for start in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_a_read_past_the_end_is_a_truncated_file_naming_it_and_the_offset(local_file):
    with pytest.raises(
        TruncatedFileError, match=r"ends after 16384 bytes, but 100 bytes were expected at offset 16300"
    ):
        local_file.read(16300, 100)
    with pytest.raises(TruncatedFileError) as caught:
        local_file.read_scatter(16000, [memoryview(bytearray(300)), memoryview(bytearray(300))])
    assert caught.value.file == local_file.name


def test_a_file_cut_short_after_it_was_opened_is_told_so_not_given_its_old_size(tmp_path):
    path = tmp_path / "shrinking.bin"
    path.write_bytes(DATA)
    source = LocalFile(str(path))
    os.truncate(path, 60)  # was "the file ends after 16384 bytes, but 100 bytes were expected at offset 136"
    with pytest.raises(TruncatedFileError, match=r"cut short after it was opened \(of 16384 bytes\), but 100 bytes"):
        source.read(136, 100)


@pytest.mark.parametrize("live", [False, True])
def test_a_file_written_in_place_is_an_error_at_the_next_read_unless_a_writer_is_known_to_change_it(tmp_path, live):
    path = tmp_path / "growing.bin"
    path.write_bytes(DATA)
    source = LocalFile(str(path), live=live)  # live: an HDF5 file its SWMR writer appends to (io.swmr reads them)
    with open(path, "ab") as file:
        file.write(b"more")
    if live:
        assert source.read(0, 100) == DATA[:100]
    else:
        with pytest.raises(StorageError, match=r"changed since it was opened \(it now has 16388 bytes of the 16384"):
            source.read(0, 100)
    source.close()


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(PathNotFoundError, match="no such file") as caught:
        LocalFile(str(tmp_path / "missing.jxs"))
    assert caught.value.file == str(tmp_path / "missing.jxs")


def test_a_file_object_is_read_from_where_it_stood_and_left_there():
    file = io.BytesIO(b"prefix:" + DATA)
    file.seek(7)
    source = FileObject(file, "<BytesIO>")
    assert source.size == len(DATA)
    assert source.read(0, 4) == DATA[:4] and source.read(300, 2) == DATA[300:302]
    with pytest.raises(TruncatedFileError):
        source.read(len(DATA) - 1, 2)
    source.close()
    assert file.tell() == 7 and not file.closed


def test_a_file_object_left_at_its_end_says_so():
    file = io.BytesIO(DATA)
    file.seek(0, io.SEEK_END)
    assert (
        "was the file object left at its end? seek(0) before loading" in FileObject(file, "<BytesIO>").describe_size()
    )
    assert FileObject(io.BytesIO(DATA), "<BytesIO>").describe_size() == f"{len(DATA)} bytes"


def test_a_local_sink_appears_whole_and_an_error_leaves_the_old_file(tmp_path):
    path = tmp_path / "model.jxs"
    with atomic_sink(path) as sink:
        sink.write(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_sink(path) as sink:
        sink.write(b"new, half")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["model.jxs"]


def test_storage_options_with_a_local_path_are_refused(tmp_path):
    settings = StorageSettings(options={"anon": True})
    with (
        pytest.raises(ArgumentError, match="storage_options are for fsspec URLs"),
        atomic_sink(tmp_path / "x.jxs", settings),
    ):
        pass
    assert os.listdir(tmp_path) == []


def test_a_url_sink_appears_whole_under_its_name_and_an_error_leaves_what_was_there():
    folder = f"memory://jaxstow-tests/sinks-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    with atomic_sink(f"{folder}/model.jxs") as sink:
        sink.write(b"old")
        (writing,) = fs.ls(folder, detail=False)  # the bytes go to a temporary object first
        assert TEMPORARY_MARKER in writing
    assert fs.cat_file(f"{folder}/model.jxs") == b"old"
    with pytest.raises(RuntimeError, match="the network went away"), atomic_sink(f"{folder}/model.jxs") as sink:
        sink.write(b"new, half")
        raise RuntimeError("the network went away")
    assert fs.cat_file(f"{folder}/model.jxs") == b"old"
    assert fs.ls(folder, detail=False) == [f"{folder.removeprefix('memory:/')}/model.jxs"]
