"""A process of a ``jax.distributed`` run that misses one save (skips it, raises in it, or comes past the timeout):
that step is refused, and the next save every process makes of one step commits, as do the later ones, each whole
(``tests/distributed/skipped_save_worker.py``, 2 real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_runs import launch, reports

WORKER = Path(__file__).parents[1] / "distributed" / "skipped_save_worker.py"


def _run(folder: Path, case: str, mode: str) -> list[dict]:
    return reports(launch(WORKER, 2, lambda index, port: [str(index), str(port), str(folder), case, mode]))


@pytest.mark.parametrize(
    ("case", "mode", "refused", "other"),
    [
        ("skip", "wait", 0, None),
        ("skip", "background", 0, None),
        ("raise", "background", 1, "ArgumentError: metric 'loss' of step 2 must be a number"),
        ("slow", "wait", 1, "process 1 did not report the step it saves (step 2 here"),
    ],
    ids=["skipped-waited", "skipped-in-the-background", "raised-in-process-0", "slower-than-the-timeout"],
)
def test_the_next_save_of_one_step_in_every_process_commits_after_one_missed(tmp_path, case, mode, refused, other):
    folder = tmp_path / "run"
    found = _run(folder, case, mode)
    for report in found:
        assert report["errors"]["3"] is None and report["errors"]["4"] is None, report
        assert report["steps"] == [1, 3, 4], report
        assert report["restored"] == {"3": True, "4": True}, report
    # The process whose save of step 2 met the other's of step 3 is told so, naming both; the other, why it missed it.
    error = found[refused]["errors"]["2"]
    assert error.startswith("CheckpointError: step 2 is not saved: the processes' saves met with other steps"), error
    assert ", ".join(f"process {index}: step {3 - (index == refused)}" for index in range(2)) in error, error
    assert "the next save that every process makes of step 3 (or of a later step) commits" in error, error
    missed = found[1 - refused]["errors"]["2"]
    assert missed is None if other is None else other in missed, missed
    assert sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) == ["1", "3", "4"]
