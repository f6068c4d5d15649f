"""A file that names objects of several libraries, loaded in a fresh process that imported none of them, fails once,
with one error naming every library to import ("import equinox and optax first"), never one library per attempt;
once they are imported, it loads. Each save and load runs in a process of its own, with the real libraries."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

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


def _run(script: str, folder: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(folder), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env={"PYTHONPATH": f"{folder}:{Path(jaxstow.__file__).parents[1]}", "JAX_PLATFORMS": "cpu"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _load(folder: Path, load: str, build: str, *then: str) -> dict:
    script = _LOAD.replace("LOAD", load).replace("BUILD", build)
    return json.loads(_run(script, folder, *then).splitlines()[-1])


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "state.py").write_text(_STATE)
    return tmp_path


def test_a_model_and_its_optimizer_state_name_both_libraries_in_one_error(folder: Path) -> None:
    _run("import jaxstow, state; jaxstow.save('mixed.jxs', state.mixed())", folder)
    loaded = _load(folder, "jaxstow.load('mixed.jxs')", "mixed", "equinox", "optax")
    before = loaded["before"]
    assert before["libraries"] == ["equinox", "optax"], before
    assert before["error"].endswith("import equinox and optax first"), before
    assert before["file"].endswith("mixed.jxs")
    assert loaded["imported_by_loading"] == {"equinox": False, "optax": False, "flax": False}
    assert loaded["after"] == {"same": True}


def test_a_step_whose_items_name_one_library_each_names_both_in_one_error(folder: Path) -> None:
    _run("import jaxstow, state\nwith jaxstow.CheckpointManager('run') as m: m.save(1, state.items())", folder)
    loaded = _load(folder, "jaxstow.CheckpointManager('run').restore(1)", "items", "equinox", "optax")
    before = loaded["before"]
    assert before["libraries"] == ["equinox", "optax"], before
    assert "the step's files also name objects of" in before["error"], before
    assert before["error"].endswith("import equinox and optax first"), before
    assert loaded["after"] == {"same": True}


def test_three_libraries_are_listed_in_order(folder: Path) -> None:
    pytest.importorskip("flax")
    (folder / "state.py").write_text(
        _STATE
        + "\ndef three():\n    from flax import nnx\n"
        + "    return {**mixed(), 'layer': nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))}\n"
    )
    _run("import jaxstow, state; jaxstow.save('three.jxs', state.three())", folder)
    loaded = _load(folder, "jaxstow.load('three.jxs')", "three", "equinox", "flax.nnx", "optax")
    assert loaded["before"]["libraries"] == ["equinox", "flax.nnx", "optax"], loaded  # import flax leaves nnx out
    assert loaded["before"]["error"].endswith("import equinox, flax.nnx and optax first"), loaded
    assert loaded["after"] == {"same": True}


def test_a_file_naming_one_library_not_imported_says_to_import_it_alone(folder: Path) -> None:
    _run("import jaxstow, state; jaxstow.save('opt.jxs', state.sgd())", folder)
    loaded = _load(folder, "jaxstow.load('opt.jxs')", "sgd", "optax")
    assert loaded["before"]["libraries"] == ["optax"]
    assert loaded["before"]["error"].endswith(
        "it belongs to optax, which is not imported in this process: import optax first"
    )
    assert loaded["after"] == {"same": True}
