"""A copy of a running run's folder (``cp -r``, rsync) holds a copy of its lock file, which names the run's writer:
a live process of this host, whose lock is on the other folder. A manager of the copy takes the copy's lock without
warning of a takeover from that writer, which holds nothing there; a second writer of the run's own folder is still
refused. Each writer is a real process (``tests/support/forked.py``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import forked
import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.errors import CheckpointError

_WRITER = """
import sys, time
import numpy as np
from jaxstow import CheckpointManager
manager = CheckpointManager(sys.argv[1])
manager.save(1, {"w": np.arange(4.0)})
manager.wait()
print("saved", flush=True)
time.sleep(120)
"""

_COPY_WRITER = """
import sys
import numpy as np
from jaxstow import CheckpointManager
with CheckpointManager(sys.argv[1]) as manager:
    manager.save(2, {"w": np.arange(4.0) + 2})
print(manager.steps())
"""


def test_a_copy_of_a_running_run_is_written_without_a_takeover_warning_and_the_run_stays_locked(tmp_path):
    run, copy = tmp_path / "run", tmp_path / "copy"
    writer = forked.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "saved\n"
        shutil.copytree(run, copy)
        assert str(writer.pid) in (copy / ".jaxstow.lock").read_text()  # the copy names the run's live writer
        opened = forked.run(
            [sys.executable, "-c", textwrap.dedent(_COPY_WRITER), str(copy)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (opened.returncode, opened.stdout) == (0, "[1, 2]\n"), opened.stderr
        assert "taking over the lock" not in opened.stderr, opened.stderr
        with pytest.raises(
            CheckpointError, match=f"being written by another checkpoint manager \\(process {writer.pid} "
        ):
            CheckpointManager(run).save(2, {"w": np.arange(4.0)})
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert CheckpointManager(copy).steps() == [1, 2] and CheckpointManager(run).steps() == [1]
