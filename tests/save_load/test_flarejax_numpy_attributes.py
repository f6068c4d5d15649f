"""A FlareJax module holding a numpy array: FlareJax keeps it out of the tree, where a file keeps JSON only."""

from __future__ import annotations

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import UnsaveableObjectError

flr = pytest.importorskip("flarejax")
jnp = pytest.importorskip("jax").numpy


@jaxstow.saveable("tests.flarejax.Standardize")
class Standardize(flr.Module):
    def __init__(self, mean, scale):
        self.mean = mean
        self.scale = scale

    def __call__(self, x):
        return (x - self.mean) / self.scale


def test_the_refusal_says_how_to_hold_the_array_and_the_advice_works(tmp_path):
    path = tmp_path / "model.npz"
    with pytest.raises(UnsaveableObjectError, match=r"in a FlareJax module, hold jnp\.asarray\(array\)") as caught:
        jaxstow.save(Standardize(np.arange(3.0), np.full(3, 2.0)), path)
    assert str(path) in str(caught.value) and (
        "leaf 'mean'" in str(caught.value) or "leaf 'scale'" in str(caught.value)
    )
    assert not path.exists()

    jaxstow.save(Standardize(jnp.asarray(np.arange(3.0)), jnp.asarray(np.full(3, 2.0))), path)
    loaded = jaxstow.load(path)
    assert type(loaded) is Standardize
    np.testing.assert_array_equal(loaded(jnp.ones(3)), (np.ones(3) - np.arange(3.0)) / 2.0)
