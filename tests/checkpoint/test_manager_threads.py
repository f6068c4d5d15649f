"""One manager called from several threads: its saves, deletes and closes take turns, so that the first saves of two
threads take the folder's lock once, and ``close()`` returns only once every save that got in before it is on disk."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.errors import CheckpointError


def _in_threads(*calls) -> list[str]:
    outcomes: list[str] = [""] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(index: int, call) -> None:
        barrier.wait()
        try:
            call()
            outcomes[index] = "ok"
        except CheckpointError as error:
            outcomes[index] = str(error)

    threads = [threading.Thread(target=run, args=(index, call)) for index, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


@pytest.mark.parametrize("trial", range(5))
def test_the_first_saves_of_two_threads_both_go_through(tmp_path, trial):
    manager = CheckpointManager(tmp_path / "run")
    tree = {"w": np.ones(1000, np.float32)}
    assert _in_threads(lambda: manager.save(1, tree), lambda: manager.save(2, tree)) == ["ok", "ok"]
    manager.close()
    assert manager.steps() == [1, 2]


@pytest.mark.parametrize("trial", range(5))
def test_close_from_two_threads_returns_once_the_step_is_on_disk_and_the_lock_is_gone(tmp_path, trial):
    manager = CheckpointManager(tmp_path / "run")
    manager.save(1, {"w": np.ones(2_000_000, np.float32)})
    assert _in_threads(manager.close, manager.close) == ["ok", "ok"]
    assert manager.steps() == [1] and not os.path.exists(tmp_path / "run" / ".jaxstow.lock")
    CheckpointManager(tmp_path / "run").save(2, {"w": np.ones(2)})  # the folder is free


@pytest.mark.parametrize("trial", range(5))
def test_a_save_racing_close_is_on_disk_before_close_returns_or_refused(tmp_path, trial):
    manager = CheckpointManager(tmp_path / "run")
    manager.save(0, {"w": np.zeros(2)})
    outcomes = _in_threads(lambda: manager.save(1, {"w": np.ones(1_000_000, np.float32)}), manager.close)
    assert outcomes[1] == "ok"
    assert outcomes[0] == "ok" or outcomes[0].endswith("is closed"), outcomes
    steps = CheckpointManager(tmp_path / "run").steps()
    assert steps == ([0, 1] if outcomes[0] == "ok" else [0])
    assert not os.path.exists(tmp_path / "run" / ".jaxstow.lock")


def test_four_threads_restoring_from_one_manager_in_a_loop_each_get_their_steps_values(tmp_path):
    manager = CheckpointManager(tmp_path / "run")
    for step in range(1, 5):  # step 1 of 2 items ... step 4 of 5, each of its own values
        manager.save(step, {f"item{item}": {"w": np.full(5, 10.0 * step + item)} for item in range(step + 1)})
    manager.wait()
    wrong: list[str] = []

    def restore_in_a_loop(first: int) -> None:
        for turn in range(40):
            step = 1 + (first + turn) % 4
            select = ["item1/**", "item0/**"] if turn % 3 == 0 else None  # the items chosen, then each restored
            restored = manager.restore(step, as_numpy=True, select=select)
            values = {name: item["w"].tolist() for name, item in restored.items()}
            expected = {f"item{item}": [10.0 * step + item] * 5 for item in range(2 if select else step + 1)}
            if values != expected:
                wrong.append(f"step {step}: {values}, not {expected}")

    assert _in_threads(*(lambda first=first: restore_in_a_loop(first) for first in range(4))) == ["ok"] * 4
    assert wrong == []
    manager.close()
