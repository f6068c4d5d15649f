"""Pytrees as plain dicts of dicts, with one rule per node type.

A rule turns a node into ``(key, child)`` pairs. Rules exist for dicts, lists (``list_element_0``, ...), tuples,
namedtuples (by field name), equinox Modules (by field name) and flax ``FrozenDict``; register more with
:func:`register_dictionize_rule`. The collectors name stored leaves by these keys.

>>> from collections import namedtuple
>>> from jaxstow import io
>>> Point = namedtuple("Point", ["y", "x"])
>>> io.pytree_to_dict({"p": Point(y=1.0, x=2.0), "ws": (3.0,)})
{'p': {'y': 1.0, 'x': 2.0}, 'ws': {'list_element_0': 3.0}}
>>> io.pytree_dict_keys({"p": Point(y=1.0, x=2.0), "ws": (3.0,)})
[('p', 'y'), ('p', 'x'), ('ws', 'list_element_0')]
"""

from __future__ import annotations

import builtins
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from jaxstow._format.keypaths import key_to_str
from jaxstow.errors import ArgumentError, JaxstowError, StructureMismatchError, excerpt

__all__ = ["dict_to_pytree", "joined_names", "pytree_dict_keys", "pytree_to_dict", "register_dictionize_rule"]

Rule = Callable[[Any], Iterable[tuple[Any, Any]]]
Keys = tuple[Any, ...]

_rules: dict[type, Rule] = {}


def register_dictionize_rule(type: type) -> Callable[[Rule], Rule]:
    """Decorator to define the rule that transforms a pytree node of ``type`` into a dict, as jax_sgmc's does.

    The rule of the most specific registered base class of a node applies.

    Args:
        type: The node's class, registered as a jax pytree node.

    Returns:
        A decorator of the rule, a function from a node to ``(key, child)`` pairs in jax's flattening order.

    A rule registered again for ``type`` (a notebook cell run again) replaces the earlier one, with a warning.

    >>> from jaxstow import io
    >>> from jax.tree_util import register_pytree_node
    >>> class SomeClass:
    ...   def __init__(self, value):
    ...     self._value = value
    >>> register_pytree_node(SomeClass, lambda sc: (sc._value, None), lambda _, data: SomeClass(value=data))
    >>> @io.register_dictionize_rule(SomeClass)
    ... def some_class_to_dict(instance_of_some_class):
    ...   return [("this_is_the_key", instance_of_some_class._value)]
    >>> print(io.pytree_to_dict(SomeClass({'a': 0.0, 'b': 0.5})))
    {'this_is_the_key': {'a': 0.0, 'b': 0.5}}
    """

    if not isinstance(type, builtins.type):
        raise ArgumentError(f"register_dictionize_rule takes the class of a pytree node, not {excerpt(type)}")

    def register(rule: Rule) -> Rule:
        previous = _rules.get(type)
        _rules[type] = rule
        if previous is not None and previous is not rule:  # a notebook cell run again: the newer rule wins
            warnings.warn(
                f"jaxstow.io.register_dictionize_rule: the rule for {type.__module__}.{type.__qualname__} was "
                f"{previous.__qualname__} and now is {rule.__qualname__}",
                stacklevel=2,
            )
        return rule

    return register


def _rule_for(node: Any) -> Rule:
    for attempt in range(2):
        for cls in type(node).__mro__:
            rule = _rules.get(cls)
            if rule is not None:
                return rule
        if attempt == 0:
            _register_library_rules()
    name = type(node).__qualname__
    raise ArgumentError(
        f"cannot turn a {name} node into a dict: register a rule with @jaxstow.io.register_dictionize_rule({name})"
    )


def _pairs(node: Any) -> list[tuple[Any, Any]]:
    """What the rule for ``node`` gives, checked to be ``(key, child)`` pairs: a rule's mistake is named with it."""
    rule = _rule_for(node)
    try:
        pairs = list(rule(node))
        if all(isinstance(pair, tuple | list) and len(pair) == 2 for pair in pairs):
            return [(key, child) for key, child in pairs]
        problem = f"gave {excerpt(pairs)}"
    except JaxstowError:
        raise
    except Exception as error:
        problem = f"raised {type(error).__name__}: {error}"
    raise ArgumentError(
        f"the dictionize rule for {type(node).__qualname__} ({getattr(rule, '__qualname__', rule)}) {problem}: a "
        "rule returns (key, child) pairs, one for each child in jax's flattening order"
    )


def pytree_to_dict(tree: Any) -> Any:
    """Constructs a dictionary from a pytree.

    Transforms each node of a pytree to a dict by applying the registered rules; leaves stay as they are.

    Raises:
        ArgumentError: A node has no rule (register one with :func:`register_dictionize_rule`).
        ArgumentError: A rule gives two children the same key.

    >>> from jaxstow import io
    >>> some_tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
    >>> as_dict = io.pytree_to_dict(some_tree)
    >>> print(as_dict)
    {'a': 0.0, 'b': {'b1': {'list_element_0': 0.0, 'list_element_1': 0.1}, 'b2': 0.0}}
    """
    try:
        structure = jax.tree_util.tree_structure(tree)
    except (TypeError, ValueError) as error:  # a dict of keys that do not sort together, say
        raise ArgumentError(f"jax cannot take this tree apart ({error}); its dicts' keys must sort together") from None
    if jax.tree_util.treedef_is_leaf(structure):
        return tree
    if not jax.tree_util.tree_leaves(tree):
        return {}
    as_dict: dict[Any, Any] = {}
    for key, child in _pairs(tree):
        if key in as_dict:
            raise ArgumentError(
                f"the dictionize rule for {type(tree).__qualname__} gives two children the key {key!r}: give each "
                "child a key of its own"
            )
        as_dict[key] = pytree_to_dict(child)
    return as_dict


def joined_names(keys: Sequence[Keys], separator: str) -> list[str]:
    """Each leaf's keys (as :func:`pytree_dict_keys` gives them) joined by ``separator``: the names the collectors
    (``/``) and the readers of samples (``.``) give the leaves.

    Raises:
        ArgumentError: Two leaves get one name, which would hold only one of them.

    >>> joined_names([("layer", "bias"), ("w",)], ".")
    ['layer.bias', 'w']
    >>> joined_names([("layer.bias",), ("layer", "bias")], ".")
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: the sample leaves ('layer.bias',) and ('layer', 'bias') are both named 'layer.bias' ...
    """
    names = [separator.join(str(key) for key in leaf) for leaf in keys]
    first: dict[str, Keys] = {}
    for leaf, name in zip(keys, names, strict=True):
        if first.setdefault(name, leaf) is not leaf:
            raise ArgumentError(
                f"the sample leaves {first[name]} and {leaf} are both named {name!r} (their dict keys joined by "
                f"{separator!r}), which holds one of them only: rename the keys of one of them"
            )
    return names


def pytree_dict_keys(tree: Any) -> list[Keys]:
    """Returns a list of keys to access the leaves of the tree.

    Returns:
        One tuple per leaf of ``jax.tree_util.tree_leaves(tree)``: the keys that lead to it in
        ``pytree_to_dict(tree)``.

    >>> from jaxstow import io
    >>> io.pytree_dict_keys({"a": [0.0, 1.0], "b": 2.0})
    [('a', 'list_element_0'), ('a', 'list_element_1'), ('b',)]
    """
    treedef: PyTreeDef = jax.tree_util.tree_structure(tree)
    numbered = pytree_to_dict(treedef.unflatten(range(treedef.num_leaves)))
    found: dict[int, Keys] = {}

    def walk(node: Any, keys: Keys) -> None:
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, (*keys, key))
        elif isinstance(node, int):
            found[node] = keys

    walk(numbered, ())
    if len(found) != treedef.num_leaves:
        raise ArgumentError(
            f"the dictionize rules account for {len(found)} of the {treedef.num_leaves} leaves of {treedef}; "
            "a rule must return every child of its node"
        )
    return [found[index] for index in range(treedef.num_leaves)]


def dict_to_pytree(pytree_as_dict: dict[Any, Any], target: Any) -> Any:
    """Restores the original tree structure given by the target from a dict.

    Works on subtrees too, as long as the subtree of the dict matches the subtree of the target.

    Raises:
        StructureMismatchError: Entries of ``target`` are missing from the dict (all of them named at once).

    >>> from jaxstow import io
    >>> some_tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
    >>> as_dict = io.pytree_to_dict(some_tree)
    >>> sub_pytree = io.dict_to_pytree(as_dict['b'], some_tree['b'])
    >>> print(sub_pytree)
    {'b1': [0.0, 0.1], 'b2': 0.0}
    """
    leaves, problems = [], []
    for keys in pytree_dict_keys(target):
        node: Any = pytree_as_dict
        for depth, key in enumerate(keys):
            if not isinstance(node, Mapping) or key not in node:  # a dict, or an h5py group read back
                where = "/".join(str(k) for k in keys[:depth]) or "the top level"
                found = "" if isinstance(node, Mapping) else f" (a {type(node).__name__} is there, not a dict)"
                problems.append(f"{'/'.join(str(k) for k in keys)!r}: no key {key!r} at {where}{found}")
                break
            node = node[key]
        else:
            if isinstance(node, Mapping):
                problems.append(f"{'/'.join(map(str, keys))!r}: a dict ({list(node)[:4]}), where the target has a leaf")
        leaves.append(node)
    if problems:
        raise StructureMismatchError(problems, file="the dict")
    treedef: PyTreeDef = jax.tree_util.tree_structure(target)
    return treedef.unflatten(leaves)


@register_dictionize_rule(dict)
def _dict_to_dict(node: dict[Any, Any]) -> Iterable[tuple[Any, Any]]:
    return node.items()


@register_dictionize_rule(list)
def _list_to_dict(node: list[Any]) -> Iterable[tuple[Any, Any]]:
    return ((f"list_element_{index}", value) for index, value in enumerate(node))


@register_dictionize_rule(tuple)
def _tuple_to_dict(node: tuple[Any, ...]) -> Iterable[tuple[Any, Any]]:
    if hasattr(node, "_fields"):
        return zip(node._fields, node, strict=True)
    return _list_to_dict(list(node))


def _keyed_children(node: Any) -> Iterable[tuple[Any, Any]]:
    """A node's children, each under its own jax key (field name or dict key)."""
    children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda child: child is not node)
    return [(key_to_str(path[0]), child) for path, child in children]


# Rules for node types of optional libraries, registered once the library has been imported.
_LIBRARY_RULES: tuple[tuple[str, str, Rule], ...] = (
    ("equinox", "Module", _keyed_children),
    ("flax.core.frozen_dict", "FrozenDict", _keyed_children),
)


def _register_library_rules() -> None:
    for module_name, attribute, rule in _LIBRARY_RULES:
        node_type = getattr(sys.modules.get(module_name), attribute, None)
        if isinstance(node_type, type) and node_type not in _rules:
            _rules[node_type] = rule
