"""A child forked from a process that writes checkpoints: it neither releases its parent's writer lock when it exits,
nor waits at its exit for its parent's save in flight (whose writer thread it lacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


_CHILD_USES_THE_MANAGER = """
import atexit, json, os, signal, sys
import numpy as np
from jaxstow import CheckpointManager, KeepPolicy
parent = os.getpid()
atexit.register(lambda: os.getpid() != parent and os._exit(0))  # registered first, run last: jax's own exit is left out
folder, report = sys.argv[1], sys.argv[2]
manager = CheckpointManager(folder, keep=KeepPolicy(keep_last=2))
manager.save(1, {"w": np.full(4, 1.0)})
manager.save(2, {"w": np.full(4, 2.0)})
manager.wait()
manager.save(3, {"w": np.full(8_000_000, 3.0, np.float32)})  # in flight while the child runs (or already written)
child = os.fork()
if child == 0:
    signal.alarm(30)  # a child that hangs dies, and writes no report
    answers = {}
    try:
        manager.save(4, {"w": np.full(4, 4.0)})
        manager.wait()
        answers["save"] = "saved"
    except Exception as error:
        answers["save"] = f"{type(error).__name__}: {error}"
    manager.wait()
    manager.close()
    with open(report, "w") as file:
        json.dump(answers, file)
    sys.exit(0)
os.waitpid(child, 0)
manager.close()
print(json.dumps({"steps": manager.steps(), "3": float(manager.restore(3)["w"][-1])}))
"""


def _forking(script: str, folder: Path, report: Path) -> subprocess.CompletedProcess[str]:
    """``script``, which forks, run in a process of its own on ``folder``, its child reporting to ``report``."""
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(script), str(folder), str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_forked_child_cannot_save_with_its_parents_manager_and_its_wait_and_close_return(tmp_path):
    folder, report = tmp_path / "run", tmp_path / "child.json"
    done = _forking(_CHILD_USES_THE_MANAGER, folder, report)
    assert done.returncode == 0, done.stderr
    assert report.exists(), "the child hung on its parent's save in flight"
    answer = json.loads(report.read_text())["save"]
    assert answer.startswith("CheckpointError: the checkpoint manager of ") and str(folder) in answer, answer
    assert "forked" in answer and "from the parent process" in answer, answer
    assert json.loads(done.stdout.splitlines()[-1]) == {"steps": [2, 3], "3": 3.0}


_RESTORES_AFTER_A_FORK = """
import atexit, json, os, signal, sys, threading
import numpy as np
from jaxstow import CheckpointManager
parent = os.getpid()
atexit.register(lambda: os.getpid() != parent and os._exit(0))  # registered first, run last: jax's own exit is left out
folder, report = sys.argv[1], sys.argv[2]
manager = CheckpointManager(folder)
manager.save(1, {f"item{i}": {"w": np.full(3, float(i))} for i in range(8)})
manager.save(2, {"params": {"w": np.arange(4.0)}, "opt": {"m": np.full(3, 2.0)}})
manager.wait()
for _ in range(3):
    manager.restore(1, as_numpy=True)  # the parent's threads that open and restore items started, and now idle
child = os.fork()
if child == 0:
    signal.alarm(60)  # a child that hangs dies, and writes no report
    two = manager.restore(2, as_numpy=True)
    threads = sorted({thread.name.rsplit("_", 1)[0] for thread in threading.enumerate()})
    eight = manager.restore(1, as_numpy=True)
    with open(report, "w") as file:
        json.dump({"two": two, "eight": eight, "threads": threads}, file, default=np.ndarray.tolist)
    sys.exit(0)
os.waitpid(child, 0)
manager.close()
print("parent done")
"""


def test_a_child_forked_after_restores_restores_side_by_side_on_threads_of_its_own(tmp_path):
    folder, report = tmp_path / "run", tmp_path / "child.json"
    done = _forking(_RESTORES_AFTER_A_FORK, folder, report)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "parent done", done.stderr
    assert report.exists(), "the child hung restoring"
    answer = json.loads(report.read_text())
    assert answer["two"] == {"params": {"w": [0.0, 1.0, 2.0, 3.0]}, "opt": {"m": [2.0, 2.0, 2.0]}}
    assert answer["eight"] == {f"item{i}": {"w": [float(i)] * 3} for i in range(8)}
    # its two items opened and restored side by side, each pair on a thread of the child's (none of its parent's)
    assert {"jaxstow-open", "jaxstow-restore"} <= set(answer["threads"]), answer["threads"]
