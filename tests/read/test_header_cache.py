"""A file opened again takes the header it had checked before, and only while the header and the size are the same:
a file rewritten in place is checked again, its data is verified on every read, a hostile header is refused every
time, and no reader shares with another anything it can change."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from format_trees import assert_same, expected

import jaxstow
from jaxstow._format import header
from jaxstow._format.header import HeaderCache
from jaxstow._format.native import write_native
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import CorruptFileError, FormatError, NewerFormatError

DATA = Path(__file__).parents[1] / "data"


def _tree(seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((64, 32), dtype=np.float32),
        "b": rng.standard_normal(32).astype(np.float32),
        "config": {"depth": 2, "rate": 0.5, "name": "mlp"},
    }


def _equal(tree, expected) -> None:
    np.testing.assert_array_equal(tree["w"], expected["w"])
    np.testing.assert_array_equal(tree["b"], expected["b"])
    assert tree["config"] == expected["config"]


def _slots(path) -> object:
    with jaxstow.open(path) as reader:
        return reader.container.slots


@pytest.fixture
def saved(tmp_path):
    path, tree = tmp_path / "model.jxs", _tree()
    jaxstow.save(path, tree, metadata={"step": 3, "history": {"loss": [1.0, 0.5]}, "note": "first"})
    return path, tree


def test_a_second_open_of_an_unchanged_file_takes_the_checked_header_and_gives_an_equal_tree(saved):
    path, tree = saved
    with jaxstow.open(path) as first:
        loaded, metadata = first.load(as_numpy=True), first.metadata
    with jaxstow.open(path) as again:
        assert again.container.slots is first.container.slots  # the tensor table was not parsed and checked again
        _equal(again.load(as_numpy=True), tree)
        _equal(loaded, tree)
        assert again.metadata == metadata and again["w"].tobytes() == tree["w"].tobytes()
    _equal(jaxstow.load(path, as_numpy=True), tree)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_file_of_every_version_opened_again_describes_and_reads_every_leaf_as_at_first(version):
    """Keys, packed dtypes, sharded leaves and values: each leaf's entry made again as checking made it."""
    path = DATA / f"format_v{version}.jxs"
    header._CHECKED.reset()  # the first open below checks the header whole
    with jaxstow.open(path) as first, jaxstow.open(path) as again:
        assert again.container.slots is first.container.slots and again.paths == first.paths
        assert [again.info(leaf) for leaf in again.paths] == [first.info(leaf) for leaf in first.paths]
        if version >= 3:
            assert again.container.columns.entries == first.container.columns.entries
        assert again.container.manifest == first.container.manifest
        assert_same(again.load(as_numpy=True), first.load(as_numpy=True))
        assert_same(again.load(as_numpy=True), expected(sharded=True))


def test_a_file_rewritten_in_place_with_another_header_of_the_same_size_is_read_as_it_is_now(saved, tmp_path):
    path, _ = saved
    first = _slots(path)
    other, replacement = tmp_path / "other.jxs", _tree(seed=1)
    replacement["v"] = replacement.pop("w")  # another name, the same size: only the header's bytes differ
    jaxstow.save(other, replacement, metadata={"step": 4, "history": {"loss": [1.0, 0.5]}, "note": "other"})
    assert os.path.getsize(other) == os.path.getsize(path)
    with open(path, "r+b") as file:  # the same file, its bytes changed in place
        file.write(other.read_bytes())
    with jaxstow.open(path) as reader:
        assert reader.container.slots is not first
        assert sorted(reader.paths) == ["b", "config/depth", "config/name", "config/rate", "v"]
        assert reader.metadata["note"] == "other"
        np.testing.assert_array_equal(reader["v"], replacement["v"])


def test_the_same_header_over_a_corrupt_data_byte_is_taken_and_the_data_still_refused(saved):
    path, tree = saved
    first = _slots(path)
    data = bytearray(path.read_bytes())
    offset = first["w"].offset + 100
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))  # a new file of the same bytes, one data byte flipped
    with jaxstow.open(path) as reader:
        assert reader.container.slots is first  # the header is the same: it is not checked again ...
        with pytest.raises(CorruptFileError, match="checksum mismatch") as error:
            reader["w"]  # ... but the data is verified as ever
        assert error.value.path == "w"
        np.testing.assert_array_equal(reader["b"], tree["b"])
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        jaxstow.load(path)


def test_the_same_header_in_a_file_of_another_size_is_checked_again_and_refused(saved):
    path, _ = saved
    _slots(path)
    with open(path, "ab") as file:
        file.write(b"\0")  # the header unchanged, the tensors no longer end where the file does
    for _ in range(2):
        with pytest.raises(FormatError):
            jaxstow.open(path)


def _plain_safetensors(entries: dict[str, object], data: bytes) -> bytes:
    text = json.dumps(entries).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("kind", ["overlapping tensors", "a newer manifest", "a changed header byte"])
def test_a_hostile_file_is_refused_at_every_open_and_never_kept(saved, tmp_path, kind):
    path, _ = saved
    if kind == "overlapping tensors":
        info = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        path.write_bytes(_plain_safetensors({"a": info, "b": info}, bytes(8)))
        error: type[FormatError] = FormatError
    elif kind == "a newer manifest":  # its header and tensor table pass: only its manifest is refused
        buffer = io.BytesIO()
        write_native(buffer, [("w", np.zeros(2, np.float32))], {"format": "jaxstow", "version": 99, "structure": "*"})
        path.write_bytes(buffer.getvalue())
        error = NewerFormatError
    else:
        _slots(path)  # the good header kept; then one byte of its manifest changed
        data = bytearray(path.read_bytes())
        data[data.index(b"mlp")] = ord("M")
        path.write_bytes(bytes(data))
        error = CorruptFileError
    raw = path.read_bytes()
    for _ in range(2):
        with pytest.raises(error):
            jaxstow.open(path)
        with pytest.raises(error):
            jaxstow.load(path)
    length = struct.unpack_from("<Q", raw)[0]
    assert header._CHECKED.get(raw[8 : 8 + length], len(raw)) is None


def test_what_one_reader_gives_can_be_changed_without_changing_the_next_reader_of_the_file(saved):
    path, tree = saved
    with jaxstow.open(path) as first:
        first.metadata["step"] = 99
        first.metadata["history"]["loss"].append(0.0)
        first.paths.append("extra")
        first.paths.sort(reverse=True)
        first.value_entries["config/rate"]["value"]["float"] = "0.25"
        first.value_entries["config/depth"]["value"] = 7
        first.container.manifest["structure"] = None
        first.container.metadata["jaxstow"] = "{}"
        marks = first.container.columns.marks
        for shared in (first.container.slots.offsets, marks.stored, marks.rank):
            with pytest.raises(ValueError, match="read-only"):
                shared[0] = 0
        for index in (first.container.slots.index, marks.index()):
            with pytest.raises(TypeError):
                index["w"] = 5  # type: ignore[index]
    with jaxstow.open(path) as again:
        assert again.container.slots is first.container.slots
        assert again.metadata == {"step": 3, "history": {"loss": [1.0, 0.5]}, "note": "first"}
        assert again.paths == ["b", "config/depth", "config/name", "config/rate", "w"]
        _equal(again.load(as_numpy=True), tree)
        assert (again.value("config/rate"), again.value("config/depth")) == (0.5, 2)


def test_threads_opening_the_same_files_at_once_all_read_them_right(tmp_path):
    paths, trees = [], []
    for seed in range(3):
        paths.append(tmp_path / f"model{seed}.jxs")
        trees.append(_tree(seed))
        jaxstow.save(paths[-1], trees[-1])
    failures: list[BaseException] = []
    start = threading.Barrier(6)

    def work(offset: int) -> None:
        start.wait()
        try:
            for round in range(15):
                k = (offset + round) % 3
                with jaxstow.open(paths[k]) as reader:
                    _equal(reader.load(as_numpy=True), trees[k])
                    np.testing.assert_array_equal(reader["w"], trees[k]["w"])
        except BaseException as error:  # handed to the main thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert len({id(_slots(path)) for path in paths}) == 3


def test_the_cache_keeps_the_headers_used_last_within_its_count_and_bytes():
    cache: HeaderCache[str] = HeaderCache(most=2, most_bytes=10)
    cache.keep(b"aaa", 1, "a")
    cache.keep(b"bbb", 1, "b")
    assert cache.get(b"aaa", 1) == "a"  # now the last used
    cache.keep(b"ccc", 1, "c")  # over the count: b, used longest ago, goes
    assert (cache.get(b"aaa", 1), cache.get(b"bbb", 1), cache.get(b"ccc", 1)) == ("a", None, "c")
    cache.keep(b"dddddd", 1, "d")  # 12 bytes with the others: a goes, then 9
    assert (cache.get(b"aaa", 1), cache.get(b"ccc", 1), cache.get(b"dddddd", 1), cache.held) == (None, "c", "d", 9)
    cache.keep(b"e" * 11, 1, "e")  # larger than the whole cache: not kept, nothing let go
    assert (cache.get(b"e" * 11, 1), cache.get(b"ccc", 1), cache.held) == (None, "c", 9)
    cache.keep(bytearray(b"ccc"), 1, "c2")  # the same header kept again replaces it
    assert (cache.get(b"ccc", 1), len(cache.kept), cache.held) == ("c2", 2, 9)


def test_a_forked_child_starts_with_no_header_kept(saved):
    path, _ = saved
    script = f"""
        import os, jaxstow
        from jaxstow._format import header
        jaxstow.open({str(path)!r}).close()
        assert len(header._CHECKED.kept) == 1
        child = os.fork()
        if child == 0:
            empty = not header._CHECKED.kept
            reader = jaxstow.open({str(path)!r})
            os._exit(0 if empty and len(header._CHECKED.kept) == 1 and reader["w"].shape == (64, 32) else 3)
        assert os.waitpid(child, 0)[1] == 0
        print("ok")
        """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def _header_reads(monkeypatch) -> list[tuple[int, int]]:
    """The (offset, length) of every read of a local file's bytes through ``read`` from now on: the header's."""
    reads: list[tuple[int, int]] = []
    plain = LocalFile.read

    def recorded(self, offset, length):
        reads.append((offset, length))
        return plain(self, offset, length)

    monkeypatch.setattr(LocalFile, "read", recorded)
    return reads


def _wide(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A tree of ``count`` small leaves: a header of about 100 bytes a leaf."""
    rng = np.random.default_rng(seed)
    return {f"layer_{i:04d}": rng.standard_normal(3).astype(np.float32) for i in range(count)}


@pytest.mark.parametrize("then", [400, 20, 2], ids=["longer-header", "shorter-header", "tiny-file"])
def test_a_name_opened_again_reads_its_header_in_one_read_whatever_file_it_names_now(tmp_path, monkeypatch, then):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, _wide(100))
    reads = _header_reads(monkeypatch)
    with jaxstow.open(path) as reader:  # a header of about 10 KiB, past the first page: two reads
        assert len(reader.paths) == 100
    assert len(reads) == 2 and reads[0] == (0, 4096)
    reads.clear()
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader["layer_0099"], _wide(100)["layer_0099"])
    assert len(reads) == 1 and reads[0][1] > 4096  # as much as the header of the file opened last by this name
    tree = _wide(then, seed=1)
    jaxstow.save(path, tree)  # another file by that name: its header longer, shorter, or the file shorter than it
    for _ in range(2):
        reads.clear()
        with jaxstow.open(path) as reader:
            assert sorted(reader.paths) == sorted(tree)
            np.testing.assert_array_equal(reader[f"layer_{then - 1:04d}"], tree[f"layer_{then - 1:04d}"])
    assert len(reads) == 1
