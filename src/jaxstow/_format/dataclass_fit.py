"""Whether a node a file gives a class registered with ``jax.tree_util.register_dataclass`` fits its fields.

jax rebuilds such a node from its counts as they are: static data of another length, or fewer children than the class
has data fields, make it read past their ends (a crash of the process, not an error). Checked before jax sees them;
more children than fields are caught later by their names, with a better message.

>>> import dataclasses, jax
>>> @jax.tree_util.register_dataclass
... @dataclasses.dataclass
... class Layer:
...     w: jax.Array
...     b: jax.Array
>>> check_dataclass_fit(Layer, (), 2, path="layer", file="model.jxs")
>>> check_dataclass_fit(Layer, (), 1, path="layer", file="model.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: leaf 'layer' of model.jxs: 1 children do not fit Layer's 2 data fields ('w', 'b'): the class changed since the save; load the file with the class as it was saved
"""

from __future__ import annotations

from typing import Any

from jaxstow._util import jax_compat
from jaxstow.errors import FormatError, excerpt

__all__ = ["check_dataclass_fit"]


def check_dataclass_fit(node_type: type, aux: Any, children: int, *, path: str, file: str | None) -> None:
    """Raise a :class:`FormatError` unless ``aux`` (the static data) and ``children`` (how many) fit ``node_type``'s
    static and data fields, where it is a registered dataclass."""
    fields = jax_compat.dataclass_fields(node_type)
    if fields is None:
        return
    data, meta = fields
    name = node_type.__qualname__
    if not (isinstance(aux, tuple) and len(aux) == len(meta)):
        problem = f"the static data {excerpt(aux)} does not fit {name}'s static fields {meta}"
    elif children < len(data):
        problem = f"{children} children do not fit {name}'s {len(data)} data fields {data}"
    else:
        return
    message = f"{problem}: the class changed since the save; load the file with the class as it was saved"
    raise FormatError(message, file=file, path=path)
