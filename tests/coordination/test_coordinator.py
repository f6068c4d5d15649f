"""The coordinator with real ``jax.distributed`` processes: messages, decisions, a maximum, bounded barriers, and the
keys of a finished conversation deleted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed_runs import launch

WORKER = Path(__file__).parents[1] / "distributed" / "coordinator_worker.py"


def run(action: str, count: int, *extra: str) -> list[dict]:
    processes = launch(WORKER, count, lambda index, port: [action, str(index), str(count), str(port), *extra])
    found = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        found.append(json.loads(out.strip().splitlines()[-1]))
    return found


def test_processes_gather_decide_agree_and_leave_no_keys_behind():
    reports = run("talk", 3)
    for report in reports:
        assert "error" not in report, report
        assert report["gathered"] == [{"process": 0}, {"process": 1}, {"process": 2}]
        assert report["decided"] == 7
        assert report["max"] == 20
        assert report["second"] == [0, 1, 2]
    assert reports[0]["left"] == []  # process 0 deleted the first conversation's keys once every process closed it
    assert reports[0]["left of the second"] == []  # and the second's, as a conversation of another scope closed


def test_a_silent_process_makes_the_others_raise_within_the_timeout_naming_it():
    reports = run("stall", 3, "2")
    for report in reports[:2]:
        assert "process 2 did not report its part of the restore within 3 s" in report["error"]
        assert report["seconds"] < 8
    assert "error" in reports[2]  # the late one finds the barrier broken too


def test_a_call_one_process_made_alone_does_not_pair_with_the_others_next_call():
    # Process 0's lone call times out naming process 1; the call every process makes next pairs up in each, rather
    # than process 1 reading what process 0 said in its lone call and process 0 waiting for process 1 in vain.
    reports = run("alone", 2)
    assert "process 1 did not report its request within 3 s" in reports[0]["alone"]
    for report in reports:
        assert "error" not in report, report
        assert report["gathered"] == [0, 1]


@pytest.mark.parametrize("count", [1, 2])
def test_a_decision_that_fails_reaches_every_process(count):
    reports = run("refuse", count)
    assert reports[0]["error"] == "ValueError: no step to restore"
    for report in reports[1:]:
        assert report["error"] == "CheckpointError: process 0 failed: ValueError: no step to restore"
    if count > 1:
        assert reports[0]["left"] == []  # the failed conversation was closed in every process, and its keys deleted


def test_a_step_not_found_by_process_0_is_a_step_not_found_error_in_every_process():
    # As in one process: the `except StepNotFoundError:` that starts a run afresh runs in every process, not in one.
    reports = run("refuse missing", 2)
    assert reports[0]["error"] == "StepNotFoundError: runs/test holds no committed step to restore"
    assert reports[1]["error"] == (
        "StepNotFoundError: process 0 failed: StepNotFoundError: runs/test holds no committed step to restore"
    )
