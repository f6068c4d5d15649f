"""Crash safety, corruption detection, header validation, interoperability and deterministic bytes."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import CorruptFileError, FormatError, TruncatedFileError

TREE = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int8), "depth": 3}


def _data_start(path) -> int:
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
    return 8 + length


def test_a_save_killed_midway_leaves_the_old_file_intact(tmp_path):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"version": 1, "w": np.zeros(4, np.float32)})
    before = path.read_bytes()
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys, numpy as np, jaxstow
                big = {f"layer{i}": np.full(16 << 20, i, np.float32) for i in range(16)}  # 1 GiB
                while True:
                    jaxstow.save(sys.argv[1], {"version": 2, **big})
                """
            ),
            str(path),
        ]
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the temporary file is being written
            partial = [p for p in tmp_path.iterdir() if TEMPORARY_MARKER in p.name]
            if partial and partial[0].stat().st_size > 64 << 20:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the writer never started writing")
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait()
    assert path.read_bytes() == before
    restored = jaxstow.load(path)
    assert restored["version"] == 1 and restored["w"].shape == (4,)


def test_a_failed_save_leaves_no_file_behind(tmp_path):
    with pytest.raises(TypeError):
        jaxstow.save(tmp_path / "x.jxs", {"bad": object()})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", ["jxs", "npz"])
def test_a_flipped_data_byte_names_the_leaf(tmp_path, suffix):
    path = tmp_path / f"model.{suffix}"
    jaxstow.save(path, {"w": np.arange(1000, dtype=np.float32), "b": np.ones(3, np.float32)})
    data = bytearray(path.read_bytes())
    w_bytes = np.arange(1000, dtype=np.float32).tobytes()
    at = bytes(data).index(w_bytes) + 1000
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=rf"leaf 'w' of .*model.{suffix}: .*(checksum|CRC)"):
        jaxstow.load(path)


def test_a_flipped_header_byte_is_detected(tmp_path):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, TREE)
    data = bytearray(path.read_bytes())
    at = bytes(data).index(b"depth") + 1  # a byte of the manifest's text: still valid JSON, wrong meaning
    data[at] ^= 0x02
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="header's checksum"):
        jaxstow.load(path)


@pytest.mark.parametrize("keep", [0, 5, 100, -1])
def test_a_truncated_file_is_detected(tmp_path, keep):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, TREE)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(TruncatedFileError, match=r"model\.jxs"):
        jaxstow.load(path)


def test_a_truncated_npz_is_detected(tmp_path):
    path = tmp_path / "model.npz"
    jaxstow.save(path, TREE)
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(CorruptFileError, match=r"model\.npz"):
        jaxstow.load(path)


def _forge(path, header: dict, data: bytes = b"") -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"x": {"dtype": "F32", "shape": [1 << 40, 1 << 20], "data_offsets": [0, 4]}}, "needs"),
        ({"x": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}}, "file has only"),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "non-negative"),
        ({"x": {"dtype": "O", "shape": [1], "data_offsets": [0, 8]}}, "unknown safetensors dtype"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, "malformed data_offsets"),
    ],
)
def test_header_numbers_are_validated_before_allocation(tmp_path, header, message):
    _forge(tmp_path / "forged.safetensors", header, b"\x00" * 8)
    with pytest.raises(FormatError, match=message):
        jaxstow.load(tmp_path / "forged.safetensors")


def test_a_huge_header_length_is_refused_without_reading_it(tmp_path):
    (tmp_path / "f.safetensors").write_bytes(struct.pack("<Q", 1 << 62) + b"{}")
    with pytest.raises(FormatError, match="exceeds the limit"):
        jaxstow.load(tmp_path / "f.safetensors")


def test_the_native_file_is_a_valid_safetensors_file(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "model.safetensors"
    jaxstow.save(
        path, {"w": jnp.arange(6.0).reshape(2, 3), "bf": jnp.ones(2, jnp.bfloat16), "i4": jnp.ones(3, jnp.int4)}
    )
    with safe_open(path, framework="flax") as file:
        assert sorted(file.keys()) == ["bf", "i4", "w"]
        assert jnp.array_equal(file.get_tensor("w"), jnp.arange(6.0).reshape(2, 3))
        assert file.get_tensor("bf").dtype == jnp.bfloat16
        manifest = json.loads(file.metadata()["jaxstow"])
    assert manifest["format"] == "jaxstow" and manifest["version"] == 4
    assert manifest["paths"] == ["bf", "i4", "w"] and manifest["kinds"] == "aaa"  # dtypes and shapes: the tensors'
    assert manifest["details"] == {"1": {"dtype": "int4", "shape": [3]}}  # but of a leaf stored as raw bytes
    assert _data_start(path) % 4096 == 0


def test_plain_safetensors_and_npz_files_load(tmp_path):
    from safetensors.numpy import save_file

    arrays = {"a.weight": np.ones((2, 2), np.float32), "b": np.arange(3, dtype=np.int64)}
    save_file(arrays, tmp_path / "plain.safetensors")
    np.savez(tmp_path / "plain.npz", **arrays)
    for name in ("plain.safetensors", "plain.npz"):
        flat = jaxstow.load(tmp_path / name, as_numpy=True)
        assert sorted(flat) == ["a.weight", "b"] and np.array_equal(flat["b"], arrays["b"])
        fitted = jaxstow.load(
            tmp_path / name, like={"a.weight": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.int64)}
        )
        assert np.array_equal(fitted["a.weight"], arrays["a.weight"])


def test_an_npz_with_pickled_objects_is_refused(tmp_path):
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(FormatError, match="object arrays are never loaded"):
        jaxstow.load(tmp_path / "objects.npz")


def test_objax_and_flarejax_archives_given_to_load_name_the_call_that_reads_them(tmp_path):
    objax = pytest.importorskip("objax")
    flr = pytest.importorskip("flarejax")
    objax.io.save_var_collection(str(tmp_path / "net.npz"), objax.nn.Linear(2, 2).vars())
    with pytest.raises(FormatError, match=r"Objax archive .*jaxstow\.objax\.load_var_collection\('.*net\.npz', "):
        jaxstow.load(tmp_path / "net.npz")
    flr.save(flr.net.Sequential(flr.net.Linear(jnp.zeros(2, jnp.uint32), 3)), str(tmp_path / "model.npz"))
    with pytest.raises(FormatError, match=r"FlareJax archive .*flarejax\.load\('.*model\.npz'\) and save it again"):
        jaxstow.load(tmp_path / "model.npz")
    np.savez(tmp_path / "labels.npz", labels=np.array(["cat", "dog"]))
    with pytest.raises(FormatError, match=r"leaf 'labels' .*dtype <U3, .*numpy\.load\('.*labels\.npz'\)"):
        jaxstow.load(tmp_path / "labels.npz")


def test_bytes_are_identical_across_processes_and_hash_seeds(tmp_path):
    script = textwrap.dedent(
        """
        import sys, jax, jax.numpy as jnp, equinox as eqx, jaxstow
        model = eqx.nn.MLP(3, 2, 4, 2, key=jax.random.key(0))
        tree = {"model": model, "names": {"zeta": 1, "alpha": "a", "mid": (1.5, None)}, "set": {f"k{i}": i for i in range(50)}}
        jaxstow.save(sys.argv[1], tree, metadata={"run": "x", "b": 1, "a": 2})
        """
    )
    outputs = []
    for seed in ("1", "12345"):
        path = tmp_path / f"model-{seed}.jxs"
        subprocess.run(
            [sys.executable, "-c", script, str(path)], check=True, env={**os.environ, "PYTHONHASHSEED": seed}
        )
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]


class _Unseekable(io.RawIOBase):
    """A write-only stream, like a pipe or an upload."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, chunk) -> int:
        self.data += chunk
        return memoryview(chunk).nbytes


@pytest.mark.parametrize("target", ["model.jxs", "model.npz", "bytesio", "unseekable"])
def test_large_trees_hashed_while_written_carry_true_checksums(tmp_path, target):
    tree = {f"w{i}": np.full((3 << 20) + i, i, np.float32) for i in range(4)}  # 48 MiB: hashed on other threads
    if target == "bytesio":
        sink = io.BytesIO()
        jaxstow.save(sink, tree)
        data = bytearray(sink.getvalue())
    elif target == "unseekable":
        sink = _Unseekable()
        jaxstow.save(sink, tree)
        data = sink.data
    else:
        jaxstow.save(tmp_path / target, tree)
        data = bytearray((tmp_path / target).read_bytes())
    restored = jaxstow.load(io.BytesIO(bytes(data)), as_numpy=True)
    assert all(np.array_equal(restored[k], v) for k, v in tree.items())
    data[bytes(data).index(np.full(1024, 3, np.float32).tobytes()) + 5] ^= 0xFF
    with pytest.raises(CorruptFileError, match=r"leaf 'w3'.*(checksum|CRC)"):
        jaxstow.load(io.BytesIO(bytes(data)))


def test_a_manifest_that_contradicts_its_tensor_is_refused(tmp_path):
    from jaxstow._write.encoded import encode_tree

    frozen = encode_tree({"w": np.ones(3, np.float32), "b": np.ones(4, np.uint8)})
    frozen.leaves[0].entry.update(dtype="bfloat16", shape=[2])  # 'b' is uint8[4]: the raw bytes of a bfloat16[2]
    frozen.write(tmp_path / "raw.jxs")
    assert jaxstow.load(tmp_path / "raw.jxs", as_numpy=True)["b"].dtype.name == "bfloat16"
    frozen.leaves[1].entry.update(dtype="int32", shape=[3])  # 'w' is float32[3]
    frozen.write(tmp_path / "forged.jxs")
    with pytest.raises(FormatError, match=r"leaf 'w'.*says int32\[3\] but the tensor is float32\[3\]"):
        jaxstow.load(tmp_path / "forged.jxs")


def test_an_npz_member_promising_more_than_it_holds_is_refused_before_allocation():
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, archive.open("w.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)})
        member.write(b"\0" * 64)
    buffer.seek(0)
    with pytest.raises(CorruptFileError, match=r"leaf 'w'.*promises float64\[1099511627776\]"):
        jaxstow.load(buffer)


def test_npz_members_of_npy_version_3_load_as_numpy_reads_them_and_a_later_version_is_named(tmp_path):
    import zipfile

    for version, path in (((3, 0), tmp_path / "v3.npz"), ((4, 0), tmp_path / "v4.npz")):
        member = io.BytesIO()
        np.lib.format.write_array(member, np.arange(3.0), version=(3, 0))  # numpy's for UTF-8 field names
        data = bytearray(member.getvalue())
        data[6:8] = bytes(version)
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("a.npy", bytes(data))
    np.testing.assert_array_equal(
        jaxstow.load(tmp_path / "v3.npz", as_numpy=True)["a"], np.load(tmp_path / "v3.npz")["a"]
    )
    with pytest.raises(FormatError) as caught:  # was: CorruptFileError, "npy format version (3, 0) is not supported"
        jaxstow.load(tmp_path / "v4.npz")
    assert type(caught.value) is FormatError and caught.value.path == "a"
    assert "an npy member of format version (4, 0), which jaxstow does not read" in str(caught.value)


def test_compressed_npz_files_load(tmp_path):
    np.savez_compressed(tmp_path / "c.npz", a=np.arange(1000.0), b=np.zeros((3, 3), np.int16))
    restored = jaxstow.load(tmp_path / "c.npz", as_numpy=True)
    assert np.array_equal(restored["a"], np.arange(1000.0)) and restored["b"].shape == (3, 3)


@pytest.mark.parametrize("value", [{"complex": 5}, {"bytes": 5}, {"float": "x"}, {"tuple": 3}, {"npscalar": "float32"}])
def test_malformed_values_in_a_manifest_raise_format_errors(tmp_path, value):
    from jaxstow._write.encoded import encode_tree

    frozen = encode_tree({"v": 1})
    frozen.leaves[0].entry["value"] = value
    frozen.write(tmp_path / "forged.jxs")
    with pytest.raises(FormatError, match="leaf 'v'"):
        jaxstow.load(tmp_path / "forged.jxs")
