"""A 64-bit integer leaf restored with x64 off into the int32 (uint32) ``like`` leaves that a model built then holds:
with ``cast=True``, its values checked to fit, as a restore into an int64 ``jax.ShapeDtypeStruct`` narrows it; values
beyond 32 bits are refused, naming the leaf, whether the leaf is read whole or box by box onto four devices."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow.errors import RequestError, StructureMismatchError


def _saved(tree) -> io.BytesIO:
    buffer = io.BytesIO()
    with jax.enable_x64(True):  # a run with x64 on, which a run with it off restores
        jaxstow.save(buffer, jax.tree.map(jnp.asarray, tree))
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("pipeline", [False, True])
def test_int64_restores_into_an_int32_like_with_cast_when_its_values_fit(pipeline):
    saved = _saved({"step": np.array([1, -2, 3, 2**31 - 1], np.int64), "seen": np.array([2**32 - 1], np.uint64)})
    like = {"step": jnp.zeros(4, jnp.int32), "seen": jnp.zeros(1, jnp.uint32)}  # what jnp.int64 gives with x64 off
    with pytest.raises(
        StructureMismatchError, match=r"'step': the file has int64\[4\], expected int32\[4\]; pass cast"
    ):
        jaxstow.load(saved, like=like, pipeline=pipeline)
    saved.seek(0)
    restored = jaxstow.load(saved, like=like, cast=True, pipeline=pipeline)
    assert restored["step"].dtype == jnp.int32 and restored["step"].tolist() == [1, -2, 3, 2**31 - 1]
    assert restored["seen"].dtype == jnp.uint32 and restored["seen"].tolist() == [2**32 - 1]


@pytest.mark.parametrize("sharded", [False, True])
def test_int64_beyond_32_bits_is_refused_rather_than_wrapped_into_an_int32_like(sharded):
    rows = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    values = np.array([1, 2**40, -3, 4], np.int64)
    with jax.enable_x64(True):
        saved = _saved({"step": jax.device_put(values, rows) if sharded else values})
    like = {"step": jax.ShapeDtypeStruct((4,), jnp.int32, sharding=rows)}
    with pytest.raises(
        RequestError,
        match=r"leaf 'step' of <BytesIO>: cast=True would wrap values from -3 to 1099511627776: int32 holds",
    ):
        jaxstow.load(saved, like=like, cast=True)


def test_a_numpy_like_is_no_jax_array_that_x64_narrows():
    saved = _saved({"step": np.array([1, 2], np.int64)})
    with pytest.raises(StructureMismatchError, match="cast=True does not turn int64 into int32, which would lose"):
        jaxstow.load(saved, like={"step": np.zeros(2, np.int32)}, cast=True)
