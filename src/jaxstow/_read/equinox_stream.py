"""An equinox ``tree_serialise_leaves`` stream read into ``like``, every leaf as the stream holds it.

The stream holds each leaf's ``.npy`` without the tree's structure, so ``like`` gives it. equinox checks an array's
shape and dtype against ``like``'s, but casts a number to the type of ``like``'s leaf (``int(0.5)`` is ``0``), and a
64-bit array into a jax array's 32 bits where jax's 64-bit mode is off (``2**40 + 1`` is ``1``): here a number or an
array that the cast would change is a :class:`~jaxstow.errors.FormatError` naming the leaf, never a value other than
the one saved.

>>> import io, equinox as eqx
>>> from jaxstow._read.equinox_stream import read_equinox
>>> stream = io.BytesIO()
>>> eqx.tree_serialise_leaves(stream, {"p": 0.5, "n": 3})
>>> read_equinox(stream.getvalue(), "model.eqx", {"p": 0.0, "n": 0.0})
{'n': 3.0, 'p': 0.5}
"""

from __future__ import annotations

import functools
import io
from typing import Any

import jax
import numpy as np

from jaxstow._format.keypaths import path_to_str
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, FormatError, excerpt

__all__ = ["read_equinox"]

#: The leaves of ``like`` that equinox casts to their own type: Python's numbers and numpy's scalars.
_NUMBERS = (bool, int, float, complex, np.bool_, np.number)


def read_equinox(data: bytes, name: str, like: Any) -> Any:
    """The tree of ``like`` with the leaves of the stream ``data`` (of the file ``name``), each checked to fit."""
    if like is None:
        raise ArgumentError(
            f"an equinox stream stores leaves without their structure: pass like=, the model {name} was saved from "
            "(or an abstract copy of it)"
        )
    eqx = require("equinox", extra="equinox", purpose=f"reading the equinox stream {name}")
    spec = jax.tree_util.tree_map_with_path(
        lambda key_path, _: functools.partial(_leaf, eqx.default_deserialise_filter_spec, name, path_to_str(key_path)),
        like,
    )
    stream = io.BytesIO(data)
    try:
        tree = eqx.tree_deserialise_leaves(stream, like, filter_spec=spec)
    except Exception as error:  # equinox and numpy raise several kinds on a stream that does not fit
        raise _ours(error) or FormatError(f"the equinox stream does not fit like ({error})", file=name) from None
    if stream.tell() != len(data):
        raise FormatError(
            f"the equinox stream holds more than like's leaves ({len(data) - stream.tell()} bytes left)", file=name
        )
    return tree


def _leaf(default: Any, name: str, path: str, stream: io.BytesIO, leaf: Any) -> Any:
    """The stream's next leaf for ``like``'s ``leaf`` at ``path``, as equinox reads it; a number only if the type of
    ``like``'s leaf holds it as saved."""
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        return _array(default, name, path, stream, leaf)
    if not isinstance(leaf, _NUMBERS):
        return default(stream, leaf)
    start = stream.tell()
    saved = np.load(stream)
    stream.seek(start)
    value = default(stream, leaf)
    if saved.dtype.kind in "biufc" and saved.ndim == 0 and not _same(saved.item(), value):
        raise FormatError(
            f"the equinox stream holds {excerpt(saved.item())} here, which like's {type(leaf).__name__} leaf would "
            f"turn into {excerpt(value)}: give like a {type(saved.item()).__name__} here, as the model saved had",
            file=name,
            path=path,
        )
    return value


def _array(default: Any, name: str, path: str, stream: io.BytesIO, leaf: Any) -> Any:
    """The stream's next array for ``like``'s jax array ``leaf`` at ``path``, as equinox reads it (jax's dtype for
    it); only if that dtype holds every value saved."""
    start = stream.tell()
    value = default(stream, leaf)
    end = stream.tell()
    stream.seek(start)
    if (stored := _npy_dtype(stream)) is not None and stored != value.dtype:
        stream.seek(start)
        saved = np.load(stream)
        kept = np.asarray(value).astype(saved.dtype)
        if not np.array_equal(kept, saved, equal_nan=saved.dtype.kind in "fc"):
            first = np.flatnonzero((kept != saved) & ~(np.isnan(saved) if saved.dtype.kind in "fc" else False))[0]
            raise FormatError(
                f"the equinox stream holds {saved.dtype} here, which like's {value.dtype} leaf would change "
                f"({excerpt(saved.flat[first].item())} into {excerpt(kept.flat[first].item())}): turn on jax's "
                "64-bit mode (jax.config.update('jax_enable_x64', True)) and give like this dtype",
                file=name,
                path=path,
            )
    stream.seek(end)
    return value


def _npy_dtype(stream: io.BytesIO) -> np.dtype | None:
    """The dtype of the ``.npy`` at the stream's position (read up to its data), or ``None`` where it is none to cast:
    not a number's."""
    try:
        version = np.lib.format.read_magic(stream)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        dtype: np.dtype = read(stream)[2]
    except ValueError:
        return None
    return dtype if dtype.kind in "biufc" else None


def _ours(error: BaseException | None) -> FormatError | None:
    """The :class:`FormatError` of :func:`_leaf` that equinox raised ``error`` from (its ``TreePathError``), if any."""
    while error is not None and not isinstance(error, FormatError):
        error = error.__cause__ if error.__cause__ is not error else None
    return error


def _same(saved: Any, value: Any) -> bool:
    """Whether ``value`` is ``saved`` (both NaN counts as the same)."""
    return bool(value == saved) or (saved != saved and value != value)
