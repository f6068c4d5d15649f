"""Every demo that ``make demo`` runs, run as ``make demo`` runs it: a script in a process of its own, which must end
with status 0 (each demo checks its own results and exits otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEMOS = sorted((Path(__file__).parents[2] / "examples").glob("demo_*.py"))


def test_there_are_demos():
    assert len(DEMOS) >= 6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("demo", DEMOS, ids=[demo.stem for demo in DEMOS])
def test_the_demo_runs_to_its_end(demo, missing_optional):
    missing = missing_optional(demo.read_text(), anywhere=True)
    if missing:
        pytest.skip(f"{demo.name} needs {', '.join(missing)}, not installed here")
    ran = subprocess.run([sys.executable, str(demo)], capture_output=True, text=True, timeout=280)
    assert ran.returncode == 0, (
        f"{demo.name} ended with status {ran.returncode}:\n{ran.stdout[-2000:]}\n{ran.stderr[-4000:]}"
    )
