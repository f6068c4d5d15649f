"""Optional packages are imported where a feature needs them, and a missing one is an error that names the extra to
install and what needed it."""

from __future__ import annotations

import sys

import pytest

from jaxstow._util.optional import require
from jaxstow.errors import JaxstowError, MissingDependencyError


def test_an_installed_module_is_imported_and_returned():
    assert require("json.decoder", extra="none", purpose="reading JSON") is sys.modules["json.decoder"]


def test_a_missing_package_names_the_extra_and_the_purpose(monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # an import of it fails, as where it is not installed
    with pytest.raises(MissingDependencyError) as caught:
        require("h5py", extra="h5py", purpose="an HDF5 collector")
    assert str(caught.value) == "an HDF5 collector needs the optional package h5py: pip install 'jaxstow[h5py]'"
    assert isinstance(caught.value, JaxstowError) and isinstance(caught.value, ImportError)
    assert isinstance(caught.value.__cause__, ImportError)


def test_a_package_whose_own_dependency_is_missing_names_that_dependency(tmp_path, monkeypatch):
    (tmp_path / "jaxstow_tests_wrapper.py").write_text("import jaxstow_tests_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "jaxstow_tests_wrapper", raising=False)
    with pytest.raises(MissingDependencyError, match="needs the optional package jaxstow_tests_absent_dependency: pip"):
        require("jaxstow_tests_wrapper", extra="cli", purpose="a table")
