"""The known libraries are registered through one hook, the core's and a face's alike.

A library registered in a fresh process, after the registry's tables were built, makes its objects nameable once it
is imported, under its policy; FlareJax's names come from the FlareJax face, registered by ``import jaxstow``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import jaxstow
from jaxstow._names import libraries
from jaxstow._names.libraries import known, register_library
from jaxstow.errors import ArgumentError

TOY_LIBRARY = """
import jax


def act(x):
    return jax.numpy.tanh(x)


def save_weights(path):
    raise AssertionError("a file named a serialisation helper and it was called")


class Key:
    def __init__(self, name):
        self.name = name
"""


def _run(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{folder}:{Path(jaxstow.__file__).parents[1]}", "JAX_PLATFORMS": "cpu"},
        check=False,
    )


def test_a_library_registered_after_the_tables_were_built_is_named_under_its_policy(tmp_path: Path) -> None:
    (tmp_path / "toylib.py").write_text(TOY_LIBRARY)
    done = _run(
        f"""
        import jax.numpy as jnp, jaxstow
        from jaxstow._names import registry
        from jaxstow._names.libraries import register_library
        from jaxstow.errors import RefusedNameError, UnsaveableObjectError
        import toylib

        assert registry.name_of(jnp.sin) == "jax.numpy.sin"  # the tables are built, without toylib
        try:
            jaxstow.save({str(tmp_path / "early.jxs")!r}, {{"act": toylib.act}})
        except UnsaveableObjectError:
            pass
        else:
            raise AssertionError("an unknown library's function was saved")
        assert registry.name_of(toylib.act) is None
        register_library("toylib", public_namespaces=("toylib",), attribute_classes=("toylib.Key",))
        assert registry.name_of(toylib.act) == "toylib.act"  # no module imported since: the registration counts
        path = {str(tmp_path / "model.jxs")!r}
        jaxstow.save(path, {{"act": toylib.act, "key": toylib.Key("w"), "w": jnp.ones(2)}})
        loaded = jaxstow.load(path)
        assert loaded["act"] is toylib.act and type(loaded["key"]) is toylib.Key and loaded["key"].name == "w"
        assert registry.name_of(toylib.save_weights) is None  # a model library's serialisation helper
        try:
            registry.lookup("toylib.save_weights")
        except RefusedNameError as error:
            assert "serialisation" in str(error) and "toylib" in str(error), error
        else:
            raise AssertionError("a serialisation helper was looked up")
        print("ok")
        """,
        tmp_path,
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_flarejax_is_registered_by_its_face_when_jaxstow_is_imported(tmp_path: Path) -> None:
    done = _run(
        """
        import sys
        import jaxstow
        from jaxstow._names.libraries import known
        library = known().library("flarejax")
        assert library is jaxstow.flarejax.LIBRARY, library
        assert known().names[-1] == "flarejax" and known().policy_of("flarejax.net.Linear") == "model"
        assert "flarejax" not in sys.modules  # registering imports nothing
        print("ok")
        """,
        tmp_path,
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_core_registers_its_libraries_through_the_hook() -> None:
    numeric = [library.name for library in known().libraries if library.policy == "numeric"]
    searched = known().searched_inside
    assert numeric == ["jax", "numpy", "ml_dtypes"]
    assert {"equinox", "flax", "optax", "flarejax"} <= searched and not searched & {"jax", "numpy"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"name": "flax.nnx"}, r"top-level module, such as 'optax', not 'flax.nnx'"),
        ({"name": "toy", "public_namespaces": ("numpy",)}, r"public_namespaces of the library 'toy' .*\['numpy'\]"),
        ({"name": "toy", "public_namespaces": "toy"}, r"a sequence of dotted names, not the single string 'toy'"),
        ({"name": "toy", "attribute_classes": ("os.PathLike",)}, r"attribute_classes .*\['os.PathLike'\]"),
        ({"name": "toy", "policy": "anything"}, r"policy must be one of \('numeric', 'model'\), not 'anything'"),
        ({"name": "jax", "public_namespaces": ("jax",)}, r"'jax' is registered already, with other settings"),
    ],
)
def test_bad_registrations_are_refused_and_change_nothing(arguments, message) -> None:
    before = known()
    with pytest.raises(ArgumentError, match=message):
        register_library(**arguments)
    assert known() is before


def test_registering_again_with_the_same_settings_changes_nothing() -> None:
    before = known()
    assert register_library(**_settings("optax")) == before.library("optax")
    assert known() is before


def _settings(name: str) -> dict[str, object]:
    library = known().library(name)
    assert library is not None
    return {
        "name": library.name,
        "public_namespaces": library.public_namespaces,
        "searched_inside": library.searched_inside,
        "attribute_classes": library.attribute_classes,
        "policy": library.policy,
    }


def test_threads_registering_at_once_lose_no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each registration publishes the whole set; threads registering together all find theirs in it."""
    monkeypatch.setattr(libraries, "_known", known())  # restored after the test
    names = [f"threaded_library_{index}" for index in range(16)]
    start = threading.Barrier(len(names))

    def register(name: str) -> None:
        start.wait()
        register_library(name, public_namespaces=(name,))

    threads = [threading.Thread(target=register, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(names) <= set(known().names)
