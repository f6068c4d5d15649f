"""Posterior draws as ArviZ's data, at either major version of ArviZ.

ArviZ 0.x holds a run in an ``arviz.InferenceData`` (``arviz.from_dict(posterior=...)``); ArviZ 1.x in xarray's
``DataTree`` (``arviz.from_dict({"posterior": ...})``). :func:`from_posterior` makes whichever the installed ArviZ
works with, so that :func:`~jaxstow.io.to_inference_data` and ``jaxstow watch`` run with both.

>>> import numpy as np
>>> from jaxstow.io.arviz_data import from_posterior
>>> dict(from_posterior({"mu": np.zeros((2, 5))}, purpose="an example").posterior.sizes)
{'chain': 2, 'draw': 5}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError
from jaxstow.io.arviz_labels import checked_labels

__all__ = ["arviz_major", "from_posterior", "without_slash", "without_slashes"]


def arviz_major(arviz: Any) -> int:
    """The major version of an imported ``arviz`` module: 0 or 1 (or later)."""
    return int(str(arviz.__version__).split(".")[0])


def from_posterior(
    posterior: Mapping[str, np.ndarray],
    *,
    purpose: str,
    coords: Mapping[str, Any] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """ArviZ's data whose ``posterior`` group holds ``posterior`` (each array shaped ``(chain, draw, ...)``).

    Args:
        posterior: The variables by name.
        purpose: What needs ArviZ, named in the error where it is not installed.
        coords: Labels of dimensions, passed to ``arviz.from_dict`` once checked: one label per entry.
        dims: Names of the axes of each variable's draws, passed to ``arviz.from_dict`` once checked: one per axis.

    Returns:
        An ``arviz.InferenceData`` with ArviZ 0.x, an ``xarray.DataTree`` with ArviZ 1.x (whose variables may not
        hold a ``/``: ``group/mu``, a numpyro site of ``numpyro.handlers.scope``, is ``group%2Fmu`` there).

    Raises:
        MissingDependencyError: ArviZ is not installed.
        ArgumentError: ``coords`` or ``dims`` do not fit the variables (see :mod:`~jaxstow.io.arviz_labels`).
    """
    arviz = require("arviz", extra="arviz", purpose=purpose)
    modern = arviz_major(arviz) >= 1  # a DataTree, whose variables may not hold a "/": spelt as the file spells it
    labels, axes = checked_labels(posterior, coords, dims, spelt=without_slash if modern else str)
    options: dict[str, Any] = {"coords": labels, "dims": axes}
    if modern:
        named = {spelt: posterior[name] for name, spelt in without_slashes(posterior).items()}
        if axes is not None:
            options["dims"] = {without_slash(name): names for name, names in axes.items()}
        return arviz.from_dict({"posterior": named}, **options)
    return arviz.from_dict(posterior=dict(posterior), **options)


def without_slash(name: str) -> str:
    """A variable's name with its ``/`` as ``%2F`` (and so its ``%`` as ``%25``), if it has one.

    >>> without_slash("group/mu"), without_slash("theta"), without_slash("a%/b")
    ('group%2Fmu', 'theta', 'a%25%2Fb')
    """
    return name.replace("%", "%25").replace("/", "%2F") if "/" in name else name


def without_slashes(names: Iterable[str]) -> dict[str, str]:
    """Each of ``names`` as :func:`without_slash` spells it; two spelt alike (``g/mu`` and ``g%2Fmu``) are an
    :class:`~jaxstow.errors.ArgumentError` naming both, never one variable in place of the other.

    >>> without_slashes(["g/mu", "theta"])
    {'g/mu': 'g%2Fmu', 'theta': 'theta'}
    """
    spelt: dict[str, str] = {}
    for name in names:
        twin = next((other for other, spelling in spelt.items() if spelling == without_slash(name)), None)
        if twin is not None:
            raise ArgumentError(
                f"the variables {twin!r} and {name!r} would both be named {without_slash(name)!r} in ArviZ, whose "
                "variable names hold no '/': rename one of them"
            )
        spelt[name] = without_slash(name)
    return spelt
