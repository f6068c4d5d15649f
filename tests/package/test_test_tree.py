"""The tests mirror the package: every layer and face (a folder of ``src/jaxstow``, and ``_save_load.py``) has a folder
of tests of its own, named without the underscore, and every folder of tests is one of those or one of the few that
span the package. Test files are run under their bare names (pytest's default import mode), so no two may share one.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
PACKAGE = TESTS.parent / "src" / "jaxstow"

#: Folders of tests that belong to no one layer: the reference libraries' own tests, the docs' examples, the package
#: as a whole, helpers shared by the tests, the golden files, and the scripts the multi-process tests start.
SPANNING = {"reference", "docs", "package", "support", "data", "distributed"}


def _units() -> set[str]:
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    return {name.lstrip("_") for name in folders | {"_save_load"}}


def test_every_layer_and_face_has_tests_of_its_own():
    units = _units()
    assert {"util", "names", "format", "storage", "steps", "write", "read", "save_load", "checkpoint"} <= units
    without = sorted(unit for unit in units if not any((TESTS / unit).glob("test_*.py")))
    assert without == [], f"layers with no tests of their own: add tests/<layer>/test_*.py for {without}"


def test_every_folder_of_tests_is_a_layer_or_spans_the_package():
    folders = {path.name for path in TESTS.iterdir() if path.is_dir() and not path.name.startswith((".", "__"))}
    assert folders - _units() - SPANNING == set()


def test_no_two_test_files_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []


#: What the repository's top level holds: the package, its tests, docs, examples, benchmarks and reliability suite,
#: and the files that build, check and describe them. A file a test or a script left in the working folder is none.
TOP_LEVEL = {
    ".ci", "bench", "docs", "examples", "reliability", "src", "tests",
    ".gitignore", ".pre-commit-config.yaml", "CHANGELOG.md", "LICENSE", "Makefile", "README.md", "conftest.py",
    "mkdocs.yml", "pyproject.toml",
}  # fmt: skip


def test_the_repository_top_level_holds_only_the_projects_files():
    root = TESTS.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    stray = sorted({line.split("/")[0] for line in listed.splitlines()} - TOP_LEVEL)
    assert stray == [], f"files committed at the top level that are not the project's: {stray}"
