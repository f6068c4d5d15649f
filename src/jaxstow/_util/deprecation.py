"""Names that moved: the old name still works, with a :class:`DeprecationWarning` that names the new place.

>>> import warnings
>>> from jaxstow._util.deprecation import moved
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     dumps = moved("mylib.dumps", "json", "dumps")
>>> dumps is __import__("json").dumps, str(caught[0].message)
(True, 'mylib.dumps has moved: use json.dumps (the old name will be removed)')
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     keywords = {"indent": 2, "sort_keys": True}
...     moved_keywords("mylib.dumps", keywords, ("indent",), use="mylib.pretty")
{'indent': 2}
>>> keywords, str(caught[0].message)
({'sort_keys': True}, 'mylib.dumps(indent=...) is deprecated: use mylib.pretty, which takes it (the old keyword will be removed)')
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["moved", "moved_keywords"]


def moved(old: str, module: str, name: str | None = None, *, use: str | None = None) -> Any:
    """Return ``module.name`` (the module itself without ``name``), warning that ``old`` is deprecated.

    The warning says what to ``use`` instead (``module.name`` by default).
    """
    use = use or (f"{module}.{name}" if name else module)
    warnings.warn(f"{old} has moved: use {use} (the old name will be removed)", DeprecationWarning, stacklevel=3)
    found = importlib.import_module(module)
    return getattr(found, name) if name else found


def moved_keywords(call: str, given: dict[str, Any], names: Iterable[str], *, use: str) -> dict[str, Any]:
    """Take the keywords ``names`` out of ``given`` (the keywords passed to ``call``), warning that ``use`` takes them.

    Returns those taken, by name (one given as ``None`` is dropped, as not given); the warning is the caller's
    caller's, once for all of them.
    """
    taken = {name: given.pop(name) for name in names if name in given}
    taken = {name: value for name, value in taken.items() if value is not None}  # None: as if not given
    if taken:
        shown = ", ".join(f"{name}=..." for name in taken)
        keywords = "them" if len(taken) > 1 else "it"
        warnings.warn(
            f"{call}({shown}) is deprecated: use {use}, which takes {keywords} (the old keyword"
            f"{'s' if len(taken) > 1 else ''} will be removed)",
            DeprecationWarning,
            stacklevel=3,
        )
    return taken
