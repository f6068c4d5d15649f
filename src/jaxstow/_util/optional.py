"""Optional dependencies, imported where the feature that needs them runs.

jaxstow's required dependencies are jax, numpy, ml_dtypes, xxhash and orjson. Everything else (fsspec for URLs,
h5py for HDF5, tqdm for progress bars, rich for tables, arviz, torch, orbax, ...) is an extra: :func:`require`
imports it when a feature needs it, and its absence is a :class:`~jaxstow.errors.MissingDependencyError` that says
which extra to install.

>>> from jaxstow._util.optional import require
>>> require("json", extra="none", purpose="reading JSON").__name__
'json'
>>> require("no_such_package", extra="h5py", purpose="an HDF5 collector")
Traceback (most recent call last):
...
jaxstow.errors.MissingDependencyError: an HDF5 collector needs the optional package no_such_package: pip install 'jaxstow[h5py]'
"""

from __future__ import annotations

import importlib
import types

from jaxstow.errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, *, extra: str, purpose: str) -> types.ModuleType:
    """Import ``module``, or raise :class:`MissingDependencyError` naming ``extra``; ``purpose`` says what needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = error.name or module
        raise MissingDependencyError(
            f"{purpose} needs the optional package {missing}: pip install 'jaxstow[{extra}]'"
        ) from error
