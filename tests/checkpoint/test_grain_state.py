"""A real grain ``DataLoader`` iterator saved per process mid-epoch and restored in fresh processes: each process goes
on with exactly the batches it would have produced (``tests/distributed/grain_worker.py``; 2 ``jax.distributed``
processes on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_runs import launch, reports

pytest.importorskip("grain", reason="grain is not installed (the dev extra installs it)")
WORKER = Path(__file__).parents[1] / "distributed" / "grain_worker.py"


def _run(action: str, folder: Path) -> list[dict]:
    return reports(launch(WORKER, 2, lambda index, port: [action, str(index), "2", str(port), str(folder)]))


def test_each_process_goes_on_with_exactly_the_batches_its_loaders_would_have_given(tmp_path):
    saved = _run("save", tmp_path / "run")
    restored = _run("restore", tmp_path / "run")
    for before, after in zip(saved, restored, strict=True):
        assert after["live"] == {"train": True, "eval": True}  # set_state on the iterators in like=
        assert after["next"] == before["next"], before["process"]
    first, second = (report["next"]["train"] for report in saved)
    indices = [{i for batch in batches for i in batch["index"]} for batches in (first, second)]
    assert not indices[0] & indices[1]  # each process reads its own shard
    for report in saved:  # mid-epoch (the next batches are not the first ones) and crossing into the second epoch
        assert report["next"]["train"][: len(report["first"]["train"])] != report["first"]["train"]
        seen = [i for batch in report["first"]["train"] + report["next"]["train"] for i in batch["index"]]
        assert len(set(seen)) == 50 < len(seen), seen  # the shard's 50 records, some again in epoch 2
