"""``sharding=`` as a tree, on restored trees holding None (saved so, or left by select=): each array lands where its
subtree says, and a tree that does not match is a ShardingError naming where."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from memory_files import saved_in_memory

import jaxstow
from jaxstow.errors import RequestError, ShardingError


@pytest.fixture(scope="module")
def devices():
    assert len(jax.devices()) >= 4, "tests/conftest.py asks for four CPU devices"
    return jax.devices()


def _tree():
    return {"a": [np.ones(2, np.float32), None, np.zeros(2, np.float32)], "b": np.arange(3.0)}


def _device_of(array):
    (device,) = array.devices()
    return device


def test_a_prefix_on_a_tree_holding_none(devices):
    restored = jaxstow.load(saved_in_memory(_tree()), sharding={"a": devices[1], "b": None})
    assert restored["a"][1] is None
    assert [_device_of(x) for x in (restored["a"][0], restored["a"][2])] == [devices[1], devices[1]]
    assert _device_of(restored["b"]) == jax.devices()[0]
    np.testing.assert_array_equal(restored["a"][0], np.ones(2, np.float32))


@pytest.mark.parametrize("at_none", [None, "device"])
def test_a_whole_tree_with_none_or_a_placement_where_the_tree_holds_none(devices, at_none):
    spec = {"a": [devices[1], None if at_none is None else devices[3], devices[2]], "b": devices[3]}
    restored = jaxstow.load(saved_in_memory(_tree()), sharding=spec)
    assert restored["a"][1] is None
    assert [_device_of(restored["a"][0]), _device_of(restored["a"][2]), _device_of(restored["b"])] == [
        devices[1],
        devices[2],
        devices[3],
    ]


def test_a_prefix_when_select_leaves_none_in_a_list(devices):
    saved = saved_in_memory({"layers": [np.full(2, float(i), np.float32) for i in range(3)]})
    restored = jaxstow.load(saved, select=["layers/1"], sharding={"layers": devices[2]})
    assert restored["layers"][0] is None and restored["layers"][2] is None
    assert _device_of(restored["layers"][1]) == devices[2]
    np.testing.assert_array_equal(restored["layers"][1], np.full(2, 1.0, np.float32))


@pytest.mark.parametrize(
    ("spec", "where", "words"),
    [
        (lambda d: {"a": [d, d], "b": d}, "a", r"a list of keys \['0', '1'\] where the restored tree's list has keys"),
        (lambda d: {"a": {"x": d}, "b": d}, "a", "a dict .* where the restored tree has a list"),
        (lambda d: {"a": [d, None, {"x": d}], "b": d}, "a/2", "a dict .* where the restored tree has a leaf"),
        (lambda d: {"a": d}, "", r"a dict of keys \['a'\] where the restored tree's dict has keys \['a', 'b'\]"),
    ],
)
def test_a_tree_that_does_not_match_names_where(devices, spec, where, words):
    with pytest.raises(ShardingError, match=f"is not a prefix of the restored tree here: it holds {words}") as raised:
        jaxstow.load(saved_in_memory(_tree()), sharding=spec(devices[1]))
    assert raised.value.path == where and isinstance(raised.value, RequestError)
