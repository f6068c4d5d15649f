"""A dtype narrower than a byte is stored in the low bits of its byte, the bits above zero; a file made by hand that
sets them would read as two sets of values (numpy keeps the bits, jax drops them: a float4 ``-0.0`` in numpy, ``0.0``
in jax), so it is damage, however it is read."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
import xxhash

import jaxstow
from jaxstow.errors import CorruptFileError
from reliability.forge import forge_native, split_native

_NARROW = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4}


def _forged(tmp_path, name: str, stray: bytes):
    """A file of one leaf ``x`` of dtype ``name`` whose bytes are ``stray``, every checksum made to match."""
    dtype = np.dtype(getattr(ml_dtypes, name))
    path = tmp_path / f"{name}.jxs"
    jaxstow.save(path, {"x": np.zeros(len(stray), dtype)})
    tensors, manifest, data = split_native(path.read_bytes())
    begin, end = tensors["x"]["data_offsets"]
    manifest = manifest.replace(xxhash.xxh3_64_hexdigest(data[begin:end]), xxhash.xxh3_64_hexdigest(stray))
    path.write_bytes(forge_native(tensors, manifest, data[:begin] + stray + data[end:]))
    return path


@pytest.mark.parametrize("name", [name for name in _NARROW if hasattr(ml_dtypes, name)])
def test_a_narrow_tensor_with_bits_set_above_its_width_is_damage_however_it_is_read(tmp_path, name):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    bits = _NARROW[name]
    path = _forged(tmp_path, name, bytes([1, 1 << bits, 0, 0x80]))
    sharding = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    reads = [
        lambda: jaxstow.load(path, as_numpy=True),  # was: the bytes kept, values jax would not give
        lambda: jaxstow.load(path),  # was: the bits dropped, other values than numpy's
        lambda: jaxstow.load(path, pipeline=True),  # an accelerator's default
        lambda: jaxstow.load(path, sharding=sharding),
        lambda: jaxstow.open(path)["x"],
        lambda: jaxstow.open(path).read("x", np.s_[1:3]),
        lambda: jaxstow.open(path, mmap=True)["x"],
    ]
    for read in reads:
        with pytest.raises(CorruptFileError, match=rf"leaf 'x' of .*: a tensor of {name} holds a byte with bits set"):
            read()


@pytest.mark.parametrize("name", [name for name in _NARROW if hasattr(ml_dtypes, name)])
def test_every_value_of_a_narrow_dtype_reads_back_alike_in_numpy_and_jax(tmp_path, name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    values = np.arange(1 << _NARROW[name], dtype=np.uint8).view(dtype)  # every bit pattern of the width
    jaxstow.save(tmp_path / "all.jxs", {"x": values})
    loaded = jaxstow.load(tmp_path / "all.jxs", as_numpy=True)["x"]
    assert loaded.view(np.uint8).tolist() == values.view(np.uint8).tolist()
    on_device = np.asarray(jaxstow.load(tmp_path / "all.jxs")["x"])
    np.testing.assert_array_equal(on_device.view(np.uint8), values.view(np.uint8))


def test_a_bool_tensor_of_a_jaxstow_file_with_bytes_other_than_0_and_1_is_damage(tmp_path):
    path = tmp_path / "mask.jxs"
    jaxstow.save(path, {"x": np.zeros(4, bool)})
    tensors, manifest, data = split_native(path.read_bytes())
    begin, end = tensors["x"]["data_offsets"]
    stray = bytes([1, 2, 0, 1])
    manifest = manifest.replace(xxhash.xxh3_64_hexdigest(data[begin:end]), xxhash.xxh3_64_hexdigest(stray))
    path.write_bytes(forge_native(tensors, manifest, data[:begin] + stray + data[end:]))
    for as_numpy in (True, False):  # was: loaded without a word, as a plain safetensors file's is not
        with pytest.raises(CorruptFileError, match=r"leaf 'x' of .*: a bool tensor holds bytes other than 0 and 1"):
            jaxstow.load(path, as_numpy=as_numpy)
