"""The package's layout stays true: layers import only downwards, no import circle, small modules, documented layers.

The imports are read from the source with ``ast`` (what ``if TYPE_CHECKING:`` guards is left out: it never runs).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "jaxstow"

#: Bottom up. A module imports only from its own unit and from the layers below its own; the units of one layer
#: (``_write`` and ``_read``, the faces) know nothing of each other.
LAYERS = [
    ["jaxstow.errors", "jaxstow._version"],
    ["jaxstow._util"],
    ["jaxstow._names"],
    ["jaxstow._format"],
    ["jaxstow._storage"],
    ["jaxstow._steps"],
    ["jaxstow._write", "jaxstow._read"],
    ["jaxstow._save_load"],
    ["jaxstow.checkpoint", "jaxstow.io", "jaxstow.train", "jaxstow.objax", "jaxstow.flarejax"],
    ["jaxstow.cli"],
    ["jaxstow", "jaxstow.__main__"],
]
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str:
    """The unit (a layer's package or module) that ``module`` belongs to."""
    units = [unit for layer in LAYERS for unit in layer if module == unit or module.startswith(unit + ".")]
    if not units:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")
    return max(units, key=len)


def rank(unit: str) -> int:
    return next(index for index, layer in enumerate(LAYERS) if unit in layer)


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(module: str) -> set[str]:
    """The package's modules that ``module`` imports, at its top or inside functions."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> None:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                resolve(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name.startswith("jaxstow")}


GRAPH = {module: imported(module) for module in MODULES}


def test_every_import_goes_down_the_layers():
    wrong = []
    for module, targets in GRAPH.items():
        unit = unit_of(module)
        for target in targets:
            other = unit_of(target)
            if other != unit and (rank(other) > rank(unit) or rank(other) == rank(unit)):
                wrong.append(f"{module} imports {target} ({other} is not below {unit})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circle():
    circles = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                walk(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            walk(module)
    assert not circles, "\n".join(circles)


def test_the_layout_test_sees_a_violation():
    """The checks above are only as good as the graph: it holds the imports that matter."""
    assert "jaxstow._format.source" in GRAPH["jaxstow._format.native"]
    assert "jaxstow._read.restore" in GRAPH["jaxstow._read.reader"]
    assert "jaxstow._storage.remote" in GRAPH["jaxstow._storage.opening"]  # imported inside a function
    assert "jaxstow.train" not in GRAPH["jaxstow"]  # only under TYPE_CHECKING (and imported on first use)
    assert rank(unit_of("jaxstow._storage.remote")) > rank(unit_of("jaxstow._format.native"))


def test_modules_are_small():
    long = {module: n for module, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long


@pytest.mark.parametrize("unit", [unit for layer in LAYERS for unit in layer if unit in MODULES])
def test_each_layer_says_its_job_and_what_it_must_not_import(unit):
    doc = ast.get_docstring(ast.parse(MODULES[unit].read_text())) or ""
    assert doc.strip(), f"{unit} has no docstring"
    if MODULES[unit].name == "__init__.py" and unit.startswith("jaxstow._"):
        assert "import" in doc, f"{unit}'s docstring does not say what it must not import"


OPTIONAL = [
    "fsspec",
    "s3fs",
    "h5py",
    "rich",
    "tqdm",
    "torch",
    "arviz",
    "orbax",
    "flax",
    "equinox",
    "optax",
    "safetensors",
]

BLOCKED_IMPORT = f"""
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
sys.meta_path.insert(0, Blocker())
"""


def test_the_core_imports_no_optional_dependency(tmp_path):
    """With every optional package unimportable: save, load, open, a local CheckpointManager, and a URL's error."""
    script = (
        BLOCKED_IMPORT
        + f"""
import jax.numpy as jnp, jaxstow
from jaxstow.errors import MissingDependencyError
path = {str(tmp_path / "model.jxs")!r}
jaxstow.save(path, {{"w": jnp.ones(3), "depth": 2}})
assert jaxstow.load(path, as_numpy=True)["depth"] == 2
with jaxstow.open(path) as reader:
    assert reader.paths == ["depth", "w"]
with jaxstow.CheckpointManager({str(tmp_path / "run")!r}) as manager:
    manager.save(1, {{"params": {{"w": jnp.ones(2)}}}})
    assert manager.restore(as_numpy=True)["params"]["w"].tolist() == [1.0, 1.0]
try:
    jaxstow.load("s3://bucket/model.jxs")
except MissingDependencyError as error:
    assert "pip install 'jaxstow[fsspec]'" in str(error), error
else:
    raise AssertionError("a URL without fsspec did not raise")
print("ok")
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
