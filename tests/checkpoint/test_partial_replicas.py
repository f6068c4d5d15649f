"""Shards replicated over some of a run's processes only (``tests/distributed/partial_replicas_worker.py``, four
real processes): copies that differ between their holders commit nothing, rather than a mix of their rows."""

from __future__ import annotations

from pathlib import Path

from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "partial_replicas_worker.py"


def test_copies_of_a_shard_that_differ_between_its_holders_commit_nothing(tmp_path):
    # Processes 1 and 3 hold one half of w, and each wrote two of its rows: the step held a mix of their copies.
    found = reports(launch(WORKER, 4, lambda index, port: [str(index), str(port), str(tmp_path / "run")]))
    for report in found:
        assert report["errors"]["1"] is None, report
        error = report["errors"]["2"]
        assert error is not None and "step 2 is not committed" in error, report
        assert "processes 1 and 3 hold other copies of the shards they share of the items ['params']" in error, error
        assert "first at the leaf params/w, a global array whose replicas differ between processes" in error, error
        assert report["steps"] == [1] and report["restored"], report
