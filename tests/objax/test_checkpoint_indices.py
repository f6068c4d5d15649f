"""An Objax checkpoint's ``idx`` is a non-negative integer: a float, a bool or a negative number is refused, naming
the value, before anything is written, so that no other checkpoint is overwritten and no file is left that the
checkpoint never reads back."""

from __future__ import annotations

import os
import re

import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow.errors import ArgumentError
from jaxstow.objax import Checkpoint, TreeCheckpoint

BAD = [2.7, np.float64(1.9), -3, np.int64(-1), True, "4", jnp.zeros(2, jnp.int32)]


@pytest.mark.parametrize("idx", BAD, ids=repr)
def test_a_tree_checkpoint_refuses_an_index_that_is_no_non_negative_integer(tmp_path, idx):
    ckpt = TreeCheckpoint(tmp_path, keep_ckpts=3)
    ckpt.save({"w": np.full(2, 1.0)}, idx=1)
    with pytest.raises(ArgumentError, match="^idx must be a non-negative integer .*not " + re.escape(repr(idx)[:12])):
        ckpt.save({"w": np.full(2, 9.0)}, idx=idx)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["0000000001.npz"]
    tree, restored, _ = ckpt.restore()
    assert restored == 1 and tree["w"].tolist() == [1.0, 1.0]
    with pytest.raises(ArgumentError, match=r"^idx must be a non-negative integer"):
        ckpt.restore(idx=idx)


def test_numpy_and_python_integers_are_indices(tmp_path):
    ckpt = TreeCheckpoint(tmp_path, keep_ckpts=3)
    for idx in (0, np.int64(2), np.uint8(3), 4):
        ckpt.save({"w": np.full(2, float(idx))}, idx=idx)
    assert ckpt.indices() == [2, 3, 4]
    tree, idx, path = ckpt.restore(idx=np.int32(3))
    assert idx == 3 and type(idx) is int and path.endswith("0000000003.npz") and tree["w"].tolist() == [3.0, 3.0]


class _Var:
    def __init__(self, value):
        self.value = value

    def assign(self, value, check=True):
        self.value = value


def test_a_checkpoint_of_variables_refuses_them_too(tmp_path):
    ckpt = Checkpoint(tmp_path, keep_ckpts=2, verbose=False)
    ckpt.save({"(Linear).w": _Var(jnp.ones(2))}, 1)
    with pytest.raises(ArgumentError, match=r"^idx must be a non-negative integer .*not 1\.5"):
        ckpt.save({"(Linear).w": _Var(jnp.zeros(2))}, 1.5)
    with pytest.raises(ArgumentError, match="not -1"):
        ckpt.restore({"(Linear).w": _Var(jnp.zeros(2))}, idx=-1)
    model = {"(Linear).w": _Var(jnp.zeros(2))}
    assert ckpt.restore(model)[0] == 1 and model["(Linear).w"].value.tolist() == [1.0, 1.0]
