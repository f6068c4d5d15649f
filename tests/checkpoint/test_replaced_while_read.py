"""A step that the process saving a folder replaces (``save(step, force=True)``) while another process reads it: the
reader gets the old step or the new one, whole, never a step called damaged (``CorruptFileError``: its files and
its record taken from two saves) nor, with ``fallback=True``, an older step in its place."""

from __future__ import annotations

import sys
import textwrap
import time

import forked
import numpy as np
from forked_cli import jaxstow_command

from jaxstow import CheckpointManager

WRITER = """
import sys, time, numpy as np
from jaxstow import CheckpointManager
with CheckpointManager(sys.argv[1]) as manager:
    for value in range(1, 100_000):
        manager.save(5, {"a": np.full(50_000, float(value)), "b": np.full(5, float(value))}, force=True,
                     metrics={"v": float(value)})
        manager.wait()
        time.sleep(float(sys.argv[2]))  # a step replaced every few (tens of) milliseconds, for seconds
"""


def test_a_step_replaced_while_it_is_read_comes_back_whole(tmp_path):
    folder = tmp_path / "run"
    with CheckpointManager(folder) as manager:
        manager.save(5, {"a": np.zeros(50_000), "b": np.zeros(5)}, metrics={"v": 0.0})
    writer = forked.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(folder), "0.02"])
    try:
        reader, restored, start = CheckpointManager(folder), 0, time.monotonic()
        while time.monotonic() - start < 6:
            for fallback in (False, True):
                tree = reader.restore(5, fallback=fallback, as_numpy=True)
                assert (tree["a"] == tree["a"][0]).all() and (tree["b"] == tree["a"][0]).all()
                assert reader.restored is None or reader.restored.step == 5
                assert reader.metrics(5)["v"] >= 0
                restored += 1
        assert restored > 50
    finally:
        writer.kill()
        writer.wait()


def test_a_step_replaced_again_and_again_is_never_called_damaged(tmp_path):
    folder = tmp_path / "run"
    with CheckpointManager(folder) as manager:
        manager.save(4, {"a": np.zeros(5), "b": np.zeros(5)})
        manager.save(5, {"a": np.zeros(50_000), "b": np.zeros(5)}, metrics={"v": 0.0})
    writer = forked.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(folder), "0"])
    try:
        checks, start = 0, time.monotonic()
        while time.monotonic() - start < 6:
            reader = CheckpointManager(folder)  # a fresh process's view: nothing remembered
            assert reader.damaged_steps() == {}
            assert reader.latest_intact_step() == 5
            checks += 1
        verified = [jaxstow_command("verify", folder) for _ in range(3)]
        assert [done.returncode for done in verified] == [0, 0, 0], [done.stdout[-300:] for done in verified]
        assert checks > 20
    finally:
        writer.kill()
        writer.wait()
