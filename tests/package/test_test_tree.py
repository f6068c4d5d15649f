"""The tests mirror the package: every layer and face (a folder of ``src/jaxstow``, and ``_save_load.py``) has a folder
of tests of its own, named without the underscore, and every folder of tests is one of those or one of the few that
span the package. Test files are run under their bare names (pytest's default import mode), so no two may share one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

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
