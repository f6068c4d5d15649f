"""JSON from untrusted bytes: every failure a jaxstow error, never a builtin one.

``json.loads`` refuses integers of more than 4,300 digits with a bare ``ValueError`` and a text nested 100,000
levels deep with ``RecursionError`` (its C parser guards its own stack). Both become the caller's error class, naming
the file. Code that walks a parsed value recursively bounds its depth itself (see :mod:`jaxstow.structure`).

>>> from jaxstow.format.untrusted_json import parse_json
>>> parse_json(b'{"a": [1, 2]}', what="the header", file="f.jxs")
{'a': [1, 2]}
>>> parse_json(b"[" * 100_000, what="the header", file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: f.jxs: the header is not valid JSON (maximum recursion depth exceeded...)
"""

from __future__ import annotations

import json
from typing import Any

from jaxstow.errors import FormatError

__all__ = ["parse_json"]


def parse_json(text: bytes | str, *, what: str, file: str | None, error: type[FormatError] = FormatError) -> Any:
    """Parse ``text``; anything but valid JSON raises ``error`` naming ``what`` and ``file``."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as problem:  # JSONDecodeError, bad UTF-8, too many digits, too deep
        raise error(f"{what} is not valid JSON ({problem})", file=file) from None
