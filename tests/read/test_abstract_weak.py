"""``reader.abstract`` describes a weakly typed array (``jnp.asarray(2.0)``) as weakly typed, so a restore into it gives
what a restore without ``like`` gives: an array that promotes as a Python scalar does."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp

import jaxstow


def test_the_abstract_tree_keeps_weak_types_and_restores_them():
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"scale": jnp.asarray(0.5), "w": jnp.ones(2, jnp.bfloat16)})
    buffer.seek(0)
    with jaxstow.open(buffer) as reader:
        abstract = reader.abstract
        assert abstract["scale"] == jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)
        assert abstract["w"] == jax.ShapeDtypeStruct((2,), jnp.bfloat16)
        restored = reader.load(like=abstract)
    assert restored["scale"].weak_type and not restored["w"].weak_type
    assert (restored["scale"] * restored["w"]).dtype == jnp.bfloat16  # as the saved scale did, not float32
