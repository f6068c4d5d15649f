"""Both ends of the supported versions: what ``make test-matrix`` installs in ``.venv-lowest`` and ``.venv-newest``.

``lowest`` pins every required dependency, and every extra the core tests use, to the lower bound that
``pyproject.toml`` declares; ``newest`` asks for the newest release of each that the index serves for this Python.
Both venvs run :data:`CORE_TESTS`: save and load of every dtype and PRNG keys, lazy reads, the manager, the command
line.

>>> [line for line in requirements("lowest") if line.startswith(("jax", "numpy"))]
['jax==0.4.38', 'numpy==1.26']
>>> "jax" in requirements("newest")
True

Run as ``python tests/versions.py requirements lowest|newest``, ``python tests/versions.py tests``, or (with a
venv's python) ``python tests/versions.py report``.
"""

from __future__ import annotations

import re
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
#: The core of the test suite, run at both ends.
CORE_TESTS = (
    "tests/test_core_leaves.py",
    "tests/test_read_reader.py",
    "tests/test_checkpoint_manager.py",
    "tests/test_checkpoint_policy.py",
    "tests/test_cli.py",
    "tests/test_io_saving.py",
)

_REQUIREMENT = re.compile(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([^,;\s]+))?")


def _declared() -> list[str]:
    """The requirements of the core and of :data:`EXTRAS`, and the test packages as the ``dev`` extra gives them."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *(line for extra in EXTRAS for line in extras[extra])]
    wanted += [line for line in extras["dev"] if _REQUIREMENT.match(line).group(1) in TEST_PACKAGES]  # type: ignore[union-attr]
    return list(dict.fromkeys(wanted))


def requirements(end: str) -> list[str]:
    """The pip requirements of one end: ``name==lower bound`` (``lowest``) or the bare names (``newest``)."""
    lines = []
    for line in _declared():
        found = _REQUIREMENT.match(line)
        assert found is not None, line
        name, lower = found.groups()
        if end == "lowest":
            if lower is None:
                raise SystemExit(f"pyproject.toml declares no lower bound for {name}: give it one (>=)")
            lines.append(f"{name}=={lower}")
        else:
            lines.append(name)
    return [*lines, *TEST_TOOLS]


def report() -> str:
    """The installed versions of the declared packages, one line, for the log of a run."""
    names = [_REQUIREMENT.match(line).group(1) for line in _declared()]  # type: ignore[union-attr]
    names.insert(1, "jaxlib")
    return f"Python {sys.version.split()[0]}, " + ", ".join(f"{name} {metadata.version(name)}" for name in names)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "requirements":
        print("\n".join(requirements(sys.argv[2])))
    elif command == "tests":
        print(" ".join(CORE_TESTS))
    else:
        print(report())
