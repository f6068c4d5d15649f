"""The package's layout stays true: layers import only downwards, no import circle, small modules with short
docstrings, documented layers, and a load that resolves its argument once and goes straight down to the bytes.

The imports are read from the source with ``ast``: those at a module's top, those inside functions and those that
``if TYPE_CHECKING:`` guards (they never run, but a type named across a circle is a circle all the same).
"""

from __future__ import annotations

import ast
import collections
import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

PACKAGE = Path(__file__).parents[2] / "src" / "jaxstow"

#: Bottom up. A module imports only from its own unit and from the layers below its own; the units of one layer
#: (``_write`` and ``_read``, the faces) know nothing of each other.
LAYERS = [
    ["jaxstow.errors", "jaxstow._version"],
    ["jaxstow._util"],
    ["jaxstow._names"],
    ["jaxstow._format"],
    ["jaxstow._storage"],
    ["jaxstow._steps", "jaxstow._coordination"],
    ["jaxstow._write", "jaxstow._read"],
    ["jaxstow._save_load"],
    ["jaxstow.checkpoint", "jaxstow.io", "jaxstow.train", "jaxstow.objax", "jaxstow.flarejax"],
    ["jaxstow.cli"],
    ["jaxstow", "jaxstow.__main__"],
]
MAX_LINES = 450
#: The most lines a docstring (of a module, a class or a function) may have.
MAX_DOCSTRING_LINES = 25
#: Docstrings still over the cap, by qualified name, with their length now: each may only shrink, and must go from
#: here once it is within the cap.
LONG_DOCSTRINGS: dict[str, int] = {}


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


def imported(module: str, text: str | None = None) -> set[str]:
    """The package's modules that ``module`` (its source ``text``, or its file's) imports: at its top, inside
    functions or for type checking only."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> None:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    def visit(node: ast.AST) -> None:
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

    visit(ast.parse(path.read_text() if text is None else text))
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


def circles_in(graph: dict[str, set[str]]) -> list[str]:
    """Every import circle a depth-first walk of ``graph`` meets, as ``a -> b -> a``."""
    circles = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                walk(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return circles


def test_no_import_circle():
    circles = circles_in(GRAPH)
    assert not circles, "\n".join(circles)


def test_the_layout_test_sees_a_violation():
    """The checks above are only as good as the graph: it holds the imports that matter."""
    assert "jaxstow._format.source" in GRAPH["jaxstow._format.header"]
    assert "jaxstow._read.restore" in GRAPH["jaxstow._read.reader"]
    assert "jaxstow._storage.remote" in GRAPH["jaxstow._storage.opening"]  # imported inside a function
    assert "jaxstow.train" in GRAPH["jaxstow"]  # only under TYPE_CHECKING (and imported on first use)
    assert "jaxstow._read.opened" in GRAPH["jaxstow._read.per_process"]
    assert "jaxstow._read.opened" not in GRAPH["jaxstow._read.shard_reads"]
    # A circle closed only by a type-checking import, or only by an import inside a function, is found.
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jaxstow._read.opened import OpenedFile\n"
    late = "def read():\n    from jaxstow._read.shard_reads import ShardReads\n"
    graph = dict(GRAPH)
    graph["jaxstow._read.shard_reads"] = imported("jaxstow._read.shard_reads", typed)
    assert "jaxstow._read.opened -> jaxstow._read.shard_reads -> jaxstow._read.opened" in circles_in(graph)
    graph = dict(GRAPH)
    graph["jaxstow._format.tensor_reads"] = imported("jaxstow._format.tensor_reads", late)
    assert any("jaxstow._format.tensor_reads" in circle for circle in circles_in(graph))
    assert rank(unit_of("jaxstow._storage.remote")) > rank(unit_of("jaxstow._format.native"))


def traced(run: Callable[[], Any], target: Any) -> tuple[list[str], collections.Counter[str]]:
    """Run ``run()`` under a profiler: the jaxstow modules whose functions took ``target``, or what it was resolved
    into (its location, its source), as an argument, in call order, and how often each jaxstow function was called.
    An argument named ``file`` (the name errors give a file) does not count as taking the target."""
    from jaxstow._format.source import ReadSource
    from jaxstow._storage.opening import Location

    followed = {id(target)}
    kept = [target]  # alive, so that their ids stay theirs
    taking: set[int] = set()
    modules: list[str] = []
    calls: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, value: Any) -> None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("jaxstow."):
            return
        if event == "call":
            code = frame.f_code
            calls[f"{module}.{code.co_qualname}"] += 1
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(id(frame.f_locals.get(name)) in followed for name in names if name != "file"):
                modules.append(module)
                taking.add(id(frame))
        elif event == "return" and id(frame) in taking:
            taking.discard(id(frame))
            if isinstance(value, Location | ReadSource):
                followed.add(id(value))
                kept.append(value)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return modules, calls


def test_a_load_resolves_its_argument_once_and_goes_straight_to_the_bytes(tmp_path):
    """``load(path)`` turns the path into a location once, at its entry; what follows takes the location or its
    source, never the path again; the other libraries' formats are not looked at when the file opens."""
    import jax.numpy as jnp

    import jaxstow

    path = str(tmp_path / "small.jxs")
    jaxstow.save(path, {"w": jnp.arange(4.0), "depth": 2})
    jaxstow.load(path)  # imports and compiles what a load needs
    modules, calls = traced(lambda: jaxstow.load(path), path)
    assert calls["jaxstow._storage.opening.locate"] == 1
    assert calls["jaxstow._storage.opening.local_path"] == 1
    assert calls["jaxstow._storage.opening.display_name"] == 0
    assert not any(name.startswith("jaxstow._read.foreign.") for name in calls)
    visited = set(modules)
    assert len(visited) <= 10, modules
    assert {"jaxstow._save_load", "jaxstow._storage.opening", "jaxstow._storage.sources"} <= visited, modules
    left_and_back = sum(a != b and b in modules[:i] for i, (a, b) in enumerate(itertools.pairwise(modules), 1))
    assert left_and_back <= 6, modules


def entered(run: Callable[[], Any]) -> list[str]:
    """The jaxstow modules that ``run()`` enters, in order, each as often as it is entered again (a call into a
    function, a method, a generator or a comprehension of a module after one of another)."""
    sequence: list[str] = []

    def profile(frame: FrameType, event: str, value: Any) -> None:
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("jaxstow.") and (not sequence or sequence[-1] != module):
            sequence.append(module)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return sequence


def test_a_load_of_a_local_file_passes_through_at_most_12_modules_going_down(tmp_path):
    """Every module a ``load(path)`` of arrays and plain values enters counts: the one opening step, the header
    checked in one module, the restore, the check of 64-bit arrays that jax with x64 off would change; few returns to
    a module left before (the bound is what it takes now)."""
    import numpy as np

    import jaxstow

    path, other = str(tmp_path / "model.jxs"), str(tmp_path / "other.jxs")
    tree = {"w": np.arange(10.0), "b": {"c": np.ones((3, 3), np.float32)}, "depth": 2, "name": "mlp"}
    jaxstow.save(other, tree)
    jaxstow.load(other)  # imports and compiles what a load needs
    jaxstow.save(path, {**tree, "depth": 3})  # a file opened for the first time: its header checked whole
    sequence = entered(lambda: jaxstow.load(path))
    modules = list(dict.fromkeys(sequence))
    assert len(modules) <= 12, modules
    back = sum(module in sequence[:i] for i, module in enumerate(sequence))
    assert back <= 27, " > ".join(sequence)
    assert not any(module.startswith(("jaxstow._read.sharded_folder", "jaxstow._write")) for module in modules)


def test_a_refused_file_is_recognised_from_the_source_already_open(tmp_path):
    """A file of another library is opened once: its kind is read from the source the failed open left open."""
    import flax.serialization
    import numpy as np

    import jaxstow

    path = str(tmp_path / "params.msgpack")
    with open(path, "wb") as file:
        file.write(flax.serialization.to_bytes({"w": np.ones(3, np.float32)}))

    def load() -> None:
        with pytest.raises(jaxstow.errors.FormatError, match="is a flax msgpack file"):
            jaxstow.load(path)

    load()
    _, calls = traced(load, path)
    assert calls["jaxstow._storage.opening.locate"] == 1
    assert calls["jaxstow._storage.sources.LocalFile.__init__"] == 1
    assert calls["jaxstow._read.foreign.explained"] == 1


def test_modules_are_small():
    long = {module: n for module, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def docstring_lengths(module: str, text: str) -> dict[str, int]:
    """The number of lines of every docstring in ``text`` (the source of ``module``), by qualified name."""
    lengths: dict[str, int] = {}

    def visit(node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> None:
        doc = ast.get_docstring(node)
        if doc is not None:
            lengths[name] = len(doc.splitlines())
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, f"{name}.{child.name}")

    visit(ast.parse(text), module)
    return lengths


def test_docstrings_are_short():
    lengths = {
        name: n for module, path in MODULES.items() for name, n in docstring_lengths(module, path.read_text()).items()
    }
    long = {name: n for name, n in lengths.items() if n > MAX_DOCSTRING_LINES and name not in LONG_DOCSTRINGS}
    assert not long, f"docstrings over {MAX_DOCSTRING_LINES} lines: {long}"
    grown = {
        name: lengths.get(name)
        for name, n in LONG_DOCSTRINGS.items()
        if not MAX_DOCSTRING_LINES < lengths.get(name, 0) <= n
    }
    assert not grown, f"LONG_DOCSTRINGS is out of date (grown, or within the cap now: drop them): {grown}"


def test_the_docstring_count_sees_every_docstring():
    body = "\n".join(f"        line {i}" for i in range(26))
    text = f'"""Module."""\nclass A:\n    """One\n\n    two."""\n\n    def f(self):\n        """\n{body}\n        """\n'
    assert docstring_lengths("m", text) == {"m": 1, "m.A": 3, "m.A.f": 26}


@pytest.mark.parametrize("unit", [unit for layer in LAYERS for unit in layer if unit in MODULES])
def test_each_layer_says_its_job_and_what_it_must_not_import(unit):
    doc = ast.get_docstring(ast.parse(MODULES[unit].read_text())) or ""
    assert doc.strip(), f"{unit} has no docstring"
    if MODULES[unit].name == "__init__.py" and unit != "jaxstow":  # every folder, private or a face
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
    assert "pip install 'jaxstow[s3]'" in str(error), error
else:
    raise AssertionError("a URL without fsspec did not raise")
print("ok")
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_jax_sgmcs_scheduler_is_one_module_whichever_way_it_is_imported():
    done = subprocess.run(
        [sys.executable, "-c", "import jaxstow; first = jaxstow.scheduler\n"
         "import jaxstow.scheduler\nfrom jaxstow.scheduler import static_information\nfrom jaxstow import io, scheduler\n"
         "assert first is scheduler is jaxstow.scheduler\n"
         "assert static_information is io.scheduler.static_information\n"
         "print(scheduler.static_information(samples_collected=3))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "static_information(samples_collected=3)", done.stderr
