"""JSON from untrusted bytes: nesting depth checked before parsing, every failure a jaxstow error.

``json.loads`` recurses once per nesting level and refuses integers of more than 4,300 digits with a bare
``ValueError``; a header of 100,000 ``[`` would end in ``RecursionError``. :func:`parse_json` measures the depth
first, outside strings, with one regular expression and one pass of numpy, so it costs little even for large headers.

>>> from jaxstow.format.bounded_json import json_depth, parse_json
>>> json_depth(b'{"a": [1, {"b": "[[["}]}')
3
>>> parse_json(b'{"a": [1, 2]}', what="the header", file="f.jxs", max_depth=4)
{'a': [1, 2]}
>>> parse_json(b"[" * 100_000, what="the header", file="f.jxs", max_depth=64)
Traceback (most recent call last):
...
jaxstow.errors.FormatError: f.jxs: the header nests 100000 levels deep, more than the 64 allowed
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from jaxstow.errors import FormatError

__all__ = ["json_depth", "parse_json"]

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


def json_depth(text: bytes | str) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    codes = np.frombuffer(_STRING.sub(b'""', data), np.uint8)
    steps = np.isin(codes, _OPEN).view(np.int8) - np.isin(codes, _CLOSE).view(np.int8)
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def parse_json(
    text: bytes | str, *, what: str, file: str | None, max_depth: int, error: type[FormatError] = FormatError
) -> Any:
    """Parse ``text``; anything but valid JSON no deeper than ``max_depth`` raises ``error`` naming ``what``."""
    depth = json_depth(text)
    if depth > max_depth:
        raise error(f"{what} nests {depth} levels deep, more than the {max_depth} allowed", file=file)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as problem:  # JSONDecodeError, bad UTF-8, integers of too many digits
        raise error(f"{what} is not valid JSON ({problem})", file=file) from None
