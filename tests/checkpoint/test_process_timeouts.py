"""No wait of a multi-process save or restore outlasts ``process_timeout``: real ``jax.distributed`` processes, one of
them stopped (SIGSTOP), killed (SIGKILL) or stalled (alive but silent) mid-run, and every other process raising a
``CheckpointError`` that names the step and the missing process, with no step committed.

Three processes of one CPU device each run ``tests/distributed/worker.py`` with a timeout of 3 s. A stopped or killed
process stops sending jax's heartbeats, after which jax's coordination service ends the others (SIGABRT) unless
``jax_enable_recoverability`` is set: these runs set it, except the one that shows the error comes first anyway.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked
import numpy as np
import pytest
from distributed_runs import launch

WORKER = Path(__file__).parents[1] / "distributed" / "worker.py"
LONELY_WORKER = Path(__file__).parents[1] / "distributed" / "lonely_save_worker.py"
TIMEOUT = 3.0
GRACE = 5.0  # how much longer the others wait for process 0's outcome (Processes.grace)
SLOWER = 3.0  # how much longer than its timeout a wait may take on a loaded machine (the step's own work included)
VICTIM = 2


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(action: str, folder: Path, *extra: str, recoverable: bool = True) -> list[subprocess.Popen[str]]:
    port = _free_port()
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    flags = ["--process-timeout", str(TIMEOUT), *extra, *(["--recoverable"] if recoverable else [])]
    return [
        forked.Popen(
            [sys.executable, str(WORKER), action, str(index), "3", "1", str(port), str(folder), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=environment,
        )
        for index in range(3)
    ]


def _line(process: subprocess.Popen[str], timeout: float) -> dict:
    """The next JSON line the process prints, within ``timeout`` seconds."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            line = process.stdout.readline()
            assert line, f"process {process.args[3]} ended ({process.poll()}) without a report"
            if line.startswith("{"):
                return json.loads(line)
    raise AssertionError(f"process {process.args[3]} printed nothing within {timeout} s")


def _end(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def _steps(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if not path.name.startswith("."))


def _stop(process: subprocess.Popen[str], how: str) -> None:
    if how == "SIGSTOP":
        process.send_signal(signal.SIGSTOP)
    elif how == "SIGKILL":
        process.send_signal(signal.SIGKILL)
    # "stalled": the worker itself sleeps for a minute, alive and heartbeating


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Steps 1 and 2 saved by 3 processes."""
    folder = tmp_path_factory.mktemp("saved") / "run"
    processes = _start("save", folder)
    try:
        reports = [_line(process, 120) for process in processes]
    finally:
        _end(processes)
    assert [report.get("steps") for report in reports] == [[1, 2]] * 3, reports
    return folder


@pytest.mark.parametrize("how", ["SIGSTOP", "SIGKILL", "stalled"])
def test_a_save_whose_process_stops_dies_or_stalls_ends_everywhere_with_no_step(tmp_path, how):
    folder = tmp_path / "run"
    extra = ["--pause-before-commit", "1"] + (["--stall", str(VICTIM)] if how == "stalled" else [])
    processes = _start("save", folder, *extra)
    try:
        for process in processes:
            assert _line(process, 120) == {"process": int(process.args[3]), "saved": 1}
        _stop(processes[VICTIM], how)
        survivors = [_line(process, SLOWER * (TIMEOUT + GRACE) + 10) for process in processes[:VICTIM]]
    finally:
        _end(processes)
    for index, report in enumerate(survivors):
        assert "CheckpointError" in report["error"] and f"process {VICTIM} did not report" in report["error"], report
        assert "step 2" in report["error"], report
        assert report["seconds"] <= SLOWER * (TIMEOUT + (GRACE if index else 0)), report
    assert _steps(folder) == ["1"]
    assert not [path.name for path in folder.iterdir() if "jaxstow-tmp" in path.name]  # nor a staging folder left
    from jaxstow import CheckpointManager

    with CheckpointManager(folder) as manager:
        assert manager.steps() == [1]


@pytest.mark.parametrize("saver", [0, 1])
def test_a_save_that_one_process_alone_calls_ends_within_the_timeout_naming_the_other(tmp_path, saver):
    folder = tmp_path / "run"
    processes = launch(LONELY_WORKER, 2, lambda index, port: [str(index), str(port), str(folder), str(saver)])
    try:
        report = _line(processes[saver], SLOWER * (TIMEOUT + GRACE) + 10)
    finally:
        (tmp_path / "run.done").touch()
        _end(processes)
    other = 1 - saver  # the step each process saves, which process 0 waits for and then tells: nothing is written
    waited = "the step it saves (step 2 here" if saver == 0 else "the steps of the save of step 2"
    assert (
        report["error"].startswith("CheckpointError") and f"process {other} did not report {waited}" in report["error"]
    )
    assert report["steps"] == [1] and _steps(folder) == ["1"]


def test_a_step_process_0_commits_after_the_others_gave_up_waiting_holds_their_files(tmp_path):
    """The others told their files, then stopped waiting for the outcome: process 0, which heard them, commits the
    step, which must restore whole (their files were removed once, and the keep policy then deleted the step before)."""
    folder = tmp_path / "run"
    processes = _start("save", folder, "--slow-writes", str(TIMEOUT + GRACE + 3))
    try:
        reports = [_line(process, 120) for process in processes]
    finally:
        _end(processes)
    assert reports[0].get("steps") == [1, 2], reports
    assert all("process 0 did not report the commit of step 2" in report["error"] for report in reports[1:]), reports
    from jaxstow import CheckpointManager

    with CheckpointManager(folder) as manager:
        restored = manager.restore(step=2)["params"]
    np.testing.assert_array_equal(restored["w"], np.arange(512 * 384, dtype=np.float32).reshape(512, 384) + 2000)


@pytest.mark.parametrize("how", ["SIGSTOP", "SIGKILL", "stalled"])
def test_a_restore_whose_process_stops_dies_or_stalls_raises_everywhere(saved, how):
    extra = ["--pause-before-restore", "1"] + (["--stall", str(VICTIM)] if how == "stalled" else [])
    processes = _start("restore", saved, *extra)
    try:
        for process in processes:
            assert _line(process, 120) == {"process": int(process.args[3]), "restored": 1}
        _stop(processes[VICTIM], how)
        survivors = [_line(process, SLOWER * TIMEOUT + 10) for process in processes[:VICTIM]]
    finally:
        _end(processes)
    for report in survivors:
        assert "CheckpointError" in report["error"], report
        assert f"process {VICTIM} did not report" in report["error"], report  # its restore, or its peer address
        assert report["seconds"] <= SLOWER * TIMEOUT, report


def test_without_recoverability_the_error_comes_before_jax_ends_the_run(tmp_path):
    """jax's heartbeat (here 3x the longest wait, timeout and grace) ends the survivors of a killed process; the
    process_timeout raises first."""
    folder = tmp_path / "run"
    heartbeat = str(int(SLOWER * (TIMEOUT + GRACE)))
    processes = _start("save", folder, "--pause-before-commit", "1", "--heartbeat", heartbeat, recoverable=False)
    try:
        for process in processes:
            _line(process, 120)
        processes[VICTIM].send_signal(signal.SIGKILL)
        survivors = [_line(process, SLOWER * (TIMEOUT + GRACE) + 10) for process in processes[:VICTIM]]
    finally:
        _end(processes)
    assert all(f"process {VICTIM} did not report" in report["error"] for report in survivors), survivors
    assert _steps(folder) == ["1"]


def test_a_damaged_step_moves_every_process_to_the_step_before(saved, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved, copy, ignore=shutil.ignore_patterns(".jaxstow.lock"))
    damaged = copy / "2" / "params.p1.safetensors"
    data = bytearray(damaged.read_bytes())
    data[20] ^= 1  # in the header of a file every process reads
    damaged.write_bytes(bytes(data))
    processes = _start("restore", copy, "--fallback")
    try:
        reports = [_line(process, 120) for process in processes]
    finally:
        _end(processes)
    assert [report.get("restored") for report in reports] == [1, 1, 1], reports


def test_a_damaged_leaf_in_another_process_file_is_named_with_that_file(saved, tmp_path):
    # The error named the first file of the tree (params.safetensors, intact) for a shard of params.p1.safetensors.
    import shutil

    from jaxstow import CheckpointManager
    from jaxstow.errors import CorruptFileError

    copy = tmp_path / "copy"
    shutil.copytree(saved, copy, ignore=shutil.ignore_patterns(".jaxstow.lock"))
    damaged = copy / "2" / "params.p1.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1  # in the data of its last shard
    damaged.write_bytes(bytes(data))
    with CheckpointManager(copy) as manager, pytest.raises(CorruptFileError, match=r"params\.p1\.safetensors"):
        manager.restore(step=2)
