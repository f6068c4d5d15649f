"""One error model wherever a user reaches: a file's contents quoted in a bounded excerpt, a reader used after close,
a ``from_format`` that does not fit the file, and a missing optional package named with its face's own extra.

The missing packages are blocked here by an import hook in a subprocess; ``tests/package/required_only`` checks the same
faces in a venv where they are truly absent.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import flax.serialization
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._read.foreign import DESCRIBED, FROM_FORMATS, recognise
from jaxstow.errors import (
    ClosedError,
    FormatError,
    IsAFolderError,
    JaxstowError,
    PathNotFoundError,
    excerpt,
)
from reliability.forge import forge_native

if importlib.util.find_spec("torch") is None:  # imported by the tests that use it, not while the suite is collected
    pytest.skip("needs torch (pip install 'jaxstow[torch]')", allow_module_level=True)

ROOT = Path(__file__).parents[2]

# -- file contents quoted in errors -----------------------------------------------------------------------------------


def deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def called_deep(frames: int, load):
    """``load()`` called ``frames`` Python frames below this one."""
    return load() if frames == 0 else called_deep(frames - 1, load)


def forged_manifest(**fields) -> bytes:
    """A jaxstow file of one value leaf whose manifest has ``fields`` as given (as JSON text), checksummed."""
    manifest = {
        "format": '"jaxstow"',
        "version": "4",
        "structure": '"*"',
        "metadata": "null",
        "paths": '[""]',
        "kinds": '"v"',
        "xxh3": "[]",
        "details": '{"0": {"value": 1}}',
    }
    manifest.update(fields)
    return forge_native({}, "{" + ",".join(f'"{key}":{text}' for key, text in manifest.items()) + "}")


def plain_header(text: str) -> bytes:
    """A safetensors file of no tensor data whose header is ``text``."""
    return struct.pack("<Q", len(text)) + text.encode()


DEEP = deep_list(990)
DEEP_FILES = {
    "metadata": forged_manifest(metadata=DEEP),
    "version": forged_manifest(version=DEEP),
    "format": forged_manifest(format=DEEP),
    "part": forged_manifest(part=DEEP),
    "kinds": forged_manifest(kinds=DEEP),
    "detail": forged_manifest(details='{"0": ' + DEEP + "}"),
    "tensor entry": plain_header('{"w":' + DEEP + "}"),
    "shape": plain_header('{"w":{"dtype":"F32","shape":' + DEEP + ',"data_offsets":[0,0]}}'),
    "plain metadata": plain_header('{"__metadata__":{"a":' + DEEP + "}}"),
}


@pytest.mark.parametrize("where", DEEP_FILES)
def test_a_value_nested_990_deep_is_quoted_in_a_line_from_deep_in_the_stack(tmp_path, where):
    path = tmp_path / "deep.jxs"
    path.write_bytes(DEEP_FILES[where])
    assert sys.getrecursionlimit() <= 1100  # so that a repr of the whole value could not fit above 60 frames
    with pytest.raises(FormatError) as caught:
        called_deep(60, lambda: jaxstow.load(path))
    message = str(caught.value)
    assert str(path) in message and len(message) < 400, message


def test_a_long_string_from_a_file_is_cut(tmp_path):
    path = tmp_path / "long.jxs"
    path.write_bytes(forged_manifest(format=json.dumps("x" * 100_000)))
    with pytest.raises(FormatError, match=r"the manifest's format is 'x+\.\.\.x+', not 'jaxstow'") as caught:
        jaxstow.load(path)
    assert len(str(caught.value)) < 300


def test_excerpt_is_bounded_for_any_value():
    class Loud:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    for value in (deep, "y" * 10**6, 10**4000, b"z" * 10**6, {str(i): i for i in range(10**4)}, Loud()):
        assert len(excerpt(value)) <= 100
    assert "Loud" in excerpt(Loud())


# -- a reader used after close ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "mmap"), [("closed.jxs", False), ("closed.jxs", True), ("closed.npz", False)])
def test_a_reader_used_after_close_says_so(tmp_path, name, mmap):
    path = tmp_path / name
    jaxstow.save(path, {"w": jnp.arange(4.0), "depth": 2}, metadata={"epoch": 1})
    reader = jaxstow.open(path, mmap=mmap)
    with reader:
        assert reader["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    reader.close()  # twice: nothing more happens
    for read in (
        lambda: reader["w"],
        lambda: reader["depth"],
        lambda: reader.read("w", np.s_[1:3]),
        lambda: reader.load(),
        lambda: reader.load(select=["depth"]),
    ):
        with pytest.raises(ClosedError, match="after the reader was closed; open the file again") as caught:
            read()
        assert isinstance(caught.value, ValueError) and str(caught.value).startswith(f"{path}: ")
    assert reader.paths == ["depth", "w"] and reader.metadata == {"epoch": 1}  # the header stays known
    assert reader.info("w").shape == (4,)


# -- from_format against every kind of file ---------------------------------------------------------------------------


def _orbax_folders(root: Path) -> dict[str, Path]:
    import orbax.checkpoint as ocp

    from jaxstow._read.orbax_steps import quiet

    with quiet():
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(root / "orbax", {"w": np.ones(2, np.float32)})
        checkpointer.wait_until_finished()
        with ocp.CheckpointManager(root / "orbax_manager") as manager:
            manager.save(3, args=ocp.args.StandardSave({"w": np.ones(2, np.float32)}))
            manager.wait_until_finished()
    return {"orbax": root / "orbax", "orbax-manager": root / "orbax_manager", "orbax-step": root / "orbax_manager/3"}


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> dict[str, Path]:
    """A file or folder of every kind jaxstow recognises, by kind name."""
    import equinox as eqx
    import torch
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("kinds")
    tree = {"w": np.ones(2, np.float32)}
    jaxstow.save(root / "a.jxs", tree)
    jaxstow.save(root / "a.npz", tree)
    save_file(tree, str(root / "plain.safetensors"))
    np.savez(root / "numpy.npz", **tree)
    torch.save({"w": torch.ones(2)}, root / "zip.pt")
    torch.save({"w": torch.ones(2)}, root / "legacy.pt", _use_new_zipfile_serialization=False)
    (root / "data.pkl").write_bytes(pickle.dumps({"w": [1.0]}, protocol=4))
    np.save(root / "one.npy", np.ones(2))
    eqx.tree_serialise_leaves(root / "stream.eqx", (jnp.ones(2), jnp.zeros(3)))
    (root / "params.msgpack").write_bytes(flax.serialization.to_bytes({"w": np.ones(2, np.float32)}))
    with jaxstow.CheckpointManager(root / "run") as manager:
        manager.save(5, {"params": tree})
    kinds = {
        "jaxstow": root / "a.jxs",
        "jaxstow-npz": root / "a.npz",
        "safetensors": root / "plain.safetensors",
        "npz": root / "numpy.npz",
        "torch-zip": root / "zip.pt",
        "torch-legacy": root / "legacy.pt",
        "pickle": root / "data.pkl",
        "npy": root / "one.npy",
        "equinox": root / "stream.eqx",
        "flax": root / "params.msgpack",
        "jaxstow-folder": root / "run",
        "jaxstow-step": root / "run/5",
        **_orbax_folders(root),
    }
    for name, path in kinds.items():
        assert recognise(path).name == name, path
    return kinds


#: The kinds each from_format reads (an equinox stream of one leaf is an .npy file).
READS = {
    "torch": {"torch-zip", "torch-legacy"},
    "flax": {"flax"},
    "orbax": {"orbax", "orbax-step", "orbax-manager"},
    "equinox": {"equinox", "npy"},
}
#: The words that name each call that reads a kind, in the error.
CALLS = {
    "jaxstow-folder": "CheckpointManager(",
    "jaxstow-step": "CheckpointManager(",
    "pickle": "never unpickles",
    "npy": "numpy.load(",
}
KINDS = [
    "jaxstow",
    "jaxstow-npz",
    "safetensors",
    "npz",
    "torch-zip",
    "torch-legacy",
    "pickle",
    "npy",
    "equinox",
    "flax",
    "orbax",
    "orbax-step",
    "orbax-manager",
    "jaxstow-folder",
    "jaxstow-step",
]


@pytest.mark.parametrize(
    ("from_format", "kind"), [(fmt, kind) for fmt in FROM_FORMATS for kind in KINDS if kind not in READS[fmt]]
)
def test_a_from_format_that_does_not_fit_names_what_the_file_is_and_what_reads_it(every_kind, from_format, kind):
    path = every_kind[kind]
    with pytest.raises(JaxstowError) as caught:
        jaxstow.load(
            path, like=(jnp.ones(2), jnp.zeros(3)) if from_format == "equinox" else None, from_format=from_format
        )
    message = str(caught.value)
    assert isinstance(caught.value, FormatError | IsAFolderError), message
    assert message.startswith(f"{path}: is "), message
    described = DESCRIBED[kind].split(" (")[0]
    assert described in message or (path.is_dir() and "folder" in message), message
    assert CALLS.get(kind, "jaxstow.load(") in message, message
    assert "weights_only set to False" not in message and "Traceback" not in message


@pytest.mark.parametrize("from_format", FROM_FORMATS)
def test_a_from_format_of_a_file_object_or_a_missing_path(tmp_path, from_format):
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"w": jnp.ones(2)})
    buffer.seek(0)
    with pytest.raises(JaxstowError, match=r"jaxstow file|a folder: give its path") as caught:
        jaxstow.load(buffer, like={"w": jnp.ones(2)}, from_format=from_format)
    assert from_format == "orbax" or "jaxstow.load(file) reads it, without from_format" in str(caught.value)
    with pytest.raises(PathNotFoundError, match=f"{tmp_path / 'nothing.pt'}: no such file or folder"):
        jaxstow.load(tmp_path / "nothing.pt", from_format=from_format)


def test_the_kinds_that_fit_still_read(every_kind):
    assert jaxstow.load(every_kind["torch-zip"], from_format="torch", as_numpy=True)["w"].tolist() == [1.0, 1.0]
    assert jaxstow.load(every_kind["torch-legacy"], from_format="torch", as_numpy=True)["w"].tolist() == [1.0, 1.0]
    assert jaxstow.load(every_kind["flax"], from_format="flax", as_numpy=True)["w"].tolist() == [1.0, 1.0]
    assert jaxstow.load(every_kind["orbax"], from_format="orbax", as_numpy=True)["w"].tolist() == [1.0, 1.0]
    streamed = jaxstow.load(every_kind["npy"], like=jnp.zeros(2), from_format="equinox")
    assert streamed.tolist() == [1.0, 1.0]


def test_a_torch_file_of_other_objects_is_refused_without_torchs_advice(tmp_path):
    import fractions

    import torch

    torch.save({"w": torch.ones(2), "ratio": fractions.Fraction(1, 3)}, tmp_path / "objects.pt")
    with pytest.raises(FormatError) as caught:
        jaxstow.load(tmp_path / "objects.pt", from_format="torch")
    message = str(caught.value)
    assert "it holds an object of fractions.Fraction, which torch.load(weights_only=True) never unpickles" in message
    assert "weights_only` set to `False`" not in message and "Re-running" not in message


# -- missing optional packages ----------------------------------------------------------------------------------------

BLOCKER = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, Blocker())
"""


def run_blocked(blocked: list[str], script: str) -> subprocess.CompletedProcess[str]:
    code = f"BLOCKED = {blocked!r}\n" + BLOCKER + script
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_every_face_names_its_own_extra(tmp_path, every_kind):
    import torch

    torch_leaf = tmp_path / "torch_leaf.jxs"
    jaxstow.save(torch_leaf, {"w": torch.ones(2)})
    checks = {
        "equinox": "from jaxstow.train import EquinoxOptaxModule",
        "blackjax": "jaxstow.io.blackjax.sample('run.h5', None, None, None, num_samples=1)",
        "numpyro": "jaxstow.io.numpyro.run('run.h5', None, None)",
        "torch": f"jaxstow.load({str(every_kind['torch-zip'])!r}, from_format='torch')",
        "flax": f"jaxstow.load({str(every_kind['flax'])!r}, from_format='flax')",
        "orbax": f"jaxstow.load({str(every_kind['orbax'])!r}, from_format='orbax')",
        "torch ": f"jaxstow.load({str(torch_leaf)!r})",
    }
    script = "import jaxstow, jaxstow.io\nfrom jaxstow.errors import MissingDependencyError\n"
    for extra, call in checks.items():
        script += f"try:\n    {call}\nexcept MissingDependencyError as error:\n    print(str(error))\n"
        script += f"else:\n    print('no error: {extra}')\n"
    blocked = ["equinox", "optax", "h5py", "torch", "msgpack", "flax", "orbax"]
    done = run_blocked(blocked, script)
    lines = done.stdout.splitlines()
    assert len(lines) == len(checks), done.stderr
    for line, extra in zip(lines, checks, strict=True):
        assert f"pip install 'jaxstow[{extra.strip()}]'" in line, line
    assert f"leaf 'w' of {torch_leaf}, a torch.Tensor, needs the optional package torch" in lines[-1]


def test_the_command_line_names_the_extra_without_a_traceback(every_kind):
    script = (
        "import sys\nfrom jaxstow.cli import main\n"
        f"sys.exit(main(['convert', {str(every_kind['torch-zip'])!r}, {str(every_kind['torch-zip'])!r} + '.jxs']))"
    )
    done = run_blocked(["torch"], script)
    assert done.returncode == 2, done.stderr
    assert "pip install 'jaxstow[torch]'" in done.stderr and "Traceback" not in done.stderr


def test_arguments_of_the_wrong_kind_in_these_calls_are_argument_errors(tmp_path):
    from jaxstow.errors import ArgumentError

    for folder in (None, 3):
        with pytest.raises(ArgumentError, match=r"a checkpoint folder is named by a path or a URL, not"):
            jaxstow.CheckpointManager(folder)
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": {"w": np.ones(2)}})
        manager.wait()
        with pytest.raises(ArgumentError, match=r"items must be a list of item names, such as \['params'\], not 3"):
            manager.restore(items=3)
    jaxstow.save(tmp_path / "x.jxs", {"w": np.ones(2)})
    assert jaxstow.load(tmp_path / "x.jxs", names=None, transposed=None, as_numpy=True)["w"].tolist() == [1.0, 1.0]
    assert jaxstow.open(tmp_path / "x.jxs", names=None).paths == ["w"]  # None: as if not given, no warning
    with pytest.raises(ArgumentError, match=r"huggingface\.open\(\) takes no 'as_numpy'"):
        jaxstow.huggingface.open(tmp_path, as_numpy=True)
