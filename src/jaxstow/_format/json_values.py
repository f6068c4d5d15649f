"""Whether a value survives a trip through strict JSON unchanged, and if not, which key spoils it; the limits on the
JSON a jaxstow file holds (its nesting, its integers' digits), beyond which a save and a load both refuse it.

>>> import numpy as np
>>> from jaxstow._format.json_values import json_problem
>>> json_problem({"epoch": 3, "lr": 0.1, "tags": ["a", "b"]}) is None
True
>>> json_problem({"run": {"loss": float("nan")}})
"key 'run/loss': nan is not a JSON number (JSON has no NaN or infinity)"
>>> json_problem({"step": np.int64(7)})
"key 'step': np.int64(7) is a numpy int64, not a JSON value (convert it with .item())"
>>> json_problem({"size": (224, 224)})
"key 'size': the tuple (224, 224) would come back as a list (JSON has no tuples): pass list(...) of it"
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import numpy as np

from jaxstow.errors import FormatError, UnsaveableObjectError, excerpt

__all__ = ["MAX_INTEGER_DIGITS", "MAX_NESTING", "float_text", "json_problem", "parse_float"]

#: The most JSON levels around any part of a manifest's structure or of a value: a save refuses deeper trees, a load
#: refuses deeper files before its decoders recurse that far.
MAX_NESTING = 400
#: The most decimal digits of an integer anywhere in a manifest (a value, the metadata): Python's default bound on
#: converting integers to and from text, fixed here so that a save refuses what a load of any jaxstow would refuse.
MAX_INTEGER_DIGITS = 4300


def json_problem(value: Any, key: str = "") -> str | None:
    """What keeps ``value`` from being strict JSON, naming the key path (``'run/loss'``), or ``None`` if nothing."""
    where = f"key {key!r}: " if key else ""
    if value is None or isinstance(value, str | bool) or type(value) is int:
        return None
    if type(value) is float:
        return None if math.isfinite(value) else f"{where}{value!r} is not a JSON number (JSON has no NaN or infinity)"
    if type(value) is tuple:
        return f"{where}the tuple {value!r} would come back as a list (JSON has no tuples): pass list(...) of it"
    if type(value) is list:
        for index, item in enumerate(value):
            problem = json_problem(item, f"{key}/{index}" if key else str(index))
            if problem is not None:
                return problem
        return None
    if type(value) is dict:
        for name, item in value.items():
            if not isinstance(name, str):
                return f"{where}the key {name!r} is not a string (JSON object keys are strings)"
            problem = json_problem(item, f"{key}/{name}" if key else name)
            if problem is not None:
                return problem
        return None
    if isinstance(value, np.generic):
        return f"{where}{value!r} is a numpy {value.dtype}, not a JSON value (convert it with .item())"
    if isinstance(value, np.ndarray):
        return f"{where}an array of shape {value.shape} is not a JSON value (convert it with .tolist())"
    return f"{where}{value!r} of type {type(value).__name__} is not a JSON value"


#: A float as ``repr`` writes one: digits, a point, an exponent, ``inf`` or ``nan``, a sign; no spaces or underscores.
_FLOAT_TEXT = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)")


#: The bits of the NaNs that text keeps: ``nan`` and ``-nan``.
_PLAIN_NANS = {struct.pack("<d", math.nan): "nan", struct.pack("<d", -math.nan): "-nan"}


def float_text(value: float, *, path: str, file: str | None) -> str:
    """A float as a file writes it, which :func:`parse_float` reads back bit for bit: its ``repr``, or ``-nan`` for a
    NaN with its sign set (as ``inf - inf`` makes).

    A NaN with a payload, which no text keeps, is an :class:`~jaxstow.errors.UnsaveableObjectError` naming the leaf.

    >>> float_text(0.1, path="lr", file=None), float_text(math.inf - math.inf, path="lr", file=None)
    ('0.1', '-nan')
    """
    if not math.isnan(value):
        return repr(value)
    text = _PLAIN_NANS.get(struct.pack("<d", value))
    if text is None:
        advice = (
            f"a float NaN with a payload (bits {struct.pack('>d', value).hex()}), which a file keeps only as a "
            "number's text: save it as a numpy scalar (numpy.float64, numpy.complex128), whose bytes are kept"
        )
        raise UnsaveableObjectError(value, file=file, path=path, advice=advice)
    return text


def parse_float(text: str, *, path: str, file: str | None) -> float:
    """A float as ``repr`` writes it into a file; a :class:`~jaxstow.errors.FormatError` for text that is none, or
    that only ``float()`` would round to infinity (``"1e400"``).

    >>> parse_float("0.1", path="lr", file=None), parse_float("-inf", path="lr", file=None)
    (0.1, -inf)
    """
    if not isinstance(text, str) or _FLOAT_TEXT.fullmatch(text) is None:  # float() also takes " 1_0.5 ", "Infinity"
        raise FormatError(f"{excerpt(text)} is not a float as repr writes one", file=file, path=path)
    value = float(text)
    if math.isinf(value) and text.lstrip("+-") != "inf":
        raise FormatError(f"{excerpt(text)} is beyond the range of a float", file=file, path=path)
    return value
