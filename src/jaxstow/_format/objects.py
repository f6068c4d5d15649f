"""Objects a file holds by their class's registered name: enum members, and instances saved by their attributes.

An enum member is its class's name and the member's name, and loads back as the very member, looked up by name in
the class (nothing is called). An instance of any other class registered with :func:`jaxstow.saveable` is its class's
name and its attributes, and loads as an instance made without calling ``__init__``, its attributes set one by one.

>>> import enum, jaxstow
>>> from jaxstow._format.objects import decode_member, encode_member
>>> @jaxstow.saveable(name="examples.Mode")
... class Mode(str, enum.Enum):
...     TRAIN = "train"
>>> encode_member(Mode.TRAIN, file=None, path="mode")
{'enum': 'examples.Mode', 'member': 'TRAIN'}
>>> decode_member(encode_member(Mode.TRAIN, file=None, path="mode"), file=None, path="mode") is Mode.TRAIN
True
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from jaxstow._format.attribute_paths import attributes, join
from jaxstow._format.init_attributes import always_set
from jaxstow._names import registry
from jaxstow._names.repeated_keys import refuse_repeated
from jaxstow.errors import FormatError, StructureMismatchError, UnsaveableObjectError, excerpt

__all__ = ["decode_member", "encode_attributes", "encode_member", "rebuild", "refuse_missing_fields"]

JSON = Any
Part = Callable[[Any, str], Any]
#: Builtin types whose subclasses' instances hold their value outside their attributes.
_VALUE_TYPES = (int, float, complex, str, bytes, tuple, list, dict)


def _is_dunder(name: str) -> bool:
    """Whether an attribute name is a dunder (``__x__``), which a file never holds."""
    return name.startswith("__") and name.endswith("__")


def encode_member(member: enum.Enum, *, file: str | None, path: str) -> JSON:
    """``member`` as ``{"enum": class name, "member": member name}``; its class must be registered."""
    cls = type(member)
    name = registry.name_of(cls)
    if name is None:
        raise UnsaveableObjectError(
            member,
            file=file,
            path=path,
            advice=f"a member of the enum {cls.__module__}.{cls.__qualname__}, which is not registered: register "
            f"the class with jaxstow.saveable({cls.__name__}, name=...) (or decorate it with @jaxstow.saveable), in "
            "the process that loads it too",
        )
    if cls.__members__.get(member.name) is not member:
        raise UnsaveableObjectError(
            member,
            file=file,
            path=path,
            advice=f"a combination of the flags of {name}, not one of its members: save its value, {member.value!r}, "
            f"and rebuild it with {cls.__name__}(value) after loading, or save the members as a tuple",
        )
    return {"enum": name, "member": member.name}


def decode_member(data: dict[str, Any], *, file: str | None, path: str) -> enum.Enum:
    """The member :func:`encode_member` described, looked up by its name in its registered class."""
    name, member = data["enum"], data.get("member")
    if not (isinstance(name, str) and isinstance(member, str) and len(data) == 2):
        raise FormatError(f"unreadable enum member {excerpt(data)} in the structure", file=file, path=path)
    cls = registry.lookup(name, file=file, path=path)
    if not isinstance(cls, enum.EnumType):
        raise FormatError(f"{excerpt(name)} names {cls!r}, not an enum class", file=file, path=path)
    found = cls.__members__.get(member)
    if found is None:
        raise FormatError(
            f"the enum {name} has no member {member!r} in this process (was it renamed since the file was saved?)",
            file=file,
            path=path,
        )
    return found


def encode_attributes(obj: object, class_name: str, encode_part: Part, *, file: str | None, path: str) -> JSON:
    """``obj``, of a class registered to be saved by its attributes, as ``{"object": class_name, "attrs": [...]}``.

    ``encode_part(value, attribute)`` encodes an attribute's value. An instance of a subclass of a builtin value
    (``int``, ``str``, ``tuple``...), whose value is not among its attributes, and an attribute that is a dunder are
    refused.
    """
    if isinstance(obj, _VALUE_TYPES):
        base = next(kind for kind in _VALUE_TYPES if isinstance(obj, kind))
        raise UnsaveableObjectError(
            obj,
            file=file,
            path=path,
            advice=f"an instance of {class_name}, a subclass of {base.__name__} whose value is not among its "
            f"attributes, so it cannot be saved by them: keep a plain {base.__name__}(...) of it in the tree, or "
            "register the object itself to save it by name, jaxstow.saveable(obj, name=...)",
        )
    held = attributes(obj)
    if not held and not hasattr(obj, "__dict__") and not _declares_slots(type(obj)):
        raise UnsaveableObjectError(
            obj,
            file=file,
            path=path,
            advice=f"an instance of {class_name}, a class that keeps its state out of Python's reach (no __dict__ and "
            f"no __slots__: written in C), so it cannot be saved by its attributes: keep a value of it in the tree "
            f"instead, such as str(...) or its fields",
        )
    for key, _ in held:
        if _is_dunder(key):
            raise UnsaveableObjectError(
                obj,
                file=file,
                path=join(path, key),
                advice=f"an instance of {class_name} with the attribute {key!r}; a file holds no dunder attributes: "
                "register the object itself to save it by name, jaxstow.saveable(obj, name=...), or delete the "
                "attribute before saving",
            )
    return {"object": class_name, "attrs": [[key, encode_part(value, key)] for key, value in held]}


def rebuild(name: JSON, attrs: list[Any], decode_part: Part, *, file: str | None, path: str) -> object:
    """An instance of the class ``name`` (saved by its attributes), made without calling ``__init__``.

    ``decode_part(value, attribute)`` decodes an attribute's value.
    """
    if not isinstance(name, str):
        raise FormatError(f"unreadable class name {excerpt(name)} in the structure", file=file, path=path)
    cls = registry.lookup(name, file=file, path=path)
    if not isinstance(cls, type) or registry.attribute_class_name(cls) != name or issubclass(cls, _VALUE_TYPES):
        raise FormatError(
            f"{excerpt(name)} names no class whose instances are saved by their attributes (a subclass of a builtin "
            "value keeps its value out of them, and is never saved so)",
            file=file,
            path=path,
        )
    for pair in attrs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise FormatError(f"unreadable value {excerpt(pair)} in the structure", file=file, path=path)
        if not isinstance(pair[0], str) or _is_dunder(pair[0]):
            raise FormatError(f"{excerpt(pair[0])} cannot be an attribute of a {name} instance", file=file, path=path)
    refuse_repeated([key for key, _ in attrs], file=file, path=path)
    refuse_missing_fields(cls, name, [key for key, _ in attrs], file=file, path=path)
    obj: object = cls.__new__(cls)  # type: ignore[call-overload]
    for key, value in attrs:
        object.__setattr__(obj, key, decode_part(value, key))
    return obj


def refuse_missing_fields(cls: type, name: str, saved: list[str], *, file: str | None, path: str) -> None:
    """Refuse to rebuild an instance without a value for each of the fields its class's ``__init__`` sets (a
    dataclass's fields, or the attributes a plain ``__init__`` always sets): an attribute renamed or added since the
    save would be missing from the instance, or read as the class's default."""
    if dataclasses.is_dataclass(cls):
        kind, fields = "the dataclass", [field.name for field in dataclasses.fields(cls) if field.init]
        now = f"has the fields {fields} now"
    else:
        kind, fields = "the class", list(always_set(cls))
        now = f"sets the attributes {fields} in __init__ now"
    missing = [field for field in fields if field not in saved]
    if missing:
        raise StructureMismatchError(
            [
                f"{path!r}: {kind} {name} {now}, the file holds the attributes {saved}: {missing} would be missing "
                "from the instance (renamed or added since the save?)"
            ],
            file=file,
            fix="Load the file with the class as it was saved, and build the new class from what it loads.",
        )


def _declares_slots(cls: type) -> bool:
    """Whether a class of ``cls``'s, other than ``object``, declares ``__slots__`` (its instances' state is there)."""
    return any("__slots__" in vars(base) for base in cls.__mro__ if base is not object)
