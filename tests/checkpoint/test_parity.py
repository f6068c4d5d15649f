"""The manager's answers to orbax's ``CheckpointManager`` habits, checked against orbax itself where orbax has them:
steps of any integer kind, ``should_save`` with ``save_every``, ``latest_step``, ``best_step``, a keep rule by time, and
the preemption sync point of a real two-process ``jax.distributed`` run stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import forked
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.cli import main
from jaxstow.errors import CheckpointError

ocp = pytest.importorskip("orbax.checkpoint")
PREEMPTED = Path(__file__).parents[1] / "distributed" / "preempted.py"


def test_steps_may_be_python_numpy_or_jax_integers(tmp_path):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    optimizer.step[...] += 7
    with CheckpointManager(tmp_path) as manager:
        manager.save(optimizer.step[...], {"params": nnx.state(model)})  # a 0-d uint32 jax array
        manager.save(np.int64(8), {"params": nnx.state(model)})
        manager.save(jnp.asarray(9), {"params": nnx.state(model)})
        for bad in (9.0, jnp.asarray(10.0), True, -1, np.arange(2), "11"):
            with pytest.raises(TypeError, match="a step must be a non-negative integer"):
                manager.save(bad, {"params": nnx.state(model)})
        assert manager.steps() == [7, 8, 9] and manager.latest_step() == 9
        assert manager.restore(jnp.asarray(7, jnp.int8))["params"]["kernel"][...].shape == (2, 3)


def _orbax_saves(directory: Path, steps: range, interval: int) -> list[int]:
    options = ocp.CheckpointManagerOptions(save_interval_steps=interval)
    with warnings.catch_warnings(), ocp.CheckpointManager(directory, options=options) as manager:
        warnings.simplefilter("ignore")
        for step in steps:
            if manager.should_save(step):
                manager.save(step, args=ocp.args.StandardSave({"w": np.full(2, step)}))
        manager.wait_until_finished()
        return list(manager.all_steps())


@pytest.mark.parametrize(("steps", "interval"), [(range(0, 35), 10), (range(3, 40), 7), (range(1, 6), 1)])
def test_should_save_decides_as_orbax_does(tmp_path, steps, interval):
    with CheckpointManager(tmp_path / "jaxstow", save_every=interval) as manager:
        for step in steps:
            if manager.should_save(step):
                manager.save(step, {"w": np.full(2, step)})
        assert not manager.should_save(manager.latest_step())  # never the newest step again
        ours = manager.steps()
    assert ours == _orbax_saves(tmp_path / "orbax", steps, interval)
    with CheckpointManager(tmp_path / "jaxstow", save_every=interval) as reopened:  # the newest step, found on disk
        assert not reopened.should_save(ours[-1]) and reopened.should_save(ours[-1] + interval)


def test_latest_and_best_step_agree_with_orbax(tmp_path):
    losses = {1: 0.5, 2: 0.2, 3: 0.4, 4: 0.2, 5: 0.9}
    options = ocp.CheckpointManagerOptions(best_fn=lambda metrics: metrics["loss"], best_mode="min")
    with warnings.catch_warnings(), ocp.CheckpointManager(tmp_path / "orbax", options=options) as theirs:
        warnings.simplefilter("ignore")
        with CheckpointManager(tmp_path / "jaxstow", keep=KeepPolicy(metric="loss")) as ours:
            for step, loss in losses.items():
                theirs.save(step, args=ocp.args.StandardSave({"w": np.ones(2)}), metrics={"loss": loss})
                ours.save(step, {"w": np.ones(2)}, metrics={"loss": loss})
            theirs.wait_until_finished()
            assert (ours.latest_step(), ours.best_step()) == (theirs.latest_step(), theirs.best_step()) == (5, 4)
            assert ours.best_step(mode="max") == 5
            with pytest.raises(ValueError, match="best_step needs a metric"):
                CheckpointManager(tmp_path / "other").best_step()
            assert ours.best_step("accuracy") is None


def test_a_folder_of_orbax_steps_is_refused_with_the_command_that_converts_it(tmp_path):
    run = tmp_path / "run"
    with warnings.catch_warnings(), ocp.CheckpointManager(run) as theirs:
        warnings.simplefilter("ignore")
        for step in (1, 2):
            theirs.save(step, args=ocp.args.StandardSave({"w": np.full(2, float(step))}))
        theirs.wait_until_finished()
    with pytest.raises(CheckpointError, match=r"orbax CheckpointManager \(\[1, 2\]\).*start again from scratch"):
        CheckpointManager(run)  # whose latest_step() would be None: a resumed run would start over among orbax's
    assert main(["convert", str(run), str(tmp_path / "converted")]) == 0
    converted = CheckpointManager(tmp_path / "converted")
    assert converted.latest_step() == 2
    np.testing.assert_array_equal(converted.restore()["w"], [2.0, 2.0])


def test_keep_every_seconds_keeps_one_step_per_interval_of_save_time(tmp_path, capsys):
    # Pairs of steps saved back to back, the pairs 1 s apart or more (a sleep lasts at least as long as asked): the
    # first step of each pair is kept, the second is not, however slow the machine, as long as one save of two
    # floats takes less than the 1 s interval.
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=1, keep_every_seconds=1.0)) as manager:
        for first in (1, 3, 5):
            if first > 1:
                time.sleep(1.0)
            for step in (first, first + 1):
                manager.save(step, {"w": np.full(2, step)})
                manager.wait()
        assert manager.steps() == [1, 3, 5, 6]  # one step per interval, and the newest
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "every 1 s" in out and "keep_every_seconds=1" in out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_line(process: subprocess.Popen[str], deadline: float) -> str:
    assert process.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            return process.stdout.readline().strip()
    raise AssertionError("the process did not report in time")


def test_a_preemption_notice_makes_every_process_save_the_same_step(tmp_path):
    port, folder = _free_port(), tmp_path / "run"
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    processes = [
        forked.Popen(
            [sys.executable, str(PREEMPTED), str(index), str(port), str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for index in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        # Each process prints "ready" once ten steps went by without a save after step 1.
        assert [_wait_for_line(process, deadline) for process in processes] == ["ready", "ready"]
        processes[1].send_signal(signal.SIGTERM)  # the scheduler's preemption notice, to one process
        outcomes = []
        for process in processes:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err[-3000:]
            outcomes.append(json.loads(out.strip().splitlines()[-1])["saved"])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == 1 and outcomes[0][1] > 10
    assert CheckpointManager(folder).steps() == outcomes[0]
