"""A typed PRNG key against an array of ``like``, and raw key bits (``jax.random.PRNGKey``'s uint32 data) against a
key of ``like``: each refused with what to give ``like`` instead, which then restores."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError


def test_keys_and_raw_key_bits_against_each_other_say_what_to_give_like():
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"raw": jax.random.PRNGKey(0), "typed": jax.random.key(1)})
    buffer.seek(0)
    key = jax.eval_shape(lambda: jax.random.key(0))
    with pytest.raises(StructureMismatchError) as caught:
        jaxstow.load(buffer, like={"raw": key, "typed": jax.ShapeDtypeStruct((2,), jnp.uint32)})
    assert caught.value.problems == [
        "'raw': the file has uint32[2], expected key<threefry2x32>[]; give like a uint32 array there and make a key "
        "of it with jax.random.wrap_key_data",
        "'typed': the file has key<threefry2x32>[], expected uint32[2]; the file holds a typed PRNG key there: give "
        "like a key (jax.random.key's) in its place",
    ]
    buffer.seek(0)
    restored = jaxstow.load(buffer, like={"raw": jax.ShapeDtypeStruct((2,), jnp.uint32), "typed": key})
    assert restored["raw"].tolist() == jax.random.key_data(jax.random.key(0)).tolist()
    assert jax.random.key_data(restored["typed"]).tolist() == jax.random.key_data(jax.random.key(1)).tolist()
