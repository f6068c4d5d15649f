"""Counts a user gives (``keep_last=2``, ``save_every=np.int64(5)``): any integer but a truth value, as a Python int.

>>> import numpy as np
>>> from jaxstow._util.counts import count
>>> count(np.int64(5), "save_every"), count(0, "replicas", least=0)
(5, 0)
>>> count(2.0, "keep_last")
Traceback (most recent call last):
...
jaxstow.errors.ArgumentError: keep_last must be a positive integer, not 2.0
"""

from __future__ import annotations

import numbers
from typing import Any

from jaxstow.errors import ArgumentError

__all__ = ["count"]


def count(value: Any, name: str, *, least: int = 1, or_none: bool = False) -> int:
    """``value`` as an int of at least ``least`` (1 or 0); an ArgumentError naming ``name`` for anything else (a bool,
    a float), whose words add ``or None`` where ``None`` is also taken (``or_none``, checked by the caller)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        kind = "positive integer" if least == 1 else "non-negative integer"
        raise ArgumentError(f"{name} must be a {kind}{' or None' if or_none else ''}, not {value!r}")
    return int(value)
