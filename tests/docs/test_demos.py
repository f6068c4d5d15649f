"""Every demo that ``make demo`` runs, run as ``make demo`` runs it: a script in a process of its own, which must end
with status 0 (each demo checks its own results and exits otherwise) and print no Python warning: a demo does what
the docs recommend, which warns of nothing. Each process is forked from a server that has imported jax and jaxstow
(``tests/support/forked.py``), which prints again what those imports printed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import forked
import pytest

#: A warning as Python's ``warnings`` module prints it: ``file:line: SomeWarning: message``.
WARNING = re.compile(r"^.*:\d+: \w*Warning: .*$", re.MULTILINE)
DEMOS = sorted((Path(__file__).parents[2] / "examples").glob("demo_*.py"))


def test_there_are_demos():
    assert len(DEMOS) >= 6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("demo", DEMOS, ids=[demo.stem for demo in DEMOS])
def test_the_demo_runs_to_its_end_printing_no_warning(demo, missing_optional):
    missing = missing_optional(demo.read_text(), anywhere=True)
    if missing:
        pytest.skip(f"{demo.name} needs {', '.join(missing)}, not installed here")
    ran = forked.run([sys.executable, str(demo)], capture_output=True, text=True, timeout=280)
    assert ran.returncode == 0, (
        f"{demo.name} ended with status {ran.returncode}:\n{ran.stdout[-2000:]}\n{ran.stderr[-4000:]}"
    )
    printed = WARNING.findall(ran.stdout + ran.stderr)
    assert not printed, f"{demo.name} printed warnings:\n" + "\n".join(printed)


def test_a_printed_warning_is_recognized():
    line = '/tmp/demo_3.py:136: LiveReadWarning: /tmp/x/posterior.h5 was opened without libver="latest", so no'
    assert WARNING.findall(f"data: 1000 points\n{line}\n  main()\n") == [line]
    assert not WARNING.findall("SGLD: 4 chains under vmap, every 10th sample kept (300)\n  done in 3.9 s\n")
