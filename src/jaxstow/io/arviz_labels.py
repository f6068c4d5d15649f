"""The ``dims`` and ``coords`` that :func:`~jaxstow.io.to_inference_data` hands to ArviZ, checked against the draws
first: ArviZ's own errors (a ``KeyError`` of a name, xarray's conflicting sizes) name no variable, and it takes some
mistakes without a word (a dimension of two lengths, padded with NaN; ``dims`` of a variable that does not exist,
ignored). Each mistake is an :class:`~jaxstow.errors.ArgumentError` naming the variable, the shape of its draws and
what was expected.

>>> import numpy as np
>>> from jaxstow.io.arviz_labels import checked_labels
>>> posterior = {"theta": np.zeros((2, 5, 3))}                  # (chain, draw, ...)
>>> checked_labels(posterior, {"school": ["a", "b", "c"]}, {"theta": ("school",)}, spelt=str)
({'school': array(['a', 'b', 'c'], dtype='<U1')}, {'theta': ['school']})
>>> checked_labels(posterior, None, {"theta": ["school", "year"]}, spelt=str)
Traceback (most recent call last):
...
jaxstow.errors.ArgumentError: dims['theta'] names 2 axes (['school', 'year']), but the draws of 'theta' have 1 axis: give one name per axis of the draws of 'theta', shape (3,), none twice, and neither 'chain' nor 'draw'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow.errors import ArgumentError, excerpt

__all__ = ["checked_labels"]

#: The dimensions every variable has first, which ArviZ adds itself.
_SAMPLE_DIMENSIONS = ("chain", "draw")


def checked_labels(
    posterior: Mapping[str, np.ndarray], coords: Any, dims: Any, *, spelt: Callable[[str], str]
) -> tuple[dict[str, np.ndarray] | None, dict[str, list[str]] | None]:
    """``coords`` (labels by dimension) and ``dims`` (the names of the axes of each variable's draws) as ArviZ takes
    them, each checked against the variables of ``posterior`` (shaped ``(chain, draw, ...)``); ``spelt`` gives the
    name ArviZ gives a variable, whose axes ``dims`` does not name are ``<that name>_dim_<axis>``."""
    named = _checked_dims(posterior, dims)
    sizes, origins = _dimensions(posterior, named, spelt)
    if coords is None:
        return None, named if dims is not None else None
    if not isinstance(coords, Mapping):
        raise ArgumentError(
            f"coords maps dimensions to their labels, as {{'school': ['a', 'b']}}, not {excerpt(coords)}"
        )
    checked = {}
    for dimension, labels in coords.items():
        if dimension not in sizes:
            raise ArgumentError(
                f"coords names {excerpt(dimension)}, which is no dimension of the draws: they are {sorted(sizes)} "
                "(chain, draw, the names dims gives, and ArviZ's names of the other axes)"
            )
        try:
            values = np.asarray(labels)
        except (ValueError, TypeError):  # ragged, or of objects numpy cannot hold
            values = None
        if values is None or values.ndim != 1 or len(values) != sizes[dimension]:
            raise ArgumentError(
                f"coords[{dimension!r}] is {excerpt(labels)}, but the dimension {dimension!r} is {origins[dimension]}: "
                f"give a list of {sizes[dimension]} labels"
            )
        checked[dimension] = values
    return checked, named if dims is not None else None


def _checked_dims(posterior: Mapping[str, np.ndarray], dims: Any) -> dict[str, list[str]]:
    """``dims`` as lists of names, by variable: one name per axis of the variable's draws."""
    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise ArgumentError(
            f"dims maps each variable to the names of the axes of its draws, as {{'theta': ['school']}}, not "
            f"{excerpt(dims)}"
        )
    named = {}
    for name, axes in dims.items():
        if name not in posterior:
            raise ArgumentError(
                f"dims names {excerpt(name)}, which is no variable of the draws: they are {sorted(posterior)}"
            )
        shape = posterior[name].shape[2:]
        if isinstance(axes, str) or not isinstance(axes, Sequence) or not all(isinstance(axis, str) for axis in axes):
            raise ArgumentError(
                f"dims[{name!r}] is {excerpt(axes)}, but it takes a list of names (str), one per axis of the draws "
                f"of {name!r}, shape {shape}: as {[f'axis_{axis}' for axis in range(len(shape))]}"
            )
        clash = sorted(set(axes) & set(_SAMPLE_DIMENSIONS))
        if len(axes) != len(shape):
            problem = f"names {_axes(len(axes))} ({list(axes)}), but the draws of {name!r} have {_axes(len(shape))}"
        elif clash:
            problem = f"names an axis {clash[0]!r}, a dimension that ArviZ puts before the axes of every draw"
        elif len(set(axes)) != len(axes):
            problem = f"names two axes alike ({list(axes)})"
        else:
            named[name] = list(axes)
            continue
        raise ArgumentError(
            f"dims[{name!r}] {problem}: give one name per axis of the draws of {name!r}, shape {shape}, none twice, "
            "and neither 'chain' nor 'draw'"
        )
    return named


def _dimensions(
    posterior: Mapping[str, np.ndarray], named: Mapping[str, list[str]], spelt: Callable[[str], str]
) -> tuple[dict[str, int], dict[str, str]]:
    """The length of every dimension of the draws, and where it comes from (for messages); a dimension that two
    axes of different lengths share is an :class:`ArgumentError`."""
    chains, draws = next(iter(posterior.values())).shape[:2]
    sizes = {"chain": chains, "draw": draws}
    origins = {"chain": f"the {chains} chains", "draw": f"the {draws} draws of each chain"}
    for name, values in posterior.items():
        shape = values.shape[2:]
        axes = named.get(name) or [f"{spelt(name)}_dim_{axis}" for axis in range(len(shape))]
        for axis, (dimension, size) in enumerate(zip(axes, shape, strict=True)):
            origin = f"axis {axis} of the draws of {name!r}, shape {shape}"
            if sizes.setdefault(dimension, size) != size:
                raise ArgumentError(
                    f"the dimension {dimension!r} is {origin}, of length {size}, and {origins[dimension]}, of length "
                    f"{sizes[dimension]}: ArviZ would pad the shorter with NaN; give the axes different names in dims"
                )
            origins.setdefault(dimension, origin)
    return sizes, origins


def _axes(count: int) -> str:
    return f"{count} axis" if count == 1 else f"{count} axes"
