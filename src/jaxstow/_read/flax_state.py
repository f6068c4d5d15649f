"""The nested dicts of a flax msgpack file put back into the containers of ``like``, as flax restores them.

``flax.serialization.to_bytes`` keeps a list or a tuple (an optax state) as a dict keyed ``"0"``, ``"1"``, ... and a
namedtuple or a dataclass as a dict keyed by field: :func:`into_like` rebuilds ``like``'s containers around the file's
values with ``flax.serialization.from_state_dict``, as ``flax.serialization.from_bytes(like, data)`` does. The load
then checks every leaf against ``like`` as it checks a jaxstow file's.

>>> import numpy as np
>>> from jaxstow._read.flax_state import into_like
>>> into_like({"layers": {"0": np.ones(2), "1": np.zeros(1)}}, {"layers": [np.zeros(2), np.zeros(1)]})
{'layers': [array([1., 1.]), array([0.])]}
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["into_like"]


def into_like(tree: Any, like: Any) -> Any:
    """``tree`` (a flax file's nested dicts) in ``like``'s containers; as it is where flax is not installed, or where
    its keys do not fit ``like`` (the load's check then names each leaf that does not fit)."""
    try:
        serialization = importlib.import_module("flax.serialization")
    except ImportError:
        return tree
    try:
        return serialization.from_state_dict(like, tree)
    except Exception:  # flax raises ValueError, KeyError or TypeError where the keys differ: the load says how
        return tree
