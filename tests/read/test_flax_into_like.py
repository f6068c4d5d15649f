"""A flax msgpack file loaded into ``like`` whose containers flax keeps as dicts (a list of layers, an optax state's
tuple): each comes back as ``like``'s container, as ``flax.serialization.from_bytes(like, data)`` gives it; it was
refused ("the file has a dict, like has a tuple")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError

serialization = pytest.importorskip("flax.serialization")


def test_a_train_state_with_an_optax_state_loads_into_a_fresh_one(tmp_path):
    optax = pytest.importorskip("optax")
    nn = pytest.importorskip("flax.linen")
    from flax.training import train_state

    model = nn.Dense(3)

    def state(seed: int) -> train_state.TrainState:
        params = model.init(jax.random.key(seed), jnp.ones((1, 2)))
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    saved = state(0).replace(step=5)
    (tmp_path / "state.msgpack").write_bytes(serialization.to_bytes(saved))
    loaded = jaxstow.load(tmp_path / "state.msgpack", like=state(1), from_format="flax")
    assert isinstance(loaded, train_state.TrainState) and isinstance(loaded.opt_state, tuple)
    assert loaded.step == 5
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(got, want)


def test_lists_and_tuples_come_back_as_likes_and_a_like_that_does_not_fit_is_refused(tmp_path):
    path = tmp_path / "tree.msgpack"
    path.write_bytes(serialization.to_bytes({"layers": [np.ones(2, np.float32), np.zeros(3, np.float32)], "n": 2}))
    like = {"layers": [jnp.zeros(2), jnp.zeros(3)], "n": 0}
    loaded = jaxstow.load(path, like=like, from_format="flax", as_numpy=True)
    assert isinstance(loaded["layers"], list) and loaded["n"] == 2
    np.testing.assert_array_equal(loaded["layers"][0], np.ones(2))
    with pytest.raises(StructureMismatchError, match=r"'layers/1': the file has float32\[3\], expected float32\[4\]"):
        jaxstow.load(path, like={"layers": [jnp.zeros(2), jnp.zeros(4)], "n": 0}, from_format="flax")
    with pytest.raises(StructureMismatchError, match="'layers/1': in the file but not in the structure"):
        jaxstow.load(path, like={"layers": [jnp.zeros(2)], "n": 0}, from_format="flax")
