"""Unsharded arrays larger than those compared whole, which differ between the processes of a save: refused in every
process, naming the leaf, rather than process 0's saved silently; the same values commit, whether the arrays are
held on the host or taken down an accelerator's path (``tests/distributed/large_values_worker.py``, real
processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "large_values_worker.py"


@pytest.mark.parametrize("path", ["host", "accelerator"])
def test_large_unsharded_arrays_that_differ_commit_nothing(tmp_path, path):
    found = reports(launch(WORKER, 2, lambda index, port: [str(index), str(port), str(tmp_path / "run"), path]))
    for report in found:
        assert report["errors"]["1"] is None, report  # the same values: their prints agree on either path
        for step, leaf in (("2", "host"), ("3", "device")):
            error = report["errors"][step]
            assert error is not None and "not committed" in error, report
            assert (
                f"saved other values than process 0 for the items ['state'] (first at the leaf state/{leaf})" in error
            )
        assert report["steps"] == [1]
