"""Writes in flight when a program exits are finished before the process ends, or fail loudly with a non-zero status.

A write that failed, or did not finish, at exit makes the status 120: Python's status when its final flush of
``sys.stderr`` fails, which is how an exit handler can change it (a ``SystemExit`` raised in one is ignored).

Every scenario is a real Python process that saves and then exits: off the end of its script, with ``sys.exit(0)``,
with an uncaught exception or with ``KeyboardInterrupt``, while a checkpoint step, a collector's blocks or a trainer's
checkpoint are still being written. The 40 MB cases are larger than the size at which checksums are computed on
threads of their own while the bytes are written, which is what ``concurrent.futures`` refused during an exit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import forked
import h5py
import numpy as np
import pytest
from permissions import obey_permission_bits

import jaxstow
from jaxstow import CheckpointManager
from jaxstow._storage.lock import LOCK_NAME
from jaxstow.train import Checkpoint

_SAVE = """
import sys, numpy as np
from jaxstow import CheckpointManager
manager = CheckpointManager(sys.argv[1])
manager.save(1, {{"w": np.arange({count}, dtype=np.float32)}})
"""

_ENDINGS = {
    "end of script": ("", 0),
    "sys.exit(0)": ("sys.exit(0)", 0),
    "uncaught exception": ("raise ValueError('the run went wrong')", 1),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", -signal.SIGINT),  # Python ends as Ctrl-C does
}
_SIZES = {"1 KB": 256, "40 MB": 10_000_000}


def _start(program: str, *arguments: str, **environment: str) -> subprocess.Popen[str]:
    return forked.Popen(
        [sys.executable, "-c", textwrap.dedent(program), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **environment},
    )


def _finish(process: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


@pytest.mark.timeout(300)
def test_a_step_in_flight_is_committed_on_every_way_out(tmp_path: Path) -> None:
    runs = {}
    for ending, (line, _) in _ENDINGS.items():
        for size, count in _SIZES.items():
            folder = tmp_path / f"{ending}-{size}".replace(" ", "_")
            runs[ending, size] = (folder, _start(_SAVE.format(count=count) + line, str(folder)))
    for (ending, size), (folder, process) in runs.items():
        status, stderr = _finish(process)
        assert status == _ENDINGS[ending][1], f"{ending}, {size}: {stderr}"
        assert "failed" not in stderr, stderr
        with CheckpointManager(folder) as manager:
            assert manager.steps() == [1], f"{ending}, {size}: {stderr}"
            restored = manager.restore(1, as_numpy=True)["w"]
        np.testing.assert_array_equal(restored, np.arange(_SIZES[size], dtype=np.float32))
        assert not (folder / LOCK_NAME).exists()


def test_a_save_that_fails_during_the_exit_is_printed_with_its_step_and_the_status_is_120(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    program = """
    import os, sys, numpy as np
    from jaxstow import CheckpointManager
    manager = CheckpointManager(sys.argv[1])
    manager.save(1, {"w": np.ones(256, np.float32)})
    manager.wait()
    os.chmod(sys.argv[1], 0o555)  # read-only: step 2 is refused on the writer's thread
    manager.save(2, {"w": np.ones(256, np.float32)})
    """
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(program), str(folder)],
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=obey_permission_bits if os.geteuid() == 0 else None,
        )
    except subprocess.SubprocessError as error:  # raised when preexec_fn fails
        pytest.skip(f"running as root without the right to drop CAP_DAC_OVERRIDE, so chmod stops nothing: {error}")
    status, stderr = _finish(process)
    folder.chmod(0o755)
    assert status == 120, stderr
    assert f"jaxstow: saving step 2 to {folder}: failed before the process ended:" in stderr
    assert f"{folder}/2: cannot write it: permission denied" in stderr
    assert "Traceback" not in stderr
    assert CheckpointManager(folder).steps() == [1]


@pytest.mark.timeout(60)
def test_a_write_still_running_at_the_deadline_is_printed_and_the_status_is_120() -> None:
    program = """
    import time
    from jaxstow.io.job_queue import JobQueue
    writer = JobQueue("slow-writer")
    writer.submit(lambda: time.sleep(60))
    """
    started = time.monotonic()
    status, stderr = _finish(_start(program, JAXSTOW_EXIT_WAIT="1"))
    assert status == 120, stderr
    assert "jaxstow: the queued writes of slow-writer: not finished within 1 s (JAXSTOW_EXIT_WAIT)" in stderr
    assert time.monotonic() - started < 40


@pytest.mark.timeout(60)
def test_a_second_ctrl_c_stops_the_wait_and_the_process_ends_as_ctrl_c_ends_it(tmp_path: Path) -> None:
    program = """
    import time
    from jaxstow.io.job_queue import JobQueue
    writer = JobQueue("slow-writer")
    writer.submit(lambda: time.sleep(60))
    print("saving", flush=True)
    time.sleep(60)
    """
    process = _start(program)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline() == "saving\n"
    process.send_signal(signal.SIGINT)  # the first Ctrl-C ends the script; the exit waits for the writer
    waiting = process.stderr.readline()
    while waiting.startswith(("Traceback", " ", "KeyboardInterrupt")):
        waiting = process.stderr.readline()
    assert waiting.startswith("waiting up to 600 s for the queued writes of slow-writer to finish"), waiting
    process.send_signal(signal.SIGINT)
    status, stderr = _finish(process, timeout=30)
    assert status == -signal.SIGINT
    assert "jaxstow: the queued writes of slow-writer: abandoned by Ctrl-C, unfinished" in stderr


@pytest.mark.timeout(60)
def test_a_ctrl_c_whose_exception_python_drops_still_stops_the_wait() -> None:
    """Python drops the ``KeyboardInterrupt`` of a Ctrl-C that lands while the main thread runs a garbage-collection
    callback (jax has one): the wait at exit still ends. Here the callback presses Ctrl-C itself during the wait."""
    program = """
    import gc, logging, signal, time
    from jaxstow.io.job_queue import JobQueue
    writer = JobQueue("slow-writer")
    writer.submit(lambda: time.sleep(60))
    waiting, pressed = [], []

    class Waiting(logging.Handler):
        def emit(self, record):
            waiting.append(record.getMessage())

    def ctrl_c_inside(phase, info):
        if waiting and not pressed:  # the exit's wait has begun
            pressed.append(True)
            signal.raise_signal(signal.SIGINT)
            sum(range(1000))  # its handler runs here, and the KeyboardInterrupt it raises is printed and dropped

    logging.getLogger("jaxstow").addHandler(Waiting())
    gc.callbacks.append(ctrl_c_inside)
    gc.set_threshold(1)
    """
    started = time.monotonic()
    status, stderr = _finish(_start(program), timeout=40)
    assert "KeyboardInterrupt" in stderr and "Exception ignored" in stderr, stderr  # Python dropped it
    assert "jaxstow: the queued writes of slow-writer: abandoned by Ctrl-C, unfinished" in stderr, stderr
    assert status == 120, stderr
    assert time.monotonic() - started < 30


def test_blocks_of_a_collector_still_queued_at_the_exit_reach_the_hdf5_file(tmp_path: Path) -> None:
    path = tmp_path / "samples.h5"
    program = """
    import sys, h5py, jax, jax.numpy as jnp
    from jaxstow import io, scheduler
    init_save, save, _ = io.save(io.HDF5Collector(h5py.File(sys.argv[1], "w", libver="latest")), block_size=2)
    state = init_save(jnp.zeros(250_000), None, scheduler.static_information(samples_collected=41))
    step = lambda state, t: (save(state, True, jnp.full(250_000, t, jnp.float32))[0], None)
    jax.block_until_ready(jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(41))[0])(state))
    """  # the run is abandoned with blocks queued: postprocess_save, which would send the 41st, is never called
    status, stderr = _finish(_start(program, str(path)))
    assert status == 0, stderr
    with h5py.File(path, "r") as file:
        assert list(file["draws_done"][:]) == [40]
        samples = file["chain~0"][:40]
    np.testing.assert_array_equal(samples, np.repeat(np.arange(40, dtype=np.float32)[:, None], 250_000, axis=1))


def test_a_trainer_checkpoint_saved_after_the_main_thread_ended_is_written_whole(tmp_path: Path) -> None:
    program = """
    import sys, threading, numpy as np
    from jaxstow.train import Checkpoint, DefaultCheckpointer, DefaultCheckpointerArguments
    checkpointer = DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=sys.argv[1], model_state_save_dir=None))

    def last_epoch():
        threading.main_thread().join()  # the interpreter has begun to exit
        weights = np.arange(10_000_000, dtype=np.float32)  # large enough to be checksummed on threads
        checkpointer.save(Checkpoint(module_interface_state={"w": weights}, trainer_state={"last_epoch": 3}), 3)

    threading.Thread(target=last_epoch).start()
    """
    status, stderr = _finish(_start(program, str(tmp_path)))
    assert status == 0, stderr
    loaded = jaxstow.load(tmp_path / "checkpoint_3.jxs", as_numpy=True)
    assert isinstance(loaded, Checkpoint) and loaded.trainer_state == {"last_epoch": 3}
    np.testing.assert_array_equal(loaded.module_interface_state["w"], np.arange(10_000_000, dtype=np.float32))


@pytest.mark.timeout(120)
def test_an_upload_started_after_the_main_thread_ended_completes(s3_server) -> None:
    url = s3_server.url(f"late-{os.getpid()}", "w.jxs")
    program = """
    import json, sys, threading
    import numpy as np, jaxstow
    url, options = sys.argv[1], json.loads(sys.argv[2])
    def late_save():
        threading.main_thread().join()  # the interpreter has begun to exit: concurrent.futures refuses new work
        jaxstow.save(url, {"w": np.arange(10_000_000, dtype=np.float32)}, storage_options=options)
    threading.Thread(target=late_save).start()
    """  # 40 MB: uploaded in parts, on the upload pool while it takes work, on this thread once it refuses
    status, stderr = _finish(_start(program, url, json.dumps(s3_server.storage_options)))
    assert status == 0, stderr
    loaded = jaxstow.load(url, storage_options=s3_server.storage_options, as_numpy=True)
    np.testing.assert_array_equal(loaded["w"], np.arange(10_000_000, dtype=np.float32))


@pytest.mark.parametrize("saved_before", [False, True], ids=["first write at exit", "after a write"])
def test_a_step_saved_by_the_programs_own_exit_handler_is_committed(tmp_path: Path, saved_before: bool) -> None:
    program = """
    import atexit, sys, numpy as np
    from jaxstow import CheckpointManager
    manager = CheckpointManager(sys.argv[1])
    if sys.argv[2] == "True":
        manager.save(1, {"w": np.ones(10, np.float32)})  # jaxstow's own exit handler is registered by now
    atexit.register(lambda: manager.save(2, {"w": np.full(2_000_000, 2, np.float32)}))  # "save on exit"
    """
    status, stderr = _finish(_start(program, str(tmp_path), str(saved_before)))
    assert status == 0, stderr
    manager = CheckpointManager(tmp_path)
    assert manager.steps() == ([1, 2] if saved_before else [2])
    assert np.asarray(manager.restore()["w"]).tolist() == [2.0] * 2_000_000


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_step_saved_in_a_multiprocessing_worker_is_committed_and_a_failed_one_ends_it_with_120(
    tmp_path: Path, start_method
):
    program = """
    import multiprocessing, shutil, sys, numpy as np
    from jaxstow import CheckpointManager

    def work(folder):
        CheckpointManager(folder).save(1, {"w": np.arange(2_000_000, dtype=np.float32)})  # and returns at once

    def fail(folder):
        manager = CheckpointManager(folder)
        manager.save(1, {"w": np.ones(256, np.float32)})
        manager.wait()
        shutil.rmtree(folder)
        open(folder, "w").close()  # the folder is gone: step 2 cannot be written, and no caller hears of it
        manager.save(2, {"w": np.ones(256, np.float32)})

    if __name__ == "__main__":
        context = multiprocessing.get_context(sys.argv[2])
        worker = context.Process(target=work, args=(sys.argv[1],))
        worker.start()
        worker.join()
        failing = context.Process(target=fail, args=(sys.argv[1] + "-failing",))
        failing.start()
        failing.join()
        # from Python 3.13 a forked worker's code is set before its exit handlers run: the failure is only printed
        failed = 0 if sys.argv[2] == "fork" and sys.version_info >= (3, 13) else 120
        sys.exit(worker.exitcode or (0 if failing.exitcode == failed else 99))
    """
    script = tmp_path / "train.py"  # spawn's worker imports its function from the script's file
    script.write_text(textwrap.dedent(program))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), start_method], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "run-failing: failed before the process ended" in done.stderr
    restored = CheckpointManager(tmp_path / "run").restore(as_numpy=True)
    np.testing.assert_array_equal(restored["w"], np.arange(2_000_000, dtype=np.float32))


@pytest.mark.parametrize("value", ["nan", "-1", "soon"])
def test_an_exit_wait_that_is_no_number_of_seconds_is_the_default_not_no_wait(monkeypatch, caplog, value):
    # nan and -1 meant "do not wait": the save in flight at the exit was lost, without a word.
    from jaxstow._write.at_exit import EXIT_WAIT, exit_wait

    monkeypatch.setenv("JAXSTOW_EXIT_WAIT", value)
    with caplog.at_level(logging.WARNING, logger="jaxstow"):
        assert exit_wait() == EXIT_WAIT
    assert f"JAXSTOW_EXIT_WAIT={value!r} is not a number of seconds (0 or more)" in caplog.text
    for given, seconds in (("0", 0.0), ("2.5", 2.5), ("inf", float("inf"))):
        monkeypatch.setenv("JAXSTOW_EXIT_WAIT", given)
        assert exit_wait() == seconds
