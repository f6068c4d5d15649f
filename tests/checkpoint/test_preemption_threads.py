"""Preemption signals with a program's own threads and handlers: a training loop in a worker thread still ends the
process as the signal would, after every exit handler has run; a manager closed in a worker thread raises nothing and leaves the signal to end the
process later; the program's own handler is called, or kept when it set it after the manager."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

_PROLOGUE = """
import atexit, os, signal, sys, threading, time
atexit.register(lambda: print("another library's exit handler", file=sys.stderr, flush=True))
import numpy as np
from jaxstow import CheckpointManager
folder = sys.argv[1]
def mine(number, frame):
    print("the program's handler", flush=True)
"""

_SCRIPTS = {
    "a loop in a worker thread": """
manager = CheckpointManager(folder, save_every=1000, preemption_signals=[signal.SIGTERM])
def train():
    for step in range(1, 100):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 120  # until the main thread has run the handler, however loaded the machine
            while not manager.should_save(step) and time.monotonic() < deadline:
                time.sleep(0.01)
        if manager.should_save(step):
            manager.save(step, {"w": np.full(4, step)})
thread = threading.Thread(target=train)
thread.start()
thread.join()
print("not ended", flush=True)
""",
    "closed in a worker thread": """
manager = CheckpointManager(folder, preemption_signals=[signal.SIGTERM])
manager.save(1, {"w": np.zeros(4)})
thread = threading.Thread(target=manager.close)
thread.start()
thread.join()
print("closed", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(1)
print("not ended", flush=True)
""",
    "a handler of the program's before": """
signal.signal(signal.SIGTERM, mine)
with CheckpointManager(folder, preemption_signals=[signal.SIGTERM]) as manager:
    manager.save(1, {"w": np.zeros(4)})
    os.kill(os.getpid(), signal.SIGTERM)
    manager.save(2, {"w": np.zeros(4)})  # ends the process
print("not ended", flush=True)
""",
    "a handler of the program's after": """
manager = CheckpointManager(folder, preemption_signals=[signal.SIGTERM])
signal.signal(signal.SIGTERM, mine)
manager.save(1, {"w": np.zeros(4)})
manager.close()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.3)
print("alive", flush=True)
""",
    "no save and no close after the signal": """
manager = CheckpointManager(folder, preemption_signals=[signal.SIGTERM])
manager.save(1, {"w": np.zeros(4)})
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.3)
print("the script's end", flush=True)
""",
}
_EXPECTED = {  # status, what standard output ends with
    "a loop in a worker thread": (-signal.SIGTERM, ""),
    "closed in a worker thread": (-signal.SIGTERM, "closed"),
    "a handler of the program's before": (-signal.SIGTERM, "the program's handler"),
    "a handler of the program's after": (0, "the program's handler\nalive"),
    "no save and no close after the signal": (-signal.SIGTERM, "the script's end"),
}


@pytest.mark.parametrize("case", list(_SCRIPTS))
def test_the_signal_ends_the_process_or_reaches_the_programs_handler(tmp_path, case):
    script = textwrap.dedent(_PROLOGUE) + textwrap.dedent(_SCRIPTS[case])
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True, timeout=300
    )
    status, output = _EXPECTED[case]
    assert (done.returncode, done.stdout.strip().endswith(output)) == (status, True), (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "not ended" not in done.stdout
    if status and case != "closed in a worker thread":  # jaxstow ends it after every exit handler has run
        assert done.stderr.rstrip().endswith("another library's exit handler"), done.stderr
