"""What a name in a file stands for: objects registered with ``saveable`` first, then the known libraries' public
names; what the name policy refuses is refused by the lookup too, and an unknown name says how to make it known."""

from __future__ import annotations

import builtins
import functools
import os
import pickle
import subprocess
import sys
import types
import warnings

import jax
import numpy as np
import pytest

from jaxstow._names import registry
from jaxstow._names.registry import attribute_class_name, lookup, name_of, saveable
from jaxstow.errors import ArgumentError, RefusedNameError, UnknownNameError


def test_known_library_objects_have_their_public_names_both_ways():
    for name, obj in [("jax.nn.relu", jax.nn.relu), ("numpy.tanh", np.tanh), ("builtins.dict", dict)]:
        assert name_of(obj) == name
        assert lookup(name) is obj


def test_a_registered_name_comes_first_and_a_new_object_under_it_warns_and_wins():
    def first(x):
        return x

    def second(x):
        return -x

    saveable(first, name="tests.names.activation")
    assert lookup("tests.names.activation") is first and name_of(first) == "tests.names.activation"
    with pytest.warns(UserWarning, match="the name 'tests.names.activation' was registered for .*first.* and now"):
        saveable(second, name="tests.names.activation")
    assert lookup("tests.names.activation") is second
    assert name_of(first) is None  # the old object lost its name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saveable(second, name="tests.names.activation")  # the same object again: no warning


def test_a_librarys_name_is_not_taken_over_by_another_object():
    # It was: files naming jax.nn.relu loaded the user's function here, and its files loaded jax's relu elsewhere.
    def mine(x):
        return -x

    with pytest.raises(ArgumentError, match=r"saveable\(name='jax.nn.relu'\): that name is .*'my_project.relu'"):
        saveable(mine, name="jax.nn.relu")
    assert lookup("jax.nn.relu") is jax.nn.relu and name_of(mine) is None
    saveable(jax.nn.relu, name="jax.nn.relu")  # the library's own object under its own name: nothing changes


@saveable
def module_level_activation(x):
    return x


def test_saveable_takes_every_form_and_defaults_to_module_qualname():
    @saveable(name="tests.names.named")
    def named(x):
        return x

    @saveable("tests.names.flarejax_style")
    def flarejax_style(x):
        return x

    assert name_of(module_level_activation) == f"{__name__}.module_level_activation"
    assert lookup(f"{__name__}.module_level_activation") is module_level_activation
    assert name_of(named) == "tests.names.named"
    assert name_of(flarejax_style) == "tests.names.flarejax_style"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: saveable(lambda x: x), "has no importable module.qualname .* give it an explicit name"),
        (lambda: saveable(functools.partial(print)), "has no importable module.qualname"),
        (lambda: saveable(functools.partial(print), name=""), "a registered name must be a non-empty string"),
        (lambda: saveable("tests.names.a", name="tests.names.b"), "names twice: give the name once"),
    ],
)
def test_saveable_refuses_what_it_cannot_name(call, message):
    with pytest.raises(ArgumentError, match=message):
        call()


def test_only_classes_registered_or_known_as_such_are_saved_by_their_attributes():
    @saveable(name="tests.names.Schedule")
    class Schedule:
        pass

    registered_function = saveable(lambda: None, name="tests.names.factory")
    assert attribute_class_name(Schedule) == "tests.names.Schedule"
    assert attribute_class_name(registered_function) is None  # type: ignore[arg-type]
    assert attribute_class_name(dict) is None  # known by name, but a container, not an attribute class


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("numpy.savetxt", "is not an activation, an elementwise or reducing function or a scalar type"),
        ("numpy.load", "is not an activation"),
        ("jax.numpy.zeros", "is not an activation"),
    ],
)
def test_a_name_the_policy_refuses_is_refused_with_the_policy(name, reason):
    with pytest.raises(RefusedNameError, match="which jaxstow's name policy refuses") as caught:
        lookup(name, file="model.jxs", path="act")
    assert reason in caught.value.reason and "a file may name only pure functions" in caught.value.reason
    assert str(caught.value).startswith(f"leaf 'act' of model.jxs: the file names '{name}'")


def test_a_node_type_of_a_forbidden_module_is_refused_and_a_function_there_is_never_found():
    with pytest.raises(RefusedNameError, match="comes from subprocess, which a file may never name"):
        lookup("subprocess.Popen", node_type=True)
    for node_type in (False, True):  # never the advice to register it, which saveable refuses too
        with pytest.raises(RefusedNameError, match=r"os\.system comes from os, which a file may never name") as caught:
            lookup("os.system", node_type=node_type)
        assert "saveable(obj" not in str(caught.value)


@pytest.mark.parametrize(
    "name",
    ["builtins.eval", "subprocess.Popen", "pickle.loads", "importlib.import_module", "io.open", "numpy.lib.npyio.savetxt",
     "numpy.ctypeslib.load_library", "jax.config.update", "jax.experimental.io_callback", "flax.io.remove"],
)  # fmt: skip
def test_a_name_no_registration_may_take_is_refused_naming_the_policy(name):
    with pytest.raises(RefusedNameError, match=r"which jaxstow's name policy refuses: .*a file may name only pure"):
        lookup(name)


@pytest.mark.parametrize("obj", [os.system, subprocess.Popen, pickle.loads, builtins.eval])
def test_saveable_refuses_what_reads_writes_imports_or_runs(obj):
    with pytest.raises(ArgumentError, match="reads, writes, imports or runs something"):
        saveable(obj, name="my_project.helper")


def test_a_node_type_of_an_imported_module_is_found_by_module_and_qualname():
    assert lookup("functools.partial", node_type=True) is functools.partial
    with pytest.raises(UnknownNameError):
        lookup("functools.partial")  # only as a node type: the caller then checks it is one


def test_a_namedtuple_of_the_standard_library_is_refused_as_a_node_type():
    # platform.uname_result was rebuilt from a file, and reading it ran `uname -p` in a subprocess.
    import platform  # noqa: F401 - imported, as a process that loads files may have it

    with pytest.raises(RefusedNameError, match=r"'platform.uname_result'.* a namedtuple of Python's standard library"):
        lookup("platform.uname_result", node_type=True)


def test_an_unknown_name_says_how_to_make_it_known():
    with pytest.raises(UnknownNameError, match=r"register it with jaxstow.saveable\(obj, name='my_project.gone'\)"):
        lookup("my_project.gone")
    with pytest.raises(UnknownNameError, match=r"it is defined by jaxstow\.io\.novel: import jaxstow\.io\.novel first"):
        lookup("jaxstow.io.novel.Thing")


def test_a_name_of_an_installed_library_not_imported_yet_says_to_import_it():
    script = (
        "from jaxstow._names.registry import lookup\n"
        "for name in ('tabnanny.check', 'optax.adam'):\n"
        "    try:\n"
        "        lookup(name)\n"
        "    except LookupError as error:\n"
        "        print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    installed, known = done.stdout.splitlines()
    assert installed.endswith(
        "it belongs to tabnanny, which is installed but not imported in this process: import tabnanny first, "
        "and register the object as it was when saved: jaxstow.saveable(obj, name='tabnanny.check')"
    )
    assert known.endswith("it belongs to optax, which is not imported in this process: import optax first")


def test_the_known_names_follow_imports(monkeypatch):
    """The library index is rebuilt when modules have been imported since it was built, and only then."""
    tables = registry._libraries.tables()
    assert registry._libraries.tables() is tables
    monkeypatch.setitem(sys.modules, "tests_names_imported_now", types.ModuleType("tests_names_imported_now"))
    assert registry._libraries.tables() is not tables
