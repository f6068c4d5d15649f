"""``python -m jaxstow ARGS`` in a process of its own, forked from one that has already imported jaxstow
(``forked.py``).

A command started as ``python -m jaxstow`` spends about a second importing jax and jaxstow before it reads a byte; the
tests run hundreds. Each command here runs in a child forked from a server that imported them once: its own process,
its own exit status, its own stdout and stderr, its own working folder and environment, run by the module ``python -m
jaxstow`` runs. What it cannot give is a fresh interpreter (modules already imported stay imported): a test of what a
fresh process imports, of a terminal, of signals or of a pipe starts ``python -m jaxstow`` itself.

>>> done = jaxstow_command("--version")
>>> done.returncode, done.stdout.startswith("jaxstow ")
(0, True)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

import forked


def jaxstow_command(
    *args: object, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """What ``python -m jaxstow ARGS`` prints and its exit status; ``env`` replaces the environment (default: this
    process's), ``cwd`` the working folder."""
    arguments = [sys.executable, "-m", "jaxstow", *(str(arg) for arg in args)]
    environment = dict(os.environ if env is None else env)
    return forked.run(arguments, env=environment, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
