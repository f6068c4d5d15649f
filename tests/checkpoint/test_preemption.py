"""Preemption in one process: a scheduler's signal makes the next step a save, then the process ends as the signal
would have ended it; and ``should_save`` counts every step whose save was issued.

The preemption scenario is a real training loop in a process of its own, sent a real SIGTERM while a save is in
flight.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import forked
import numpy as np
import pytest
from tmpfs import small_tmpfs

from jaxstow import CheckpointManager
from jaxstow._storage.lock import LOCK_NAME
from jaxstow.errors import ArgumentError

_TRAINING = """
import signal, sys, time, numpy as np
from jaxstow import CheckpointManager
manager = CheckpointManager(sys.argv[1], save_every=5, preemption_signals=[signal.SIGTERM])
for step in range(10_000):
    if manager.should_save(step):
        print("saving", step, manager.reached_preemption(step), flush=True)
        manager.save(step, {"w": np.full(10_000_000, step, np.float32)})  # 40 MB: written while the loop goes on
        print("saved", step, flush=True)
    time.sleep(0.01)
print("the loop ended", flush=True)
"""


@pytest.mark.timeout(120)
def test_sigterm_saves_the_next_step_finishes_the_one_in_flight_and_ends_the_process_as_sigterm(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    process = forked.Popen(
        [sys.executable, "-c", textwrap.dedent(_TRAINING), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(4)]
    assert lines == ["saving 0 False\n", "saved 0\n", "saving 5 False\n", "saved 5\n"]
    process.send_signal(signal.SIGTERM)  # step 5 is being written
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM, stderr
    # Steps the signal came too late to change, maybe; then the notice's step, whose save never returns.
    *regular, last = [line.split() for line in stdout.splitlines()]
    assert last[0] == "saving" and last[2] == "True", stdout
    preempted = int(last[1])
    assert [words[0] for words in regular] == ["saving", "saved"] * (len(regular) // 2)
    with CheckpointManager(folder) as manager:
        assert manager.steps() == [0, 5, *[int(words[1]) for words in regular[::2]], preempted]
        for step in manager.steps():
            assert manager.restore(step, as_numpy=True)["w"][-1] == step
    assert not (folder / LOCK_NAME).exists()


def test_a_signal_that_no_save_follows_ends_the_process_at_close(tmp_path: Path) -> None:
    program = """
    import os, signal, sys, numpy as np
    from jaxstow import CheckpointManager
    with CheckpointManager(sys.argv[1], preemption_signals=[signal.SIGTERM]) as manager:
        manager.save(1, {"w": np.ones(10_000_000, np.float32)})
        os.kill(os.getpid(), signal.SIGTERM)  # after the last save: the evaluation goes on
        print("evaluated", flush=True)
    print("after close", flush=True)
    """
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(program), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "evaluated\n"
    assert CheckpointManager(tmp_path).steps() == [1]
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_manager_dropped_unclosed_leaves_the_signal_to_end_the_process(tmp_path: Path) -> None:
    # Its handler stayed: the scheduler's SIGTERM was recorded for a manager that no longer was, and the process went
    # on running.
    program = """
    import gc, os, signal, sys, time, numpy as np
    from jaxstow import CheckpointManager
    def train():
        manager = CheckpointManager(sys.argv[1], preemption_signals=[signal.SIGTERM])
        manager.save(1, {"w": np.ones(3)})
        manager.wait()  # and no close
    train()
    gc.collect()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("still running", flush=True)
    """
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(program), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == ""


def test_a_run_that_raises_after_the_signal_shows_its_error_and_no_saved_checkpoint(tmp_path: Path) -> None:
    # The error was swallowed: no traceback, exit status 143 and "now that its checkpoint is saved".
    program = """
    import os, signal, sys, numpy as np
    from jaxstow import CheckpointManager
    with CheckpointManager(sys.argv[1], preemption_signals=[signal.SIGTERM]) as manager:
        manager.save(1, {"w": np.ones(3)})
        os.kill(os.getpid(), signal.SIGTERM)
        raise RuntimeError("NaN loss at step 2")  # the step after the signal fails before it saves
    """
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(program), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 120, done.stderr
    assert "Traceback" in done.stderr and "RuntimeError: NaN loss at step 2" in done.stderr
    assert "NOT saved (exit status 120): the run raised RuntimeError: NaN loss at step 2" in done.stderr
    assert CheckpointManager(tmp_path).steps() == [1]


_TERMINATED = """
import os, signal, sys, numpy as np
from jaxstow import CheckpointManager
if sys.argv[2] == "exit":  # a handler of the program's own that turns SIGTERM into an exit of the interpreter
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
manager = CheckpointManager(sys.argv[1])  # no preemption_signals
manager.save(0, {"w": np.zeros(10, np.float32)})
manager.wait()
manager.save(5, {"w": np.full(10_000_000, 5, np.float32)})  # 40 MB: still being written when the signal comes
os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends
print("after the signal", flush=True)
"""


def test_sigterm_without_preemption_signals_loses_the_save_in_flight_and_keeps_the_steps_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "run"
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(_TERMINATED), str(folder), "plain"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr  # 143 in a shell
    assert done.stdout == ""
    left = {path.name for path in folder.iterdir()} - {LOCK_NAME, "0"}  # the lock file stays, step 0 is intact
    assert all(name.startswith(".5.jaxstow-tmp-") for name in left), left  # step 5's files, under a temporary name
    assert (folder / LOCK_NAME).exists()
    with CheckpointManager(folder) as manager:
        assert manager.steps() == [0]  # step 5 is not committed; step 0 is intact
        assert manager.restore(as_numpy=True)["w"].tolist() == [0.0] * 10
        with caplog.at_level("WARNING", logger="jaxstow"):
            manager.save(5, {"w": np.ones(2, np.float32)})  # the next writer takes the lock over, clears leftovers
        assert "which ended without releasing it" in caplog.text
    assert sorted(path.name for path in folder.iterdir()) == ["0", "5"]


def test_sigterm_turned_into_an_exit_by_the_program_finishes_the_save_in_flight(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(_TERMINATED), str(folder), "exit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stdout == ""
    with CheckpointManager(folder) as manager:
        assert manager.steps() == [0, 5]
        assert manager.restore(5, as_numpy=True)["w"][-1] == 5.0
    assert not (folder / LOCK_NAME).exists()


def test_should_save_counts_a_save_still_in_flight(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, save_every=5) as manager:
        manager.save(0, {"w": np.zeros(10_000_000, np.float32)})  # 40 MB: still being written when asked
        assert [manager.should_save(step) for step in range(7)] == [False, False, False, False, False, True, False]
        manager.save(5, {"w": np.ones(2, np.float32)})
        assert not manager.should_save(5) and manager.should_save(10)
        manager.delete(5)
        assert manager.should_save(5)


def test_closing_puts_the_signal_handler_back(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    first = CheckpointManager(tmp_path / "a", preemption_signals=[signal.SIGUSR1])
    second = CheckpointManager(tmp_path / "b", preemption_signals=[signal.SIGUSR1])
    assert signal.getsignal(signal.SIGUSR1) is not before
    first.close()
    assert signal.getsignal(signal.SIGUSR1) is not before  # the second manager still listens
    assert not second.reached_preemption(1)
    second.close()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_signals_that_cannot_be_caught_or_a_manager_off_the_main_thread_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="cannot hold SIGKILL"):
        CheckpointManager(tmp_path, preemption_signals=[signal.SIGKILL])
    with pytest.raises(ArgumentError, match="must be signals such as"):
        CheckpointManager(tmp_path, preemption_signals=["SIGTERM"])  # type: ignore[list-item]
    before = signal.getsignal(signal.SIGTERM)
    refused: list[BaseException] = []

    def make() -> None:
        try:
            CheckpointManager(tmp_path, preemption_signals=[signal.SIGTERM])
        except ArgumentError as error:
            refused.append(error)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    assert len(refused) == 1 and "main thread" in str(refused[0])
    assert signal.getsignal(signal.SIGTERM) is before


_PREEMPTED_ON_A_FULL_DISK = """
import os, signal, sys, numpy as np
from jaxstow import CheckpointManager
manager = CheckpointManager(sys.argv[1], save_every=1000, preemption_signals=[signal.SIGTERM])
for step in range(1, 2000):
    if step == 500:
        os.kill(os.getpid(), signal.SIGTERM)
    if manager.should_save(step):  # step 500's 4 MB do not fit the disk
        manager.save(step, {"w": np.full(1000 if step < 500 else 1_000_000, step, np.float32)})
print("the loop ended", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_preemption_whose_save_fails_on_a_full_disk_says_so_and_ends_with_a_failed_status(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", "1m") as disk:
        done = forked.run(
            [sys.executable, "-c", textwrap.dedent(_PREEMPTED_ON_A_FULL_DISK), str(disk / "run")],
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert done.returncode == 120, done.stderr  # not 143 (-15): the preemption did not go well
        assert "the loop ended" not in done.stdout
        assert "now that its checkpoint is saved" not in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert "SIGTERM: ending the process, as the signal asked, but its checkpoint was NOT saved" in done.stderr
        why = "saving step 500 to {} failed in the background: {}: cannot write it: no space left on the device"
        last = done.stderr.splitlines()[-1]  # the error, once more, in the same line as the end it brings
        assert why.format(disk / "run", disk / "run" / "500" / "w.safetensors") in last, done.stderr
        with CheckpointManager(disk / "run") as manager:
            assert manager.steps() == [1]
            assert manager.restore(1)["w"].tolist() == [1.0] * 1000


_TWO_MANAGERS = """
import os, signal, sys, numpy as np
from jaxstow import CheckpointManager
model = CheckpointManager(sys.argv[1] + "/model", save_every=100, preemption_signals=[signal.SIGTERM])
data = CheckpointManager(sys.argv[1] + "/data", save_every=100, preemption_signals=[signal.SIGTERM])
data_saves_at_preemption = sys.argv[2] == "yes"
for step in range(1, 1_000):
    if step == 7:
        os.kill(os.getpid(), signal.SIGTERM)
    if model.should_save(step):
        model.save(step, {"w": np.full(1000, step, np.float32)})
        print("model saved", step, flush=True)
    if data_saves_at_preemption and data.should_save(step) or step == 1:
        data.save(step, {"position": np.int64(step)})
        print("data saved", step, flush=True)
print("the loop ended", flush=True)
"""


@pytest.mark.parametrize("data_saves_at_preemption", [True, False])
def test_two_managers_that_caught_the_signal_both_save_its_step_before_the_process_ends(
    tmp_path: Path, data_saves_at_preemption: bool
) -> None:
    answer = "yes" if data_saves_at_preemption else "no"
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(_TWO_MANAGERS), str(tmp_path), answer],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    with CheckpointManager(tmp_path / "model") as model, CheckpointManager(tmp_path / "data") as data:
        assert model.steps() == [1, 7]
        # The data pipeline's manager holds the model's step; one that let it pass without a save ends the process
        # at the next step's question, its newest step older than the model's.
        assert data.steps() == ([1, 7] if data_saves_at_preemption else [1])
    assert "model saved 8" not in done.stdout and "the loop ended" not in done.stdout
