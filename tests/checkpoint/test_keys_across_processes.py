"""Typed PRNG keys and single-device arrays under ``jax.distributed`` (``tests/distributed/global_keys_worker.py``,
2 real processes): keys replicated over the global mesh restore onto it; what no process can save whole is refused
in every process, with the fix, and at once rather than after the processes' timeout."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "global_keys_worker.py"


@pytest.fixture(scope="module", name="reports")
def reports_of_two(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("global-keys") / "run"
    return reports(launch(WORKER, 2, lambda index, port: [str(index), str(port), str(folder)]))


def test_keys_replicated_over_the_global_mesh_restore_onto_it(reports):
    # restore(like=keys) put the keys, read whole, with jax.device_put, which refuses keys for other processes' devices.
    for report in reports:
        assert report["errors"]["1"] is None, report["errors"]
        assert report["fitted"] and report["fitted_sharding"] and report["whole"], report


def test_keys_sharded_over_processes_are_refused_everywhere_with_the_fix(reports):
    for report in reports:
        error = report["errors"]["2"]
        assert error is not None and "leaf 'rng'" in error, error
        assert "jax.random.key_data(keys)" in error and "several processes" in error, error
        assert 2 not in report["steps"]


def test_an_array_on_another_processs_device_is_refused_everywhere_at_once(reports):
    for report in reports:
        error = report["errors"]["3"]
        assert error is not None and "a device of process 1, not of this one (0)" in error, error
        assert report["seconds"]["3"] < 20, report["seconds"]  # not the processes' timeout (30 s)
        assert 3 not in report["steps"]
    assert reports[1]["errors"]["3"].count("process 0 failed") == 1
