"""A ``like`` of a class whose fields changed order since the save: its leaves are matched by name, and its static
data is still held against the file's, as for a class that did not change."""

from __future__ import annotations

import dataclasses
import functools
import io
import uuid
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError


def _saved(tree) -> io.BytesIO:
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    buffer.seek(0)
    return buffer


def test_an_equinox_like_with_reordered_fields_and_other_static_data_is_refused():
    name = f"tests.like_static.{uuid.uuid4().hex[:8]}"

    class Block(eqx.Module):
        w: jax.Array
        b: jax.Array
        width: int = eqx.field(static=True)

    jaxstow.saveable(Block, name=name)
    buffer = _saved({"block": Block(jnp.full(2, 1.0), jnp.full(2, 2.0), width=3)})

    class Block(eqx.Module):  # the next version: b first
        b: jax.Array
        w: jax.Array
        width: int = eqx.field(static=True)

    jaxstow.saveable(Block, name=name)
    with pytest.raises(StructureMismatchError, match=r"'block': the file's Block has width=3, like's has width=5"):
        jaxstow.load(buffer, like={"block": Block(jnp.zeros(2), jnp.zeros(2), width=5)})
    buffer.seek(0)
    restored = jaxstow.load(buffer, like={"block": Block(jnp.zeros(2), jnp.zeros(2), width=3)})["block"]
    assert restored.w.tolist() == [1.0, 1.0] and restored.b.tolist() == [2.0, 2.0] and restored.width == 3


def test_a_registered_dataclass_like_with_reordered_fields_and_another_meta_field_is_refused():
    name = f"tests.like_static.{uuid.uuid4().hex[:8]}"

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "b"], meta_fields=["act"])
    @dataclasses.dataclass
    class Pair:
        w: Any
        b: Any
        act: Any

    jaxstow.saveable(Pair, name=name)
    buffer = _saved(Pair(jnp.full(2, 1.0), jnp.full(2, 2.0), jax.nn.relu))

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["b", "w"], meta_fields=["act"])
    @dataclasses.dataclass
    class Pair:  # type: ignore[no-redef]  # the next version: b first
        b: Any
        w: Any
        act: Any

    jaxstow.saveable(Pair, name=name)
    abstract = jax.ShapeDtypeStruct((2,), jnp.float32)
    with pytest.raises(StructureMismatchError, match=r"'': the file's Pair has act=.*, like's has act=<function gelu"):
        jaxstow.load(buffer, like=Pair(abstract, abstract, jax.nn.gelu))
    buffer.seek(0)
    restored = jaxstow.load(buffer, like=Pair(abstract, abstract, jax.nn.relu))
    assert restored.w.tolist() == [1.0, 1.0] and restored.b.tolist() == [2.0, 2.0] and restored.act is jax.nn.relu
