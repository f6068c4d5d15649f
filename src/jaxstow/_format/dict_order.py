"""The keys of a dict in a saved structure, as jax orders them: each once, and sorted.

jax flattens a dict in the sorted order of its keys, and a file stores the dict's leaves in that order. A structure
that lists the keys otherwise would give each key the leaves stored for another (``load(path)["a"]`` would return
``b``'s array, with every checksum right), so it is refused as damaged.

>>> from jaxstow._format.dict_order import check_dict_keys
>>> check_dict_keys(["a", "b"], file="model.jxs", path="params")
>>> check_dict_keys(["b", "a"], file="model.jxs", path="params")
Traceback (most recent call last):
...
jaxstow.errors.CorruptFileError: leaf 'params' of model.jxs: ...'b' before 'a'...
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

from jaxstow._names.repeated_keys import refuse_repeated
from jaxstow.errors import CorruptFileError, excerpt

__all__ = ["check_dict_keys"]


def check_dict_keys(keys: Sequence[Hashable], *, file: str | None, path: str) -> None:
    """Raise a :class:`~jaxstow.errors.FormatError` for a key named twice, and a
    :class:`~jaxstow.errors.CorruptFileError` naming the first pair out of jax's sorted order."""
    refuse_repeated(keys, file=file, path=path)
    for first, then in itertools.pairwise(keys):  # jax sorts the keys: each comes before the next
        try:
            ordered = first < then  # type: ignore[operator]
        except TypeError:  # keys of types that do not sort (1 and "a"): jax cannot flatten such a dict
            ordered = False
        if not ordered:
            raise CorruptFileError(
                f"the structure lists the dict's key {excerpt(first)} before {excerpt(then)}: jax stores a dict's "
                "leaves in the sorted order of its keys, so these keys would name leaves stored for others (the "
                "header was changed)",
                file=file,
                path=path,
            )
