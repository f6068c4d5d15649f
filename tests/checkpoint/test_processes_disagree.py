"""Processes of one ``jax.distributed`` run that ask for different things: each is refused in every process, naming
what differs, rather than given process 0's silently (``tests/distributed/disagree_worker.py``, real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "disagree_worker.py"
LOCAL_MESH_WORKER = Path(__file__).parents[1] / "distributed" / "local_mesh_worker.py"


@pytest.fixture(scope="module", name="reports")
def reports_of_two(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("disagree") / "run"
    return reports(launch(WORKER, 2, lambda index, port: [str(index), str(port), str(folder)]))


def test_the_same_values_commit_and_restore(reports):
    for report in reports:
        assert report["errors"]["1"] is None and report["errors"]["2"] is None, report["errors"]
        assert report["steps"] == [1, 2]
    assert [report["restored"]["mine"] for report in reports] == [{"p": 0}, {"p": 1}]


@pytest.mark.parametrize(
    ("step", "named"),
    [
        ("3", "other values than process 0 for the items ['state'] (first at the leaf state/host)"),
        ("4", "other values than process 0 for the items ['state'] (first at the leaf state/k)"),
        ("5", "process 1 saved other metrics than process 0"),
        ("6", "process 1 saved other metadata than process 0"),
    ],
    ids=["small-array", "python-value", "metrics", "metadata"],
)
def test_other_unsharded_values_commit_nothing_in_any_process(reports, step, named):
    for report in reports:
        error = report["errors"][step]
        assert error is not None and "not committed" in error, report["errors"]
        assert named in error and "jaxstow.per_process(...)" in error, error
        assert int(step) not in report["steps"]


@pytest.mark.parametrize(("step", "leaf"), [("7", "small"), ("8", "large")])
def test_replicas_that_differ_between_processes_commit_nothing_rather_than_a_mix(reports, step, leaf):
    # Each holder writes a share of a replicated array's rows: copies that differ were saved as a mix of them.
    for report in reports:
        error = report["errors"][step]
        assert error is not None and "not committed" in error, report["errors"]
        assert f"first at the leaf state/{leaf}, a global array whose replicas differ between processes" in error, error
        assert "broadcast_one_to_all" in error and "process 0's is the one saved" not in error, error
        assert int(step) not in report["steps"]


def test_processes_that_ask_for_different_steps_or_items_all_fail(reports):
    for report in reports:
        error = report["different_steps"]
        assert error is not None, report
        assert "process 0 asked restore(step=2, fallback=False)" in error, error
        assert "process 1 asked restore(step=1, fallback=False)" in error, error
    for report in reports:
        error = report["different_items"]
        assert error is not None, report
        assert "process 0 asked restore(step=1, fallback=False, items=['state'])" in error, error
        assert "process 1 asked restore(step=1, fallback=False)" in error, error
    for report in reports:  # the same step everywhere still restores, the values saved once for all
        assert report["restored"]["step"] == 1 and report["restored"]["host"] == [0.0] * 4


def test_processes_restoring_a_leaf_onto_other_shardings_are_refused_everywhere(reports):
    # Each side held its own layout of one global array: the next collective on it hung, then failed in gloo.
    for report in reports:
        for broadcast in ("None", "True"):
            error = report[f"other_shardings_{broadcast}"]
            assert error is not None and "onto other shardings, than process 0" in error, (broadcast, report)


def test_processes_whose_managers_keep_other_steps_commit_nothing(reports):
    # Process 0's keep policy deletes the steps of all: one that differs elsewhere would be ignored there, silently.
    for report in reports:
        error = report["other_keep"]
        assert error is not None and "not committed" in error, report
        assert "process 1 keeps other steps than process 0" in error, error
        assert "same keep=KeepPolicy(...) in every process" in error and "per_process" not in error, error
        assert report["kept_steps"] == []


def test_arrays_on_each_processs_own_devices_are_its_values_saved_once_and_compared(tmp_path):
    # Each process wrote such an array whole, as if shards of one: every box twice, and a restore handed one process
    # the other's values. Now they are saved as the processes' unsharded values are: once, compared where small.
    for report in reports(
        launch(LOCAL_MESH_WORKER, 2, lambda index, port: [str(index), str(port), str(tmp_path / "run")])
    ):
        assert report["errors"]["1"] is None, report
        assert "process 1 saved other values than process 0" in report["errors"]["2"], report
        assert report["steps"] == [1]
        assert report["restored"] == report["fitted"] == {"large": True, "small": True}, report
