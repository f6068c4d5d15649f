"""Reads made as a program exits: in an ``atexit`` handler, or on a thread that goes on once the main thread ended.

``concurrent.futures`` refuses new work once the interpreter has begun to exit; every read that hands pieces to a
pool of threads (a leaf of 3 MiB or more read again, a file of 32 MiB or more, the items of a checkpoint step) then
reads them on its own thread, and gives the same arrays, whether or not the pools' threads were started before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager

_READ = """
import sys, numpy as np, jaxstow
from jaxstow import CheckpointManager

LEAF, BIG = np.arange(1 << 20, dtype=np.float32), np.ones(10 << 20, dtype=np.float32)  # 4 MiB, 40 MiB

def read():
    path, folder = sys.argv[1], sys.argv[2]
    with jaxstow.open(path) as reader:
        for _ in range(3):  # read again: into memory a read let go
            np.testing.assert_array_equal(reader["leaf"], LEAF)
    whole = jaxstow.load(path, as_numpy=True)  # 44 MiB: pieces on the disk's pool
    np.testing.assert_array_equal(whole["big"], BIG)
    step = CheckpointManager(folder).restore(1)  # two items, restored side by side
    np.testing.assert_array_equal(step["params"]["w"], BIG)
    np.testing.assert_array_equal(step["opt"]["m"], LEAF)
    print("read")
"""

_WAYS = {
    "atexit handler": "import atexit\natexit.register(read)\n",
    "atexit handler after the same reads": (
        "import atexit, contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    read()\n"
        "atexit.register(read)\n"
    ),
    "thread after the main thread": (
        "import threading\n"
        "def late():\n"
        "    threading.main_thread().join()\n"
        "    read()\n"
        "threading.Thread(target=late).start()\n"
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", list(_WAYS))
def test_a_read_made_as_the_program_exits_reads_on_its_own_thread_and_gives_the_arrays(tmp_path: Path, way) -> None:
    leaf = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    big = np.ones(10 << 20, dtype=np.float32)  # 40 MiB
    path, folder = tmp_path / "tree.jxs", tmp_path / "steps"
    jaxstow.save(path, {"leaf": leaf, "big": big})
    with CheckpointManager(folder) as manager:
        manager.save(1, {"params": {"w": big}, "opt": {"m": leaf}})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_READ) + _WAYS[way], str(path), str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=100,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "read\n"
