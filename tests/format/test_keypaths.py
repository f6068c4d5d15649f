"""A leaf's path in a file is the same whether the save reads it off a structure of plain containers or asks jax."""

from __future__ import annotations

import collections

import equinox as eqx
import jax
import numpy as np
import pytest

from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._format.manifest import container_paths
from jaxstow._format.skeleton import encode_treedef
from jaxstow._write.encoded import encode_tree

Point = collections.namedtuple("Point", ["x", "y"])
TREES = {
    "nested dicts": {"b": {"y": np.ones(1), "x": 2}, "a": [np.zeros(2), None, (3, {"k": 4.0})]},
    "int and bool keys": {1: np.ones(1), 0: {True: 2, False: 3}},
    "keys with slashes and spaces": {"a/b": 1, "c d": {"": 2}},
    "an empty key at the root": {"": {"c": np.ones(2), "": 1}, "d": 3},
    "empty containers": {"a": {}, "b": [], "c": (), "d": None, "e": 1},
    "a bare leaf": np.ones(3),
    "a tuple of lists": ([1, 2], [3]),
}
FOREIGN = {
    "a namedtuple": {"p": Point(np.ones(1), 2)},
    "a float key": {0.5: 1, 1.5: 2},
    "an equinox module": {"layer": eqx.nn.Linear(2, 3, key=jax.random.key(0))},
}


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
def test_plain_containers_give_jaxs_paths(tree):
    structure = encode_treedef(jax.tree_util.tree_structure(tree))
    assert container_paths(structure) == flatten_with_paths(tree)[0]
    assert [leaf.entry["path"] for leaf in encode_tree(tree).leaves] == flatten_with_paths(tree)[0]


@pytest.mark.parametrize("tree", FOREIGN.values(), ids=FOREIGN.keys())
def test_other_nodes_leave_the_paths_to_jax(tree):
    assert container_paths(encode_treedef(jax.tree_util.tree_structure(tree))) is None
    assert [leaf.entry["path"] for leaf in encode_tree(tree).leaves] == flatten_with_paths(tree)[0]


def test_an_empty_key_at_the_root_restores_onto_its_own_like(tmp_path):
    import jaxstow

    tree = {"": {"c": np.arange(2.0)}, "d": np.ones(1)}
    jaxstow.save(tmp_path / "empty.jxs", tree)
    back = jaxstow.load(tmp_path / "empty.jxs", like=tree, as_numpy=True)
    np.testing.assert_array_equal(back[""]["c"], [0.0, 1.0])
