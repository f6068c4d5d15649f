"""The host memory of in-jit saving: storage sized once, reused by the next run, released when nothing needs it.

A run streams 64 samples in blocks of 8 into a ``MemoryCollector``; the storage's address, seen through the arrays the
collector returns, tells whether it was allocated again. Every saved sample is checked against the scan's outputs.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.io import host_buffers

STEPS = 64


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _run(collector: io.MemoryCollector, samples_collected: int | None = STEPS) -> tuple[dict, int]:
    """Stream ``STEPS`` samples of a scan; the samples, checked against its outputs, and the storage's first address."""
    init_save, save, postprocess_save = io.save(collector, block_size=8)
    information = scheduler.static_information(samples_collected=samples_collected)
    state = init_save({"w": jnp.zeros(300)}, None, information)
    before = _address(collector.finished(0)["w"])

    def step(state, t):
        w = jnp.sin(jnp.arange(300.0) + t)
        return save(state, True, {"w": w})[0], w

    state, outputs = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(float(STEPS))))(state)
    samples = postprocess_save(state, None)["samples"]
    np.testing.assert_array_equal(samples["w"], np.asarray(outputs))
    return samples, before


@pytest.fixture(autouse=True)
def _empty_pool():
    host_buffers.release()
    yield
    host_buffers.release()


def test_the_storage_is_allocated_once_from_samples_collected_and_kept_across_blocks():
    collector = io.MemoryCollector()
    samples, before = _run(collector)
    assert _address(samples["w"]) == before  # eight blocks landed in the storage made at registration
    assert samples["w"].shape == (STEPS, 300)


def test_without_samples_collected_the_storage_grows_geometrically():
    collector = io.MemoryCollector()
    collector.register_chain({"w": np.zeros(3, np.float32)}, None, scheduler.static_information())
    addresses = set()
    for block in range(100):
        rows = np.full((10, 3), block, np.float32)
        collector.save(0, 10 * block, [rows])
        addresses.add(_address(collector.finished(0)["w"]))
    assert len(addresses) <= 8  # 10, 20, 40, ..., 1280 rows: doubling, not one allocation per block
    np.testing.assert_array_equal(collector.finished(0)["w"][:, 0], np.repeat(np.arange(100.0), 10))


def test_the_next_run_reuses_the_storage_of_a_run_whose_samples_are_gone():
    samples, _ = _run(io.MemoryCollector())
    first = _address(samples["w"])
    del samples  # the run's functions and collector are gone already: nothing else holds the storage
    assert host_buffers.idle_bytes() >= STEPS * 300 * 4
    samples, before = _run(io.MemoryCollector())
    assert before == first == _address(samples["w"])


def test_storage_whose_samples_are_held_is_never_reused():
    held, _ = _run(io.MemoryCollector())
    kept = held["w"].copy()
    samples, _ = _run(io.MemoryCollector())
    assert not np.shares_memory(held["w"], samples["w"])
    np.testing.assert_array_equal(held["w"], kept)  # the second run wrote nothing into the first run's samples


def test_a_finished_run_frees_its_collector_without_the_garbage_collector():
    gc.disable()
    try:
        collector = io.MemoryCollector()
        gone = weakref.ref(collector)
        samples, _ = _run(collector)
        del collector, samples
        assert gone() is None
    finally:
        gc.enable()


def _abandoned_run(collector: io.MemoryCollector, *, jitted: bool) -> None:
    """Stream ``STEPS`` samples into ``collector`` and raise, as a user's code may, before ``postprocess_save``."""
    init_save, save, _ = io.save(collector, block_size=8)
    state = init_save({"w": jnp.zeros(300)}, None, scheduler.static_information(samples_collected=STEPS))

    def step(state, t):
        return save(state, True, {"w": jnp.sin(jnp.arange(300.0) + t)})[0], None

    def run(state):
        return jax.lax.scan(step, state, jnp.arange(float(STEPS)))[0]

    jax.block_until_ready((jax.jit(run) if jitted else run)(state))
    raise KeyboardInterrupt


@pytest.mark.parametrize("jitted", [False, True], ids=["scan", "jit"])
def test_a_run_abandoned_before_postprocess_save_frees_its_collector_once_its_strategy_is_gone(jitted):
    """A run that raised before ``postprocess_save`` (an interrupted cell of a notebook, run again with a strategy
    made anew): its draws go with the strategy, though JAX keeps the traced program in its caches."""
    collector = io.MemoryCollector()
    gone = weakref.ref(collector)
    with pytest.raises(KeyboardInterrupt) as raised:
        _abandoned_run(collector, jitted=jitted)
    del collector, raised  # the traceback holds the run's frames
    gc.collect()
    assert gone() is None


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_release_frees_the_idle_memory():
    array = host_buffers.empty((16 << 20,), np.float32)
    array[:] = 1.0  # 64 MiB, resident
    del array
    assert host_buffers.idle_bytes() == 64 << 20
    resident = _resident_bytes()
    assert host_buffers.release() == 64 << 20
    assert host_buffers.idle_bytes() == 0
    assert resident - _resident_bytes() >= 48 << 20


def test_idle_memory_is_capped():
    arrays = [host_buffers.empty((host_buffers.IDLE_LIMIT // 3,), np.uint8) for _ in range(4)]
    del arrays
    assert host_buffers.idle_bytes() <= host_buffers.IDLE_LIMIT
    assert host_buffers.idle_bytes() >= host_buffers.IDLE_LIMIT // 3 * 3


def test_rows_that_never_arrived_are_refused_not_read_from_an_earlier_runs_storage():
    # Storage reused from an earlier run holds its samples: a collector driven by hand whose rows 10 to 49 never
    # arrived returned run 1's 7.0s there as this run's.
    information = scheduler.static_information(samples_collected=100)
    first = io.MemoryCollector()
    chain = first.register_chain(
        init_sample={"w": jnp.zeros(1000)}, init_checkpoint=None, static_information=information
    )
    first.save(chain, 0, [np.full((100, 1000), 7.0, np.float32)])
    first.finalize(chain)
    first.release(chain)
    gc.collect()
    second = io.MemoryCollector()
    chain = second.register_chain(
        init_sample={"w": jnp.zeros(1000)}, init_checkpoint=None, static_information=information
    )
    second.save(chain, 0, [np.full((10, 1000), 1.0, np.float32)])
    second.save(chain, 50, [np.full((10, 1000), 2.0, np.float32)])
    second.finalize(chain)
    with pytest.raises(io.CollectorError, match="samples 10 to 49 never reached the collector"):
        second.finished(chain)
