"""Crash safety and the writer's lock, with real processes killed by SIGKILL.

A training process saves a step after every update, in the background, and is killed: every third one the moment a
step's staging folder appears (a save in flight), the others at times spread over 0.3 s after their first step is
committed (several saves); then a reader checks the directory; then a new training process resumes from the latest
step, taking over the dead one's lock and removing its leftovers; and so on. The processes are forked from a
``multiprocessing`` fork server that has already imported JAX and jaxstow, so each one starts in a fraction of a
second, but each is a real process, killed by the kernel in the middle of whatever it was doing: writing an item,
fsyncing, renaming, deleting an old step.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.connection import Connection

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import CheckpointError

IN_A_SAVE = "in a save"
#: Where each trainer is killed: in a save, or that many seconds after its first step is committed.
MOMENTS = (IN_A_SAVE, 0.0, 0.1, IN_A_SAVE, 0.2, 0.3)


def _state(step: int) -> dict:
    """The training state after ``step`` updates: every value is a function of the step, so any restore can be checked."""
    return {
        "params": {"w": jnp.full((512, 512), float(step)), "b": jnp.arange(step % 7, dtype=jnp.int32)},
        "opt_state": (jnp.full(4096, -float(step)), {"count": step}),
        "rng": jax.random.key(step),
    }


def _check(restored: dict, step: int) -> None:
    expected = _state(step)
    assert restored["opt_state"][1] == {"count": step}
    for name in ("w", "b"):
        np.testing.assert_array_equal(restored["params"][name], expected["params"][name])
    np.testing.assert_array_equal(restored["opt_state"][0], expected["opt_state"][0])
    np.testing.assert_array_equal(jax.random.key_data(restored["rng"]), jax.random.key_data(expected["rng"]))


def _trainer(directory: str, ready: Connection) -> None:
    """Resume from the latest step and save every step from there on, until killed."""
    manager = CheckpointManager(directory, keep=KeepPolicy(keep_last=3, keep_every=50))
    latest = manager.latest_step()
    step = 0 if latest is None else latest + 1
    jax.block_until_ready(_state(step))  # compile before the clock starts
    ready.send(step)
    while True:
        manager.save(step, _state(step), metrics={"loss": 1.0 / (step + 1)})
        step += 1


def _holder(directory: str, ready: Connection) -> None:
    """Save once, then hold the directory's lock until killed."""
    manager = CheckpointManager(directory)
    manager.save(0, {"w": jnp.ones(3)})
    manager.wait()
    ready.send(os.getpid())
    time.sleep(600)


@pytest.fixture(scope="module")
def processes() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["jax", "jax.numpy", "jaxstow.checkpoint", __name__])
    return context


def _start(context, target, directory) -> tuple[multiprocessing.process.BaseProcess, object]:
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=target, args=(str(directory), sender), daemon=True)
    process.start()
    sender.close()
    assert receiver.poll(60), "the child process did not start"
    return process, receiver.recv()


def _kill(process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    assert process.exitcode == -signal.SIGKILL


def _staging(directory) -> set[str]:
    return {name for name in os.listdir(directory) if TEMPORARY_MARKER in name} if directory.exists() else set()


def _wait_until(done, trainer) -> None:
    deadline = time.monotonic() + 120
    while not done():
        assert trainer.is_alive(), "the trainer ended by itself"
        assert time.monotonic() < deadline, "the trainer made no progress in 120 s"
        time.sleep(0.001)


def _committed(directory, step: int) -> bool:
    return (directory / str(step)).is_dir()


def test_sigkill_at_moments_spread_over_a_run(tmp_path, processes):
    directory = tmp_path / "run"
    latest_seen = -1
    kills_with_leftovers = 0
    resumed_from = []
    for moment in MOMENTS:
        stale = _staging(directory)
        trainer, first_step = _start(processes, _trainer, directory)
        resumed_from.append(first_step)
        assert first_step == latest_seen + 1, f"resumed at {first_step}, latest committed {latest_seen}"
        if moment == IN_A_SAVE:
            _wait_until(lambda stale=stale: bool(_staging(directory) - stale), trainer)
        else:  # somewhere after a step of its own is committed
            _wait_until(lambda first=first_step: _committed(directory, first), trainer)
            time.sleep(moment)
        _kill(trainer)

        entries = os.listdir(directory)
        kills_with_leftovers += bool(_staging(directory) - stale)
        reader = CheckpointManager(directory)  # reading takes no lock
        steps = reader.steps()
        assert all(str(step) in entries for step in steps)
        assert not [step for step in steps if TEMPORARY_MARKER in str(step)]
        if not steps:
            continue  # killed before its first save committed
        assert steps[-1] >= latest_seen, f"committed step {latest_seen} was lost ({steps})"
        latest_seen = steps[-1]
        _check(reader.restore(), latest_seen)
        for step in steps[:-1]:
            _check(reader.restore(step), step)
        kept = [step for step in steps if step % 50 and step < latest_seen - 3]
        assert not kept, f"steps {kept} outlived the keep policy ({steps})"

    print(f"{len(MOMENTS)} kills, {kills_with_leftovers} in the middle of a save, resumed at {resumed_from}")
    assert latest_seen >= len(MOMENTS) - MOMENTS.count(IN_A_SAVE) - 1, f"committed steps were lost ({resumed_from})"
    assert kills_with_leftovers > 0, "no kill ever hit a save in flight"
    # The next writer removes every leftover of the killed ones.
    with CheckpointManager(directory, keep=KeepPolicy(keep_last=3, keep_every=50)) as manager:
        manager.save(latest_seen + 1, _state(latest_seen + 1))
    assert not [name for name in os.listdir(directory) if TEMPORARY_MARKER in name]


def test_second_writer_gets_a_clear_error_and_a_dead_writers_lock_is_taken_over(tmp_path, processes, caplog):
    holder, pid = _start(processes, _holder, tmp_path)
    try:
        reader = CheckpointManager(tmp_path)
        assert reader.steps() == [0]
        np.testing.assert_array_equal(reader.restore(as_numpy=True)["w"], np.ones(3))
        host = socket.gethostname()
        with pytest.raises(
            CheckpointError,
            match=rf"{tmp_path} is being written by another checkpoint manager \(process {pid} on host {host} since ",
        ):
            reader.save(1, {"w": jnp.zeros(3)})
    finally:
        _kill(holder)
    with caplog.at_level(logging.WARNING, logger="jaxstow"), CheckpointManager(tmp_path) as writer:
        writer.save(1, {"w": jnp.zeros(3)})
        assert writer.steps() == [0, 1]
    assert f"taking over the lock of process {pid} on host {host}" in caplog.text
    assert not os.path.exists(tmp_path / ".jaxstow.lock")  # released at close


def test_two_writers_in_one_process(tmp_path):
    with CheckpointManager(tmp_path) as first:
        first.save(0, {"w": jnp.ones(1)})
        second = CheckpointManager(tmp_path)
        with pytest.raises(CheckpointError, match=rf"process {os.getpid()} on host"):
            second.save(1, {"w": jnp.ones(1)})
        second.close()
        first.save(1, {"w": jnp.ones(1)})
    with CheckpointManager(tmp_path) as third:
        third.save(2, {"w": jnp.ones(1)})
        assert third.steps() == [0, 1, 2]
