"""Test modules and modules' doctests that need an optional package are skipped, naming it, where it is missing.

An optional package is one of the project's extras (``optional-dependencies`` in ``pyproject.toml``: torch, orbax,
flax, blackjax, ...). A module is skipped as a whole when it imports a missing one at its top level, where the import
would fail, and a module's doctests also when their examples import one. Imports inside a test are the test's own
business (``pytest.importorskip``); for the scripts and examples a test runs, the fixture ``missing_optional`` names
the missing packages they import.
"""

from __future__ import annotations

import ast
import doctest
import functools
import importlib.util
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule

_PYPROJECT = Path(__file__).parent / "pyproject.toml"


def _optional_distributions() -> set[str]:
    extras = tomllib.loads(_PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {_normalized(re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]) for lines in extras.values() for line in lines}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


_OPTIONAL = _optional_distributions()


def _is_optional(module: str) -> bool:
    """Whether ``module`` (a top-level import name) is what an optional distribution installs: ``torch`` for
    ``torch``, ``orbax`` for ``orbax-checkpoint``."""
    name = _normalized(module)
    return any(distribution == name or distribution.startswith(name + "_") for distribution in _OPTIONAL)


def _imports(nodes: Iterable[ast.AST]) -> set[str]:
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def _example_imports(source: str) -> set[str]:
    found: set[str] = set()
    for example in doctest.DocTestParser().get_examples(source):
        try:
            found |= _imports(ast.walk(ast.parse(example.source)))
        except SyntaxError:
            continue  # a fragment of a statement: doctest reports it
    return found


#: Every ``import NAMES`` and ``from NAME import``, in code, examples or prose alike: more than the module imports.
_IMPORT_WORDS = re.compile(r"\bfrom\s+([\w.]+)\s+import\b|\bimport\s+([^\n;]+)")


def _may_import_missing(source: str) -> bool:
    """Whether ``source`` names, after an ``import`` or ``from``, an optional package that is not installed: when it
    does not, it imports none (the check runs on every module the suite collects; parsing them all costs a second)."""
    for match in _IMPORT_WORDS.finditer(source):
        names = [match[1]] if match[1] else [part.split()[0] for part in match[2].split(",") if part.split()]
        if any(_is_optional(name.split(".")[0]) and not _installed(name.split(".")[0]) for name in names):
            return True
    return False


def missing_packages(source: str, *, examples: bool = False, anywhere: bool = False) -> list[str]:
    """The optional packages that the module ``source`` imports (at its top level, or ``anywhere`` in it, and in its
    doctests' examples if ``examples``) and that are not installed."""
    if not _may_import_missing(source):
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # collecting it reports the error
    names = _imports(ast.walk(tree) if anywhere else tree.body)
    if examples:
        names |= _example_imports(source)
    return sorted(name for name in names if _is_optional(name) and not _installed(name))


@functools.cache
def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport | None:
    if not isinstance(collector, pytest.Module | DoctestModule):
        return None
    missing = missing_packages(collector.path.read_text(), examples=isinstance(collector, DoctestModule))
    if not missing:
        return None
    reason = f"Skipped: needs {', '.join(missing)}, not installed (an optional dependency)"
    return pytest.CollectReport(collector.nodeid, "skipped", (str(collector.path), 0, reason), [])


@pytest.fixture(scope="session")
def missing_optional() -> Callable[..., list[str]]:
    """:func:`missing_packages`, for the scripts and examples that a test runs: a test skips where it finds any."""
    return missing_packages
