"""A file that names objects of several libraries, loaded in a fresh process that imported none of them, fails once,
with one error naming every library to import ("import equinox and optax first"), never one library per attempt;
once they are imported, it loads. The saves run in the test's process; each load in a process of its own that has
imported numpy, jax and jaxstow only (forked: ``tests/support/forked.py``), with the real libraries."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import forked
import pytest

import jaxstow

pytest.importorskip("equinox")
pytest.importorskip("optax")

#: Builds the same model and optimizer state in every process: ``mixed`` is one tree of both, ``sgd`` names optax
#: alone, ``items`` is a step whose items name one library each.
_STATE = """
import equinox as eqx, jax, jax.numpy as jnp, optax

def mixed():
    model = eqx.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(0))
    return {"model": model, "opt": optax.adam(1e-2).init(eqx.filter(model, eqx.is_array))}

def sgd():
    return optax.sgd(0.1).init(jnp.ones(2))

def items():
    return {"model": eqx.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(1)),
            "opt": optax.sgd(0.1, momentum=0.9).init({"w": jnp.arange(4.0)})}
"""

#: Loads ``load`` in a process that imports only jaxstow, then again after importing ``then``; prints what happened.
_LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import jaxstow

def attempt():
    try:
        tree = LOAD
    except jaxstow.errors.UnknownNameError as error:
        return {"error": str(error), "libraries": list(error.libraries), "file": error.file}
    import jax, numpy as np
    from state import BUILD
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(BUILD()), strict=True))
    return {"same": same and jax.tree.structure(tree) == jax.tree.structure(BUILD())}

before = attempt()
imported = {name: name in sys.modules for name in ("equinox", "optax", "flax")}
for name in sys.argv[2:]:
    __import__(name)
print(json.dumps({"before": before, "imported_by_loading": imported, "after": attempt()}))
"""


def _load(folder: Path, load: str, build: str, *then: str) -> dict:
    script = textwrap.dedent(_LOAD.replace("LOAD", load).replace("BUILD", build))
    done = forked.run(
        [sys.executable, "-c", script, str(folder), *then], capture_output=True, text=True, timeout=300, cwd=folder
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _state(folder: Path) -> ModuleType:
    """``state.py`` of ``folder``, imported in this process (which may have imported the libraries already)."""
    spec = importlib.util.spec_from_file_location(f"state_{folder.name}", folder / "state.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "state.py").write_text(_STATE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_model_and_its_optimizer_state_name_both_libraries_in_one_error(folder: Path) -> None:
    jaxstow.save("mixed.jxs", _state(folder).mixed())
    loaded = _load(folder, "jaxstow.load('mixed.jxs')", "mixed", "equinox", "optax")
    before = loaded["before"]
    assert before["libraries"] == ["equinox", "optax"], before
    assert before["error"].endswith("import equinox and optax first"), before
    assert before["file"].endswith("mixed.jxs")
    assert loaded["imported_by_loading"] == {"equinox": False, "optax": False, "flax": False}
    assert loaded["after"] == {"same": True}


def test_a_step_whose_items_name_one_library_each_names_both_in_one_error(folder: Path) -> None:
    with jaxstow.CheckpointManager("run") as manager:
        manager.save(1, _state(folder).items())
    loaded = _load(folder, "jaxstow.CheckpointManager('run').restore(1)", "items", "equinox", "optax")
    before = loaded["before"]
    assert before["libraries"] == ["equinox", "optax"], before
    assert "the step's files also name objects of" in before["error"], before
    assert before["error"].endswith("import equinox and optax first"), before
    assert loaded["after"] == {"same": True}


@pytest.mark.parametrize("kept_in", ["one file", "a step's items"])
def test_three_libraries_are_listed_in_order(folder: Path, kept_in: str) -> None:
    pytest.importorskip("flax")
    (folder / "state.py").write_text(
        _STATE
        + "\ndef three():\n    from flax import nnx\n"
        + "    return {**mixed(), 'layer': nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))}\n"
    )
    if kept_in == "one file":
        jaxstow.save("three.jxs", _state(folder).three())
        load = "jaxstow.load('three.jxs')"
    else:  # each item names one library, flax.nnx among them
        with jaxstow.CheckpointManager("run") as manager:
            manager.save(1, _state(folder).three())
        load = "jaxstow.CheckpointManager('run').restore(1)"
    loaded = _load(folder, load, "three", "equinox", "flax.nnx", "optax")
    assert loaded["before"]["libraries"] == ["equinox", "flax.nnx", "optax"], loaded  # import flax leaves nnx out
    assert loaded["before"]["error"].endswith("import equinox, flax.nnx and optax first"), loaded
    assert loaded["after"] == {"same": True}


def test_a_file_naming_one_library_not_imported_says_to_import_it_alone(folder: Path) -> None:
    jaxstow.save("opt.jxs", _state(folder).sgd())
    loaded = _load(folder, "jaxstow.load('opt.jxs')", "sgd", "optax")
    assert loaded["before"]["libraries"] == ["optax"]
    assert loaded["before"]["error"].endswith(
        "it belongs to optax, which is not imported in this process: import optax first"
    )
    assert loaded["after"] == {"same": True}
