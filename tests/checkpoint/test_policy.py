"""Keep policies, alone and combined, on real checkpoint directories; step names."""

from __future__ import annotations

import logging
import os

import jax.numpy as jnp
import pytest

from jaxstow import CheckpointManager
from jaxstow._steps.names import StepNames
from jaxstow.checkpoint import KeepPolicy


def _run(directory, steps, losses=None, **policy) -> list[int]:
    """Save ``steps`` in order (with their ``losses``) under ``policy``; returns the steps on disk afterwards."""
    with CheckpointManager(directory, keep=KeepPolicy(**policy)) as manager:
        for step in steps:
            metrics = None if losses is None else {"loss": losses[step]}
            manager.save(step, {"w": jnp.full(2, step)}, metrics=metrics)
        listed = manager.steps()
    on_disk = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    assert listed == on_disk
    return on_disk


def test_no_policy_keeps_everything(tmp_path):
    assert _run(tmp_path, range(6)) == [0, 1, 2, 3, 4, 5]


def test_keep_last(tmp_path):
    assert _run(tmp_path, range(10), keep_last=3) == [7, 8, 9]


def test_keep_last_counts_step_numbers_not_save_order(tmp_path):
    # Objax's sequence: a lower step saved late is dropped once two higher ones exist.
    assert _run(tmp_path, [1, 5, 3, 10, 7], keep_last=2) == [7, 10]


def test_a_step_the_keep_policy_deletes_as_soon_as_it_is_saved_is_told_with_what_to_do(tmp_path, caplog):
    """A run gone back to step 3 of 1..5: what it saves next is older than the steps kept, and deleted at once."""
    _run(tmp_path, range(1, 6), keep_last=2)
    with (
        caplog.at_level(logging.INFO, logger="jaxstow"),
        CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=2)) as manager,
    ):
        manager.save(3, {"w": jnp.full(2, 33)}, force=True)
        manager.wait()
        assert manager.steps() == [4, 5]
    told = [record for record in caplog.records if "step 3 was saved and at once deleted" in record.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.WARNING and "manager.delete(step)" in told[0].getMessage()
    assert "no rule of the keep policy (keep_last=2) keeps it beside the later steps [4, 5]" in told[0].getMessage()
    assert not any("deleted step 3 (keep policy)" in record.getMessage() for record in caplog.records)


def test_keep_every(tmp_path):
    # Every 4th step forever, plus the newest one until a newer one is committed.
    assert _run(tmp_path, range(1, 11), keep_every=4) == [4, 8, 10]


LOSSES = {0: 5.0, 1: 3.0, 2: 0.5, 3: 4.0, 4: 0.7, 5: 2.0, 6: 6.0, 7: 1.0, 8: 9.0, 9: 8.0}


def test_keep_best_min(tmp_path):
    # The two lowest losses, and the newest step (which is the worst one).
    assert _run(tmp_path, range(10), LOSSES, keep_best=2, metric="loss") == [2, 4, 9]


def test_keep_best_max(tmp_path):
    assert _run(tmp_path, range(9), LOSSES, keep_best=2, metric="loss", mode="max") == [6, 8]


def test_policies_combine(tmp_path):
    kept = _run(tmp_path, range(10), LOSSES, keep_last=2, keep_every=5, keep_best=1, metric="loss")
    assert kept == [0, 2, 5, 8, 9]


def test_newest_step_survives_until_a_newer_one_commits(tmp_path):
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_best=1, metric="loss")) as manager:
        manager.save(0, {"w": jnp.ones(1)}, metrics={"loss": 0.1})
        manager.save(1, {"w": jnp.ones(1)}, metrics={"loss": 0.9})
        assert manager.steps() == [0, 1]  # 1 is worse but newest
        manager.save(2, {"w": jnp.ones(1)}, metrics={"loss": 0.8})
        assert manager.steps() == [0, 2]  # 1 goes only once 2 is committed


def test_policy_applies_to_steps_of_earlier_runs(tmp_path):
    _run(tmp_path, range(5))
    assert _run(tmp_path, [5], keep_last=2) == [4, 5]


def test_many_saves_leave_exactly_keep_last(tmp_path):
    assert _run(tmp_path, range(100), keep_last=3) == [97, 98, 99]


def test_keep_policy_ranking_rules():
    policy = KeepPolicy(keep_best=2, metric="loss")
    # Missing and NaN values rank last; ties go to the newer step.
    assert policy.keep([1, 2, 3, 4, 5], {1: None, 2: float("nan"), 3: 0.5, 4: 0.5, 5: None}) == {3, 4, 5}
    assert policy.keep([1, 2, 3, 4], {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.9}) == {2, 3, 4}
    assert policy.to_delete([], {}) == []
    with pytest.raises(ValueError, match='mode must be "min" or "max"'):
        KeepPolicy(keep_last=1, mode="lowest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_every must be a positive integer"):
        KeepPolicy(keep_every=True)


def test_step_names():
    names = StepNames("%d")
    assert names.steps(["10", "9", "010", "x", "-1", "3.5", ".4.jaxstow-tmp-1-aa", "7"]) == [7, 9, 10]
    assert StepNames("ckpt-%05d.jxs").steps(["ckpt-00012.jxs", "ckpt-12.jxs", "ckpt-00012.npz"]) == [12]
    for bad in ("%s", "%d-%d", "no field", "%d%%"):
        with pytest.raises(ValueError, match="exactly one integer field"):
            StepNames(bad)


@pytest.mark.parametrize(("mode", "best"), [("max", float("inf")), ("min", float("-inf"))])
def test_an_infinite_metric_in_the_best_direction_is_kept_as_the_best(tmp_path, mode, best):
    """JSON has no infinity: an infinite metric is recorded apart, and read back as one, not as no value."""
    values = {1: 0.5, 2: best, 3: 0.7, 4: 0.6, 5: -best}
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_best=1, metric="acc", mode=mode)) as manager:
        for step, value in values.items():
            manager.save(step, {"w": jnp.full(2, step)}, metrics={"acc": value})
        assert manager.steps() == [2, 5] and manager.best_step() == 2
    with CheckpointManager(tmp_path) as reopened:
        assert reopened.metrics(2) == {"acc": best} and reopened.metrics(5) == {"acc": -best}
        assert reopened.best_step(metric="acc", mode=mode) == 2


def test_steps_deleted_by_another_policy_than_they_were_saved_under_are_warned_of(tmp_path, caplog):
    # A run restarted with keep_every and keep_best forgotten: its first save deleted the milestones and the best
    # step of the first run, logged at INFO only.
    losses = {step: 0.01 if step == 150 else 1.0 for step in range(50, 500, 50)}
    first = {"keep_last": 2, "keep_every": 100, "keep_best": 1, "metric": "loss"}
    with caplog.at_level(logging.WARNING, logger="jaxstow"):
        assert _run(tmp_path, range(50, 450, 50), losses, **first) == [100, 150, 200, 300, 350, 400]
        assert not caplog.records  # the same policy all along: nothing to warn of
        assert _run(tmp_path, [450], losses, keep_last=2) == [400, 450]
    [warned] = [record.getMessage() for record in caplog.records]
    assert "deleting steps [100, 150, 200, 300, 350], saved under another keep policy" in warned
    assert "(keep_last=2, keep_every=100, keep_best=1 by loss (min)) than this manager's (keep_last=2)" in warned
