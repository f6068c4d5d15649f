"""A save that one process alone cannot make (process 0 takes the folder's lock, which another manager holds) fails in
every process, and the run's next saves commit once the lock is free (``tests/distributed/lock_worker.py``, 2 real
processes): the processes' conversations of later saves still pair up."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from distributed_runs import launch, reports

from jaxstow import CheckpointManager

WORKER = Path(__file__).parents[1] / "distributed" / "lock_worker.py"


def test_a_lock_refused_to_process_0_fails_the_step_everywhere_and_later_saves_commit(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = CheckpointManager(folder)
    holder.save(0, {"state": {"w": np.zeros(2)}})
    holder.wait()  # it holds the lock from its first save
    processes = launch(WORKER, 2, lambda index, port: [str(index), str(port), str(folder)])
    deadline = time.monotonic() + 120
    while not all(Path(f"{folder}.refused.{index}").exists() for index in range(2)):
        assert time.monotonic() < deadline and all(process.poll() is None for process in processes)
        time.sleep(0.05)
    holder.close()
    Path(f"{folder}.free").touch()
    found = reports(processes)
    for report in found:
        assert "being written by another checkpoint manager" in report["errors"]["1"], report
        assert report["errors"]["2"] is None and report["errors"]["3"] is None, report
        assert report["steps"] == [0, 2, 3], report
    assert "process 0 failed" in found[1]["errors"]["1"], found[1]
