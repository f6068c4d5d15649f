"""A save of a ``jax.distributed`` run whose part fails in one process after every process agreed on its step (a
leaf it cannot hold): every process counts the step as saved alike, so that ``should_save`` answers alike after it
(``tests/distributed/failed_part_worker.py``, 2 real processes)."""

from __future__ import annotations

from pathlib import Path

from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "failed_part_worker.py"


def test_should_save_answers_alike_in_every_process_after_a_first_save_that_failed_in_one(tmp_path):
    folder = tmp_path / "run"
    found = reports(launch(WORKER, 2, lambda index, port: [str(index), str(port), str(folder)]))
    for report in found:
        assert report["picked"] == [1, 10], report  # not step 2, as the first of a run, in the process that failed
        assert report["errors"]["10"] is None and report["steps"] == [10] and report["restored"], report
    assert "has been deleted" in found[0]["errors"]["1"] and "has been deleted" in found[1]["errors"]["1"], found
