"""The keep policy: which steps each rule keeps, that a step is kept if any rule keeps it, that the newest is always
kept, and that rules a policy cannot follow are refused when it is made."""

from __future__ import annotations

import datetime
import math
import random

import pytest

from jaxstow._steps.keep import KeepPolicy
from jaxstow.errors import ArgumentError

STEPS = [0, 5, 10, 15, 20, 25, 30]


def test_no_rule_keeps_every_step():
    assert KeepPolicy().to_delete(STEPS, {}) == []
    assert KeepPolicy().reasons(STEPS, {}) == {step: ["no keep rule"] for step in STEPS}


def test_each_rule_alone():
    assert sorted(KeepPolicy(keep_last=2).keep(STEPS, {})) == [25, 30]
    assert sorted(KeepPolicy(keep_every=10).keep(STEPS, {})) == [0, 10, 20, 30]
    losses = {0: 0.9, 5: 0.1, 10: 0.5, 15: 0.1, 20: 0.7, 25: 0.3, 30: 0.8}
    assert sorted(KeepPolicy(keep_best=2, metric="loss").keep(STEPS, losses)) == [5, 15, 30]
    assert sorted(KeepPolicy(keep_best=1, metric="loss").keep(STEPS, losses)) == [15, 30]  # of equals, the newer
    assert sorted(KeepPolicy(keep_best=1, metric="acc", mode="max").keep(STEPS, losses)) == [0, 30]
    times = {step: step * 100.0 for step in STEPS}  # one save every 500 s
    assert sorted(KeepPolicy(keep_every_seconds=1000).keep(STEPS, {}, times)) == [0, 10, 20, 30]


def test_the_newest_step_is_kept_even_when_no_rule_keeps_it():
    reasons = KeepPolicy(keep_every=10).reasons([10, 15, 21], {})
    assert reasons == {10: ["every 10"], 15: [], 21: ["newest"]}


def test_steps_without_a_usable_metric_rank_last():
    metrics = {1: None, 2: math.nan, 3: 0.5, 4: None}
    assert sorted(KeepPolicy(keep_best=1, metric="loss").keep([1, 2, 3, 4], metrics)) == [3, 4]
    assert KeepPolicy(keep_best=1, metric="loss").best(metrics) == 3
    assert KeepPolicy(keep_best=1, metric="loss").best({1: None, 2: math.nan}) is None


def test_reasons_name_every_rule_that_keeps_a_step():
    policy = KeepPolicy(keep_last=1, keep_every=10, keep_best=1, metric="loss", keep_every_seconds=3600)
    reasons = policy.reasons([10, 15, 20], {10: 0.1, 15: 0.5, 20: 0.9}, {10: 0.0, 15: 60.0, 20: 3600.0})
    assert reasons == {
        10: ["every 10", "every 3600 s", "best 1 by loss"],
        15: [],
        20: ["last 1", "every 10", "every 3600 s"],
    }


def test_a_step_without_a_time_is_kept_by_no_time_rule():
    policy = KeepPolicy(keep_every_seconds=10)
    assert policy.reasons([1, 2, 3], {}, {2: 0.0, 3: 5.0}) == {1: [], 2: ["every 10 s"], 3: ["newest"]}


def test_a_clock_set_back_starts_the_intervals_again():
    # Steps 1-3 saved on a clock years ahead, then the clock corrected: the hourly steps after it are kept.
    ahead = 1.9e9
    times = {1: ahead, 2: ahead + 7200, 3: ahead + 14400, **{step: 1.7e9 + (step - 4) * 7200 for step in range(4, 10)}}
    policy = KeepPolicy(keep_last=2, keep_every_seconds=3600)
    assert policy.to_delete(list(range(1, 10)), {}, times) == []
    times = {1: 100, 2: 130, 3: 90, 4: 120, 5: 125}
    assert KeepPolicy(keep_every_seconds=60).to_delete([1, 2, 3, 4, 5], {}, times) == [2, 4]


def test_any_rule_keeps_and_to_delete_is_the_rest_oldest_first():
    rng = random.Random(0)
    for _ in range(200):
        steps = sorted(rng.sample(range(1000), rng.randint(1, 30)))
        metrics = {step: rng.choice([None, math.nan, rng.random()]) for step in steps}
        times = {step: step * rng.uniform(0.5, 2.0) for step in steps if rng.random() < 0.9}
        policy = KeepPolicy(
            keep_last=rng.choice([None, 1, 3]),
            keep_every=rng.choice([None, 7, 50]),
            keep_best=rng.choice([None, 2]),
            metric="loss",
            mode=rng.choice(["min", "max"]),
            keep_every_seconds=rng.choice([None, 100.0]),
        )
        kept, deleted = policy.keep(steps, metrics, times), policy.to_delete(steps, metrics, times)
        assert kept | set(deleted) == set(steps) and not kept & set(deleted)
        assert deleted == sorted(deleted) and steps[-1] in kept
        if policy.keep_last is not None:
            assert set(steps[-policy.keep_last :]) <= kept
        if policy.keep_every is not None:
            assert {step for step in steps if step % policy.keep_every == 0} <= kept


def test_a_timedelta_is_stored_as_seconds():
    assert KeepPolicy(keep_every_seconds=datetime.timedelta(hours=1)).interval == 3600.0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"keep_last": 0}, "keep_last must be a positive integer or None, not 0"),
        ({"keep_every": True}, "keep_every must be a positive integer or None, not True"),
        ({"keep_best": 2.0, "metric": "loss"}, "keep_best must be a positive integer or None, not 2.0"),
        ({"keep_best": 1}, "keep_best ranks steps by a metric: name it with metric="),
        ({"mode": "avg"}, 'mode must be "min" or "max", not \'avg\''),
        ({"keep_every_seconds": -1}, "keep_every_seconds must be a positive number of seconds"),
        ({"keep_every_seconds": math.inf}, "keep_every_seconds must be a positive number of seconds"),
        ({"keep_every_seconds": "1h"}, "keep_every_seconds must be a positive number of seconds"),
        # A step's record holds its policy: one of no time, or back in time, made every step unreadable after a restart
        (
            {"keep_every_seconds": datetime.timedelta(0)},
            "a positive datetime.timedelta or None, not datetime.timedelta",
        ),
        ({"keep_every_seconds": datetime.timedelta(seconds=-60)}, "a positive datetime.timedelta or None, not"),
    ],
)
def test_rules_that_cannot_be_followed_are_refused(arguments, message):
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(")):
        KeepPolicy(**arguments)


def test_numpy_integers_are_counts_and_stored_as_python_ones(tmp_path):
    import json

    import numpy as np

    from jaxstow import CheckpointManager, LocalTier

    policy = KeepPolicy(keep_last=np.int64(2), keep_every=np.int32(10), keep_every_seconds=np.float32(5))
    assert (type(policy.keep_last), type(policy.keep_every), type(policy.keep_every_seconds)) == (int, int, float)
    tier = LocalTier(tmp_path / "local", save_every=np.int64(2), keep_last=np.uint8(1), replicas=np.int64(0))
    assert (tier.save_every, tier.keep_last, tier.replicas) == (2, 1, 0)
    with CheckpointManager(tmp_path / "run", keep=policy, save_every=np.int64(5)) as manager:
        manager.save(0, {"w": np.zeros(2)})
    assert json.loads((tmp_path / "run" / "0" / "checkpoint.json").read_text())["keep_policy"]["keep_last"] == 2
