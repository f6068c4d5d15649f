"""Lazy reads refuse what they do not do (an array or list index, a boolean mask, a step of 0) with a SliceError
naming the leaf and the file and saying what is supported, and still take integers, slices and one '...'."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow.errors import SliceError

ARRAY = np.arange(12.0).reshape(3, 4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("slicing") / "model.jxs"
    jaxstow.save(path, {"w": ARRAY})
    return path


@pytest.mark.parametrize(
    ("index", "words"),
    [
        (np.array([0, 2]), "a numpy array picks elements one by one"),
        (np.array([True, False, True]), "a boolean mask picks elements one by one"),
        ((slice(None), np.array([1, 3])), "a numpy array picks elements one by one"),
        ((..., np.array([1, 3])), "a numpy array picks elements one by one"),
        ((np.array([0, 1]), ...), "a numpy array picks elements one by one"),
        ([0, 2], "a list picks elements one by one"),
        (np.s_[::0], "a slice's step cannot be 0"),
        (np.s_[1, ::0], "a slice's step cannot be 0"),
        (np.s_[0.5:], "bounds or a step that are not integers"),
        (None, r"None \(np.newaxis\) adds an axis"),
        (True, "is a boolean, not an integer"),
        (jnp.array([1]), "an array picks elements one by one"),
        (jnp.float32(1.0), r"Array\(1\., dtype=float32\) is not an integer"),
    ],
)
def test_an_unsupported_index_names_the_leaf_and_what_is_supported(saved, index, words):
    with jaxstow.open(saved) as reader, pytest.raises(SliceError, match=words) as raised:
        reader.read("w", index)
    assert raised.value.path == "w" and raised.value.file == str(saved)
    assert "only integers, slices and '...' select a part of a stored array" in str(raised.value)
    assert isinstance(raised.value, IndexError)


def test_supported_indices_still_read_what_numpy_picks(saved):
    with jaxstow.open(saved) as reader:
        for index in [np.s_[..., 1], np.s_[1, ...], np.s_[np.int64(2)], np.s_[::-2, 1:3], np.s_[...], np.s_[-1, ::3]]:
            np.testing.assert_array_equal(np.asarray(reader.read("w", index)), ARRAY[index])


def test_a_0d_integer_array_of_jax_or_numpy_reads_as_the_integer_it_holds(saved):
    # was: "Array(1, dtype=int32) is not an integer", for the index of a loop over jnp.arange or a jitted result
    with jaxstow.open(saved) as reader:
        for index in [jnp.int32(1), np.array(2), (jnp.array(-1), np.array(1)), np.s_[jnp.int32(0), 1:3]]:
            np.testing.assert_array_equal(np.asarray(reader.read("w", index)), ARRAY[index])
        with pytest.raises(SliceError, match=r"index 3 is out of bounds for axis 0 of shape \[3, 4\]"):
            reader.read("w", jnp.int32(3))


def test_two_ellipses_are_refused_beside_an_array(saved):
    with jaxstow.open(saved) as reader, pytest.raises(SliceError, match=r"one '\.\.\.'"):
        reader.read("w", (..., ...))
