"""Static objects of known libraries that a structure can hold, rebuilt from their fields: flax nnx's graph
definitions, and ``collections.Counter`` (a PyTorch ``MultiStepLR``'s state holds one).

A flax nnx ``Module`` keeps static data in its pytree structure, and ``nnx.split`` returns a ``GraphDef``, a tree
of frozen dataclasses: not data, and without a name of their own. :mod:`jaxstow._format.skeleton` stores them as
their type's name and their fields, and rebuilds them by calling the type with those fields. Only the types listed
here are ever called, only when flax is imported, and the classes they refer to must be flax's node or variable types.

>>> import io, jax, jaxstow
>>> from flax import nnx
>>> graphdef, state = nnx.split(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"graphdef": graphdef, "state": state}); _ = buffer.seek(0)
>>> restored = jaxstow.load(buffer)
>>> restored["graphdef"] == graphdef, nnx.merge(restored["graphdef"], restored["state"])(jax.numpy.ones(2)).shape
(True, (3,))
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from jaxstow._names import registry
from jaxstow._names.advice import import_advice
from jaxstow._names.repeated_keys import refuse_repeated
from jaxstow.errors import FormatError, UnknownNameError, UnsaveableObjectError, excerpt

__all__ = ["REBUILDABLE", "decode", "encode", "graph_path"]

#: The types rebuilt from their fields, by ``module.qualname``.
REBUILDABLE = (
    "collections.Counter",
    "flax.typing.HashableMapping",
    "flax.nnx.graphlib.GraphDef",
    "flax.nnx.graphlib.NodeDef",
    "flax.nnx.graphlib.VariableDef",
    "flax.nnx.graphlib.NodeRef",
    "flax.nnx.graphlib.Static",
    "flax.nnx.graphlib.ArrayRefDef",
    "flax.nnx.graphlib.IndexesPytreeDef",
)

JSON = Any
_TYPE_TAG = "nodetype"


def _imported(name: str) -> Any:
    """The object ``module.qualname`` names in an imported module, or ``None``; nothing is imported."""
    module_name, _, attribute = name.rpartition(".")
    module = sys.modules.get(module_name)
    return None if module is None else getattr(module, attribute, None)


def _name_of_type(cls: type) -> str | None:
    for name in REBUILDABLE:
        if _imported(name) is cls:
            return name
    return None


def encode(obj: Any, encode_value: Callable[[Any, str], JSON], *, file: str | None, path: str) -> JSON | None:
    """``obj`` as ``{"object": type name, "fields": [[field, value], ...]}``, or ``None`` if it is not rebuildable.

    ``encode_value(value, field)`` encodes a field's value; classes (a node's type) are stored by their name.
    """
    name = _name_of_type(type(obj))
    if name is None:
        return None
    if name == "flax.typing.HashableMapping":
        fields: dict[str, Any] = {"mapping": dict(obj)}
    elif name == "collections.Counter":  # a PyTorch MultiStepLR's milestones
        fields = {"counts": dict(obj)}
    elif dataclasses.is_dataclass(obj):
        fields = {field.name: getattr(obj, field.name) for field in dataclasses.fields(obj) if field.init}
    else:
        fields = obj._asdict()
    encoded = []
    for field, value in fields.items():
        if isinstance(value, type) and registry.name_of(value) is None:  # a node type of the user's
            try:
                encoded.append([field, {_TYPE_TAG: registry.type_name(value)}])
            except ValueError:  # a class with no module.qualname (defined inside a function)
                raise UnsaveableObjectError(value, file=file, path=f"{path}/{field}") from None
        else:
            encoded.append([field, encode_value(value, field)])
    return {"object": name, "fields": encoded}


def decode(data: JSON, decode_value: Callable[[JSON, str], Any], *, file: str | None, path: str) -> Any:
    """The object :func:`encode` described; ``decode_value(value, field)`` decodes a field's value."""
    name, fields = data.get("object"), data.get("fields")
    if name not in REBUILDABLE or not isinstance(fields, list):
        raise FormatError(f"{name!r} is not an object jaxstow rebuilds from its fields", file=file, path=path)
    cls = _imported(name)
    if cls is None:
        raise _not_imported(name, file=file, path=path)
    if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in fields):
        raise FormatError(f"unreadable fields of {name} {excerpt(fields)} in the structure", file=file, path=path)
    refuse_repeated([field for field, _ in fields], file=file, path=path)
    kwargs = {}
    for field, value in fields:
        if isinstance(value, dict) and set(value) == {_TYPE_TAG}:
            kwargs[field] = _node_type(value[_TYPE_TAG], file=file, path=f"{path}/{field}")
        else:
            kwargs[field] = decode_value(value, field)
    try:
        if name == "collections.Counter":  # its keyword arguments are counts: given as one dict
            if set(kwargs) != {"counts"} or not isinstance(kwargs["counts"], dict):
                raise TypeError(f"a Counter holds one field, counts, a dict, not {sorted(kwargs)}")
            return cls(kwargs["counts"])
        return cls(**kwargs)
    except TypeError as error:
        raise FormatError(f"cannot rebuild {name} from its fields ({error})", file=file, path=path) from None


def _node_type(name: str, *, file: str | None, path: str) -> type:
    """A flax node or variable type named in a graph definition; nothing else is accepted."""
    found = registry.lookup(name, node_type=True, file=file, path=path)
    graphlib, variables = sys.modules.get("flax.nnx.graphlib"), sys.modules.get("flax.nnx.variablelib")
    if graphlib is None or variables is None:
        raise _not_imported(name, file=file, path=path)
    if isinstance(found, type) and (graphlib.is_node_type(found) or issubclass(found, variables.Variable)):
        return found
    raise FormatError(f"{name!r} is not a flax nnx node or variable type", file=file, path=path)


def _not_imported(name: str, *, file: str | None, path: str) -> UnknownNameError:
    """``name``, of a flax module not imported in this process: import it."""
    missing = registry.not_imported([name])
    advice = import_advice(missing[0], missing) if missing else f"import {name.partition('.')[0]} first"
    return UnknownNameError(name, file=file, path=path, advice=advice, libraries=missing)


def graph_path(graphdef: Any, segments: list[str]) -> list[str] | None:
    """A place inside a graph definition as the attribute path it stands for.

    ``attributes/16/1/value``, the value of its 17th attribute, is ``model/linear/use_bias``; ``None`` if
    ``graphdef`` is not a graph definition or the place is elsewhere.

    >>> import optax
    >>> from flax import nnx
    >>> graphdef, _ = nnx.split(nnx.Optimizer(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), wrt=nnx.Param))
    >>> index = [key for key, _ in graphdef.attributes].index("tx")
    >>> graph_path(graphdef, ["attributes", str(index), "1", "value"])
    ['tx']
    """
    if _name_of_type(type(graphdef)) != "flax.nnx.graphlib.GraphDef" or segments[:1] != ["attributes"]:
        return None
    paths = _attribute_paths(graphdef.nodes, graphdef.attributes)
    if len(segments) < 2 or not segments[1].isdigit() or int(segments[1]) >= len(paths):
        return None
    rest = segments[2:]
    rest = rest[1:] if rest[:1] == ["1"] else rest  # the attribute's value, not its key
    rest = rest[1:] if rest[:1] == ["value"] else rest  # a static attribute's value
    return [*paths[int(segments[1])].split("/"), *rest]


def _attribute_paths(nodes: Any, attributes: Any) -> list[str]:
    """The path of each attribute of a graph definition.

    Its nodes and attributes are listed depth first, each node followed by its ``num_attributes`` attributes, and an
    attribute that is a node by that node's.
    """
    remaining = iter(nodes)
    root = next(remaining, None)
    stack = [("", getattr(root, "num_attributes", 0))]
    paths = []
    for key, value in attributes:
        while stack and stack[-1][1] == 0:
            stack.pop()
        if not stack:
            break
        prefix, left = stack[-1]
        stack[-1] = (prefix, left - 1)
        path = f"{prefix}/{key}" if prefix else str(key)
        paths.append(path)
        if type(value).__name__ == "NodeAttr":
            count = getattr(next(remaining, None), "num_attributes", None)
            if isinstance(count, int) and count > 0:
                stack.append((path, count))
    return paths
