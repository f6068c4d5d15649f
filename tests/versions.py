"""The ends of the supported versions: what ``make test-matrix`` installs in ``.venv-lowest``, ``.venv-newest`` and
``.venv-newest-python``.

``lowest`` pins every required dependency, and every extra the core tests use, to the lower bound that
``pyproject.toml`` declares; ``newest`` asks for the newest release of each that the index serves (within the
declared bounds) for the Python that runs ``make``. Both run :data:`CORE_TESTS`: save and load of every dtype and PRNG
keys, lazy reads, the manager, the command line. ``newest-python`` is the newest release of every package of the
``dev`` extra on :data:`NEWEST_PYTHON`, the newest Python the project supports, and runs the whole suite; torch is
left out there (PyPI's torch for that Python is a CUDA build of several GB), so the tests that need it skip; and it
asks for the major versions that only a newer Python installs (:data:`NEWEST_PYTHON_AT_LEAST`: ArviZ 1.x), so that
both majors are tested.

>>> [line for line in requirements("lowest") if line.startswith(("jax", "numpy"))]
['jax==0.4.38', 'numpy==1.26']
>>> [line for line in requirements("newest") if line.startswith(("jax", "numpy"))]
['jax>=0.4.38', 'numpy>=1.26']
>>> [line for line in requirements("newest-python") if line.startswith(("arviz", "blackjax", "ruff"))]
['arviz>=1', 'blackjax>=1.7.1']

Run as ``python tests/versions.py requirements lowest|newest|newest-python``, ``python tests/versions.py tests``,
``python tests/versions.py interpreter`` (the path of the newest Python's interpreter; or, with status 1, why there
is none), or (with a venv's python) ``python tests/versions.py report lowest|newest|newest-python``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"

#: The extras the core tests use: models (equinox, optax), URLs (fsspec), the command line's tables and bars, HDF5.
EXTRAS = ("equinox", "optax", "fsspec", "cli", "h5py")
#: What the tests themselves need; safetensors (at the lower bound of the ``dev`` extra) writes plain files.
TEST_TOOLS = ("pytest", "pytest-xdist", "pytest-timeout")
TEST_PACKAGES = ("safetensors",)
#: The core of the test suite, run at the ``lowest`` and ``newest`` ends.
CORE_TESTS = (
    "tests/format/test_leaves.py",
    "tests/read/test_reader.py",
    "tests/checkpoint/test_manager.py",
    "tests/checkpoint/test_policy.py",
    "tests/checkpoint/test_remote.py",
    "tests/cli/test_commands.py",
    "tests/io/test_saving.py",
    "tests/util/test_jax_compat.py",
    "tests/coordination/test_coordinator.py",
    "tests/read/test_sharding_trees.py",
    "tests/save_load/test_saved_mesh.py",
    "tests/save_load/test_weak_types.py",
    "tests/format/test_repeated_keys.py",
)
#: The newest Python the project supports, and the newest end of the matrix runs on.
NEWEST_PYTHON = (3, 13)
#: Lower bounds of the ``newest-python`` end above the declared ones: ArviZ 1.x (a DataTree, not an InferenceData)
#: needs Python 3.12, so the ``newest`` end on 3.11 tests ArviZ 0.x and this one 1.x.
NEWEST_PYTHON_AT_LEAST = {"arviz": "1"}
#: Packages of the ``dev`` extra that no test imports: the linters.
LINTERS = ("ruff", "mypy")

_REQUIREMENT = re.compile(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([^,;\s]+))?")


def _name(line: str) -> str:
    found = _REQUIREMENT.match(line)
    assert found is not None, line
    return found.group(1)


def _declared(end: str) -> list[str]:
    """The requirements of an end as ``pyproject.toml`` declares them: the core's and :data:`EXTRAS`'s with the test
    packages, or (``newest-python``) the core's and the whole ``dev`` extra but the linters."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    if end == "newest-python":
        wanted = [*project["dependencies"], *(line for line in extras["dev"] if _name(line) not in LINTERS)]
    else:
        wanted = [*project["dependencies"], *(line for extra in EXTRAS for line in extras[extra])]
        wanted += [line for line in extras["dev"] if _name(line) in TEST_PACKAGES]
    return list(dict.fromkeys(wanted))


def requirements(end: str) -> list[str]:
    """The pip requirements of one end: ``name==lower bound`` (``lowest``) or the declared ranges (the others)."""
    if end not in ("lowest", "newest", "newest-python"):
        raise SystemExit(f"no end {end!r}: lowest, newest or newest-python")
    lines = []
    for line in _declared(end):
        found = _REQUIREMENT.match(line)
        assert found is not None, line
        name, lower = found.groups()
        if end == "lowest":
            if lower is None:
                raise SystemExit(f"pyproject.toml declares no lower bound for {name}: give it one (>=)")
            lines.append(f"{name}=={lower}")
        elif end == "newest-python" and name in NEWEST_PYTHON_AT_LEAST:
            lines.append(f"{name}>={NEWEST_PYTHON_AT_LEAST[name]}")
        else:
            lines.append(line.replace(" ", ""))
    named = {_name(line) for line in lines}
    return [*lines, *(tool for tool in TEST_TOOLS if tool not in named)]


def _version_of(folder: Path) -> tuple[int, ...] | None:
    """The version of a pyenv CPython folder of :data:`NEWEST_PYTHON` (``3.13.2``); None for others (``3.13-dev``,
    ``3.13.0t``, which is free-threaded, ``pypy3.10-7.3``)."""
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", folder.name)
    version = tuple(int(part) for part in found.groups()) if found else None
    return version if version and version[:2] == NEWEST_PYTHON else None


def _pyenv_root() -> Path | None:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    if shutil.which("pyenv"):
        done = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip())
    return None


def _works(python: str) -> bool:
    """Whether ``python`` runs, is :data:`NEWEST_PYTHON` with the GIL, and makes venvs."""
    check = (
        "import sys, sysconfig, venv, ensurepip; "
        f"sys.exit(sys.version_info[:2] != {NEWEST_PYTHON} or bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"
    )
    try:
        return subprocess.run([python, "-c", check], capture_output=True, timeout=60, check=False).returncode == 0
    except OSError:
        return False


def interpreter() -> tuple[str | None, str]:
    """The interpreter of :data:`NEWEST_PYTHON` on this machine: pyenv's newest CPython of it, else ``python3.13``
    on ``PATH``; or None and why there is none."""
    wanted = "{}.{}".format(*NEWEST_PYTHON)
    candidates = []
    root = _pyenv_root()
    if root is not None and (root / "versions").is_dir():
        found = [(version, folder) for folder in (root / "versions").iterdir() if (version := _version_of(folder))]
        candidates += [str(folder / "bin" / f"python{wanted}") for _, folder in sorted(found, reverse=True)]
    on_path = shutil.which(f"python{wanted}")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        if _works(candidate):
            return candidate, ""
    where = f"pyenv ({root}/versions)" if root is not None else "pyenv (not installed)"
    return None, f"no Python {wanted} in {where} nor python{wanted} on PATH (pyenv install {wanted})"


def report(end: str) -> str:
    """The installed versions of an end's packages, one line, for the log of a run."""
    names = [_name(line) for line in _declared(end)]
    names.insert(1, "jaxlib")
    if end == "newest-python":
        names += ["flarejax", "torch"]  # installed without its dependencies (as by make test), and left out

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"Python {sys.version.split()[0]}, " + ", ".join(f"{name} {version(name)}" for name in names)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "requirements":
        print("\n".join(requirements(sys.argv[2])))
    elif command == "tests":
        print(" ".join(CORE_TESTS))
    elif command == "interpreter":
        python, why = interpreter()
        print(python or why)
        sys.exit(python is None)
    else:
        print(report(sys.argv[2] if len(sys.argv) > 2 else "newest"))
