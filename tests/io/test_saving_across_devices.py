"""Chains run on several devices with ``jax.pmap`` and ``jax.shard_map`` (tests/conftest.py gives the CPU four):
each chain must come back with its own draws, in order, or the run must fail with an error that shows how to give
each device's chains states of their own.

Each chain of a small random walk draws from its own key and keeps every other step; the draws the strategies return
must be exactly those of the same walk stacked by ``lax.scan`` without saving.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

DEVICES = 4
STEPS = 12
SAMPLE = {"x": jnp.zeros(2)}
INFORMATION = scheduler.static_information(samples_collected=None)
KEYS = jax.random.split(jax.random.key(0), DEVICES)


def _walk(save, saving_state, key, x):
    """``STEPS`` steps of a random walk from ``x``, saving every other position (``save=None``: none)."""

    def step(carry, t):
        state, key, x = carry
        key, noise = jax.random.split(key)
        x = x + jax.random.normal(noise, (2,))
        if save is not None:
            state, _ = save(state, t % 2 == 0, {"x": x}, solver_state={"x": x})
        return (state, key, x), x

    (state, _, _), xs = jax.lax.scan(step, (saving_state, key, x), jnp.arange(STEPS))
    return state, xs


def _expected(keys) -> list[np.ndarray]:
    _, xs = jax.vmap(lambda key: _walk(None, None, key, jnp.zeros(2)))(keys)
    return [np.asarray(chain)[::2] for chain in xs]


@pytest.fixture(params=["memory", "hdf5"])
def collector(request, tmp_path):
    if request.param == "memory":
        return io.MemoryCollector(save_dir=tmp_path / "checkpoints")
    return io.HDF5Collector(tmp_path / "samples.h5")


@pytest.mark.parametrize("checkpoint_every", [0, 4])
def test_pmap_over_each_chains_state_gives_each_chain_its_own_draws(collector, checkpoint_every) -> None:
    init_save, save, postprocess_save = io.save(collector, checkpoint_every, block_size=2)
    keys = jax.random.split(jax.random.key(1), 2 * DEVICES)  # two chains on each device, under a vmap there
    states = jax.vmap(lambda _: init_save(SAMPLE, SAMPLE, INFORMATION))(jnp.arange(2 * DEVICES))
    on_devices = jax.tree.map(lambda leaf: leaf.reshape(DEVICES, 2, *leaf.shape[1:]), (states, keys))
    run = jax.pmap(jax.vmap(lambda state, key: _walk(save, state, key, jnp.zeros(2))[0]))
    final = jax.tree.map(lambda leaf: leaf.reshape(2 * DEVICES, *leaf.shape[2:]), run(*on_devices))
    results = postprocess_save(final)
    for result, draws in zip(results, _expected(keys), strict=True):
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), draws)


def test_shard_map_over_the_chains_gives_each_chain_its_own_draws(collector) -> None:
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    states = jax.vmap(lambda _: init_save(SAMPLE, None, INFORMATION))(jnp.arange(DEVICES))
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("chains",))
    run = jax.shard_map(
        jax.vmap(lambda state, key, x: _walk(save, state, key, x)[0]),
        mesh=mesh,
        in_specs=P("chains"),
        out_specs=P("chains"),
    )
    results = postprocess_save(jax.jit(run)(states, KEYS, jnp.zeros((DEVICES, 2))))
    for result, draws in zip(results, _expected(KEYS), strict=True):
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), draws)


def test_a_state_given_whole_to_each_device_of_a_pmap_is_refused(collector) -> None:
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    state = init_save(SAMPLE, None, INFORMATION)
    run = jax.pmap(lambda state, key: _walk(save, state, key, jnp.zeros(2))[0], in_axes=(None, 0), out_axes=None)
    final = run(state, KEYS)  # every device's walk, written as chain 0
    with pytest.raises(CollectorError, match=r"chain 0 went to several devices .*in_axes=0"):
        postprocess_save(final)


def test_a_state_given_whole_to_each_device_of_a_shard_map_is_refused(collector) -> None:
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    state = init_save(SAMPLE, None, INFORMATION)
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("chains",))
    run = jax.shard_map(
        lambda state, key, x: _walk(save, state, key[0], x[0])[0],
        mesh=mesh,
        in_specs=(P(), P("chains"), P("chains")),
        out_specs=P(),
        check_vma=False,
    )
    final = jax.jit(run)(state, KEYS, jnp.zeros((DEVICES, 2)))
    with pytest.raises(CollectorError, match=r"chain 0 went to several devices .*P\(axis\)"):
        postprocess_save(final)


def test_chains_replicated_along_a_mesh_axis_their_walk_does_not_split_give_their_draws(collector) -> None:
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    states = jax.vmap(lambda _: init_save(SAMPLE, None, INFORMATION))(jnp.arange(2))
    keys = KEYS[:2]
    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(2, 2), ("chains", "replicas"))
    run = jax.shard_map(  # each chain on two devices, which compute the same walk
        jax.vmap(lambda state, key, x: _walk(save, state, key, x)[0]),
        mesh=mesh,
        in_specs=P("chains"),
        out_specs=P("chains"),
    )
    results = postprocess_save(jax.jit(run)(states, keys, jnp.zeros((2, 2))))
    for result, draws in zip(results, _expected(keys), strict=True):
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), draws)


class _OneCallAtATime(io.DataCollector):
    """A collector of jax_sgmc's interface (``save(chain_id, values)``, a sample at a time) that takes a while in each
    call and notes every call that began while another was running."""

    def __init__(self) -> None:
        self.rows: dict[int, list[np.ndarray]] = {}
        self.running = 0
        self.overlapping: list[str] = []

    def register_data_loader(self, data_loader) -> None:
        pass

    def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None) -> int:
        self.rows[len(self.rows)] = []
        return len(self.rows) - 1

    def _call(self, what: str, action) -> None:
        self.running += 1
        try:
            if self.running > 1:
                self.overlapping.append(what)
            time.sleep(0.001)  # as a collector writing to storage does, letting the other threads run
            action()
        finally:
            self.running -= 1

    def save(self, chain_id, values) -> None:
        self._call(f"save of chain {chain_id}", lambda: self.rows[chain_id].append(np.array(values[0])))

    def checkpoint(self, chain_id, checkpoint) -> None:
        self._call(f"checkpoint of chain {chain_id}", lambda: None)

    def finalize(self, chain_id) -> None:
        pass

    def finished(self, chain_id):
        return {"x": np.stack(self.rows[chain_id])}

    def resume(self):
        return {}


class _CopyingBlocks(_OneCallAtATime):
    """The same, taking whole blocks that it copies at once: it gets them inside the run, on the devices' threads."""

    copies_blocks = True

    def save(self, chain_id, first, values) -> None:  # type: ignore[override]
        def store() -> None:
            rows = self.rows[chain_id]
            rows[first:] = list(np.array(values[0])) + rows[first + len(values[0]) :]

        self._call(f"save of chain {chain_id}", store)


@pytest.mark.parametrize(("kind", "checkpoint_every"), [(_OneCallAtATime, 2), (_CopyingBlocks, 0)])
def test_a_collector_is_called_one_call_at_a_time_while_the_devices_call_back_at_once(kind, checkpoint_every) -> None:
    collector = kind()
    init_save, save, postprocess_save = io.save(collector, checkpoint_every, block_size=1)
    keys = jax.random.split(jax.random.key(2), 2 * DEVICES)
    states = jax.vmap(lambda _: init_save(SAMPLE, SAMPLE, INFORMATION))(jnp.arange(2 * DEVICES))
    on_devices = jax.tree.map(lambda leaf: leaf.reshape(DEVICES, 2, *leaf.shape[1:]), (states, keys))
    run = jax.pmap(jax.vmap(lambda state, key: _walk(save, state, key, jnp.zeros(2))[0]))
    final = jax.tree.map(lambda leaf: leaf.reshape(2 * DEVICES, *leaf.shape[2:]), run(*on_devices))
    results = postprocess_save(final)
    assert collector.overlapping == []
    for result, draws in zip(results, _expected(keys), strict=True):
        np.testing.assert_array_equal(result["samples"]["x"], draws)
