"""Processes of one run that spell their checkpoint folder differently (``run`` from its parent, ``/abs/run/``) still
agree on it (``tests/distributed/spelling_worker.py``, 2 real processes): each waited for the other under a name of
its own spelling, and every save ran out its timeout."""

from __future__ import annotations

from pathlib import Path

from distributed_runs import launch, reports


def test_one_folder_spelled_two_ways_is_one_folder_to_the_processes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the workers start here: "run" is tmp_path / "run"
    spellings = ["run", f"{tmp_path / 'run'}/"]
    worker = Path(__file__).parents[1] / "distributed" / "spelling_worker.py"
    found = reports(launch(worker, 2, lambda index, port: [str(index), str(port), spellings[index]]), timeout=120)
    for report in found:
        assert report["errors"] == {"1": None, "2": None}, report
        assert report["steps"] == [1, 2], report
