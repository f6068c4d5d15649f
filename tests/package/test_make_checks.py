"""The checks of ``make test`` that are not tests of the package's behaviour: ruff and strict mypy over the sources
(``make lint``), and the tests of a venv with the required dependencies only (``make test-bare``). They run as tests
of the suite, each through its own make target, so that they run beside the other tests on the suite's workers
instead of before them, and a failure shows what the tool printed.

The venvs are taken as they are (``--old-file``): ``make test`` has made them before the suite starts, and a suite
run from them must not install them again under itself. Without the bare venv, its test is skipped, saying how to
make it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
VENVS = (".venv/.installed", ".venv-bare/.installed")


def _make(target: str) -> None:
    if shutil.which("make") is None:
        pytest.skip(f"`make {target}` needs make, not installed here")
    kept = [f"--old-file={stamp}" for stamp in VENVS]
    done = subprocess.run(
        ["make", "--no-print-directory", *kept, target], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"make {target} failed:\n{done.stdout[-8000:]}\n{done.stderr[-8000:]}"


def test_ruff_and_strict_mypy_find_nothing() -> None:
    if not (ROOT / VENVS[0]).exists():
        pytest.skip("`make lint` runs ruff and mypy from the venv `make test` makes (.venv)")
    _make("lint")


def test_the_required_dependencies_alone_pass_their_tests() -> None:
    if not (ROOT / VENVS[1]).exists():
        pytest.skip("`make test-bare` makes the venv with the required dependencies only (.venv-bare) first")
    _make("test-bare")
