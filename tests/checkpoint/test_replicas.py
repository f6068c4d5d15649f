"""Replicated shards written by every process holding them, read once and gathered over jax's collectives, and
per-process state, with real ``jax.distributed`` processes (``tests/distributed/replicas_worker.py``) on CPU devices
and gloo."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from distributed_runs import reports, start

WORKER = Path(__file__).parents[1] / "distributed" / "replicas_worker.py"
ARRAY = 512 * 256 * 4  # bytes of each of the two arrays
HEADERS = 64 << 10  # every file's header and the step's record, read by every process


@pytest.fixture(scope="module")
def saved_by_four(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("replicas") / "run"
    found = reports(start(WORKER, "save", 4, 1, folder))
    assert [report["steps"] for report in found] == [[1]] * 4
    assert [report["listening"] for report in found] == [[]] * 4  # no socket of jaxstow's own
    return folder


def test_replicated_bytes_are_written_by_every_process_in_equal_shares(saved_by_four):
    record = json.loads((saved_by_four / "1" / "checkpoint.json").read_text())
    files = [record["files"]["state"], *record["parts"]["state"]]
    sizes = [(saved_by_four / "1" / name).stat().st_size for name in files]
    assert all(ARRAY // 2 < size < ARRAY // 2 + 16384 for size in sizes), sizes  # a quarter of each array, a header
    assert max(sizes) <= 1.1 * min(sizes), sizes


def test_each_process_gets_its_own_state_and_replicas_are_read_once_and_gathered(saved_by_four):
    # Chunks of 64 KiB per process: the gather runs in several rounds, each behind a barrier.
    found = reports(start(WORKER, "restore", 4, 1, saved_by_four, "--chunk-bytes", str(256 << 10)))
    for process, report in enumerate(found):
        assert "error" not in report, report
        assert report["loader"] == [{"process": process, "seen": list(range(process + 2))}]
        assert report["it"] == 10 * process + 1  # set on the live iterator
        assert report["listening"] == [], report  # the gather runs on jax's collectives, no socket of jaxstow's
    # Each box is read once among the processes that hold it: ``rows`` in halves, each held by two processes, and
    # ``rep`` by all four. Read by every process that holds it, it is 3x the model.
    model = 2 * ARRAY
    assert sum(report["bytes_read"] for report in found) <= 1.1 * model + 4 * HEADERS, found
    # A local disk: by default every process reads what it holds.
    assert sum(report["default_bytes_read"] for report in found) >= 2.9 * model, found


def test_another_process_count_gets_every_value_only_when_asking_for_all(saved_by_four):
    for report in reports(start(WORKER, "restore", 2, 2, saved_by_four)):
        assert "saved by 4 processes cannot go to each of 2" in report["error"], report
        assert "per_process='all'" in report["error"]
        assert report["loader"] == [{"process": k, "seen": list(range(k + 2))} for k in range(4)]
        assert report["it"] == [{"position": 10 * k + 1} for k in range(4)]


def test_one_process_restores_a_step_saved_by_four_bit_for_bit(saved_by_four):
    (report,) = reports(start(WORKER, "restore", 1, 2, saved_by_four))
    assert "each of 1" in report["error"] and len(report["loader"]) == 4


def test_peers_killed_or_stopped_during_the_broadcast_end_the_others_restore_within_the_timeout(saved_by_four):
    processes = start(WORKER, "restore", 4, 1, saved_by_four, "--die", "1", "--stop", "2", "--process-timeout", "4")
    began = time.monotonic()
    try:
        outputs = [process.communicate(timeout=120) for process in (processes[0], processes[3])]
    finally:
        for process in processes[1:3]:
            process.kill()
            process.wait()
    elapsed = time.monotonic() - began
    assert processes[1].returncode == -signal.SIGKILL
    for out, err in outputs:
        report = json.loads(out.strip().splitlines()[-1])
        assert "processes 1, 2 did not report its restore of step 1" in report.get("error", ""), (out, err[-3000:])
        assert report["seconds"] < 4 + 5 + 3, report  # the timeout, process 0's grace: never jax's own abort
    assert elapsed < 60


def test_a_peer_stopped_between_chunks_of_the_gather_ends_the_others_restore_within_the_timeout(saved_by_four):
    # Chunks of 64 KiB per process: process 2 stops after the first, the others wait at the barrier before the next.
    extra = ["--chunk-bytes", str(256 << 10), "--stop-after-gather", "2", "--process-timeout", "4"]
    processes = start(WORKER, "restore", 4, 1, saved_by_four, *extra)
    try:
        outputs = [process.communicate(timeout=120) for process in (processes[0], processes[1], processes[3])]
    finally:
        processes[2].kill()
        processes[2].wait()
    for out, err in outputs:
        assert out.strip().splitlines()[-1].startswith("{"), (out, err[-3000:])
        report = json.loads(out.strip().splitlines()[-1])
        assert "process 2 did not report its part of the gather of step 1" in report.get("error", ""), (
            out,
            err[-3000:],
        )
        assert report["seconds"] < 4 + 3, report


def test_without_collectives_across_processes_every_process_reads_and_none_waits(saved_by_four):
    found = reports(start(WORKER, "restore", 4, 1, saved_by_four, "--collectives", "none"))
    assert all("error" not in report for report in found), found
    assert sum(report["bytes_read"] for report in found) >= 2.9 * 2 * ARRAY, found  # broadcast_restore=True: off
