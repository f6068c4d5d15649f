"""``functools.partial`` over a nameable function, saved as ``jax.tree_util.Partial`` is.

The function is saved by its name, so the name policy decides what a file may call; its arguments as data.

>>> import functools, jax
>>> from jaxstow._names import partials
>>> act = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
>>> data = partials.encode(act, lambda value, field: value, file=None, path="act")
>>> data
{'partial': {'func': 'jax.nn.leaky_relu', 'args': [], 'keywords': [['negative_slope', 0.1]]}}
>>> rebuilt = partials.decode(data, lambda value, field: value, file=None, path="act")
>>> rebuilt.func is jax.nn.leaky_relu, rebuilt.keywords
(True, {'negative_slope': 0.1})
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxstow._names import registry
from jaxstow._names.repeated_keys import refuse_repeated
from jaxstow.errors import FormatError, UnsaveableObjectError

__all__ = ["decode", "encode"]

JSON = Any
Part = Callable[[Any, str], Any]


def encode(obj: functools.partial[Any], encode_part: Part, *, file: str | None, path: str) -> JSON:
    """``obj`` as ``{"partial": {"func": name, "args": [...], "keywords": [[key, value], ...]}}``.

    ``encode_part(value, field)`` encodes an argument. A function without a name, arguments that are arrays and
    attributes set on the partial are refused, each with what to do instead.
    """
    name = registry.name_of(obj.func)
    if name is None:
        raise UnsaveableObjectError(
            obj,
            file=file,
            path=path,
            advice=f"a functools.partial over {obj.func!r}, which is neither data nor registered: register the "
            "function with jaxstow.saveable(function, name=...), and the partial saves with it",
        )
    arrays = [leaf for leaf in jax.tree.leaves((obj.args, obj.keywords)) if isinstance(leaf, jax.Array | np.ndarray)]
    if arrays or vars(obj):
        raise UnsaveableObjectError(
            obj,
            file=file,
            path=path,
            advice=(
                "a functools.partial with arrays among its arguments"
                if arrays
                else "a functools.partial with attributes of its own"
            )
            + ", which a file does not hold as values: wrap the function in jax.tree_util.Partial instead, whose "
            "arguments are saved as leaves",
        )
    return {
        "partial": {
            "func": name,
            "args": [encode_part(arg, f"args/{i}") for i, arg in enumerate(obj.args)],
            "keywords": [[key, encode_part(value, f"keywords/{key}")] for key, value in obj.keywords.items()],
        }
    }


def decode(data: JSON, decode_part: Part, *, file: str | None, path: str) -> functools.partial[Any]:
    """The partial :func:`encode` described.

    Its function is looked up by name (the name policy applies), and nothing is called.
    """
    parts = data.get("partial")
    name, args, keywords = (
        (parts.get(key) for key in ("func", "args", "keywords")) if isinstance(parts, dict) else [None] * 3
    )
    if not (
        isinstance(name, str)
        and isinstance(args, list)
        and isinstance(keywords, list)
        and all(map(_is_keyword, keywords))
    ):
        raise FormatError(f"unreadable functools.partial {str(data)[:200]} in the structure", file=file, path=path)
    refuse_repeated([key for key, _ in keywords], file=file, path=f"{path}/keywords" if path else "keywords")
    function = registry.lookup(name, file=file, path=f"{path}/func" if path else "func")
    if not callable(function):
        raise FormatError(
            f"{name!r} names {type(function).__name__}, which a partial cannot wrap", file=file, path=path
        )
    return functools.partial(
        function,
        *[decode_part(arg, f"args/{i}") for i, arg in enumerate(args)],
        **{key: decode_part(value, f"keywords/{key}") for key, value in keywords},
    )


def _is_keyword(pair: Any) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)  # any name **kwargs passes
