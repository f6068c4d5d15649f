"""A ``like`` that holds a subtree of the saved tree at the root (the encoder's template for a whole checkpoint): the
error says where in the file its leaves are, and how to give ``like`` there, which restores."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError


def test_a_subtree_given_at_the_root_is_told_where_it_belongs(tmp_path):
    path = tmp_path / "ckpt.jxs"
    state = {"params": {"encoder": {"w": np.ones((8, 4), np.float32)}, "decoder": {"w": np.zeros((4, 8), np.float32)}}}
    jaxstow.save(path, {**state, "step": 7})
    encoder = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    with pytest.raises(StructureMismatchError) as caught:
        jaxstow.load(path, like=encoder, partial=True)
    assert caught.value.problems == [
        "'w': missing from the file (expected float32[8, 4])",
        "like's leaves are all in the file below 'params/decoder' or 'params/encoder': give like at its place, such "
        "as {'params': {'decoder': like}}, with partial=True",
    ]
    restored = jaxstow.load(path, like={"params": {"encoder": encoder}}, partial=True)
    assert restored["params"]["encoder"]["w"].tolist() == state["params"]["encoder"]["w"].tolist()


def test_leaves_missing_for_other_reasons_get_no_such_note(tmp_path):
    path = tmp_path / "ckpt.jxs"
    jaxstow.save(path, {"a": {"w": np.ones(2)}, "b": {"v": np.ones(2)}})
    with pytest.raises(StructureMismatchError) as caught:  # w and v are in two subtrees, not below one
        jaxstow.load(path, like={"w": np.zeros(2), "v": np.zeros(2)}, partial=True)
    assert not any("below" in problem for problem in caught.value.problems)
