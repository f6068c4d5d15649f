"""Files of every format version load: ``tests/data/format_v2.*`` were written by jaxstow with format version 2
(a manifest entry per leaf), before version 3 made the manifest columnar; ``tests/data/format_v3.*`` with version 3,
before version 4 copied the user's string metadata into the native header; version 1 headers are built here from the
version 2 files.

The tree below is the one those files hold; each file must load back to it exactly, through ``jaxstow.load``, a
``like`` target, ``select``, ``jaxstow.open`` and ``verify``, and a damaged byte must still be caught.
"""

from __future__ import annotations

import collections
import io
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow._format.manifest import FORMAT_VERSION
from jaxstow.errors import CorruptFileError, FormatError, NewerFormatError
from reliability.forge import forge_native, split_native

DATA = Path(__file__).parent / "data"
Pair = jaxstow.saveable(collections.namedtuple("Pair", "first second"), name="fixtures.Pair")


def expected(*, sharded: bool) -> dict[Any, Any]:
    tree: dict[Any, Any] = {
        "params": {"w": np.arange(12.0, dtype=np.float32).reshape(3, 4), "b": np.arange(3, dtype=np.int16)},
        "bf16": np.ones((2, 3), ml_dtypes.bfloat16),
        "int4": np.arange(6).astype(ml_dtypes.int4).reshape(2, 3),
        "c128": np.array([1 + 2j, 3 - 4j]),
        "scalar": np.float32(2.5),
        "key": jax.random.key(7),
        "empty": np.zeros((0, 3), np.float32),
        "zero_d": np.array(5, np.uint8),
        "pair": Pair(1.5, "name"),
        "list": [None, 3, (True, jax.nn.relu)],
        "ints": {7: "int key", 2: np.int64(-3)},
    }
    if sharded:
        tree["sharded"] = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    return tree


def assert_same(found: Any, wanted: Any) -> None:
    found_paths, found_leaves = zip(*jax.tree_util.tree_leaves_with_path(found), strict=True)
    wanted_paths, wanted_leaves = zip(*jax.tree_util.tree_leaves_with_path(wanted), strict=True)
    assert found_paths == wanted_paths
    assert jax.tree.structure(found) == jax.tree.structure(wanted)
    for path, a, b in zip(found_paths, found_leaves, wanted_leaves, strict=True):
        if isinstance(b, jax.Array) and jnp.issubdtype(b.dtype, jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b), err_msg=str(path))
        elif isinstance(b, np.ndarray | np.generic):
            assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape, path
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=str(path))
        else:
            assert a is b or (type(a) is type(b) and a == b), path


OLDER_FILES = ["format_v2.jxs", "format_v2.npz", "format_v3.jxs", "format_v3.npz"]


@pytest.mark.parametrize("name", OLDER_FILES)
def test_files_of_older_format_versions_load_exactly(name):
    path = DATA / name
    tree = expected(sharded=name.endswith(".jxs"))
    assert_same(jaxstow.load(path, as_numpy=True), tree)
    assert jaxstow.load_metadata(path)["epoch"] == 3
    assert_same(jaxstow.load(path, like=tree, as_numpy=True), tree)
    assert_same(jaxstow.load(path, select=["params/**"], as_numpy=True), {"params": tree["params"]})
    restored = jaxstow.load(path)
    assert isinstance(restored["params"]["w"], jax.Array)
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader["int4"], tree["int4"])
        assert reader.info("c128").dtype == np.complex128
        np.testing.assert_array_equal(reader.read("params/w", np.s_[1:, 2]), tree["params"]["w"][1:, 2])


@pytest.mark.parametrize("name", OLDER_FILES)
def test_a_flipped_data_byte_of_an_older_file_is_caught(tmp_path, name):
    damaged = tmp_path / name
    shutil.copy(DATA / name, damaged)
    data = bytearray(damaged.read_bytes())
    if name.endswith(".jxs"):
        data[-2] ^= 0x10  # the last tensor's bytes
    else:
        start = data.index(b"params/w.npy")
        data[start + 200] ^= 0x10
    damaged.write_bytes(bytes(data))
    with pytest.raises((CorruptFileError, FormatError)):
        jaxstow.load(damaged, as_numpy=True)


def _as_version_1(file: bytes) -> bytes:
    """A version 1 file with the same tensors: every stored entry gives its dtype and shape."""
    tensors, text, data = split_native(file)
    assert text is not None
    manifest = json.loads(text)
    codes = {"F32": "float32", "I16": "int16", "BF16": "bfloat16", "U32": "uint32", "I64": "int64", "U8": "uint8"}
    for entry in manifest["leaves"]:
        tensor = tensors.get(entry["path"])
        if tensor is not None and "dtype" not in entry:
            code = tensor["dtype"]
            entry["dtype"], entry["shape"] = codes.get(code, code), tensor["shape"]
    manifest["version"] = 1
    return forge_native(tensors, json.dumps(manifest), data)


def test_a_version_1_header_loads_too():
    file = _as_version_1((DATA / "format_v2.jxs").read_bytes())
    assert_same(jaxstow.load(io.BytesIO(file), as_numpy=True), expected(sharded=True))


def test_the_files_written_now_are_version_4_and_smaller_per_leaf(tmp_path):
    tree = {f"layer_{i:03d}": {"w": np.full((4, 4), i, np.float32), "b": np.zeros(4, np.float32)} for i in range(200)}
    jaxstow.save(tmp_path / "now.jxs", tree)
    _, text, _ = split_native((tmp_path / "now.jxs").read_bytes())
    assert text is not None
    manifest = json.loads(text)
    assert manifest["version"] == 4
    assert len(text) < 60 * 400  # about one path and one checksum per leaf, not an object per leaf
    assert_same(jaxstow.load(tmp_path / "now.jxs", as_numpy=True), tree)


def test_a_version_3_file_keeps_its_header_and_a_plain_key_in_it_is_damage(tmp_path):
    from safetensors import safe_open

    path = DATA / "format_v3.jxs"
    with safe_open(str(path), "np") as file:
        assert set(file.metadata()) == {"jaxstow", "jaxstow_header_xxh3"}  # version 3 wrote no plain keys
    tensors, text, data = split_native(path.read_bytes())
    assert text is not None and json.loads(text)["version"] == 3
    forged = forge_native(tensors, text, data, plain={"note": "written by format version 3"})
    with pytest.raises(CorruptFileError, match=r"metadata keys .* are not jaxstow's"):
        jaxstow.load(io.BytesIO(forged))


def test_a_newer_version_with_keys_this_one_does_not_know_is_newer_not_corrupt():
    tensors, text, data = split_native((DATA / "format_v3.jxs").read_bytes())
    assert text is not None
    manifest = json.loads(text)
    manifest["version"] = FORMAT_VERSION + 1
    forged = forge_native(tensors, json.dumps(manifest), data, plain={"jaxstow_future": "1", "epoch": "3"})
    with pytest.raises(NewerFormatError, match=f"format {FORMAT_VERSION + 1} is newer than this jaxstow"):
        jaxstow.load(io.BytesIO(forged))
