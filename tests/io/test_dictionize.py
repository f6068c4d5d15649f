"""Pytrees as dicts of dicts: the rules, key order, library node types, and errors."""

from __future__ import annotations

import warnings
from collections import OrderedDict, namedtuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import FrozenDict

from jaxstow import io
from jaxstow.errors import ArgumentError, StructureMismatchError

Stats = namedtuple("Stats", ["zeta", "alpha"])  # fields deliberately not in sorted order


def test_keys_follow_the_leaf_order_of_the_original_tree() -> None:
    tree = {"stats": Stats(zeta=1.0, alpha=2.0), "layers": [float(i) for i in range(12)]}
    keys = io.pytree_dict_keys(tree)
    leaves = jax.tree.leaves(tree)
    as_dict = io.pytree_to_dict(tree)
    for key, leaf in zip(keys, leaves, strict=True):
        node = as_dict
        for part in key:
            node = node[part]
        assert node == leaf
    assert keys[0] == ("layers", "list_element_0") and keys[11] == ("layers", "list_element_11")
    assert keys[12:] == [("stats", "zeta"), ("stats", "alpha")]


def test_dict_to_pytree_inverts_pytree_to_dict() -> None:
    tree = (Stats(zeta=jnp.ones(2), alpha=[3.0, {"deep": 4}]), OrderedDict(b=5.0, a=6.0))
    restored = io.dict_to_pytree(io.pytree_to_dict(tree), tree)
    assert jax.tree.structure(restored) == jax.tree.structure(tree)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(tree), strict=True):
        np.testing.assert_array_equal(got, want)


def test_dict_to_pytree_names_every_missing_key() -> None:
    target = {"a": 0.0, "b": {"b1": [0.0, 0.1]}}
    with pytest.raises(StructureMismatchError) as raised:
        io.dict_to_pytree({"a": 1.0, "b": {"b1": {"list_element_0": 2.0}}}, target)
    assert raised.value.problems == ["'b/b1/list_element_1': no key 'list_element_1' at b/b1"]
    with pytest.raises(StructureMismatchError, match="'a': no key 'a' at the top level"):
        io.dict_to_pytree({"b": {}}, {"a": 0.0})


def test_equinox_modules_and_flax_frozen_dicts_by_field_and_key() -> None:
    linear = eqx.nn.Linear(3, 2, key=jax.random.key(0))
    assert io.pytree_dict_keys(linear) == [("weight",), ("bias",)]
    assert io.pytree_dict_keys({"model": linear, "params": FrozenDict({"w": 1.0, "b": 2.0})}) == [
        ("model", "weight"),
        ("model", "bias"),
        ("params", "b"),
        ("params", "w"),
    ]
    restored = io.dict_to_pytree(io.pytree_to_dict(linear), linear)
    assert isinstance(restored, eqx.nn.Linear) and restored.in_features == 3
    np.testing.assert_array_equal(restored.weight, linear.weight)


def test_the_most_specific_rule_applies_and_the_newest_rule_of_a_type_wins() -> None:
    class Pair(tuple):  # a tuple subclass, registered as its own pytree node
        pass

    jax.tree_util.register_pytree_node(Pair, lambda pair: (tuple(pair), None), lambda _, children: Pair(children))

    @io.register_dictionize_rule(Pair)
    def pair_to_dict(pair: Pair):
        return zip(("first", "second"), pair, strict=True)

    assert io.pytree_to_dict(Pair((1.0, 2.0))) == {"first": 1.0, "second": 2.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        io.register_dictionize_rule(Pair)(pair_to_dict)  # the same rule again: nothing changes

    def renamed(pair: Pair):  # the cell defining the rule run again, changed
        return zip(("left", "right"), pair, strict=True)

    with pytest.warns(UserWarning, match=r"the rule for .*Pair was .*pair_to_dict and now is .*renamed"):
        io.register_dictionize_rule(Pair)(renamed)
    assert io.pytree_to_dict(Pair((1.0, 2.0))) == {"left": 1.0, "right": 2.0}


def test_unknown_node_types_and_incomplete_rules_are_errors() -> None:
    class Box:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jax.tree_util.register_pytree_node(Box, lambda box: ((box.a, box.b), None), lambda _, c: Box(*c))
    with pytest.raises(TypeError, match=r"cannot turn a .*Box node into a dict: register a rule"):
        io.pytree_to_dict({"box": Box(1.0, 2.0)})

    io.register_dictionize_rule(Box)(lambda box: [("a", box.a)])  # forgets b
    with pytest.raises(ArgumentError, match="account for 1 of the 2 leaves"):
        io.pytree_dict_keys(Box(1.0, 2.0))


def test_empty_subtrees_and_single_leaves() -> None:
    assert io.pytree_to_dict({"a": [None], "b": 1.0}) == {"a": {}, "b": 1.0}
    assert io.pytree_dict_keys(jnp.zeros(3)) == [()]


class _Node:
    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(_Node, lambda node: ((node.value,), None), lambda _, children: _Node(*children))


@pytest.mark.parametrize("gives", [5, [("a",)], ["ab", "cd", "ef"]], ids=["no pairs", "one of a pair", "strings"])
def test_a_rule_that_gives_no_key_child_pairs_is_named_with_what_it_must_give(gives):
    @io.register_dictionize_rule(_Node)
    def rule(node):
        return gives

    with pytest.raises(
        ArgumentError, match=r"the dictionize rule for _Node \(.*rule\) (gave|raised).*: a rule returns"
    ):
        io.pytree_to_dict(_Node(1.0))
    with pytest.raises(ArgumentError, match="takes the class of a pytree node, not 'notatype'"):
        io.register_dictionize_rule("notatype")
    with pytest.raises(ArgumentError, match="jax cannot take this tree apart"):
        io.pytree_to_dict({"b": 1.0, 2: 3.0})


def test_dict_to_pytree_takes_any_mapping_and_refuses_a_dict_where_the_target_has_a_leaf(tmp_path):
    # An h5py group (a collector's file read back) was "no key 'x'" though it held 'x'; a dict where the target has
    # a leaf was put there as the leaf.
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "samples.h5", "w") as file:
        file["chain~0/x"] = np.arange(3.0)
        tree = io.dict_to_pytree(file["chain~0"], {"x": 0.0})
        np.testing.assert_array_equal(tree["x"][()], np.arange(3.0))
    with pytest.raises(StructureMismatchError, match=r"'w': a dict \(\['w'\]\), where the target has a leaf"):
        io.dict_to_pytree({"w": {"w": np.arange(3)}, "b": np.ones(2)}, {"w": 0.0, "b": 0.0})
    with pytest.raises(StructureMismatchError, match=r"no key 'x' at the top level \(a int is there, not a dict\)"):
        io.dict_to_pytree(5, {"x": 0.0})
