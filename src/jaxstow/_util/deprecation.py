"""Names that moved: the old name still works, with a :class:`DeprecationWarning` that names the new place.

>>> import warnings
>>> from jaxstow._util.deprecation import moved
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     dumps = moved("mylib.dumps", "json", "dumps")
>>> dumps is __import__("json").dumps, str(caught[0].message)
(True, 'mylib.dumps has moved: use json.dumps (the old name will be removed)')
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["moved"]


def moved(old: str, module: str, name: str | None = None, *, use: str | None = None) -> Any:
    """Return ``module.name`` (the module itself without ``name``), warning that ``old`` is deprecated.

    The warning says what to ``use`` instead (``module.name`` by default).
    """
    use = use or (f"{module}.{name}" if name else module)
    warnings.warn(f"{old} has moved: use {use} (the old name will be removed)", DeprecationWarning, stacklevel=3)
    found = importlib.import_module(module)
    return getattr(found, name) if name else found
