"""Restores that hand back exactly what was saved, or refuse: 0-d torch targets, exact casts, 64-bit integers with
jax's x64 mode off, empty dict keys under ``select``."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from memory_files import saved_in_memory

import jaxstow
from jaxstow._read.targets import castable
from jaxstow.errors import JaxstowError, RequestError, StructureMismatchError
from jaxstow.objax import TreeCheckpoint

torch = pytest.importorskip("torch")

_BEYOND_32_BITS = 2**40 + 5


def test_a_0d_tensor_restored_into_a_torch_like_keeps_its_shape():
    norm = torch.nn.BatchNorm1d(3)
    norm.num_batches_tracked += 4
    restored = jaxstow.load(saved_in_memory(norm.state_dict()), like=norm.state_dict())
    assert restored["num_batches_tracked"].shape == torch.Size([])
    assert restored["num_batches_tracked"].dtype == torch.int64 and int(restored["num_batches_tracked"]) == 4
    assert restored["weight"].shape == torch.Size([3])


def test_numpy_0d_leaves_restored_into_torch_likes_keep_their_shape():
    like = {"scalar": torch.tensor(0.0), "array": torch.tensor(0, dtype=torch.int32)}
    saved = saved_in_memory({"scalar": np.float32(2.5), "array": np.array(7, np.int32)})
    restored = jaxstow.load(saved, like=like)
    assert restored["scalar"].shape == torch.Size([]) and float(restored["scalar"]) == 2.5
    assert restored["array"].shape == torch.Size([]) and int(restored["array"]) == 7


def test_a_torch_like_of_a_dtype_numpy_lacks_is_refused_by_path():
    with pytest.raises(
        RequestError, match=r"leaf 'w' of <BytesIO>: like holds a torch.Tensor of dtype torch.complex32"
    ):
        jaxstow.load(saved_in_memory({"w": np.ones(2, np.complex64)}), like={"w": torch.ones(2, dtype=torch.complex32)})


@pytest.mark.parametrize(
    ("source", "target"),
    [(np.int64, np.float64), (np.uint64, np.float64), (np.int64, np.complex128), (np.uint64, np.complex128)],
)
def test_cast_refuses_64_bit_integers_into_floats_that_round_them(source, target):
    value = np.array([2**53 + 1], source)
    with pytest.raises(StructureMismatchError, match=f"cast=True does not turn {np.dtype(source)} into"):
        jaxstow.load(saved_in_memory({"i": value}), like={"i": np.zeros(1, target)}, cast=True, as_numpy=True)
    tree = {"i8": np.array([-128, 127], np.int8), "i16": np.array([-32768, 32767], np.int16)}
    tree["i32"] = np.array([-(2**31), 2**31 - 1], np.int32)
    tree["u32"] = np.array([2**32 - 1], np.uint32)
    like = {"i8": np.zeros(2, np.float32), "i16": np.zeros(2, np.float32), "i32": np.zeros(2, np.float64)}
    like["u32"] = np.zeros(1, np.complex128)
    restored = jaxstow.load(saved_in_memory(tree), like=like, cast=True, as_numpy=True)
    for path, value in tree.items():
        assert restored[path].dtype == like[path].dtype
        assert [int(x.real) for x in restored[path]] == value.tolist()


_CASTS = [
    (np.int8, np.float32, True),
    (np.int16, np.float32, True),
    (np.int32, np.float64, True),
    (np.uint32, np.float64, True),
    (np.int32, np.complex64, False),
    (np.int32, np.float32, False),
    (np.int64, np.float64, False),
    (np.uint64, np.float64, False),
    (np.int64, np.complex128, False),
    (np.int8, ml_dtypes.bfloat16, True),
    (np.int16, np.float16, False),
    (np.int8, ml_dtypes.float8_e5m2, False),
    (np.uint8, ml_dtypes.float8_e5m2, False),
    (ml_dtypes.int4, ml_dtypes.float8_e4m3fn, True),
    (np.bool_, np.float32, True),
    (np.bool_, ml_dtypes.float8_e8m0fnu, False),
    (np.bool_, np.int8, True),
    (np.int8, np.int16, True),
    (np.int16, np.int8, False),
    (np.float64, np.float16, True),
    (np.float32, np.complex64, True),
    (np.float32, np.int32, False),
    (np.complex64, np.float32, False),
]


def test_castable_is_exact():
    got = {
        (np.dtype(source).name, np.dtype(target).name): castable(np.dtype(source), np.dtype(target))
        for source, target, _ in _CASTS
    }
    assert got == {(np.dtype(source).name, np.dtype(target).name): allowed for source, target, allowed in _CASTS}


def test_int64_beyond_32_bits_is_refused_with_x64_off():
    saved = saved_in_memory({"step": np.array([_BEYOND_32_BITS], np.int64), "w": np.ones(2, np.float32)})
    with jax.enable_x64(False):
        with pytest.raises(RequestError) as caught:
            jaxstow.load(saved)
        saved.seek(0)
        with pytest.raises(RequestError, match="leaf 'step'"):
            jaxstow.load(saved, like={"step": jax.ShapeDtypeStruct((1,), jnp.int64), "w": np.ones(2, np.float32)})
    message = str(caught.value)
    assert message.startswith("leaf 'step' of <BytesIO>: holds int64 values beyond 32 bits (up to 1099511627781)")
    assert "jax.config.update('jax_enable_x64', True)" in message and "as_numpy=True" in message
    assert isinstance(caught.value, JaxstowError) and caught.value.path == "step"

    fitting = {"i": np.array([-(2**31), 2**31 - 1], np.int64), "u": np.array([2**32 - 1], np.uint64)}
    fitting["empty"] = np.zeros(0, np.int64)
    with jax.enable_x64(False):
        restored = jaxstow.load(saved_in_memory(fitting))
        saved.seek(0)
        assert jaxstow.load(saved, as_numpy=True)["step"].tolist() == [_BEYOND_32_BITS]
    assert restored["i"].dtype == jnp.int32 and restored["i"].tolist() == fitting["i"].tolist()
    assert restored["u"].dtype == jnp.uint32 and restored["u"].tolist() == [2**32 - 1]
    assert restored["empty"].shape == (0,)
    saved.seek(0)
    with jax.enable_x64(True):
        wide = jaxstow.load(saved)
    assert wide["step"].dtype == jnp.int64 and wide["step"].tolist() == [_BEYOND_32_BITS]


def test_uint64_and_negative_int64_beyond_32_bits_are_refused_with_x64_off():
    with jax.enable_x64(False):
        with pytest.raises(RequestError, match=r"uint64 values beyond 32 bits \(up to 4294967296\)"):
            jaxstow.load(saved_in_memory({"u": np.array([2**32], np.uint64)}))
        with pytest.raises(RequestError, match=r"int64 values beyond 32 bits \(down to -2147483649\)"):
            jaxstow.load(saved_in_memory({"i": np.array([-(2**31) - 1, 0], np.int64)}))


def test_float64_beyond_float32_range_is_refused_with_x64_off_rather_than_made_infinite(tmp_path):
    """jax with x64 off keeps float64 as float32: a finite value beyond its range would come back inf, silently."""
    tree = {"x": np.array([1e300, 1.0]), "c": np.array([1 + 1e300j]), "low": np.array([-1e39, 0.5])}
    path = tmp_path / "wide.jxs"
    jaxstow.save(path, tree)
    with jax.enable_x64(False):
        for leaf, beyond in (("x", "up to 1e+300"), ("c", "up to 1e+300"), ("low", "down to -1e+39")):
            like = {leaf: jax.ShapeDtypeStruct(tree[leaf].shape, tree[leaf].dtype)}
            message = rf"leaf '{leaf}' of .*wide\.jxs: holds {tree[leaf].dtype} values beyond float32's range"
            for options in ({"select": [leaf]}, {"select": [leaf], "pipeline": True}, {"like": like, "partial": True}):
                with pytest.raises(RequestError, match=rf"{message} \({re.escape(beyond)}\)"):
                    jaxstow.load(path, **options)
        assert jaxstow.load(path, as_numpy=True)["x"].tolist() == [1e300, 1.0]
        kept = {"inf": np.array([np.inf, -np.inf, np.nan, 1e-300, 3.0e38])}  # nothing finite made infinite
        restored = jaxstow.load(saved_in_memory(kept))["inf"]
    assert restored.dtype == jnp.float32 and np.isinf(restored[:2]).all() and np.isnan(restored[2])
    with jax.enable_x64(True):
        assert jaxstow.load(path)["x"].tolist() == [1e300, 1.0]


def test_a_cast_into_float64_that_jax_keeps_as_float32_is_refused_where_it_would_round(tmp_path):
    """int32 fits float64 exactly, but not the float32 that jax with x64 off makes of it."""
    path = tmp_path / "ids.jxs"
    jaxstow.save(path, {"ids": np.array([16_777_217, 2**31 - 1], np.int32)})
    like = {"ids": jax.ShapeDtypeStruct((2,), np.float64)}
    with jax.enable_x64(False):
        with pytest.raises(
            StructureMismatchError,
            match=r"jax with x64 off keeps float64 as float32, and cast=True does not turn int32 into float32",
        ):
            jaxstow.load(path, like=like, cast=True)
        assert jaxstow.load(path, like=like, cast=True, as_numpy=True)["ids"].tolist() == [16_777_217, 2**31 - 1]
    with jax.enable_x64(True):
        restored = jaxstow.load(path, like=like, cast=True)["ids"]
    assert restored.dtype == jnp.float64 and restored.tolist() == [16_777_217, 2**31 - 1]


def test_int64_beyond_32_bits_is_refused_by_the_pipeline_and_on_several_devices(tmp_path):
    path = tmp_path / "wide.jxs"
    jaxstow.save(path, {"step": np.full(8, _BEYOND_32_BITS, np.int64)})
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    with jax.enable_x64(True):
        jaxstow.save(tmp_path / "sharded.jxs", {"step": jax.device_put(np.full(8, _BEYOND_32_BITS), spread)})
    with jax.enable_x64(False):
        with pytest.raises(RequestError, match=r"leaf 'step' of .*wide\.jxs: holds int64 values beyond 32 bits"):
            jaxstow.load(path, pipeline=True)
        with pytest.raises(RequestError, match=r"leaf 'step' of .*sharded\.jxs: holds int64 values beyond 32 bits"):
            jaxstow.load(tmp_path / "sharded.jxs", sharding="saved")


def test_objax_tree_checkpoint_refuses_int64_beyond_32_bits_with_x64_off(tmp_path):
    checkpoint = TreeCheckpoint(logdir=tmp_path, keep_ckpts=1)
    checkpoint.save({"step": np.array([_BEYOND_32_BITS], np.int64)}, idx=1)
    with jax.enable_x64(False), pytest.raises(RequestError, match=r"leaf 'step' of .*0000000001\.npz"):
        checkpoint.restore()


def test_select_takes_leaves_under_empty_dict_keys():
    tree = {"a": {"": np.ones(1), "b": np.zeros(1)}, "d": {"": {"c": np.full(1, 2.0)}}}
    selections = {
        "**": {"a": {"": [1.0], "b": [0.0]}, "d": {"": {"c": [2.0]}}},
        "a": {"a": {"": [1.0], "b": [0.0]}},
        "a/": {"a": {"": [1.0]}},
        "a/*": {"a": {"": [1.0], "b": [0.0]}},
        "d//c": {"d": {"": {"c": [2.0]}}},
        "*/": {"a": {"": [1.0]}, "d": {"": {"c": [2.0]}}},
    }
    for pattern, expected in selections.items():
        restored = jaxstow.load(saved_in_memory(tree), select=[pattern], as_numpy=True)
        assert jax.tree.map(lambda leaf: leaf.tolist(), restored) == expected, pattern
