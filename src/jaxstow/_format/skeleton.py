"""A pytree's skeleton as JSON and back, so that a whole model can be rebuilt without a template.

The skeleton is jax's own tree structure: every node's type by its registered name (:mod:`jaxstow._names.registry`),
its auxiliary data (static fields, hyperparameters) and its children. Values that are not arrays, such as a layer's
width or its activation, are tagged JSON (docs/format.md, "The skeleton").

>>> import jax
>>> from jaxstow._format.skeleton import decode_treedef, decode_value, encode_treedef, encode_value
>>> encode_value((3, 0.5, float("nan"), jax.nn.relu))
{'tuple': [3, {'float': '0.5'}, {'float': 'nan'}, {'ref': 'jax.nn.relu'}]}
>>> treedef = jax.tree_util.tree_structure({"a": [1, None], "b": (2,)})
>>> encode_treedef(treedef)
{'dict': [['a', {'list': ['*', None]}], ['b', {'tuple': ['*']}]]}
>>> decode_treedef(encode_treedef(treedef)) == treedef
True
"""

from __future__ import annotations

import base64
import enum
import functools
import os
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format import objects
from jaxstow._format.attribute_paths import aux_path, join, renamed, renamed_child, replace_json
from jaxstow._format.dataclass_fit import check_dataclass_fit
from jaxstow._format.dict_order import check_dict_keys
from jaxstow._format.dtypes import dtype_from_name, name_of_dtype, unstored_dtype_advice
from jaxstow._format.json_values import MAX_NESTING, float_text, parse_float
from jaxstow._format.static_names import AUX_NAMES, check_static_names, with_static_names
from jaxstow._format.unbuilt_node import unbuilt_error
from jaxstow._format.unset_fields import refuse_unset_fields
from jaxstow._names import partials, registry, static_objects
from jaxstow._names.advice import unsaveable_advice
from jaxstow._names.repeated_keys import refuse_repeated
from jaxstow.errors import FormatError, JaxstowError, UnknownNameError, UnsaveableObjectError, excerpt

__all__ = ["NAME_TAGS", "decode_treedef", "decode_value", "encode_treedef", "encode_value"]

_LEAF = jax.tree_util.tree_structure(0)
_NONE = jax.tree_util.tree_structure(None)
_REGISTRY = jax.tree_util.default_registry
#: ``PyTreeDef.from_node_data_and_children`` (jax 0.4.36 and newer; ``make_...`` before).
_FROM_NODE_DATA = getattr(PyTreeDef, "from_node_data_and_children", None) or PyTreeDef.make_from_node_data_and_children
#: What malformed JSON of the right syntax can make decoding raise (binascii's errors are ValueErrors); each becomes a
#: :class:`FormatError`.
_DECODE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)

JSON = Any

#: The tags whose string names an object: a node type, a reference, a class, a partial's function, a graph's node type,
#: an enum member's class.
NAME_TAGS = frozenset({"node", "ref", "object", "func", "nodetype", "enum"})


def encode_value(obj: Any, *, path: str = "", file: str | None = None) -> JSON:
    """A non-array value (scalar, string, container, dtype, registered object) as tagged JSON."""
    kind = type(obj)
    if obj is None or kind is str or kind is int or kind is bool:  # not their subclasses: enums, numpy strings
        return obj
    if kind is float:
        return {"float": float_text(obj, path=path, file=file)}
    if kind is complex:
        return {"complex": [float_text(obj.real, path=path, file=file), float_text(obj.imag, path=path, file=file)]}
    if kind is bytes:
        return {"bytes": base64.b64encode(obj).decode("ascii")}
    prefix = f"{path}/" if path else ""
    if kind is tuple:
        return {"tuple": [encode_value(item, path=f"{prefix}{i}", file=file) for i, item in enumerate(obj)]}
    if kind is list:
        return {"list": [encode_value(item, path=f"{prefix}{i}", file=file) for i, item in enumerate(obj)]}
    if kind is dict:
        return {
            "dict": [
                [encode_value(key, path=path, file=file), encode_value(value, path=f"{prefix}{key}", file=file)]
                for key, value in obj.items()
            ]
        }
    if isinstance(obj, np.dtype):
        return {"dtype": _dtype_name(obj, path=path, file=file)}
    if kind is np.str_:
        return {"npstr": str(obj)}
    if isinstance(obj, np.generic):
        dtype = _dtype_name(obj.dtype, path=path, file=file, scalar=obj)
        return {"npscalar": dtype, "bytes": base64.b64encode(np.asarray(obj).tobytes()).decode("ascii")}
    if isinstance(obj, PyTreeDef):
        return {"treedef": encode_treedef(obj, path=path, file=file)}
    name = registry.name_of(obj)
    if name is not None:
        return {"ref": name}
    if isinstance(obj, enum.Enum):
        return objects.encode_member(obj, file=file, path=path)
    part = lambda value, field: encode_value(value, path=join(path, field), file=file)  # noqa: E731
    if kind is functools.partial:
        return partials.encode(obj, part, file=file, path=path)
    rebuildable = static_objects.encode(obj, part, file=file, path=path)
    if rebuildable is not None:
        return rebuildable
    class_name = registry.attribute_class_name(kind)
    if class_name is None:
        raise UnsaveableObjectError(
            obj, file=file, path=path, advice=unsaveable_advice(obj, registry.refused_object(obj))
        )
    return objects.encode_attributes(obj, class_name, part, file=file, path=path)


def _dtype_name(dtype: np.dtype, *, path: str, file: str | None, scalar: np.generic | None = None) -> str:
    """The table's name of ``dtype``: a value's own, or the dtype of the numpy ``scalar`` that is the value."""
    name = name_of_dtype(dtype)
    if name is None and scalar is not None:
        raise UnsaveableObjectError(scalar, file=file, path=path, advice=unstored_dtype_advice(dtype, "a numpy scalar"))
    if name is None:
        advice = "a dtype outside the table of those a file stores (docs/format.md): save its name, str(dtype)"
        raise UnsaveableObjectError(dtype, file=file, path=path, advice=advice)
    return name


def decode_value(data: JSON, *, path: str = "", file: str | None = None) -> Any:
    """The value :func:`encode_value` wrote; names are looked up in the registry, nothing is imported or run."""
    return _decode_checked(data, path=path, file=file, depth=0)


def _decode_checked(data: JSON, *, path: str, file: str | None, depth: int) -> Any:
    if depth > MAX_NESTING:
        raise FormatError(f"the structure nests deeper than {MAX_NESTING} JSON levels", file=file, path=path)
    try:
        return _decode_value(data, path=path, file=file, depth=depth)
    except JaxstowError:
        raise
    except _DECODE_ERRORS as error:
        raise FormatError(
            f"unreadable value {excerpt(data)} in the structure ({error})", file=file, path=path
        ) from None


#: The tagged values written with a second member, and its name: every other tag stands alone.
_SECOND_MEMBERS = {"npscalar": ("bytes",), "enum": ("member",), "object": ("attrs", "fields")}


def _decode_value(data: JSON, *, path: str, file: str | None, depth: int) -> Any:
    if data is None or isinstance(data, bool | str | int):
        return data
    if isinstance(data, dict) and len(data) in (1, 2):
        tag = next(iter(data))
        if len(data) == 2 and not any(member in data for member in _SECOND_MEMBERS.get(tag, ())):
            raise FormatError(f"unreadable value {excerpt(data)} in the structure", file=file, path=path)
        if tag == "float" and isinstance(data[tag], str):
            return parse_float(data[tag], path=path, file=file)
        if tag == "complex":
            real, imag = data[tag]
            return complex(parse_float(real, path=path, file=file), parse_float(imag, path=path, file=file))
        if tag == "bytes":
            return base64.b64decode(data[tag], validate=True)
        if tag in ("tuple", "list", "dict"):
            return _decode_container(tag, data[tag], path=path, file=file, depth=depth)
        if tag == "dtype":
            return _parse_dtype(data[tag], path=path, file=file)
        if tag == "npstr" and isinstance(data[tag], str) and len(data) == 1:
            return np.str_(data[tag])
        if tag == "enum":
            return objects.decode_member(data, file=file, path=path)
        if tag == "npscalar":
            dtype = _parse_dtype(data[tag], path=path, file=file)
            raw = base64.b64decode(data["bytes"], validate=True)
            if len(raw) != dtype.itemsize:
                raise FormatError(
                    f"a {dtype} scalar needs {dtype.itemsize} bytes, not {len(raw)}", file=file, path=path
                )
            return np.frombuffer(raw, dtype=dtype)[0]
        if tag == "treedef":
            return _checked_treedef(data[tag], path=path, file=file, depth=depth + 1)
        if tag == "ref" and isinstance(data[tag], str):
            return registry.lookup(data[tag], file=file, path=path)
        fields = lambda value, field: _decode_checked(value, path=join(path, field), file=file, depth=depth + 3)  # noqa: E731
        if tag == "object" and isinstance(data.get("attrs"), list):
            return objects.rebuild(data[tag], data["attrs"], fields, file=file, path=path)
        if tag == "partial":
            return partials.decode(data, fields, file=file, path=path)
        if tag == "object":
            return static_objects.decode(data, fields, file=file, path=path)
    raise FormatError(f"unreadable value {excerpt(data)} in the structure", file=file, path=path)


def _decode_container(tag: str, items: JSON, *, path: str, file: str | None, depth: int) -> Any:
    """A tuple, list or dict of values (a dict's as ``[key, value]`` pairs): a JSON array, as the format says."""
    pairs = tag != "dict" or all(isinstance(item, list) and len(item) == 2 for item in items)
    if not isinstance(items, list) or not pairs:
        raise FormatError(f"a {tag} of {excerpt(items)}, which is no array of its items", file=file, path=path)
    prefix = f"{path}/" if path else ""
    if tag == "tuple":
        return tuple(
            _decode_checked(item, path=f"{prefix}{i}", file=file, depth=depth + 2) for i, item in enumerate(items)
        )
    if tag == "list":
        return [_decode_checked(item, path=f"{prefix}{i}", file=file, depth=depth + 2) for i, item in enumerate(items)]
    keys = [_decode_checked(key, path=path, file=file, depth=depth + 3) for key, _ in items]
    refuse_repeated(keys, file=file, path=path)
    return {
        key: _decode_checked(value, path=f"{prefix}{key}", file=file, depth=depth + 3)
        for key, (_, value) in zip(keys, items, strict=True)
    }


def _parse_dtype(name: str, *, path: str, file: str | None) -> np.dtype:
    dtype = dtype_from_name(name) if isinstance(name, str) else None
    if dtype is None:
        raise FormatError(f"unknown dtype {excerpt(name)}", file=file, path=path)
    return dtype


def encode_treedef(treedef: PyTreeDef, *, path: str = "", file: str | None = None) -> JSON:
    """A jax tree structure as JSON: ``"*"`` for a leaf, ``None`` for ``None``, tagged nodes for the rest."""
    node_data = treedef.node_data()
    if node_data is None:
        return "*"
    node_type, aux = node_data
    children = treedef.children()
    if node_type is type(None):
        return None
    # Most children are leaves: they are answered here, without a call or a path.
    prefix = f"{path}/" if path else ""
    if node_type in (tuple, list):
        return {
            node_type.__name__: [
                "*" if _is_leaf(child) else encode_treedef(child, path=f"{prefix}{i}", file=file)
                for i, child in enumerate(children)
            ]
        }
    if node_type is dict:
        return {
            "dict": [
                [
                    key if type(key) is str else encode_value(key, path=path, file=file),
                    "*" if _is_leaf(child) else encode_treedef(child, path=f"{prefix}{key}", file=file),
                ]
                for key, child in zip(aux, children, strict=True)
            ]
        }
    try:
        name = registry.type_name(node_type)
    except ValueError:
        raise UnsaveableObjectError(node_type, file=file, path=path) from None
    count = len(children)
    try:
        encoded_aux = encode_value(aux, path=path, file=file)
    except JaxstowError as error:  # named after the attribute that holds the value, not its place in aux
        raise renamed(error, path, lambda parts: aux_path(node_type, aux, count, parts)) from None
    try:
        encoded_children = [
            "*" if _is_leaf(child) else encode_treedef(child, path=f"{prefix}{i}", file=file)
            for i, child in enumerate(children)
        ]
    except JaxstowError as error:  # named after the child's key, not its place among the children
        raise renamed_child(error, path, node_type, aux, count) from None
    return with_static_names({"node": name, "aux": encoded_aux, "children": encoded_children}, node_type, aux, count)


def _is_leaf(treedef: PyTreeDef) -> bool:
    return bool(treedef.num_leaves == 1 and treedef.num_nodes == 1)


_PLAIN_LEAF = object()


def _plain_treedef(data: Any, depth: int) -> PyTreeDef | None:
    """The tree structure of a well-formed encoded structure made only of dicts, lists, tuples and ``None``, the most
    common kind: the containers themselves around placeholder leaves, flattened by jax in one call.

    Well formed: dict keys plain strings or integers, sorted and unique as jax orders them, nesting within bounds
    (``depth`` JSON levels around it already). ``None`` otherwise, for the node-by-node decoder to build or to name what
    is wrong.

    >>> _plain_treedef({"dict": [["a", {"list": ["*", None]}], ["b", "*"]]}, 0)
    PyTreeDef({'a': [*, None], 'b': *})
    >>> _plain_treedef({"dict": [["b", "*"], ["a", "*"]]}, 0) is None  # not in jax's order
    True
    """
    try:
        containers = _container(data, depth)
    except _NotPlain:
        return None
    return jax.tree.structure(containers, is_leaf=_is_plain_leaf)


def _is_plain_leaf(node: Any) -> bool:
    return node is _PLAIN_LEAF


class _NotPlain(Exception):
    pass


def _container(data: Any, depth: int) -> Any:
    if data == "*":
        return _PLAIN_LEAF
    if data is None:
        return None
    if depth > MAX_NESTING or type(data) is not dict or len(data) != 1:
        raise _NotPlain
    [(tag, items)] = data.items()
    if type(items) is not list:
        raise _NotPlain
    if tag == "dict":
        if not (set(map(type, items)) <= {list} and set(map(len, items)) <= {2}):
            raise _NotPlain
        keys = [pair[0] for pair in items]
        kinds = set(map(type, keys))
        if not (kinds <= {str} or kinds <= {int}) or keys != sorted(keys) or len(set(keys)) != len(keys):
            raise _NotPlain
        return {key: _PLAIN_LEAF if child == "*" else _container(child, depth + 3) for key, child in items}
    if tag in ("list", "tuple"):
        children = [_PLAIN_LEAF if child == "*" else _container(child, depth + 2) for child in items]
        return children if tag == "list" else tuple(children)
    raise _NotPlain


def decode_treedef(data: JSON, *, path: str = "", file: str | None = None) -> PyTreeDef:
    """The tree structure :func:`encode_treedef` wrote. Only registered pytree node types are ever constructed.

    Every node is checked before it is built, nesting is bounded by :data:`~jaxstow._format.json_values.MAX_NESTING`
    (``depth`` counts the JSON levels around a node, as a save counts them), and the whole structure is
    unflattened once with placeholder leaves, so that a node type refusing its auxiliary data is a
    :class:`FormatError` here rather than a builtin error later.
    """
    return _checked_treedef(data, path=path, file=file, depth=0)


def _checked_treedef(data: JSON, *, path: str, file: str | None, depth: int) -> PyTreeDef:
    plain = _plain_treedef(data, depth)
    if plain is not None:  # dicts, lists, tuples and None only: built at once by jax itself
        return plain
    treedef = None
    try:
        treedef = _decode_treedef(data, path=path, file=file, depth=depth)
        built = treedef.unflatten([_PLACEHOLDER] * treedef.num_leaves)
    except JaxstowError:
        raise
    except Exception as error:  # a node type's own unflatten may raise anything on data it never wrote
        raise unbuilt_error(error, treedef, path=path, file=file) from None
    refuse_unset_fields(built, file=file, path=path)
    return treedef


_PLACEHOLDER = object()


def _decode_treedef(data: JSON, *, path: str, file: str | None, depth: int) -> PyTreeDef:
    if depth > MAX_NESTING:
        raise FormatError(f"the structure nests deeper than {MAX_NESTING} JSON levels", file=file, path=path)
    if data == "*":
        return _LEAF
    if data is None:
        return _NONE
    if isinstance(data, dict) and len(data) == 1 and isinstance(data.get("tuple", data.get("list")), list):
        node_type: type = tuple if "tuple" in data else list
        items = data[node_type.__name__]
        prefix = f"{path}/" if path else ""
        children = [_decode_treedef(c, path=f"{prefix}{i}", file=file, depth=depth + 2) for i, c in enumerate(items)]
        return _make(node_type, None, children, path=path, file=file)
    if isinstance(data, dict) and len(data) == 1 and _is_pair_list(data.get("dict")):
        keys = [_decode_checked(key, path=path, file=file, depth=depth + 3) for key, _ in data["dict"]]
        check_dict_keys(keys, file=file, path=path)
        prefix = f"{path}/" if path else ""
        children = [
            _decode_treedef(c, path=f"{prefix}{k}", file=file, depth=depth + 3)
            for k, (_, c) in zip(keys, data["dict"], strict=True)
        ]
        return _make(dict, keys, children, path=path, file=file)
    if isinstance(data, dict) and isinstance(data.get("node"), str) and isinstance(data.get("children"), list):
        node_type_obj = registry.lookup(data["node"], node_type=True, file=file, path=path)
        if not isinstance(node_type_obj, type):
            raise FormatError(
                f"{excerpt(data['node'])} names {node_type_obj!r}, not a pytree node type", file=file, path=path
            )
        return _decode_node(node_type_obj, data, path=path, file=file, depth=depth)
    raise FormatError(f"unreadable structure node {excerpt(data)}", file=file, path=path)


def _decode_node(node_type: type, data: JSON, *, path: str, file: str | None, depth: int) -> PyTreeDef:
    """A custom node; a problem inside it is named after the node's attribute, not its place in the structure."""
    count = len(data["children"])
    try:
        aux = _decode_checked(data.get("aux"), path=path, file=file, depth=depth + 1)
    except JaxstowError as error:
        raise _in_aux(error, node_type, data, path=path, file=file, depth=depth) from None
    prefix = f"{path}/" if path else ""
    try:
        children = [
            _decode_treedef(child, path=f"{prefix}{i}", file=file, depth=depth + 2)
            for i, child in enumerate(data["children"])
        ]
    except JaxstowError as error:
        raise renamed_child(error, path, node_type, aux, count) from None
    treedef = _make(node_type, aux, children, path=path, file=file)
    check_static_names(node_type, aux, count, data.get(AUX_NAMES), path=path, file=file)
    return treedef


def _in_aux(
    error: JaxstowError, node_type: type, data: JSON, *, path: str, file: str | None, depth: int
) -> JaxstowError:
    """An error in a node's auxiliary data, named after the attribute that holds the failing value.

    The attribute is found by decoding the data again with a marker in its place. An unknown name there is avoided by
    restoring with ``like``.
    """
    marker = {"bytes": base64.b64encode(os.urandom(12)).decode("ascii")}

    def rename(parts: list[str]) -> list[str] | None:
        try:
            marked = _decode_checked(
                replace_json(data.get("aux"), parts, marker), path=path, file=file, depth=depth + 1
            )
        except (JaxstowError, LookupError):
            return None
        return aux_path(node_type, marked, len(data["children"]), parts)

    note = (
        f"; or restore into a live {node_type.__name__} with like= (jaxstow.load(path, like=...)), whose own value "
        "is used here"
        if type(error) is UnknownNameError
        else ""
    )
    return renamed(error, path, rename, note=note)


def _is_pair_list(data: JSON) -> bool:
    return isinstance(data, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in data)


def _make(node_type: type, aux: Any, children: list[PyTreeDef], *, path: str, file: str | None) -> PyTreeDef:
    check_dataclass_fit(node_type, aux, len(children), path=path, file=file)
    try:
        return _FROM_NODE_DATA(_REGISTRY, (node_type, aux), children)
    except (TypeError, ValueError, RuntimeError) as error:
        raise FormatError(
            f"{node_type.__module__}.{node_type.__qualname__} is not a registered pytree node type here "
            f"(register it with jax.tree_util before loading): {error}",
            file=file,
            path=path,
        ) from None
