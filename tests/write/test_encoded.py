"""A tree encoded for writing: its file loads back, its checksums are right whether hashed at once or on threads while
the bytes are written, and what cannot make a file is refused before any byte is written."""

from __future__ import annotations

import io

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._format.checksum import checksum
from jaxstow._format.header_checksum import header_checksum
from jaxstow._storage.sources import LocalFile
from jaxstow._write import encoded as encoded_module
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import CorruptFileError, FormatError, MetadataError

TREE = {"w": np.arange(1000, dtype=np.float32).reshape(10, 100), "b": np.ones(7, np.int64), "depth": 3}


def _assert_same(loaded, tree=TREE):
    np.testing.assert_array_equal(loaded["w"], tree["w"])
    np.testing.assert_array_equal(loaded["b"], tree["b"])
    assert loaded["depth"] == tree["depth"]


def test_a_native_file_loads_back_and_its_header_checksum_is_returned(tmp_path):
    encoded = encode_tree(TREE, metadata={"epoch": 2})
    assert encoded.nbytes == 1000 * 4 + 7 * 8
    returned = encoded.write(tmp_path / "t.jxs")
    _assert_same(jaxstow.load(tmp_path / "t.jxs", as_numpy=True))
    assert jaxstow.load_metadata(tmp_path / "t.jxs") == {"epoch": 2}
    source = LocalFile(str(tmp_path / "t.jxs"))
    try:
        assert returned == header_checksum(source)
    finally:
        source.close()
    assert encode_tree(TREE).write(tmp_path / "t.npz") is None  # npz has no header checksum
    _assert_same(jaxstow.load(tmp_path / "t.npz", as_numpy=True))


def test_a_file_object_gets_the_same_bytes_as_a_path(tmp_path):
    encoded = encode_tree(TREE)
    buffer = io.BytesIO()
    assert encoded.write(buffer) == encoded.write(tmp_path / "t.jxs")
    assert buffer.getvalue() == (tmp_path / "t.jxs").read_bytes()


def test_large_trees_hashed_on_threads_get_the_checksums_hashed_at_once(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    tree = {f"layer{i:02d}": rng.standard_normal(1000 + i).astype(np.float32) for i in range(11)}
    at_once = encode_tree(tree)
    at_once.write(tmp_path / "at_once.jxs")
    monkeypatch.setattr(encoded_module, "_PARALLEL_HASH_BYTES", 1024)  # every tree here is "large" now
    threaded = encode_tree(tree)
    threaded.write(tmp_path / "threaded.jxs")
    assert [entry["xxh3"] for entry in threaded.manifest["leaves"]] == [
        checksum(tree[f"layer{i:02d}"]) for i in range(11)
    ]
    assert (tmp_path / "threaded.jxs").read_bytes() == (tmp_path / "at_once.jxs").read_bytes()
    data = bytearray((tmp_path / "threaded.jxs").read_bytes())
    data[-10] ^= 1  # a byte of the last tensor
    (tmp_path / "flipped.jxs").write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="layer10"):
        jaxstow.load(tmp_path / "flipped.jxs", as_numpy=True)


def test_copy_takes_the_arrays_as_they_are_now(tmp_path):
    weights = np.zeros(4, np.float32)
    encoded = encode_tree({"w": weights}, copy=True)
    weights[:] = 1
    encoded.write(tmp_path / "t.jxs")
    np.testing.assert_array_equal(jaxstow.load(tmp_path / "t.jxs", as_numpy=True)["w"], np.zeros(4))


def test_copy_copies_only_what_the_caller_could_change(tmp_path):
    weights, counts, transposed = jnp.arange(1024.0), np.arange(3.0), np.arange(12.0).reshape(3, 4).T
    encoded = encode_tree({"w": weights, "n": counts, "t": transposed}, copy=True)
    arrays = {leaf.entry["path"]: leaf.array for leaf in encoded.leaves}
    assert np.shares_memory(arrays["w"], np.asarray(weights))  # a jax array never changes: held as a view
    assert not np.shares_memory(arrays["n"], counts)
    assert not np.shares_memory(arrays["t"], transposed) and arrays["t"].flags.c_contiguous
    counts[:], transposed[:] = -1, -1
    encoded.write(tmp_path / "t.jxs")
    loaded = jaxstow.load(tmp_path / "t.jxs", as_numpy=True)
    np.testing.assert_array_equal(loaded["w"], np.arange(1024.0))
    np.testing.assert_array_equal(loaded["n"], np.arange(3.0))
    np.testing.assert_array_equal(loaded["t"], np.arange(12.0).reshape(3, 4).T)


def test_what_cannot_make_a_file_is_refused_naming_it(tmp_path):
    with pytest.raises(MetadataError, match=r"metadata for out\.jxs must be a JSON-able dict") as caught:
        encode_tree(TREE, metadata={"lr": np.float32(0.1)}, file="out.jxs")
    assert caught.value.file == "out.jxs"
    with pytest.raises(FormatError, match="both have the path 'a/b'") as caught:
        encode_tree({"a/b": jnp.ones(1), "a": {"b": jnp.ones(1)}}, file="out.jxs")
    assert caught.value.path == "a/b"
    with pytest.raises(jaxstow.errors.UnsaveableObjectError, match="cannot save leaf 'f'"):
        encode_tree({"f": lambda x: x}, file="out.jxs")


def test_metadata_with_a_tuple_is_refused_rather_than_coming_back_a_list(tmp_path):
    with pytest.raises(MetadataError, match=r"key 'image/size': the tuple \(224, 224\) would come back as a list"):
        jaxstow.save(tmp_path / "m.jxs", TREE, metadata={"image": {"size": (224, 224)}})
    assert not (tmp_path / "m.jxs").exists()
    with jaxstow.CheckpointManager(tmp_path / "run") as manager, pytest.raises(MetadataError, match="tuple"):
        manager.save(1, TREE, metadata={"shape": (2, 3)})
    jaxstow.save(tmp_path / "m.jxs", TREE, metadata={"image": {"size": [224, 224]}})
    assert jaxstow.load_metadata(tmp_path / "m.jxs") == {"image": {"size": [224, 224]}}
