"""A jit-compiled run that streams its samples is dispatched as one that keeps them: it returns before the run ends.

A program that holds a Python host callback of jax's runs synchronously on the CPU, and in most runs XLA's CPU runtime
hands much of every step of such a loop of many small operations between the threads of its pool (a NUTS run took 2 to
2.5 times as long); ``io.save``'s calls to the host are XLA calls of jaxstow's own, which leave the program as jax
dispatches any other. These tests fail with a host callback of jax's in the program (the call returns only once the
run is over).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow._util import jax_compat
from jaxstow.io.host_block import send_block

STEPS = 400
INFORMATION = scheduler.static_information(samples_collected=STEPS)


def _slow_step(x: jax.Array) -> jax.Array:
    """Some milliseconds of work, whatever the machine."""
    return jax.lax.fori_loop(0, 200, lambda _, y: jnp.sin(y) @ jnp.cos(y).T / 64.0, x)


def _run(save, checkpoint: bool):
    def body(carry, t):
        state, x = carry
        x = _slow_step(x)
        solver = {"x": x} if checkpoint else None
        state, _ = save(state, True, {"s": jnp.sum(x), "t": t}, solver_state=solver)
        return (state, x), None

    return jax.jit(lambda state, x: jax.lax.scan(body, (state, x), jnp.arange(STEPS))[0])


@pytest.mark.skipif(not jax_compat.OWN_FFI_CALLS, reason="before jax 0.6.1 the calls are jax's host callbacks")
@pytest.mark.parametrize("checkpoint", [False, True], ids=["blocks", "blocks and checkpoints"])
def test_a_run_that_saves_returns_before_it_ends_and_keeps_every_sample(tmp_path, checkpoint) -> None:
    collector = io.HDF5Collector(tmp_path / "samples.h5") if checkpoint else io.MemoryCollector()
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=50 if checkpoint else 0, block_size=32)
    x = jnp.eye(64)
    sample = {"s": jnp.float32(0), "t": jnp.int32(0)}
    run = _run(save, checkpoint)
    first = run(init_save(sample, {"x": x} if checkpoint else None, INFORMATION), x)  # compiles
    postprocess_save(first[0], None)
    state = init_save(sample, {"x": x} if checkpoint else None, INFORMATION)
    started = time.perf_counter()
    state, last = run(state, x)
    returned = time.perf_counter() - started
    running = not last.is_ready()
    kept = postprocess_save(state, None)["samples"]
    took = time.perf_counter() - started
    assert running, f"the call returned after {returned:.3f} s, with the run of {took:.3f} s over"
    np.testing.assert_array_equal(np.asarray(kept["t"][:]), np.arange(STEPS))


def test_send_block_outside_jit_and_inside_answer_alike() -> None:
    received = []

    def receive(numbers: np.ndarray, *leaves: np.ndarray) -> np.ndarray:
        received.append((numbers.tolist(), [leaf.tolist() for leaf in leaves]))
        return numbers[0]

    def send(x: jax.Array) -> jax.Array:
        return send_block(receive, jnp.stack([jnp.arange(3), jnp.arange(3) * 2]), [x, x > 1])

    x = jnp.arange(6.0).reshape(3, 2)
    assert send(x).tolist() == jax.jit(send)(x).tolist() == [0, 1, 2]
    assert received[0] == received[1] == ([[0, 1, 2], [0, 2, 4]], [x.tolist(), (x > 1).tolist()])


def test_send_block_hands_over_every_dtype_a_sample_may_hold_and_empty_leaves() -> None:
    received = []

    def receive(numbers: np.ndarray, *leaves: np.ndarray) -> np.ndarray:
        received.append([(leaf.dtype, leaf.shape, leaf.tolist()) for leaf in leaves])
        return numbers[0]

    leaves = [
        jnp.arange(4, dtype=jnp.bfloat16).reshape(2, 2),
        jnp.array([True, False]),
        jnp.arange(3, dtype=jnp.int8),
        jnp.zeros((0, 3), jnp.float32),
        jnp.array([1 + 2j], jnp.complex64),
    ]
    answer = jax.jit(lambda *leaves: send_block(receive, jnp.zeros((1, 2), jnp.int32) + 7, list(leaves)))(*leaves)
    assert answer.tolist() == [7, 7]
    assert received == [[(leaf.dtype, leaf.shape, np.asarray(leaf).tolist()) for leaf in leaves]]


CHECKPOINT_RUNNING_JAX = """
import os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU: XLA's pool has one thread, busy with the run
import jax, jax.numpy as jnp
from jaxstow import io, scheduler

class Jitting(io.MemoryCollector):
    def checkpoint_chains(self, checkpoints):  # runs inside the run's call to the host
        for checkpoint in checkpoints.values():
            total = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T)(jnp.ones((64, 64)) * checkpoint.step).sum()
            keys = jax.random.key_data(checkpoint.solver_state["key"])
            print(checkpoint.step, bool(jnp.isfinite(total)), keys.shape, flush=True)

init_save, save, postprocess_save = io.save(Jitting(), checkpoint_every=5, block_size=4)
state = init_save({"x": jnp.zeros(2)}, {"key": jax.random.key(0)}, scheduler.static_information(samples_collected=20))

def body(carry, t):
    state, key = carry
    key, sub = jax.random.split(key)
    state, _ = save(state, True, {"x": jax.random.normal(sub, (2,))}, solver_state={"key": key})
    return (state, key), None

run = jax.jit(lambda state: jax.lax.scan(body, (state, jax.random.key(1)), jnp.arange(20))[0][0])
print("kept", int(postprocess_save(run(state), None)["sample_count"]))
"""


def test_a_collector_that_runs_jax_inside_the_run_does_not_deadlock_it_on_one_cpu() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", CHECKPOINT_RUNNING_JAX], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [f"{step} True (2,)" for step in (5, 10, 15, 20)]
    assert done.stdout.splitlines() == [*lines, "kept 20"]
