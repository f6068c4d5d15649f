"""``jaxstow.open``: a file read lazily, one leaf or one slice at a time, from disk, memory maps and object stores."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

import forked
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from counting import CountingSource

import jaxstow
from jaxstow._storage.opening import open_source
from jaxstow._storage.remote import RemoteSource
from jaxstow.errors import ClosedError, CorruptFileError, PathError, RequestError, SliceError

BIG = np.arange(256 * 1024, dtype=np.float32).reshape(512, 512)


def _tree():
    return {
        "big": BIG,
        "cube": np.arange(4 * 5 * 6, dtype=np.int16).reshape(4, 5, 6),
        "half": jnp.arange(6, dtype=jnp.bfloat16),
        "scalar": np.float64(2.5),
        "key": jax.random.key(3),
        "name": "run",
    }


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "tree.jxs"
    jaxstow.save(path, _tree(), metadata={"epoch": 2})
    return path


def test_header_facts_without_reading_data(saved):
    source = CountingSource(open_source(str(saved)))
    with jaxstow.open(source) as reader:
        assert reader.paths == ["big", "cube", "half", "key", "name", "scalar"] and len(reader) == 6
        assert reader.metadata == {"epoch": 2} and "cube" in reader and "nope" not in reader
        assert reader.info("big") == jaxstow.LeafInfo("big", "array", np.dtype(np.float32), (512, 512), BIG.nbytes)
        assert reader.info("key").shape == () and reader.info("key").kind == "key"
        assert reader.info("half").dtype == jnp.bfloat16 and reader.info("name").kind == "value"
    assert source.bytes_read < 8192


def test_one_leaf_reads_only_its_bytes(saved):
    source = CountingSource(open_source(str(saved)))
    with jaxstow.open(source) as reader:
        header = source.bytes_read
        np.testing.assert_array_equal(reader["cube"], _tree()["cube"])
        assert source.bytes_read - header == 4 * 5 * 6 * 2
        assert reader["name"] == "run" and reader["scalar"] == np.float64(2.5)
        assert jnp.issubdtype(reader["key"].dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize(
    "index",
    [
        np.s_[10:20],
        np.s_[10:20, :],
        np.s_[:, 100:104],
        np.s_[5],
        np.s_[-1, -3:],
        np.s_[::-7, 3],
        np.s_[..., 7],
        np.s_[100:0:-9, 1:400:50],
        np.s_[3:3],
    ],
)
def test_slices_match_numpy(saved, index):
    with jaxstow.open(saved) as reader:
        np.testing.assert_array_equal(reader.read("big", index), BIG[index])


def test_slices_of_three_axes(saved):
    cube = _tree()["cube"]
    with jaxstow.open(saved) as reader:
        for index in (np.s_[1:3, 2, ::2], np.s_[:, :, 4], np.s_[-1], np.s_[..., 1:2, :]):
            np.testing.assert_array_equal(reader.read("cube", index), cube[index])


def test_a_slice_reads_only_the_byte_ranges_it_needs(saved):
    source = CountingSource(open_source(str(saved)))
    with jaxstow.open(source) as reader:
        start = source.bytes_read
        reader.read("big", np.s_[10:20])
        assert source.bytes_read - start == 10 * 512 * 4
        start = source.bytes_read
        reader.read("big", np.s_[:, 0:64])
        assert source.bytes_read - start == 512 * 64 * 4


def test_bad_slices_name_the_leaf_and_the_file(saved):
    with jaxstow.open(saved) as reader:
        with pytest.raises(SliceError, match=r"index 512 is out of bounds for axis 0 of shape \[512, 512\]") as raised:
            reader.read("big", 512)
        assert raised.value.path == "big" and raised.value.file == str(saved)
        for past_the_end, reached in [(np.s_[500:520, :], 520), (np.s_[600:700], 600), (np.s_[:, -513:], -513)]:
            with pytest.raises(SliceError, match=rf"reaches {reached}, past the end of axis \d of shape \[512, 512\]"):
                reader.read("big", past_the_end)  # numpy would cut it short, or return nothing, without a word
        assert reader.read("big", np.s_[512:, -512:]).shape == (0, 512)  # the ends themselves are bounds
        with pytest.raises(SliceError, match=r"only integers, slices and '\.\.\.'"):
            reader.read("big", np.s_[[1, 2]])
        with pytest.raises(SliceError, match="has 3 axes"):
            reader.read("big", np.s_[1, 2, 3])
        with pytest.raises(SliceError, match="only arrays can be read by slices"):
            reader.read("name", 0)
        with pytest.raises(RequestError, match="no leaf 'bigg'"):
            reader["bigg"]


def test_whole_leaves_are_verified_and_slices_read_around_damage(saved):
    with jaxstow.open(saved) as reader:
        offset = reader.container.slots["big"].offset
    with open(saved, "r+b") as file:
        file.seek(offset + 4 * 600)  # inside row 1 of big
        file.write(b"\xff")
    with jaxstow.open(saved) as reader:
        with pytest.raises(CorruptFileError, match="checksum mismatch") as raised:
            reader["big"]
        assert raised.value.path == "big"
        np.testing.assert_array_equal(reader.read("big", np.s_[2:4]), BIG[2:4])
        np.testing.assert_array_equal(reader["cube"], _tree()["cube"])


def test_a_large_leaf_read_alone_is_aligned_and_verified(tmp_path):
    """A leaf of a few MiB (not a whole number of 2 MiB pages) read alone: its values, a 64-byte-aligned buffer, its
    checksum checked; one flipped byte near its end is caught and named."""
    path = tmp_path / "large.jxs"
    large = np.random.default_rng(0).standard_normal((5 << 20) // 4 + 3, dtype=np.float32)
    jaxstow.save(path, {"large": large, "small": np.arange(3)})
    with jaxstow.open(path) as reader:
        read = reader["large"]
        np.testing.assert_array_equal(read, large)
        assert read.ctypes.data % 64 == 0 and read.flags.writeable
        offset = reader.container.slots["large"].offset
    with open(path, "r+b") as file:
        file.seek(offset + large.nbytes - 5)
        byte = file.read(1)[0]
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte ^ 0xFF]))
    with jaxstow.open(path) as reader:
        with pytest.raises(CorruptFileError, match="checksum mismatch") as raised:
            reader["large"]
        assert raised.value.path == "large" and raised.value.file == str(path)


def test_memory_mapped_views(saved):
    with jaxstow.open(saved, mmap=True) as reader:
        view = reader["big"]
        part = reader.read("big", np.s_[7, 3:9])
        np.testing.assert_array_equal(view, BIG)
        np.testing.assert_array_equal(part, BIG[7, 3:9])
        assert not view.flags.writeable and not view.flags.owndata
        assert reader["half"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(view[1], BIG[1])  # views outlive the reader


def test_a_memory_map_is_of_the_file_opened_even_once_another_has_its_name(tmp_path):
    path = tmp_path / "f.jxs"
    jaxstow.save(path, {"a": np.full((64, 64), 1, np.float32)})
    with jaxstow.open(path, mmap=True) as reader:
        jaxstow.save(path, {"a": np.full((64, 64), 2, np.float32)})  # replaced: the reader keeps the file it opened
        np.testing.assert_array_equal(reader.read("a", np.s_[0:1, 0:1]), [[1]])
        np.testing.assert_array_equal(reader["a"], np.full((64, 64), 1, np.float32))


def test_arrays_loaded_from_a_memory_map_are_their_own_once_the_file_changes(tmp_path):
    path = tmp_path / "f.jxs"
    jaxstow.save(path, {"a": np.full((512, 256), 1, np.float32), "key": jax.random.key(3)})
    with jaxstow.open(path, mmap=True) as reader:
        loaded = reader.load()
        fitted = reader.load(like={"a": jax.ShapeDtypeStruct((512, 256), jnp.float32), "key": jax.random.key(0)})
    raw = path.read_bytes()
    with open(path, "r+b") as file:  # another program writes the file in place, then cuts it short
        file.seek(raw.find(np.full(256, 1, np.float32).tobytes()))
        file.write(np.full(256, 5, np.float32).tobytes())
        file.truncate(100)
    for tree in (loaded, fitted):
        assert isinstance(tree["a"], jax.Array) and float(tree["a"][0, 0]) == 1.0 and float(tree["a"][5, 5]) == 1.0
        assert jnp.array_equal(jax.random.key_data(tree["key"]), jax.random.key_data(jax.random.key(3)))


def test_memory_maps_need_a_local_native_file(saved):
    with pytest.raises(RequestError, match="mmap=True needs a local native"):
        jaxstow.open(io.BytesIO(saved.read_bytes()), mmap=True)


def test_npz_files_open_lazily_too(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.arange(10.0), b=np.ones((3, 3), np.int32))
    with jaxstow.open(tmp_path / "plain.npz") as reader:
        assert reader.paths == ["a", "b"] and reader.info("b").shape == (3, 3)
        np.testing.assert_array_equal(reader.read("a", np.s_[2:5]), np.arange(10.0)[2:5])


def test_a_reader_of_a_file_object_serves_several_threads_their_own_bytes():
    # One thread's seek landed between another's seek and read: slices (unverified) held another leaf's values.
    switch = sys.getswitchinterval()
    buffer = io.BytesIO()
    jaxstow.save(buffer, {f"w{i}": np.full((64, 64), i, np.int32) for i in range(4)})
    buffer.seek(0)
    reader = jaxstow.open(buffer)
    wrong: list[int] = []

    def read(i: int) -> None:
        for _ in range(3000):
            if not (reader.read(f"w{i}", np.s_[i + 1, 3:60:5]) == i).all():
                wrong.append(i)
                return

    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes
    try:
        threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert not wrong


def test_a_folder_is_not_a_file(tmp_path):
    with pytest.raises(PathError, match="is a folder") as raised:
        jaxstow.open(tmp_path)
    assert raised.value.file == str(tmp_path)


def test_memory_url():
    import fsspec

    url = f"memory://jaxstow-read-{os.getpid()}/tree.jxs"
    with fsspec.open(url, "wb") as sink:
        jaxstow.save(sink, _tree())
    with jaxstow.open(url) as reader:
        np.testing.assert_array_equal(reader.read("big", np.s_[1:3, :5]), BIG[1:3, :5])


def test_ranged_reads_on_a_real_s3_server(s3_server):
    import fsspec

    url = s3_server.url("read", "tree.jxs")
    with fsspec.open(url, "wb", **s3_server.storage_options) as sink:
        jaxstow.save(sink, _tree())
    with jaxstow.open(url, storage_options=s3_server.storage_options) as reader:
        assert reader.info("big").shape == (512, 512)
        np.testing.assert_array_equal(reader.read("big", np.s_[100:110, 8:16]), BIG[100:110, 8:16])
        np.testing.assert_array_equal(reader["cube"], _tree()["cube"])
    fs, path = fsspec.core.url_to_fs(url, **s3_server.storage_options)
    source = CountingSource(RemoteSource(fs, path, name=url))
    with jaxstow.open(source) as reader:
        start = source.bytes_read
        reader.read("big", np.s_[100:110])
        assert source.bytes_read - start == 10 * 512 * 4


_CUT_WHILE_MAPPED = """
import os, sys, numpy as np, jaxstow
jaxstow.save(sys.argv[1], {"w": np.arange(100_000, dtype=np.float32)})
with jaxstow.open(sys.argv[1], mmap=True) as reader:
    os.truncate(sys.argv[1], 5000)  # rewritten in place by another program, say
    for read in (lambda: reader["w"], lambda: reader.read("w", np.s_[99_000:])):
        try:
            read()
        except jaxstow.errors.TruncatedFileError as error:
            print(error)
"""


def test_a_memory_mapped_file_cut_short_since_it_was_opened_is_a_truncated_file_not_a_dead_process(tmp_path):
    path = tmp_path / "cut.jxs"
    done = forked.run([sys.executable, "-c", _CUT_WHILE_MAPPED, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)  # -7 (SIGBUS): the pages under the view were gone
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(f"leaf 'w' of {path}: the file now has 5000 bytes" in line for line in lines)


def _read_until_closed(reader, started: threading.Barrier, i: int, failures: list[BaseException]) -> None:
    started.wait()
    try:
        while True:
            value = reader[f"l{i}"] if i % 2 else reader.read(f"l{i}", np.s_[10:20])
            assert (np.asarray(value) == i).all()
    except ClosedError:
        return
    except BaseException as error:  # anything else is a failure of the reader
        failures.append(error)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_reader_closed_while_other_threads_read_it_gives_them_closed_errors(tmp_path, mmap):
    path = tmp_path / "c.jxs"
    jaxstow.save(path, {f"l{i}": np.full(50_000, i, np.float32) for i in range(4)})
    failures: list[BaseException] = []
    for _ in range(20):
        reader, started = jaxstow.open(path, mmap=mmap), threading.Barrier(5)
        threads = [threading.Thread(target=_read_until_closed, args=(reader, started, i, failures)) for i in range(4)]
        for thread in threads:
            thread.start()
        started.wait()
        time.sleep(0.02)  # while they read
        reader.close()
        for thread in threads:
            thread.join(timeout=60)
    assert failures == []


@pytest.mark.parametrize("suffix", [".jxs", ".npz"])
def test_paths_sorted_by_the_caller_change_nothing_the_reader_loads(tmp_path, suffix):
    # reader.paths was the list every load pairs its values with: sorted in place, layer 10 came back as layer 2.
    layers = [np.full(2, float(i)) for i in range(12)]
    path = tmp_path / f"layers{suffix}"
    jaxstow.save(path, {"layers": layers, "bias": np.zeros(3), "kernel": np.ones(4)})
    with jaxstow.open(path) as reader:
        before, names = reader.paths, reader.paths
        names.sort(key=len, reverse=True)
        names.append("extra")
        assert reader.paths == before and names != before
        loaded = reader.load(as_numpy=True)
        assert [float(layer[0]) for layer in loaded["layers"]] == [float(i) for i in range(12)]
        assert loaded["bias"].shape == (3,) and loaded["kernel"].shape == (4,)
        assert list(reader.load(select="bias", as_numpy=True)) == ["bias"]


def test_a_file_object_closed_by_its_owner_is_a_storage_error_and_the_reader_closes(tmp_path):
    # Python's "ValueError: seek of closed file", from every read and from close() and the with block's end.
    path = tmp_path / "w.jxs"
    jaxstow.save(path, {"w": np.arange(10.0)})
    with open(path, "rb") as file, jaxstow.open(file) as reader:
        file.close()
        for read in (lambda: reader["w"], lambda: reader.read("w", 0), reader.load):
            with pytest.raises(jaxstow.errors.StorageError, match="its file object was closed by its owner"):
                read()
    assert reader.closed


def test_a_numpy_string_leaf_restores_into_the_saved_tree_and_into_the_abstract_one(tmp_path):
    # like=tree and like=reader.abstract were refused: "the file has str_ np.str_('mlp'), expected <U3[]".
    tree = {"name": np.str_("mlp"), "w": np.ones(2)}
    jaxstow.save(tmp_path / "model.jxs", tree)
    with jaxstow.open(tmp_path / "model.jxs") as reader:
        abstract = reader.abstract
    for like in (tree, abstract):
        restored = jaxstow.load(tmp_path / "model.jxs", like=like)
        assert type(restored["name"]) is np.str_ and restored["name"] == "mlp"


def test_a_reader_is_a_mapping_whose_get_gives_the_default_for_a_path_it_lacks(tmp_path):
    # reader.get("missing") raised RequestError, which is no KeyError, as Mapping.get expects.
    jaxstow.save(tmp_path / "w.jxs", {"w": np.ones(2)})
    with jaxstow.open(tmp_path / "w.jxs") as reader:
        assert reader.get("missing") is None and reader.get("missing", 5) == 5
        np.testing.assert_array_equal(reader.get("w"), np.ones(2))
        with pytest.raises(KeyError) as raised:
            reader["missing"]
        assert isinstance(raised.value, jaxstow.errors.RequestError)
        assert str(raised.value) == f"{tmp_path / 'w.jxs'}: no leaf 'missing' in the file (its leaves: w)"
