"""``jaxstow ls`` of a run that another process keeps saving with ``keep_last=1``: a step the keep policy deletes
between its listing and its reading is left out, never called damaged (status 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from jaxstow.cli import main

WRITER = """
import sys, numpy as np
from jaxstow import CheckpointManager, KeepPolicy
with CheckpointManager(sys.argv[1], keep=KeepPolicy(keep_last=1)) as manager:
    for step in range(1, 1_000_000):
        manager.save(step, {"p": np.full(2_000, step, np.float32)})
        manager.wait()
"""


def test_a_step_deleted_while_it_is_listed_is_left_out(tmp_path, capsys):
    folder = tmp_path / "run"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(folder)])
    try:
        while not folder.exists() or not any(path.name.isdigit() for path in folder.iterdir()):
            assert writer.poll() is None, "the writer ended"
            time.sleep(0.05)
        statuses, start = [], time.monotonic()
        while time.monotonic() - start < 4:
            statuses.append(main(["ls", str(folder)]))
    finally:
        writer.kill()
        writer.wait()
    output = capsys.readouterr()
    assert set(statuses) == {0}, output.out[-2000:] + output.err[-2000:]
