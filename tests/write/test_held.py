"""A tree held for a save that finishes later: what the caller does to its arrays after ``hold`` does not change what
is written, and errors in the tree surface when it is encoded, on the writer's side."""

from __future__ import annotations

import dataclasses
import functools
import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._write.held import hold
from jaxstow.errors import UnsaveableObjectError


def _written(held) -> dict:
    buffer = io.BytesIO()
    held.encode().write(buffer)
    buffer.seek(0)
    return jaxstow.load(buffer)


def test_arrays_donated_after_hold_are_written_as_they_were():
    params = {"w": jnp.arange(4.0), "b": jnp.ones(2)}
    held = hold(params)
    step = jax.jit(lambda tree: jax.tree.map(lambda x: x + 1, tree), donate_argnums=0)
    updated = step(params)  # the donated buffers may be reused by the update
    np.testing.assert_array_equal(updated["w"], [1.0, 2.0, 3.0, 4.0])
    written = _written(held)
    np.testing.assert_array_equal(written["w"], [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(written["b"], [1.0, 1.0])


def test_copy_holds_numpy_buffers_as_they_are_at_hold():
    weights = np.zeros(3, np.float32)
    copied = hold({"w": weights}, copy=True)
    weights[:] = 5
    np.testing.assert_array_equal(_written(copied)["w"], np.zeros(3))


def test_typed_prng_keys_are_held_as_keys():
    key = jax.random.key(7)
    written = _written(hold({"key": key, "keys": jax.random.split(key, 3)}))
    assert jax.dtypes.issubdtype(written["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(written["key"]), jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.key_data(written["keys"]), jax.random.key_data(jax.random.split(key, 3)))


class _Model(eqx.Module):
    w: jax.Array
    sizes: list = eqx.field(static=True)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w"], meta_fields=["tags"])
@dataclasses.dataclass
class _Tagged:
    w: jax.Array
    tags: list

    def __post_init__(self) -> None:  # a class that checks its arrays: never to be rebuilt around host copies
        if isinstance(self.w, np.ndarray):
            raise TypeError(f"w must be a jax.Array, got {type(self.w).__name__}")


def _act(x: jax.Array, scales: list | None = None) -> jax.Array:
    return x


jaxstow.saveable(_Tagged, name="tests.held.Tagged")
jaxstow.saveable(_act, name="tests.held.act")


def test_static_data_and_values_changed_after_hold_are_written_as_they_were():
    tree = {"model": _Model(jnp.ones(2), [16, 16]), "tagged": _Tagged(jnp.ones(2), ["a"])}
    tree["act"] = functools.partial(_act, scales=[1.0])
    held = hold(tree)
    tree["model"].sizes.append(99)  # the caller goes on changing its objects once save returned
    tree["tagged"].tags.append("changed")
    tree["act"].keywords["scales"].append(2.0)
    written = _written(held)  # and the class that refuses numpy arrays was not rebuilt around them
    assert written["model"].sizes == [16, 16] and written["tagged"].tags == ["a"]
    assert written["act"].keywords["scales"] == [1.0]


def test_an_unsaveable_leaf_is_refused_when_encoded_not_when_held():
    held = hold({"w": jnp.ones(2), "act": {"f": lambda x: x}}, file="run/7/params.safetensors")
    with pytest.raises(UnsaveableObjectError, match=r"cannot save leaf 'act/f' of run/7/params\.safetensors") as caught:
        held.encode()
    assert caught.value.file == "run/7/params.safetensors"


def test_sharded_keys_and_int4_arrays_donated_after_hold_are_written_as_they_were():
    """numpy cannot view their buffers (its arrays of them are copies): the save holds copies of its own."""
    mesh = jax.make_mesh((4,), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    make = jax.jit(
        lambda: {"keys": jax.random.split(jax.random.key(3), 8), "q": jnp.arange(32, dtype=jnp.int4).reshape(8, 4)},
        out_shardings=sharding,
    )
    state = make()
    expected = {"keys": np.asarray(jax.random.key_data(state["keys"])), "q": np.asarray(state["q"])}
    held = hold(state)
    step = jax.jit(lambda state: {"keys": state["keys"], "q": state["q"] + 1}, donate_argnums=0)
    jax.block_until_ready(step(state))
    assert state["q"].is_deleted()  # donated
    written = _written(held)
    np.testing.assert_array_equal(jax.random.key_data(written["keys"]), expected["keys"])
    np.testing.assert_array_equal(np.asarray(written["q"]), expected["q"])
