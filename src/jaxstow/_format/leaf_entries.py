"""The leaves of a version 1 or 2 manifest: a list of entries, one per leaf, each with its path and kind.

>>> import numpy as np
>>> from jaxstow._format.leaf_entries import check_entries
>>> from jaxstow._format.tensor_reads import TensorSlot
>>> slots = {"w": TensorSlot.at("w", np.dtype(np.float32), (2,), 0)}
>>> check_entries([{"path": "w", "kind": "array"}, {"path": "w", "kind": "array"}], slots, file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: leaf 'w' of f.jxs: the manifest lists this leaf twice
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxstow._format.leaves import check_entry
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import FormatError

__all__ = ["check_entries"]


def check_entries(leaves: Any, slots: Mapping[str, TensorSlot], *, file: str) -> None:
    """Check a version 1 or 2 manifest's ``leaves``: a list of entries that
    :func:`~jaxstow._format.leaves.check_entry` passes (completing those of leaves stored as their tensors, whose
    dtype and shape it fills in from ``slots``), no path twice."""
    if not isinstance(leaves, list):
        raise FormatError("the manifest has no list of leaves", file=file)
    seen: set[str] = set()
    for index, entry in enumerate(leaves):
        check_entry(entry, index, slots, file=file)
        if entry["path"] in seen:
            raise FormatError("the manifest lists this leaf twice", file=file, path=entry["path"])
        seen.add(entry["path"])
