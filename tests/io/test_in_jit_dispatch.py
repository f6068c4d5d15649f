"""A jit-compiled run that streams its samples is dispatched as one that keeps them: it returns before the run ends.

A program that holds a Python host callback of jax's runs synchronously on the CPU, and in most runs XLA's CPU runtime
hands much of every step of such a loop of many small operations between the threads of its pool (a NUTS run took 2 to
2.5 times as long); ``io.save``'s calls to the host are XLA calls of jaxstow's own, which leave the program as jax
dispatches any other. These tests fail with a host callback of jax's in the program (the call returns only once the
run is over). A call that fails fails the run, on every path, as a failing ``jax.pure_callback`` does, and XLA's call
frame is refused, before a buffer is read, where it is not the one ``send_block`` lowered.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow._util import jax_compat
from jaxstow.io import host_block
from jaxstow.io.host_block import send_block

STEPS = 400
INFORMATION = scheduler.static_information(samples_collected=STEPS)


#: The rounds of work of each step of the timed run: some milliseconds, whatever the machine. The run that compiles the
#: program first runs it with none.
WORK = 200


def _slow_step(x: jax.Array, work: jax.Array) -> jax.Array:
    return jax.lax.fori_loop(0, work, lambda _, y: jnp.sin(y) @ jnp.cos(y).T / 64.0, x)


def _run(save, checkpoint: bool):
    def body(carry, t):
        state, x, work = carry
        x = _slow_step(x, work)
        solver = {"x": x} if checkpoint else None
        state, _ = save(state, True, {"s": jnp.sum(x), "t": t}, solver_state=solver)
        return (state, x, work), None

    return jax.jit(lambda state, x, work: jax.lax.scan(body, (state, x, work), jnp.arange(STEPS))[0][:2])


@pytest.mark.skipif(not jax_compat.OWN_FFI_CALLS, reason="jax's host callbacks on this jax")
@pytest.mark.parametrize("checkpoint", [False, True], ids=["blocks", "blocks and checkpoints"])
def test_a_run_that_saves_returns_before_it_ends_and_keeps_every_sample(tmp_path, checkpoint) -> None:
    collector = io.HDF5Collector(tmp_path / "samples.h5") if checkpoint else io.MemoryCollector()
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=50 if checkpoint else 0, block_size=32)
    x = jnp.eye(64)
    sample = {"s": jnp.float32(0), "t": jnp.int32(0)}
    run = _run(save, checkpoint)
    first = run(init_save(sample, {"x": x} if checkpoint else None, INFORMATION), x, jnp.int32(0))  # compiles
    postprocess_save(first[0], None)
    state = init_save(sample, {"x": x} if checkpoint else None, INFORMATION)
    started = time.perf_counter()
    state, last = run(state, x, jnp.int32(WORK))
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


@pytest.mark.parametrize("side_effect", [False, True], ids=["blocks", "checkpoints"])
def test_a_host_function_that_raises_fails_the_run_and_the_next_run_works(side_effect) -> None:
    def receive(numbers: np.ndarray, *leaves: np.ndarray) -> np.ndarray:
        if leaves[0].sum() < 0:
            raise ValueError(f"no room for the block of chain {numbers[0]}")
        return numbers[0] + len(leaves)

    run = jax.jit(lambda x: send_block(receive, jnp.arange(3)[None], [x], side_effect=side_effect))
    with pytest.raises(RuntimeError, match=r"ValueError: no room for the block of chain \[0 1 2\]") as raised:
        run(-jnp.ones(2)).block_until_ready()
    assert "receive" in str(raised.value)  # the traceback names the function
    assert run(jnp.ones(2)).tolist() == [1, 2, 3]  # the same program, and the process, still work
    with pytest.raises(RuntimeError, match="no room"):
        run(-jnp.ones(2)).block_until_ready()


def test_a_compiled_run_whose_saving_strategy_is_gone_fails_instead_of_answering_zeros() -> None:
    class Strategy:
        def receive(self, numbers: np.ndarray, *leaves: np.ndarray) -> np.ndarray:
            return numbers[0] + 1

    strategy = Strategy()
    method, held = weakref.WeakMethod(strategy.receive), weakref.ref(strategy)

    def send(x: jax.Array) -> jax.Array:
        return send_block(lambda *arrays: method()(*arrays), jnp.ones((1, 2), jnp.int32), [x], owner=held())

    run = jax.jit(send).lower(jnp.ones(2)).compile()  # the program alone, without the function it was made from
    assert run(jnp.ones(2)).tolist() == [2, 2]
    del strategy
    gc.collect()
    # jax raises a failure of a program called as a Compiled object as a ValueError from jax 0.10 on
    with pytest.raises((RuntimeError, ValueError), match=r"is gone|'NoneType' object is not callable"):
        run(jnp.ones(2)).block_until_ready()


@pytest.mark.skipif(not jax_compat.OWN_FFI_CALLS, reason="jax's host callbacks carry no call of jaxstow's")
@pytest.mark.parametrize(
    ("operands", "attribute", "expected"),
    [
        ((jnp.arange(3), jnp.ones(5)), "issued", r"args 1 is a buffer of XLA type 11 and rank 1 \(dims \(5,\)\)"),
        ((jnp.arange(3), jnp.ones(2, jnp.int32)), "issued", "args 1 is a buffer of XLA type 4"),
        ((jnp.arange(3),), "issued", "the call has 1 args, not 2"),
        ((jnp.arange(3), jnp.ones(2)), "unknown", r"call 1099511627776\) is gone"),
        ((jnp.arange(3), jnp.ones(2)), "int32", "not uint64"),
    ],
    ids=["a longer buffer", "another dtype", "an operand fewer", "an unknown call", "an attribute of another type"],
)
def test_a_call_frame_other_than_the_one_lowered_fails_the_run_before_any_buffer_is_read(
    operands, attribute, expected
) -> None:
    """A program that calls jaxstow's FFI target with other operands or attributes than ``send_block`` lowered."""
    received = []

    def receive(numbers: np.ndarray, *leaves: np.ndarray) -> np.ndarray:
        received.append(numbers.copy())
        return np.int32(0)

    assert int(jax.jit(lambda x: send_block(receive, jnp.arange(3), [x]))(jnp.ones(2))) == 0
    issued = max(host_block._calls)  # that program's call: (3,) int32 and (2,) float32
    call = {"issued": np.uint64(issued), "unknown": np.uint64(2**40), "int32": np.int32(issued)}[attribute]
    target = jax.ffi.ffi_call("jaxstow_send_block", jax.ShapeDtypeStruct((), jnp.int32))
    with pytest.raises(RuntimeError, match=f"unexpected call frame: .*{expected}"):
        jax.jit(lambda *operands: target(*operands, call=call))(*operands).block_until_ready()
    assert len(received) == 1


def test_a_host_function_answering_another_shape_fails_the_run() -> None:
    run = jax.jit(lambda x: send_block(lambda numbers, *leaves: numbers, jnp.arange(3)[None], [x]))
    with pytest.raises(RuntimeError, match=r"shape.*\(3,\)"):
        run(jnp.ones(2)).block_until_ready()
