"""JSON text of headers and manifests: written compactly and fast, parsed from untrusted bytes safely.

:func:`dump_json` writes with orjson, and with the standard library what orjson cannot write exactly (integers
beyond 64 bits, lone surrogates). :func:`parse_json` turns every failure into a jaxstow error, never a builtin one
(``json.loads`` raises a bare ``ValueError`` or ``RecursionError`` for huge integers and deep nesting). Code that
walks a parsed value bounds its depth itself (:mod:`jaxstow._format.skeleton`); :func:`limits_problem` tells whether
a value stays within the nesting and integer digits a jaxstow file holds. :func:`check_containers` refuses a long
header holding more objects and arrays than one per :data:`BYTES_PER_CONTAINER` bytes before it is parsed: parsing
makes a Python object of about 64 bytes of each (for the 3 bytes of ``[],``), over 20 times the text's length.

>>> from jaxstow._format.json_codec import dump_json, parse_json
>>> dump_json({"a": [1, 2**70]})
b'{"a":[1,1180591620717411303424]}'
>>> parse_json(b'{"a": [1, 2]}', what="the header", file="f.jxs")
{'a': [1, 2]}
>>> parse_json(b"[" * 100_000, what="the header", file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: f.jxs: the header is not valid JSON (maximum recursion depth exceeded...)
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np
import orjson

from jaxstow._format.json_values import MAX_INTEGER_DIGITS, MAX_NESTING
from jaxstow.errors import FormatError

__all__ = [
    "BYTES_PER_CONTAINER",
    "check_containers",
    "containers_outside_strings",
    "dump_json",
    "has_lone_surrogate",
    "limits_problem",
    "parse_json",
    "repeated_member",
    "tensor_names_problem",
]

_INTEGER_BOUND = 10**MAX_INTEGER_DIGITS

#: Compact; the values written are trees of fresh dicts and lists, never circular, so that check is skipped.
_STANDARD = json.JSONEncoder(separators=(",", ":"), check_circular=False)


#: Maps every digit to ``1`` and every other byte to ``0``: a run of 19 digits is then a substring search.
_DIGIT_MARKS = bytes(49 if 48 <= byte <= 57 else 48 for byte in range(256))
_LONG_RUN = b"1" * 19


def _long_digit_run(text: bytes | str) -> bool:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return _LONG_RUN in data.translate(_DIGIT_MARKS)


def dump_json(value: Any) -> bytes:
    """Compact UTF-8 JSON of strict-JSON ``value``, which :func:`parse_json` reads back equal.

    Keys must be strings and floats finite.
    """
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits or a string it cannot encode as UTF-8
        return _STANDARD.encode(value).encode("ascii")


def parse_json(
    text: bytes | str,
    *,
    what: str,
    file: str | None,
    error: type[FormatError] = FormatError,
    exact_integers: bool = True,
    fast: bool = True,
) -> Any:
    """Parse ``text``; anything but valid JSON raises ``error`` naming ``what`` and ``file``.

    The fast parser (orjson) reads integers beyond 64 bits as floats, so a text that may hold arbitrary Python
    integers (a manifest's values) goes to it only when it has no run of 19 digits; ``exact_integers=False`` sends
    any text to it, for a text whose checks refuse a float wherever an integer belongs (a safetensors header).
    Whatever the fast parser refuses is parsed again by the standard library, which is the judge. ``fast=False`` leaves
    the fast parser out: it reserves about eight bytes per byte of text first, whatever the text holds (spaces too),
    where the standard library's memory follows the values parsed.
    """
    if fast and (
        not exact_integers or not _long_digit_run(text)
    ):  # without 19 digits in a row, every integer fits 64 bits
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:  # NaN, overflowing numbers, lone surrogates, deep nesting: see below
            pass
    try:  # bytes as UTF-8 only: json.loads would guess UTF-16 or UTF-32 from the first bytes
        decoded = text.decode("utf-8") if isinstance(text, bytes) else text
        return json.loads(decoded, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as problem:  # JSONDecodeError, bad UTF-8, too many digits, too deep
        raise error(f"{what} is not valid JSON ({problem})", file=file) from None


def _no_constant(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity``, which Python's parser takes and JSON (RFC 8259) has not."""
    raise ValueError(f"{name} is no JSON value")


def _finite_float(literal: str) -> float:
    """A number's value, unless it overflows a float (``1e999``): the fast parser refuses it, and a value read as
    ``inf`` is one that no writer of ours wrote (they refuse infinite numbers)."""
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"the number {literal[:40]} overflows a float")
    return value


def tensor_names_problem(text: bytes, header: dict[str, Any]) -> tuple[str | None, str] | None:
    """The first tensor name of a safetensors header that breaks a rule, shown printable (``None`` for the header as
    a whole), and the rule; or ``None``.

    A member given twice (a parser keeps the last, as safetensors' does: the header says two things of one tensor,
    and none is the truth): looked for only where the text spells a member of a tensor's entry more often than the
    header has tensors, ``__metadata__`` twice, a key of ``__metadata__`` other than once, or any escape
    (``\\u0061`` spells ``a``), as the standard library parses it again; a name with a lone surrogate, which UTF-8 cannot write (only an escape gives one, and the writer
    refuses such a name).

    >>> text = b'{"w":{"dtype":"F32","data_offsets":[0,4]},"w":{"dtype":"I32","data_offsets":[4,8]}}'
    >>> tensor_names_problem(text, parse_json(text, what="the header", file=None))
    ('w', "the header lists 'w' twice: which is meant cannot be told")
    >>> text = b'{"w":{"data_offsets":[0,4]},"__metadata__":{"note":"data_offsets"}}'
    >>> tensor_names_problem(text, parse_json(text, what="the header", file=None)) is None
    True
    >>> tensor_names_problem(b'{"\\\\ud800x":{}}', {chr(0xD800) + "x": {}})[0]  # the text escapes it
    '\\\\ud800x'
    """
    escaped = b"\\u" in text
    if escaped:
        for name in header:
            shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
            if shown != name and not name.isascii() and has_lone_surrogate(name):
                return shown, "the tensor name holds a lone surrogate, which UTF-8 cannot write"
    tensors = len(header) - ("__metadata__" in header)
    metadata = header.get("__metadata__")
    keys = list(metadata) if isinstance(metadata, dict) else []
    if (
        not escaped
        and text.count(b'"__metadata__"') <= 1
        and all(text.count(key) <= tensors for key in _ENTRY_KEYS)
        and all(text.count(orjson.dumps(key)) == 1 for key in keys)  # spelled otherwise or more often: looked for
    ):
        return None
    try:
        twice = repeated_member(text)
    except RecursionError:  # orjson takes 1024 levels, the standard library fewer: no header nests so deep
        return None, "the header nests too deep to be one of safetensors"
    if twice is None:
        return None
    if twice in header:
        return twice, f"the header lists {twice!r} twice: which is meant cannot be told"
    where = "the header's __metadata__" if twice in keys else "an entry of the header"
    return None, f"{where} gives {twice!r} twice: which is meant cannot be told"


#: The members of a tensor's entry: each spelled once a tensor in a header that repeats none.
_ENTRY_KEYS = (b'"dtype"', b'"shape"', b'"data_offsets"')


def repeated_member(text: bytes) -> str | None:
    """The first name an object of the JSON ``text`` (valid, parsed before) gives twice, or ``None``: a parser keeps
    the last of them, and the text says two things of one name.

    >>> repeated_member(b'{"weight_map": {"a": "1.safetensors", "a": "2.safetensors"}}')
    'a'
    """

    def members(pairs: list[tuple[str, Any]]) -> None:
        counts = Counter(name for name, _ in pairs)
        if len(counts) < len(pairs):
            raise _Repeated(next(name for name, _ in pairs if counts[name] > 1))
        # None: no object is kept, so the parse takes little memory beyond the text's, whatever the text holds

    try:
        json.loads(text.decode("utf-8"), object_pairs_hook=members)
    except _Repeated as found:  # the parse stops at the first object that gives a name twice
        return str(found.args[0])
    return None


class _Repeated(Exception):
    """The name an object of a JSON text gives twice (raised to stop the parse there)."""


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate, which UTF-8 cannot write (a JSON escape can give one; no file name or
    zip member holds one).

    >>> has_lone_surrogate("b\\ud800"), has_lone_surrogate("b\\u00e9")
    (True, False)
    """
    return any("\ud800" <= char <= "\udfff" for char in text)


#: Levels of a value counted before it is called too deep as it is: a value that holds itself has no end.
_DEEPEST_COUNTED = 2 * MAX_NESTING


def limits_problem(value: Any) -> str | None:
    """How a JSON value breaks the limits a jaxstow file holds (:data:`MAX_NESTING` levels, integers of
    :data:`MAX_INTEGER_DIGITS` digits), or ``None``."""
    depth, huge = _nesting(value)
    if depth > _DEEPEST_COUNTED:
        return (
            f"nests JSON levels deeper than {_DEEPEST_COUNTED} (where counting stopped), or holds itself; a jaxstow "
            f"file holds at most {MAX_NESTING} levels"
        )
    if depth > MAX_NESTING:
        return f"nests {depth} JSON levels deep; a jaxstow file holds at most {MAX_NESTING}"
    if huge:
        return f"holds an integer of more than {MAX_INTEGER_DIGITS} digits; a jaxstow file holds at most {MAX_INTEGER_DIGITS}"
    return None


def _nesting(value: Any) -> tuple[int, bool]:
    """The most JSON containers around any part of ``value``, and whether it holds too long an integer.

    An empty container holds no part. Counted level by level; an integer is too long beyond :data:`MAX_INTEGER_DIGITS`
    digits.
    """
    deepest, level, huge = 0, [value], False
    while level:
        inner: list[Any] = []
        for node in level:
            if type(node) is str:  # most parts of a structure are its leaves, "*"
                continue
            if isinstance(node, dict):
                inner.extend(node.values())
            elif isinstance(node, list | tuple):  # metadata may hold tuples, saved as lists
                inner.extend(node)
            elif type(node) is int and not -_INTEGER_BOUND < node < _INTEGER_BOUND:
                huge = True
        deepest += bool(inner)
        level = inner
        if deepest > _DEEPEST_COUNTED:  # a value that holds itself, or far too deep: no need to go on
            break
    return deepest, huge


#: The bytes of a long header's text each object or array outside its strings needs, beyond the first two (the
#: header and its ``__metadata__``): a tensor's entry holds three in at least 50 bytes (docs/format.md, "Limits").
BYTES_PER_CONTAINER = 12
#: The header length from which its objects and arrays are counted (a shorter one takes little memory whatever it is).
COUNTED_FROM = 64 * 1024
#: The bytes of text looked at at a time: the count's own memory is a few times this.
_SLICE = 1 << 20
_QUOTE, _BRACE, _BRACKET = ord('"'), ord("{"), ord("[")


def containers_outside_strings(text: bytes) -> int:
    r"""The ``{`` and ``[`` of the JSON ``text`` that lie outside its strings (exact for valid JSON), counted a slice
    at a time with a few copies of it.

    >>> containers_outside_strings(b'{"a\\\\":{"b":[1,"[{\\\\\\"}"]}}')  # {"a\\":{"b":[1,"[{\\\"}"]}}
    3
    """
    if b"\\" in text:  # an escaped backslash, then an escaped quote, cannot open or close a string
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(text, np.uint8)
    inside = np.uint8(0)
    count = 0
    for start in range(0, len(codes), _SLICE):
        part = codes[start : start + _SLICE]
        opened = np.bitwise_xor.accumulate((part == _QUOTE).view(np.uint8)) ^ inside
        count += int(np.count_nonzero(((part == _BRACE) | (part == _BRACKET)) & (opened == 0)))
        inside = opened[-1]
    return count


def check_containers(raw: bytes, *, file: str, error: type[FormatError]) -> None:
    """Refuse the header text ``raw`` with ``error`` if it is long and holds more objects and arrays than a
    header of its length may."""
    if len(raw) < COUNTED_FROM:
        return
    most = len(raw) // BYTES_PER_CONTAINER + 2
    count = containers_outside_strings(raw)
    if count > most:
        raise error(
            f"the header's {len(raw)} bytes hold {count} JSON objects and arrays, more than the {most} a header of "
            f"this length may (one per {BYTES_PER_CONTAINER} bytes, beyond the header and its __metadata__; a "
            "tensor's entry holds three in at least 50 bytes), so it is refused before it is parsed: the file is damaged "
            "or was not made by a safetensors writer; get it again from its source, or save its tensors again with one",
            file=file,
        )
