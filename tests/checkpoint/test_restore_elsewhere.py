"""A step restored by more processes than saved it, onto layouts that hold it on some processes' devices only: the
processes beyond them get the array (holding no shard of it), not a foreign error."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "elsewhere_worker.py"


def _run(action: str, count: int, folder: Path) -> list[dict]:
    return reports(launch(WORKER, count, lambda index, port: [action, str(index), str(count), str(port), str(folder)]))


@pytest.mark.skipif(
    jax.__version_info__ < (0, 5), reason="jax before 0.5 makes no array of which a process holds no shard"
)
def test_processes_that_hold_none_of_a_restored_array_get_it_all_the_same(tmp_path):
    _run("save", 2, tmp_path / "run")
    held = _run("restore", 4, tmp_path / "run")
    assert held[:2] == [{"saved": 2, "replicated": 2, "split": 2}] * 2  # values checked shard by shard
    assert held[2:] == [{"saved": 0, "replicated": 0, "split": 0}] * 2
