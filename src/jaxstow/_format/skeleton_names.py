"""The names of objects a file's skeleton holds, found without looking any up: one error names every library to import.

A file may name objects of several libraries (a model's node types, its activations); when one is not imported, a
restore's :class:`~jaxstow.errors.UnknownNameError` names all those the file needs, not one per attempt.

>>> from jaxstow._format.skeleton_names import names_in
>>> sorted(names_in([{"node": "equinox.nn.MLP", "aux": {"ref": "jax.nn.relu"}, "children": []}, {"list": ["a"]}]))
['equinox.nn.MLP', 'jax.nn.relu']
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from jaxstow._format.skeleton import JSON, NAME_TAGS
from jaxstow._names import registry
from jaxstow.errors import UnknownNameError

__all__ = ["names_in", "with_every_library"]


def names_in(data: JSON) -> Iterator[str]:
    """Every object name that ``data``, structures and values as :mod:`jaxstow._format.skeleton` writes them,
    holds; nothing is looked up."""
    pending = [data]
    while pending:  # without recursion, whatever the depth
        item = pending.pop()
        if isinstance(item, dict):
            for tag, value in item.items():
                if tag in NAME_TAGS and isinstance(value, str):
                    yield value
                else:
                    pending.append(value)
        elif isinstance(item, list):
            pending.extend(item)


def with_every_library(
    error: UnknownNameError, manifest: dict[str, Any] | None, values: Iterable[dict[str, Any]]
) -> UnknownNameError:
    """``error``, about a name of a library that is not imported, made to name every library not imported that the
    file names: in its ``manifest``'s structure or in the entries of its ``values``. One error then says all there
    is to import. ``error`` itself when it is about something else (nothing is read then).
    """
    structure = None if manifest is None else manifest.get("structure")
    found = itertools.chain(names_in(structure), *(names_in(entry.get("value")) for entry in values))
    return registry.naming_every_library(error, found)
