"""A child forked from a process that writes checkpoints: it neither releases its parent's writer lock when it exits,
nor waits at its exit for its parent's save in flight (whose writer thread it lacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_FORKING = """
import atexit, json, os, sys, time
import numpy as np
from jaxstow import CheckpointManager
parent = os.getpid()
atexit.register(lambda: os.getpid() != parent and os._exit(0))  # registered first, run last: jax's own exit is left out
folder = sys.argv[1]
manager = CheckpointManager(folder)
manager.save(1, {"w": np.arange(4.0)})
manager.wait()
manager.save(2, {"w": np.arange(4.0)})  # in flight while the child runs (or already written)
child = os.fork()
if child == 0:
    sys.exit(0)  # a normal exit of the child: its exit handlers run
started = time.monotonic()
os.waitpid(child, 0)
report = {"child_exit_s": time.monotonic() - started, "lock": os.path.exists(os.path.join(folder, ".jaxstow.lock"))}
manager.close()
report["steps"] = manager.steps()
print(json.dumps(report))
"""


def test_a_forked_child_keeps_its_parents_lock_and_waits_for_none_of_its_saves(tmp_path):
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(_FORKING), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAXSTOW_EXIT_WAIT": "60"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["lock"], "the child's exit removed its parent's lock file"
    assert report["child_exit_s"] < 30, report  # not JAXSTOW_EXIT_WAIT's 60 s for the parent's save
    assert report["steps"] == [1, 2]
