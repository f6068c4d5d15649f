"""Every kind of leaf round-trips through both containers with its dtype, shape and Python type."""

from __future__ import annotations

import io
import math
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow._format.skeleton import decode_value
from jaxstow.errors import CorruptFileError, FormatError, RequestError, UnsaveableObjectError

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "bfloat16",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
    "int4", "uint4",
]  # fmt: skip
SUFFIXES = ["model.jxs", "model.npz"]


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, name))  # numpy 1.x has no np.bool: a name numpy takes


def _sample(name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = _dtype(name)
    values = np.arange(math.prod(shape)).reshape(shape) % 7
    if dtype == np.bool_:
        return (values % 2).astype(bool)
    if dtype.kind == "c":
        return (values + 1j * values).astype(dtype)
    return values.astype(dtype)


def _roundtrip(tmp_path, tree, suffix="model.jxs", **load_options):
    path = tmp_path / suffix
    jaxstow.save(path, tree)
    return jaxstow.load(path, **load_options)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips_as_jax_and_numpy(tmp_path, name, suffix):
    tree = {"matrix": _sample(name, (3, 5)), "scalar": np.asarray(_sample(name, ())), "empty": _sample(name, (0, 4))}
    as_numpy = _roundtrip(tmp_path, tree, suffix, as_numpy=True)
    as_jax = jaxstow.load(tmp_path / suffix)
    for key, expected in tree.items():
        got = as_numpy[key]
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()
        on_device = jnp.asarray(expected)  # 64-bit types follow jax's x64 setting, as everywhere in jax
        assert isinstance(as_jax[key], jax.Array) and as_jax[key].dtype == on_device.dtype
        assert np.asarray(as_jax[key]).tobytes() == np.asarray(on_device).tobytes()


@pytest.mark.parametrize("name", DTYPES)
def test_jax_arrays_of_every_dtype_round_trip(tmp_path, name):
    tree = {"matrix": jnp.asarray(_sample(name, (2, 3))), "scalar": jnp.asarray(_sample(name, ()))}
    restored = _roundtrip(tmp_path, tree)
    for key, expected in tree.items():
        assert restored[key].dtype == expected.dtype and restored[key].shape == expected.shape
        assert np.asarray(restored[key]).tobytes() == np.asarray(expected).tobytes()


#: ml_dtypes' small types that this ml_dtypes has (0.4 has int4 and uint4 only).
SUB_BYTE = [
    name
    for name in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e8m0fnu", "int2", "int4", "uint2", "uint4")
    if hasattr(ml_dtypes, name)
]


def _jax_makes(dtype: np.dtype) -> bool:
    try:
        jnp.asarray(np.zeros(1, dtype))
    except Exception:  # XLA's own error: the float6 dtypes in jax 0.10
        return False
    return True


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("name", SUB_BYTE)
def test_ml_dtypes_small_types_are_kept_exactly_and_jax_that_lacks_one_is_told(tmp_path, name, suffix):
    tree = {"w": _sample(name, (3, 5)), "nothing": _sample(name, (0, 2))}
    path = tmp_path / suffix
    jaxstow.save(path, tree)  # float6: was "an array of dtype float6_e2m3fn, strings or raw bytes, ... save .tolist()"
    loaded = jaxstow.load(path, as_numpy=True)
    for key, expected in tree.items():
        assert loaded[key].dtype == expected.dtype and loaded[key].tobytes() == expected.tobytes()
    if _jax_makes(_dtype(name)):
        assert np.asarray(jaxstow.load(path)["w"]).tobytes() == tree["w"].tobytes()
    else:  # never jax's own error
        with pytest.raises(
            RequestError, match=rf"leaf 'nothing' of .*: holds {name} values, .*load with as_numpy=True"
        ):
            jaxstow.load(path)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_numpy_scalars_keep_their_type(tmp_path, suffix):
    tree = [np.float32(1.5), np.int64(-3), np.bool_(True), np.complex64(1 - 2j), ml_dtypes.bfloat16(0.25)]
    restored = _roundtrip(tmp_path, tree, suffix)
    for got, expected in zip(restored, tree, strict=True):
        assert type(got) is type(expected) and got == expected


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_typed_prng_keys_round_trip(tmp_path, impl):
    keys = {"one": jax.random.key(3, impl=impl), "many": jax.random.split(jax.random.key(4, impl=impl), 5)}
    restored = _roundtrip(tmp_path, keys)
    for name, key in keys.items():
        assert restored[name].dtype == key.dtype and restored[name].shape == key.shape
        assert jnp.array_equal(jax.random.key_data(restored[name]), jax.random.key_data(key))
        assert jnp.array_equal(jax.random.normal(restored[name].reshape(-1)[0]), jax.random.normal(key.reshape(-1)[0]))


def test_python_values_keep_their_type_including_nan(tmp_path):
    hyper = {
        "int": 3, "big": 2**80, "neg": -7, "float": 0.1, "nan": float("nan"), "inf": float("-inf"),
        "bool": True, "complex": 1 + 2j, "str": "héllo", "none": None, "bytes": b"\x00\xff",
    }  # fmt: skip
    restored = _roundtrip(tmp_path, hyper)
    assert set(restored) == set(hyper)
    for key, expected in hyper.items():
        got = restored[key]
        assert type(got) is type(expected), key
        assert got == expected or (key == "nan" and math.isnan(got)), key


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_nan_keeps_its_sign_and_one_with_a_payload_is_refused(tmp_path, suffix):
    """inf - inf is a NaN with its sign set: it comes back bit for bit, in a float, a complex and a node's aux."""
    bits = lambda value: struct.pack("<d", value)  # noqa: E731
    negative = math.inf - math.inf
    hyper = {"loss": negative, "z": complex(negative, -0.0), "partial": jax.tree_util.Partial(jnp.add, negative)}
    jaxstow.save(tmp_path / suffix, hyper)
    restored = jaxstow.load(tmp_path / suffix)
    assert bits(restored["loss"]) == bits(negative)
    assert bits(restored["z"].real) == bits(negative) and bits(restored["z"].imag) == bits(-0.0)
    assert bits(restored["partial"].args[0]) == bits(negative)
    payload = struct.unpack("<d", bytes.fromhex("0100000000fff87f"))[0]
    with pytest.raises(UnsaveableObjectError, match=r"NaN with a payload.*numpy\.float64") as raised:
        jaxstow.save(tmp_path / suffix, {"run": {"loss": payload}})
    assert raised.value.path == "run/loss" and str(tmp_path / suffix) in str(raised.value)
    assert bits(jaxstow.load(tmp_path / suffix)["loss"]) == bits(negative)  # the file saved before is kept
    jaxstow.save(tmp_path / suffix, {"loss": np.float64(payload)})
    assert jaxstow.load(tmp_path / suffix)["loss"].tobytes() == bits(payload)


@pytest.mark.parametrize("text", ["1e400", "-1e309", ("0.5", "1e400")])
def test_a_float_beyond_float64s_range_is_refused_not_read_as_infinity(text):
    """repr writes infinity as 'inf'; a value that only float() rounds to it is no value jaxstow wrote."""
    value = {"complex": list(text)} if isinstance(text, tuple) else {"float": text}
    with pytest.raises(FormatError, match="beyond the range of a float"):
        decode_value(value)
    assert decode_value({"float": "-inf"}) == float("-inf") and decode_value({"complex": ["inf", "0.0"]}).real > 1e308


def test_containers_round_trip_with_their_types(tmp_path):
    import collections

    Point = collections.namedtuple("Point", "x y")
    jaxstow.saveable(Point, name="tests.Point")
    tree = {
        "list": [1, (2.0, None), []],
        "tuple": (),
        "dict": {},
        "int_keys": {0: jnp.ones(2), 1: "one"},
        "point": Point(jnp.zeros(3), 4),
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "none": None,
    }
    restored = _roundtrip(tmp_path, tree)
    assert restored["list"] == [1, (2.0, None), []] and restored["tuple"] == () and restored["dict"] == {}
    assert list(restored["int_keys"]) == [0, 1] and restored["int_keys"][1] == "one"
    assert type(restored["point"]) is Point and restored["point"].y == 4
    assert type(restored["ordered"]) is collections.OrderedDict and list(restored["ordered"]) == ["b", "a"]
    assert restored["none"] is None


def test_a_bare_array_and_an_empty_tree_round_trip(tmp_path):
    assert jnp.array_equal(_roundtrip(tmp_path, jnp.arange(4)), jnp.arange(4))
    assert _roundtrip(tmp_path, {}) == {}
    assert _roundtrip(tmp_path, None) is None


def test_big_endian_numpy_arrays_are_stored_in_native_order(tmp_path):
    big = np.arange(4, dtype=">i4")
    restored = _roundtrip(tmp_path, {"x": big}, as_numpy=True)
    assert restored["x"].dtype == np.int32 and restored["x"].tolist() == [0, 1, 2, 3]


def test_large_arrays_are_restored_aligned_so_jax_adopts_them(tmp_path):
    restored = _roundtrip(tmp_path, {"w": np.ones((1024, 1024), np.float32)}, as_numpy=True)
    assert restored["w"].ctypes.data % 64 == 0


def test_file_objects_round_trip_and_can_be_read_twice():
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"w": jnp.arange(3.0)})
    buffer.seek(0)
    first = jaxstow.load(buffer)
    second = jaxstow.load(buffer)
    assert jnp.array_equal(first["w"], second["w"])


def test_a_file_object_saved_into_twice_is_refused_saying_so_and_each_save_loads_from_where_it_begins(tmp_path):
    with open(tmp_path / "runs.bin", "wb") as file:  # as pickle.dump is called once per object
        jaxstow.save(file, {"run": 1})
        second = file.tell()
        jaxstow.save(file, {"run": 2})
    with open(tmp_path / "runs.bin", "rb") as file:
        # was: only "(the data region must hold the tensors and nothing else)", with no word of what to do
        with pytest.raises(CorruptFileError, match=r"holds more after its end, as a file object saved into twice does"):
            jaxstow.load(file)
        file.seek(second)
        assert jaxstow.load(file) == {"run": 2}


def test_metadata_is_kept_and_must_be_json(tmp_path):
    jaxstow.save(tmp_path / "m.jxs", {"w": jnp.ones(1)}, metadata={"step": 3, "tags": ["a"]})
    assert jaxstow.load_metadata(tmp_path / "m.jxs") == {"step": 3, "tags": ["a"]}
    with pytest.raises(TypeError, match="JSON"):
        jaxstow.save(tmp_path / "bad.jxs", {}, metadata={"when": object()})
    assert not (tmp_path / "bad.jxs").exists()


def test_two_leaves_with_one_path_are_refused(tmp_path):
    with pytest.raises(jaxstow.errors.FormatError, match="both have the path 'a/b'"):
        jaxstow.save(tmp_path / "x.jxs", {"a/b": jnp.ones(1), "a": {"b": jnp.ones(1)}})
    assert not (tmp_path / "x.jxs").exists()


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_text_that_the_fast_json_writer_cannot_encode_round_trips(tmp_path, suffix):
    """Integers beyond 64 bits and strings with lone surrogates are written by the standard library's encoder (no
    tensor is named with a lone surrogate, see below)."""
    tree = {"big": 2**100, "negative": -(2**70), "w": np.ones(2), "é/ü": np.zeros(1), "text": "\ud800"}
    restored = _roundtrip(tmp_path, tree, suffix, as_numpy=True)
    assert restored["big"] == 2**100 and type(restored["big"]) is int and restored["negative"] == -(2**70)
    assert restored["text"] == "\ud800" and restored["w"].tolist() == [1.0, 1.0]
    assert restored["é/ü"].tolist() == [0.0]
    assert jaxstow.load_metadata(tmp_path / suffix) is None
    jaxstow.save(tmp_path / suffix, {"w": np.ones(1)}, metadata={"huge": 2**80, "lr": 1e-300, "name": "é"})
    assert jaxstow.load_metadata(tmp_path / suffix) == {"huge": 2**80, "lr": 1e-300, "name": "é"}


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_tensor_named_with_a_lone_surrogate_is_refused_as_safetensors_would_refuse_the_file(tmp_path, suffix):
    # JSON escapes it, and jaxstow read it back; serde, the safetensors library's parser, refuses the whole header.
    with pytest.raises(FormatError, match=r"lone surrogate") as raised:
        jaxstow.save(tmp_path / suffix, {"odd \udc80 key": np.ones(2), "w": np.zeros(1)})
    assert raised.value.path == "odd \udc80 key" and not (tmp_path / suffix).exists()
