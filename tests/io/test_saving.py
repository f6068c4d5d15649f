"""Saving samples from inside jit: every strategy and collector against the scan's own outputs.

A 15-step scan emits its sample at every step as a stacked output and also hands it to ``save`` with a keep flag
drawn from a Bernoulli distribution; whatever the strategy, the saved samples must be exactly the outputs at the
kept steps, for one chain and for several under ``vmap`` with a keep list per chain.
"""

from __future__ import annotations

import functools
import random
import subprocess
import sys
import textwrap
import threading
from collections import namedtuple
from typing import Any

import equinox as eqx
import forked
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError, CollectorError, NotAFolderError
from jaxstow.io import hdf5_read_back, receiving
from jaxstow.io.live import run_finished

STEPS = 15
Stats = namedtuple("Stats", ["step", "energy"])


def _sample(x: jax.Array, t: jax.Array) -> dict[str, Any]:
    return {"x": x, "stats": Stats(step=t, energy=jnp.sum(x**2))}


INIT_SAMPLE = _sample(jnp.zeros(3), jnp.int32(0))


def _scan(save, saving_state, x0, keep):
    """15 steps of a small deterministic chain; returns the saving state and every step's sample."""

    def step(carry, keep_t):
        saving_state, x, t = carry
        x = 0.7 * x + jnp.sin(t + jnp.arange(3.0))
        sample = _sample(x, t)
        saving_state, _ = save(saving_state, keep_t, sample)
        return (saving_state, x, t + 1), sample

    (saving_state, _, _), outputs = jax.lax.scan(step, (saving_state, x0, jnp.int32(0)), keep)
    return saving_state, outputs


def _keep_list(seed: int, shape: tuple[int, ...]) -> jax.Array:
    keep = jax.random.bernoulli(jax.random.key(seed), 0.5, shape)
    assert int(keep.sum(axis=-1).min()) > 0 and int(keep.sum(axis=-1).max()) < STEPS  # a real mix at every chain
    return keep


def test_a_state_of_another_kind_of_strategy_is_refused_naming_both() -> None:
    information = scheduler.static_information(samples_collected=2)
    init_device, save_device, postprocess_device = io.no_save()
    init_host, save_host, postprocess_host = io.save(io.MemoryCollector())
    on_device, on_host = init_device({"x": 0.0}, None, information), init_host({"x": 0.0}, None, information)
    for save, state, expected in [(save_device, on_host, "SavingState"), (save_host, on_device, "DeviceSamples")]:
        with pytest.raises(ArgumentError, match=rf"init_save returned .*got a {expected}: a state of another strategy"):
            save(state, True, {"x": 1.0})
    with pytest.raises(ArgumentError, match=r"no_save's postprocess_save needs .*got a SavingState"):
        postprocess_device(on_host, None)
    with pytest.raises(ArgumentError, match=r"postprocess_save needs .*got a DeviceSamples"):
        postprocess_host(on_device, None)


def _as_numpy(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: np.asarray(leaf[:]), tree)


def _assert_trees_equal(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


class Strategy:
    """A saving strategy under test, with what it needs to read its samples back."""

    def __init__(self, kind: str, tmp_path: Any, block_size: int | None = 4) -> None:
        self.kind = kind
        self.file = None
        if kind == "no_save":
            self.collector = None
            self.triple = io.no_save()
            return
        if kind == "memory":
            self.collector = io.MemoryCollector(save_dir=tmp_path / "npz")
        else:
            self.file = h5py.File(tmp_path / "samples.h5", "w")
            self.collector = io.HDF5Collector(self.file)
        self.triple = io.save(self.collector, block_size=block_size)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@pytest.fixture(params=["no_save", "memory", "hdf5"])
def strategy(request, tmp_path):
    made = Strategy(request.param, tmp_path)
    yield made
    made.close()


def test_one_chain_saves_exactly_the_kept_outputs(strategy) -> None:
    init_save, save, postprocess_save = strategy.triple
    keep = _keep_list(0, (STEPS,))
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=int(keep.sum())))
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
    result = postprocess_save(state, None)

    want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
    assert int(result["sample_count"]) == int(keep.sum())
    _assert_trees_equal(_as_numpy(result["samples"]), want)
    if strategy.kind == "hdf5":  # the layout of the reference: /chain~{id}/<dict keys>, plus sample_count
        assert set(strategy.file["/chain~0"]) == {"x", "stats"}
        assert set(strategy.file["/chain~0/stats"]) == {"step", "energy"}
        np.testing.assert_array_equal(strategy.file["/chain~0/stats/energy"][:], want["stats"].energy)
        assert strategy.file["/chain~0"].attrs["sample_count"] == int(keep.sum())
    if strategy.kind == "memory":  # with save_dir: chain_0.npz, keys joined by "/"
        with np.load(strategy.collector._save_dir + "/chain_0.npz") as npz:
            np.testing.assert_array_equal(npz["stats/step"], want["stats"].step)
            np.testing.assert_array_equal(npz["x"], want["x"])


@pytest.mark.parametrize("integer", [int, np.int64, jnp.int32], ids=["python", "numpy", "jax"])
def test_samples_collected_may_be_a_python_numpy_or_jax_integer(strategy, integer) -> None:
    init_save, save, postprocess_save = strategy.triple
    keep = _keep_list(0, (STEPS,))
    count = jnp.sum(keep) if integer is jnp.int32 else integer(int(keep.sum()))  # jnp.sum: as jax_sgmc's tests write it
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=count))
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
    result = postprocess_save(state, None)
    assert int(result["sample_count"]) == int(keep.sum())
    want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
    _assert_trees_equal(_as_numpy(result["samples"]), want)


@pytest.mark.parametrize(
    ("count", "error", "message"),
    [
        (2.0, TypeError, "must be an integer"),
        (jnp.float32(2), TypeError, "must be an integer"),
        (jnp.array([1, 2]), TypeError, "must be an integer"),
        (True, TypeError, "not a bool"),
        (-1, ValueError, "at least 0"),
    ],
)
def test_samples_collected_that_is_no_count_is_refused(count, error, message) -> None:
    with pytest.raises(error, match=message):
        scheduler.static_information(samples_collected=count)


@pytest.mark.parametrize(
    ("strategy", "chains"),
    [("no_save", (3,)), ("memory", (3,)), ("hdf5", (3,)), ("memory", (2, 2))],
    ids=["no_save-vmap", "memory-vmap", "hdf5-vmap", "memory-vmap-of-vmap"],
    indirect=["strategy"],
)
def test_chains_under_vmap_each_save_their_own_kept_outputs(strategy, chains) -> None:
    init_save, save, postprocess_save = strategy.triple
    count = int(np.prod(chains))
    keep = _keep_list(1, (count, STEPS))
    information = scheduler.static_information(samples_collected=STEPS)
    states = [init_save(INIT_SAMPLE, None, information) for _ in range(count)]
    states = jax.tree.map(lambda *leaves: jnp.stack(leaves).reshape(*chains, *leaves[0].shape), *states)
    x0 = jnp.arange(count * 3.0).reshape(*chains, 3)

    run = functools.partial(_scan, save)
    for _ in chains:
        run = jax.vmap(run)
    states, outputs = jax.jit(run)(states, x0, keep.reshape(*chains, STEPS))
    results = postprocess_save(states, None)

    assert len(results) == count
    flat_outputs = jax.tree.map(lambda leaf: np.asarray(leaf).reshape(count, *leaf.shape[len(chains) :]), outputs)
    for chain, result in enumerate(results):
        mask = np.asarray(keep[chain])
        assert int(result["sample_count"]) == mask.sum()
        _assert_trees_equal(
            _as_numpy(result["samples"]), jax.tree.map(lambda leaf, c=chain, m=mask: leaf[c][m], flat_outputs)
        )


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_unknown_sample_count_grows_storage(kind, tmp_path) -> None:
    strategy = Strategy(kind, tmp_path, block_size=2)
    init_save, save, postprocess_save = strategy.triple
    keep = _keep_list(2, (STEPS,))
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=None))
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.ones(3), keep)
    result = postprocess_save(state, None)
    want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
    _assert_trees_equal(_as_numpy(result["samples"]), want)
    if kind == "hdf5":
        assert strategy.file["/chain~0/x"].shape == (int(keep.sum()), 3)
        assert strategy.file["/chain~0/x"].maxshape == (None, 3)
    strategy.close()


def test_hdf5_compression(tmp_path) -> None:
    with h5py.File(tmp_path / "compressed.h5", "w") as file:
        init_save, save, postprocess_save = io.save(io.HDF5Collector(file, compression="gzip"), block_size=4)
        keep = _keep_list(4, (STEPS,))
        state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=None))
        state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.ones(3), keep)
        result = postprocess_save(state, None)
        assert file["/chain~0/x"].compression == "gzip"
        want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
        _assert_trees_equal(_as_numpy(result["samples"]), want)


@pytest.mark.parametrize(("compression", "named"), [("gzipp", "'gzipp'"), (99, "99"), (12, "12")])
def test_an_hdf5_compression_h5py_cannot_use_is_refused_before_the_file_is_made(compression, named, tmp_path) -> None:
    with pytest.raises(ArgumentError, match=rf"HDF5Collector's compression={named} cannot be used .*give 'gzip'"):
        io.HDF5Collector(tmp_path / "samples.h5", compression=compression)
    assert list(tmp_path.iterdir()) == []
    assert io.HDF5Collector(tmp_path / "samples.h5", compression=4).close() is None  # a gzip level is one


def test_fewer_samples_than_declared_leave_no_padding(strategy) -> None:
    init_save, save, postprocess_save = strategy.triple
    keep = jnp.arange(STEPS) % 4 == 0
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=50))
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
    result = postprocess_save(state, None)
    assert int(result["sample_count"]) == 4
    np.testing.assert_array_equal(_as_numpy(result["samples"])["x"], np.asarray(outputs["x"])[::4])
    if strategy.kind == "hdf5":
        assert strategy.file["/chain~0/x"].shape == (4, 3)


def test_more_samples_than_declared_is_a_clear_error_after_the_run(strategy) -> None:
    init_save, save, postprocess_save = strategy.triple
    keep = jnp.arange(STEPS) < 5
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=3))
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
    with pytest.raises(io.SampleCountError, match=r"chain 0 kept 5 samples, but .* samples_collected=3") as raised:
        postprocess_save(state, None)
    assert raised.value.overflows == [(0, 5, 3)]
    if strategy.kind == "hdf5":  # nothing dropped: every kept sample is in the file
        np.testing.assert_array_equal(strategy.file["/chain~0/x"][:], np.asarray(outputs["x"])[:5])
    if strategy.kind == "memory":
        np.testing.assert_array_equal(strategy.collector.finished(0)["x"], np.asarray(outputs["x"])[:5])


def test_default_block_size_and_a_block_per_sample(tmp_path) -> None:
    keep = _keep_list(3, (STEPS,))
    want = None
    for block_size in (None, 1):
        init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=block_size)
        state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
        state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
        want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
        _assert_trees_equal(_as_numpy(postprocess_save(state, None)["samples"]), want)


def test_without_jit_blocks_reach_the_collector_all_the_same(strategy) -> None:
    init_save, save, postprocess_save = strategy.triple
    keep = _keep_list(4, (STEPS,))
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
    with jax.disable_jit():
        state, outputs = _scan(save, state, jnp.zeros(3), keep)
        result = postprocess_save(state, None)
    want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
    _assert_trees_equal(_as_numpy(result["samples"]), want)


class _CountingCollector(io.MemoryCollector):
    """A memory collector that records every block handed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[tuple[int, int, int]] = []

    def save(self, chain_id: int, first: int, values: Any) -> None:
        self.blocks.append((chain_id, first, len(values[0])))
        super().save(chain_id, first, values)


def test_chains_sharded_over_devices_deliver_each_block_once() -> None:
    collector = _CountingCollector()
    init_save, save, postprocess_save = io.save(collector, block_size=4)
    states = [init_save({"x": jnp.zeros(3)}, None, scheduler.static_information(samples_collected=16)) for _ in "ab"]
    state = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("chains",))  # axes of the Auto type in every jax
    state = jax.device_put(state, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("chains")))

    def step(state, i):
        sample = {"x": jnp.full((2, 3), i, jnp.float32) + 100 * state.chain_id[:, None]}
        return jax.vmap(lambda s, x: save(s, True, x)[0])(state, sample), None

    results = postprocess_save(jax.jit(lambda s: jax.lax.scan(step, s, jnp.arange(16))[0])(state), None)
    assert sorted(collector.blocks) == [(chain, first, 4) for chain in (0, 1) for first in (0, 4, 8, 12)]
    for chain, result in enumerate(results):
        np.testing.assert_array_equal(result["samples"]["x"][:, 0], np.arange(16) + 100 * chain)


def test_the_chains_of_a_vmap_reach_a_collector_that_stores_them_together_in_one_call(tmp_path) -> None:
    """Every block a callback carries goes to ``save_chains`` at once: one write (and one flush) for all chains."""

    calls: list[list[int]] = []

    class Together(io.MemoryCollector):
        def save_chains(self, blocks):
            calls.append(sorted(blocks))
            super().save_chains(blocks)

    collector = Together()
    init_save, save, postprocess_save = io.save(collector, block_size=4)
    information = scheduler.static_information(samples_collected=STEPS)
    state = jax.vmap(lambda _: init_save(INIT_SAMPLE, None, information))(jnp.arange(3))
    keep = jnp.ones((3, STEPS), bool)
    run = jax.jit(jax.vmap(functools.partial(_scan, save), in_axes=(0, None, 0)))
    state, outputs = run(state, jnp.zeros(3), keep)
    results = postprocess_save(state, None)
    assert calls == [[0, 1, 2]] * (STEPS // 4)  # three full blocks; the rest at postprocess_save
    for chain, result in enumerate(results):
        _assert_trees_equal(result["samples"], jax.tree.map(lambda leaf, chain=chain: np.asarray(leaf[chain]), outputs))


def test_the_chains_of_a_vmap_are_finalized_and_handed_back_together(tmp_path, monkeypatch) -> None:
    """``postprocess_save`` finalizes the chains of a run in one ``finalize_chains`` call and reads their samples in
    one ``finished_chains`` call; an ``HDF5Collector``'s file, closed once every chain is final, is opened once for
    all of them, and each chain gets its own samples back."""
    calls: list[tuple[str, list[int]]] = []
    opened: list[str] = []

    class Together(io.HDF5Collector):
        def finalize_chains(self, chain_ids):
            calls.append(("finalize", list(chain_ids)))
            super().finalize_chains(chain_ids)

        def finished_chains(self, chain_ids):
            calls.append(("finished", list(chain_ids)))
            return super().finished_chains(chain_ids)

    collector = Together(str(tmp_path / "together.h5"))
    reopen = hdf5_read_back.open_for_reading
    monkeypatch.setattr(
        hdf5_read_back, "open_for_reading", lambda path, *only: (opened.append(str(path)), reopen(path, *only))[1]
    )
    init_save, save, postprocess_save = io.save(collector, block_size=4)
    information = scheduler.static_information(samples_collected=STEPS)
    state = jax.vmap(lambda _: init_save(INIT_SAMPLE, None, information))(jnp.arange(3))
    run = jax.jit(jax.vmap(functools.partial(_scan, save), in_axes=(0, None, 0)))
    state, outputs = run(state, jnp.zeros(3), jnp.ones((3, STEPS), bool))
    results = postprocess_save(state, None)
    assert calls == [("finalize", [0, 1, 2]), ("finished", [0, 1, 2])]
    assert opened == [str(tmp_path / "together.h5")]
    for chain, result in enumerate(results):
        _assert_trees_equal(result["samples"], jax.tree.map(lambda leaf, chain=chain: np.asarray(leaf[chain]), outputs))


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_checkpointed_prng_keys_resume_as_keys_and_a_collector_that_checkpoints_itself_gets_jax_keys(
    kind, tmp_path, monkeypatch
):
    """The built-in collectors take a checkpoint's keys as their data (no call into jax inside the run) and give
    them back as the same typed keys; a subclass overriding ``checkpoint_chains`` still gets jax keys."""
    given: list[Any] = []
    made: list[str] = []  # the keys made by a call into jax inside the run, per collector
    make_key = receiving._key
    monkeypatch.setattr(receiving, "_key", lambda data, impl: (made.append(name), make_key(data, impl))[1])
    base = io.MemoryCollector if kind == "memory" else io.HDF5Collector

    class Logged(base):  # type: ignore[misc, valid-type]
        def checkpoint_chains(self, checkpoints):
            given.extend(checkpoint.solver_state["key"] for checkpoint in checkpoints.values())
            super().checkpoint_chains(checkpoints)

    def collector(cls, name):
        return cls(save_dir=tmp_path / name) if kind == "memory" else cls(str(tmp_path / f"{name}.h5"))

    def step(save, carry, t):
        saving_state, solver = carry
        key, noise = jax.random.split(solver["key"])
        sample = _sample(jax.random.normal(noise, (3,)), t)
        return (save(saving_state, True, sample, solver_state={"key": key})[0], {"key": key}), solver["key"]

    for cls, name in ((base, "plain"), (Logged, "logged")):
        first = collector(cls, name)
        init_save, save, _ = io.save(first, checkpoint_every=5)
        solver = {"key": jax.random.key(3)}
        state = init_save(INIT_SAMPLE, solver, scheduler.static_information(samples_collected=STEPS))
        run = jax.jit(lambda carry, save=save: jax.lax.scan(functools.partial(step, save), carry, jnp.arange(7)))
        (state, _), keys = run((state, solver))
        jax.block_until_ready(state)  # no postprocess_save: the run stops after its checkpoint at step 5
        if kind == "hdf5":
            first.close()  # as a process that ends without finishing its run: the checkpoint stays
        resumed = collector(base, name)
        io.save(resumed, checkpoint_every=5)[0](INIT_SAMPLE, solver, scheduler.static_information())
        key = resumed.resume()[0].solver_state["key"]
        assert jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(keys[5]))
    assert made == ["logged"]
    assert len(given) == 1 and jnp.issubdtype(given[0].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(given[0]), jax.random.key_data(keys[5]))


def test_a_subclass_overriding_the_calls_for_one_chain_sees_every_chain(tmp_path) -> None:
    """A subclass of a built-in collector that overrides ``save``, ``checkpoint``, ``finalize`` or ``finished`` gets a
    call for each chain, though the built-in collector takes the chains of a run together."""
    seen: dict[str, set[int]] = {"save": set(), "checkpoint": set(), "finalize": set(), "finished": set()}

    class Logged(io.HDF5Collector):
        def save(self, chain_id, first, values):
            seen["save"].add(chain_id)
            super().save(chain_id, first, values)

        def checkpoint(self, chain_id, checkpoint):
            seen["checkpoint"].add(chain_id)
            super().checkpoint(chain_id, checkpoint)

        def finalize(self, chain_id):
            seen["finalize"].add(chain_id)
            super().finalize(chain_id)

        def finished(self, chain_id):
            seen["finished"].add(chain_id)
            return super().finished(chain_id)

    init_save, save, postprocess_save = io.save(Logged(str(tmp_path / "logged.h5")), block_size=4, checkpoint_every=5)
    information = scheduler.static_information(samples_collected=STEPS)
    state = jax.vmap(lambda _: init_save(INIT_SAMPLE, jnp.zeros(3), information))(jnp.arange(3))

    def step(saving_state, t):
        sample = _sample(jnp.full(3, t, jnp.float32), t)
        return save(saving_state, True, sample, solver_state=sample["x"])[0], sample

    run = jax.jit(jax.vmap(lambda s: jax.lax.scan(step, s, jnp.arange(STEPS))))
    state, outputs = run(state)
    results = postprocess_save(state, None)
    assert seen == {name: {0, 1, 2} for name in seen}
    for chain, result in enumerate(results):
        _assert_trees_equal(result["samples"], jax.tree.map(lambda leaf, chain=chain: np.asarray(leaf[chain]), outputs))


def test_chains_declaring_different_counts_still_stack() -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector())
    sample = {"w": jnp.zeros(1000)}  # 4 KB: the declared counts below would give blocks of 128 and 2 rows
    counts = (1024, 20)
    states = [init_save(sample, None, scheduler.static_information(samples_collected=n)) for n in counts]
    state = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)

    def step(state, i):
        return jax.vmap(lambda s: save(s, i < 20, {"w": jnp.full(1000, i, jnp.float32)})[0])(state), None

    results = postprocess_save(jax.jit(lambda s: jax.lax.scan(step, s, jnp.arange(20))[0])(state), None)
    for result in results:
        np.testing.assert_array_equal(result["samples"]["w"][:, 0], np.arange(20))


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_collectors_place_blocks_that_arrive_in_any_order_or_twice(kind, tmp_path) -> None:
    file = h5py.File(tmp_path / "blocks.h5", "w") if kind == "hdf5" else None
    collector = io.HDF5Collector(file) if file is not None else io.MemoryCollector()
    sample = {"w": np.zeros((2, 2), np.float32), "n": np.int64(0)}
    chain = collector.register_chain(sample, None, scheduler.static_information(samples_collected=64))
    rows = {"w": np.arange(288.0, dtype=np.float32).reshape(72, 2, 2), "n": np.arange(72, dtype=np.int64)}
    # HDF5 chunks of 8 rows here (an eighth of 64): blocks that start and end inside chunks, cover whole ones, and
    # outgrow the 64 declared
    blocks = [(0, 3), (3, 19), (19, 20), (20, 72), (3, 19), (19, 20)]  # two of them delivered twice
    random.Random(0).shuffle(blocks)
    for first, end in blocks:
        collector.save(chain, first, [rows["n"][first:end], rows["w"][first:end]])
    collector.finalize(chain)
    _assert_trees_equal(_as_numpy(collector.finished(chain)), rows)
    if file is not None:
        assert file["/chain~0/w"].chunks == (8, 2, 2)
        file.close()


def test_an_equinox_module_as_the_sample(tmp_path) -> None:
    model = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    with h5py.File(tmp_path / "models.h5", "w") as file:
        init_save, save, postprocess_save = io.save(io.HDF5Collector(file), block_size=2)
        state = init_save(model, None, scheduler.static_information(samples_collected=5))

        def step(state, scale):
            return save(state, True, jax.tree.map(lambda leaf: leaf * scale, model))

        state, _ = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(5.0)))(state)
        samples = postprocess_save(state, None)["samples"]
        assert isinstance(samples, eqx.nn.Linear)
        assert set(file["/chain~0"]) == {"weight", "bias"}
        np.testing.assert_array_equal(file["/chain~0/bias"][3], 3 * np.asarray(model.bias))


class Gated(io.MemoryCollector):
    """A memory collector that stores nothing until the test opens its gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def save(self, chain_id, first, values):
        self.gate.wait()
        super().save(chain_id, first, values)


@pytest.mark.timeout(60)
def test_the_run_goes_on_while_the_collector_is_busy() -> None:
    collector = Gated()
    init_save, save, postprocess_save = io.save(collector, block_size=4)
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
    keep = jnp.ones(STEPS, bool)
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
    finished = threading.Thread(target=jax.block_until_ready, args=(state,))
    finished.start()
    finished.join(timeout=30)
    assert not finished.is_alive(), "the run waited for a collector that stored nothing yet"
    collector.gate.set()
    samples = postprocess_save(state, None)["samples"]
    _assert_trees_equal(samples, _as_numpy(outputs))


@pytest.mark.parametrize("chains", [None, 2])
def test_a_full_block_goes_at_the_next_call_without_that_calls_sample(chains) -> None:
    # A block is sent at the call after the one that filled it (decided by that one), without the sample of the call
    # that sends it, which starts the next block (kept or not): the rows stay exactly the kept samples. A chain whose
    # block is sent a few rows short (another chain's is full) starts the next one there, in a ring of two blocks:
    # a block that wraps around its end reaches the collector in two pieces.
    blocks = []

    class Logged(io.MemoryCollector):
        def save_chains(self, chains):
            blocks.extend(
                (chain_id, first, len(jax.tree.leaves(values)[0])) for chain_id, (first, values) in chains.items()
            )
            super().save_chains(chains)

    init_save, save, postprocess_save = io.save(Logged(), block_size=4)
    information = scheduler.static_information(samples_collected=STEPS)
    keep = np.ones(STEPS, bool)
    keep[[3, 9, 10]] = False  # the 4th and 10th calls keep nothing
    run = jax.jit(functools.partial(_scan, save))
    if chains is None:
        keeps = [keep]
        state, outputs = run(init_save(INIT_SAMPLE, None, information), jnp.zeros(3), jnp.asarray(keep))
        outputs = [outputs]
        sent = {0: [(0, 0, 4), (0, 4, 4)]}  # (chain, first row, rows), sent by the run at calls 6 and 10
    else:
        keeps = [keep, np.ones(STEPS, bool)]
        states = jax.vmap(lambda _: init_save(INIT_SAMPLE, None, information))(jnp.arange(chains))
        state, outputs = jax.vmap(run)(states, jnp.zeros((chains, 3)), jnp.asarray(np.stack(keeps)))
        outputs = [jax.tree.map(lambda leaf, i=i: leaf[i], outputs) for i in range(chains)]
        # Every chain's block goes when one chain's is full: at calls 5, 9 and 13 (chain 1's). Chain 0's third
        # block lies in ring rows 7 and 0.
        sent = {0: [(0, 0, 3), (0, 3, 4), (0, 7, 1), (0, 8, 1)], 1: [(1, 0, 4), (1, 4, 4), (1, 8, 4)]}
    results = postprocess_save(
        state, None
    )  # the run's blocks all delivered, in order, when it returns; it sends the rest
    assert {chain: [block for block in blocks if block[0] == chain] for chain in sent} == sent
    for result, chain_outputs, chain_keep in zip([results] if chains is None else results, outputs, keeps, strict=True):
        assert int(result["sample_count"]) == int(chain_keep.sum())
        _assert_trees_equal(
            result["samples"], jax.tree.map(lambda leaf, kept=chain_keep: np.asarray(leaf)[kept], chain_outputs)
        )


def test_blocks_queued_when_a_program_ends_still_reach_the_collector(tmp_path) -> None:
    log = tmp_path / "blocks.txt"
    program = textwrap.dedent(
        f"""
        import time, jax, jax.numpy as jnp
        from jaxstow import io, scheduler

        class Slow(io.MemoryCollector):
            def save(self, chain_id, first, values):
                time.sleep(0.05)
                with open({str(log)!r}, "a") as log:
                    log.write(f"{{first}}\\n")

        init_save, save, _ = io.save(Slow(), block_size=2)
        state = init_save(jnp.zeros(3), None, scheduler.static_information(samples_collected=None))
        step = lambda state, t: (save(state, True, jnp.full(3, t, jnp.float32))[0], None)
        jax.block_until_ready(jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(20))[0])(state))
        """  # the run is abandoned with blocks still queued: postprocess_save is never called
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # Every block sent: all but the last, which the call after it would have sent (or postprocess_save).
    assert log.read_text().split() == [str(first) for first in range(0, 18, 2)]


def test_a_collector_error_surfaces_in_postprocess_with_its_cause() -> None:
    class DiskFull(io.MemoryCollector):
        def save(self, chain_id, first, values):
            if first >= 4:
                raise OSError(28, "No space left on device")
            super().save(chain_id, first, values)

    init_save, save, postprocess_save = io.save(DiskFull(), block_size=4)
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
    state, _ = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), jnp.ones(STEPS, bool))
    with pytest.raises(
        io.CollectorError, match=r"DiskFull failed while saving samples 4\.\.7 of chain 0: .*No space"
    ) as raised:
        postprocess_save(state, None)
    assert isinstance(raised.value.__cause__, OSError)


def test_a_collector_that_calls_sys_exit_fails_the_run_rather_than_hanging_it() -> None:
    program = textwrap.dedent(
        """
        import sys, jax, jax.numpy as jnp
        from jaxstow import io, scheduler

        class Quits(io.DataCollector):  # its save runs on the strategy's thread, which SystemExit ended
            def register_data_loader(self, data_loader): pass
            def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None): return 0
            def save(self, chain_id, first, values): sys.exit("disk quota reached, giving up")
            def checkpoint(self, chain_id, checkpoint): pass
            def finalize(self, chain_id): pass
            def finished(self, chain_id): return None
            def resume(self): return {}

        init_save, save, postprocess_save = io.save(Quits(), block_size=2)
        state = init_save(jnp.float32(0), None, scheduler.static_information(samples_collected=20))
        step = lambda state, i: (save(state, True, i.astype(jnp.float32))[0], None)
        state = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(20))[0])(state)
        try:
            postprocess_save(state, None)
        except io.CollectorError as error:
            print(error)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Quits failed while saving samples 0..1 of chain 0: disk quota reached" in done.stdout, done.stdout


def test_a_closed_hdf5_file_surfaces_in_postprocess(tmp_path) -> None:
    file = h5py.File(tmp_path / "closed.h5", "w")
    init_save, save, postprocess_save = io.save(io.HDF5Collector(file))  # one block holds the whole run
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
    state, _ = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), jnp.ones(STEPS, bool))
    file.close()
    with pytest.raises(io.CollectorError, match="HDF5Collector failed while") as raised:
        postprocess_save(state, None)
    assert raised.value.__cause__ is not None


def test_a_finished_run_is_not_overwritten(tmp_path) -> None:
    path = tmp_path / "done.h5"
    with h5py.File(path, "w") as file:
        init_save, _, postprocess_save = io.save(io.HDF5Collector(file))
        postprocess_save(init_save(INIT_SAMPLE, None, scheduler.static_information()), None)
    with h5py.File(path, "a") as file, pytest.raises(CollectorError, match=r"finished run at /chain~0"):
        io.HDF5Collector(file).register_chain(INIT_SAMPLE, None, scheduler.static_information())


def test_a_second_collector_on_one_open_file_leaves_the_first_runs_chains_alone(tmp_path) -> None:
    # Both collectors' chain ids start at 0: the second took the first's unfinished /chain~0 for its own and
    # deleted its samples.
    path = tmp_path / "two.h5"
    with h5py.File(path, "w", libver="latest") as file:
        first_init, first_save, first_post = io.save(io.HDF5Collector(file))
        state = first_init(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
        second_init, _, _ = io.save(io.HDF5Collector(file))
        with pytest.raises(CollectorError, match=r"/chain~0 holds the samples of another HDF5Collector's run"):
            second_init(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
        steps = jnp.arange(STEPS, dtype=jnp.int32)
        state, _ = jax.lax.scan(lambda state, t: first_save(state, True, _sample(jnp.ones(3) * t, t)), state, steps)
        result = first_post(state, None)
        np.testing.assert_array_equal(result["samples"]["stats"].step[:], np.arange(STEPS))
        third_init, _, _ = io.save(io.HDF5Collector(file))  # the first run is over: its chain is finished, not taken
        with pytest.raises(CollectorError, match=r"finished run at /chain~0"):
            third_init(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))


def test_misuse_is_reported_clearly() -> None:
    init_save, save, _ = io.save(io.MemoryCollector())
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
    with pytest.raises(ValueError, match=r"sample leaf 'x' is float32\[4\], expected float32\[3\]"):
        save(state, True, _sample(jnp.zeros(4), jnp.int32(0)))
    with pytest.raises(ValueError, match="one boolean per chain"):
        save(state, jnp.ones(2, bool), _sample(jnp.zeros(3), jnp.int32(0)))
    shared = functools.partial(_scan, save, state)  # one saving state for every chain: not allowed
    with pytest.raises(ValueError, match="call init_save inside the vmap"):
        jax.vmap(shared)(jnp.zeros((2, 3)), jnp.ones((2, STEPS), bool))
    with pytest.raises(ValueError, match="samples_collected=N"):
        io.no_save()[0](INIT_SAMPLE, None, scheduler.static_information())


def test_a_typed_prng_key_in_the_sample_is_refused_saying_to_save_its_data() -> None:
    init_save, _, _ = io.save(io.MemoryCollector())
    information = scheduler.static_information(samples_collected=STEPS)
    with pytest.raises(ArgumentError, match=r"typed PRNG key at \['key'\]: save its data, jax.random.key_data"):
        init_save({"x": jnp.float32(0), "key": jax.random.key(0)}, None, information)
    state = init_save({"x": jnp.float32(0), "key": jax.random.key_data(jax.random.key(0))}, None, information)
    assert state.buffer["key"].dtype == jnp.uint32


@pytest.mark.parametrize("sample", [{}, None, {"a": {}, "b": None}], ids=["empty-dict", "none", "nested-empty"])
def test_a_sample_of_no_arrays_is_refused_before_a_chain_is_registered(strategy, sample) -> None:
    init_save, save, postprocess_save = strategy.triple
    information = scheduler.static_information(samples_collected=STEPS)
    with pytest.raises(ArgumentError, match="sample must hold at least one array"):
        init_save(sample, None, information)
    keep = _keep_list(0, (STEPS,))
    state = init_save(INIT_SAMPLE, None, information)  # the strategy serves a run all the same, as its first chain
    state, outputs = jax.jit(functools.partial(_scan, save))(state, jnp.zeros(3), keep)
    result = postprocess_save(state, None)
    want = jax.tree.map(lambda leaf: np.asarray(leaf)[np.asarray(keep)], outputs)
    _assert_trees_equal(_as_numpy(result["samples"]), want)
    if strategy.kind == "hdf5":
        assert [name for name in strategy.file if name.startswith("chain~")] == ["chain~0"]


class _Registers(io.DataCollector):
    """A collector whose ``register_chain`` returns what it is given."""

    def __init__(self, chain_id: Any) -> None:
        self.chain_id = chain_id

    def register_data_loader(self, data_loader: Any) -> None: ...

    def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None) -> Any:
        return self.chain_id

    def save(self, chain_id: int, first: int, values: Any) -> None: ...

    def checkpoint(self, chain_id: int, checkpoint: Any) -> None: ...

    def finalize(self, chain_id: int) -> None: ...

    def finished(self, chain_id: int) -> Any: ...

    def resume(self) -> dict:
        return {}


@pytest.mark.parametrize("chain_id", [None, "chain-a", 2**40, -1, True])
def test_a_collector_that_registers_no_chain_id_is_named(chain_id) -> None:
    init_save, _, _ = io.save(_Registers(chain_id))
    with pytest.raises(CollectorError, match=r"_Registers\.register_chain returned .*, which is no chain id"):
        init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=4))


def test_a_collector_that_gives_a_live_chain_id_again_is_named_at_init_save() -> None:
    # Its run went on, and postprocess_save then told the user to call init_save inside the vmap, which they did.
    init_save, _, _ = io.save(_Registers(0))
    init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=4))
    with pytest.raises(CollectorError, match=r"register_chain returned the chain id 0, which a chain whose run is not"):
        init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=4))


def test_arguments_given_wrong_are_named_where_they_are_given(tmp_path) -> None:
    # Each raised Python's or jax's error from inside the run (AttributeError, TypeError, ValueError).
    for collector, message in [
        (str(tmp_path / "samples.h5"), r"data_collector must be a collector.*io\.HDF5Collector\('.*samples\.h5'\)"),
        (io.MemoryCollector, r"data_collector is the class MemoryCollector: pass an instance"),
    ]:
        with pytest.raises(ArgumentError, match=message):
            io.save(collector)
    for options, message in [
        ({"block_size": 2.5}, r"block_size must be a number of samples, at least 1, got 2\.5"),
        ({"checkpoint_every": "10"}, r"checkpoint_every must be 0 \(never\) or a number of steps, got '10'"),
    ]:
        with pytest.raises(ArgumentError, match=message):
            io.save(io.MemoryCollector(), **options)
    for collector, message in [  # each refused at the run's first checkpoint, once the run had gone that far
        (io.MemoryCollector(), r"checkpoint_every=10\): MemoryCollector\(\) has nowhere to keep checkpoints"),
        (io.HDF5Collector(h5py.File("memory.h5", "w", driver="core", backing_store=False)), r"is not on disk"),
    ]:
        with pytest.raises(ArgumentError, match=message):
            io.save(collector, checkpoint_every=10)
    init_save, save, _ = io.save(io.MemoryCollector())
    with pytest.raises(ArgumentError, match=r"static_information must be scheduler\.static_information"):
        init_save(INIT_SAMPLE, None, 100)
    with pytest.raises(ArgumentError, match=r"leaf \['x'\] is 'abc': samples and states hold arrays and numbers"):
        init_save({"x": "abc"}, None, scheduler.static_information())
    state = init_save(INIT_SAMPLE, None, scheduler.static_information(samples_collected=STEPS))
    with pytest.raises(ArgumentError, match=r"keep is None: pass True"):
        save(state, None, INIT_SAMPLE)
    for keep in ["no", 0.5]:  # a string is true whatever it says, and a fraction is not a flag
        with pytest.raises(ArgumentError, match=r"keep must be a boolean \(or an integer flag\) for each chain"):
            save(state, keep, INIT_SAMPLE)
    h5py.File(tmp_path / "done.h5", "w").close()
    with h5py.File(tmp_path / "done.h5", "r") as file, pytest.raises(ArgumentError, match=r"open read-only"):
        io.HDF5Collector(file)


@pytest.mark.parametrize(
    ("resumed", "message"),
    [
        (None, r"Silent\.resume\(\) returned None: it returns a dict of chain ids"),
        (
            {0: {"step": 3}},
            r"Silent\.resume\(\) gave chain 0 \{'step': 3\}: it gives each chain the io\.ChainCheckpoint",
        ),
    ],
)
def test_a_collectors_resume_that_returns_no_checkpoints_is_named(resumed, message, tmp_path) -> None:
    class Silent(io.MemoryCollector):
        def resume(self):
            return resumed

    init_save, _, _ = io.save(Silent(save_dir=tmp_path), checkpoint_every=2)  # checkpointing: resume() must answer
    with pytest.raises(CollectorError, match=message):
        init_save(INIT_SAMPLE, None, scheduler.static_information())


def test_a_memory_collectors_save_dir_that_is_a_file_is_named(tmp_path) -> None:
    (tmp_path / "samples").write_text("the user's file")
    with pytest.raises(NotAFolderError, match=r"samples: is a file, not a folder for MemoryCollector's save_dir"):
        io.MemoryCollector(save_dir=tmp_path / "samples")
    init_save = io.save(io.MemoryCollector(save_dir=tmp_path / "samples" / "in"), 2)[0]
    with pytest.raises(NotAFolderError, match=r"samples/in: cannot be a folder: a part of its path is a file"):
        init_save(INIT_SAMPLE, 0.0, scheduler.static_information(samples_collected=4))  # before the run, not after
    assert (tmp_path / "samples").read_text() == "the user's file"


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: io.MemoryCollector(save_dir=3), "MemoryCollector's save_dir is a folder's path .* not 3"),
        (lambda: io.MemoryCollector(["out"]), r"MemoryCollector's save_dir is a folder's path .* not \['out'\]"),
        (lambda: io.HDF5Collector("s.h5", checkpoint_dir=1.5), "HDF5Collector's checkpoint_dir is .* not 1.5"),
        (lambda: io.MemoryCollector(""), "MemoryCollector's save_dir is a folder's path .* not ''"),
        (
            lambda: io.MemoryCollector(savedir="out"),
            r"MemoryCollector\(\) got an unexpected keyword argument 'savedir' ",
        ),
        (lambda: io.HDF5Collector("s.h5", compresion="gzip"), r"'compresion' \(did you mean compression=\?\)"),
    ],
)
def test_a_collectors_folder_that_is_no_path_or_a_misspelt_argument_is_named(
    make, named, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError, match=named):
        make()
    assert list(tmp_path.iterdir()) == []


class _ReferenceCollector(io.DataCollector):
    """A collector written to jax_sgmc's interface: ``save(chain_id, values)`` of one sample's leaves at a time."""

    def __init__(self) -> None:
        self.data: dict[int, list] = {}

    def register_data_loader(self, data_loader):
        pass

    def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None):
        self.data[len(self.data)] = []
        return len(self.data) - 1

    def save(self, chain_id, values):
        self.data[chain_id].append(float(values[0]))

    def checkpoint(self, chain_id, state):
        pass

    def finalize(self, chain_id):
        pass

    def finished(self, chain_id):
        return self.data[chain_id]

    def resume(self):
        return {}


@pytest.mark.parametrize("block_size", [None, 1, 3])
def test_a_collector_of_jax_sgmcs_interface_gets_every_sample_once_in_order(block_size) -> None:
    init_save, save, postprocess_save = io.save(_ReferenceCollector(), block_size=block_size)
    states = jax.vmap(lambda _: init_save({"x": jnp.float32(0)}, None, scheduler.static_information()))(jnp.arange(2))

    def step(states, t):
        return jax.vmap(lambda state, chain: save(state, t % 3 != 0, {"x": 10 * t + chain})[0])(
            states, jnp.arange(2)
        ), None

    states = jax.jit(lambda states: jax.lax.scan(step, states, jnp.arange(20.0))[0])(states)
    results = postprocess_save(states, None)
    assert [result["samples"] for result in results] == [[10.0 * t + c for t in range(20) if t % 3] for c in range(2)]


class _Resumable(_ReferenceCollector):
    """jax_sgmc's interface, one chain whose samples and checkpoint outlive its runs, as a file's would."""

    def __init__(self, rows=(), checkpoint=None) -> None:
        super().__init__()
        self.data = {0: list(rows)}
        self.checkpoints = {} if checkpoint is None else {0: checkpoint}
        self.senders: list = []

    def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None):
        return 0

    def checkpoint(self, chain_id, state):
        self.checkpoints[chain_id] = state

    def resume(self):
        return dict(self.checkpoints)

    def register_sender(self, wait):
        self.senders.append(wait)

    def stopped(self) -> list[float]:
        """The samples that the checkpoint counts, all a crash leaves, once the run's blocks have arrived."""
        for wait in self.senders:
            wait()
        return self.data[0][: self.checkpoints[0].sample_count]


@pytest.mark.parametrize("continued_by", ["the same collector", "a new collector"])
def test_a_collector_of_jax_sgmcs_interface_resumed_from_a_checkpoint_gets_the_samples_after_it(continued_by) -> None:
    """The rows given to ``save(chain_id, values)`` were counted from 0 in a new collector (refused: samples 0 to 3
    have not arrived) and from the stopped run's count in the same one (samples 4 and 5 of the resumed run lost)."""
    information = scheduler.static_information(samples_collected=10)

    def run(collector, steps):
        init_save, save, postprocess_save = io.save(collector, checkpoint_every=4, block_size=2)
        state = init_save({"x": jnp.float32(0)}, 0.0, information)
        for step in range(int(state.step), steps):
            state, _ = save(state, True, {"x": jnp.float32(step)}, solver_state=float(step))
        return state, postprocess_save

    collector = _Resumable()
    jax.block_until_ready(run(collector, 6)[0])  # no postprocess_save: the run stops after its checkpoint at step 4
    kept = collector.stopped()
    assert kept == [0.0, 1.0, 2.0, 3.0]
    if continued_by == "a new collector":  # the script run again
        collector = _Resumable(kept, collector.checkpoints[0])
    else:
        collector.data[0] = kept
    state, postprocess_save = run(collector, 10)
    assert postprocess_save(state, None)["samples"] == [float(step) for step in range(10)]


def test_a_collector_of_jax_sgmcs_interface_whose_run_stopped_gets_every_sample_of_a_fresh_run_of_its_chain() -> None:
    """A chain id given again after a run that stopped before postprocess_save: the rows that run gave were counted as
    given to the new one, whose first samples were dropped."""
    collector = _Resumable()
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    state = init_save({"x": jnp.float32(0)}, None, scheduler.static_information(samples_collected=6))
    for step in range(6):
        state, _ = save(state, True, {"x": jnp.float32(step)})
    jax.block_until_ready(state)  # stopped: no postprocess_save
    for wait in collector.senders:
        wait()
    collector.data[0] = []
    init_save, save, postprocess_save = io.save(collector, block_size=2)
    state = init_save({"x": jnp.float32(0)}, None, scheduler.static_information(samples_collected=6))
    for step in range(6):
        state, _ = save(state, True, {"x": jnp.float32(10 + step)})
    assert postprocess_save(state, None)["samples"] == [10.0 + step for step in range(6)]


class _StubbedResume(_ReferenceCollector):
    """jax_sgmc's interface, whose checkpointing is not supported: ``resume`` left a stub."""

    def __init__(self, stub) -> None:
        super().__init__()
        self.stub = stub

    def resume(self):
        return self.stub()


def _not_implemented():
    raise NotImplementedError("checkpointing is not supported")


def _broken():
    raise KeyError("loader")


@pytest.mark.parametrize("stub", [lambda: None, _not_implemented], ids=["returns nothing", "not implemented"])
def test_a_collector_whose_resume_is_a_stub_works_without_checkpoints(stub) -> None:
    collector = _StubbedResume(stub)
    init_save, save, postprocess_save = io.save(collector)
    state = init_save({"x": jnp.float32(0)}, None, scheduler.static_information(samples_collected=3))
    state = jax.lax.scan(lambda s, t: (save(s, True, {"x": t})[0], None), state, jnp.arange(3.0))[0]
    assert postprocess_save(state, None)["samples"] == [0.0, 1.0, 2.0]
    with pytest.raises(CollectorError, match=r"_StubbedResume\.resume\(\) (is not implemented|returned None)"):
        io.save(_StubbedResume(stub), checkpoint_every=2)[0]({"x": jnp.float32(0)}, 0.0, scheduler.static_information())


def test_a_collectors_resume_that_fails_is_a_collector_error_and_its_chain_is_not_left_running() -> None:
    init_save, _, _ = io.save(_StubbedResume(_broken))
    with pytest.raises(CollectorError, match=r"_StubbedResume\.resume\(\) raised KeyError: 'loader'"):
        init_save({"x": jnp.float32(0)}, None, scheduler.static_information())


def test_a_leaf_name_an_npz_archive_cannot_hold_is_refused_before_the_run_with_a_save_dir(tmp_path) -> None:
    init_save, _, _ = io.save(io.MemoryCollector(save_dir=tmp_path / "samples"))
    with pytest.raises(ArgumentError, match=r"leaf '\.': an npz archive cannot hold this leaf name.*save_dir keeps"):
        init_save({".": jnp.float32(0)}, None, scheduler.static_information(samples_collected=2))
    init_save, _, _ = io.save(io.MemoryCollector())  # kept in memory alone: any name
    init_save({".": jnp.float32(0)}, None, scheduler.static_information(samples_collected=2))


@pytest.mark.parametrize("strategy", [io.no_save, lambda: io.save(io.MemoryCollector())], ids=["no_save", "save"])
def test_postprocess_save_inside_jit_says_to_call_it_outside(strategy) -> None:
    init_save, save, postprocess_save = strategy()

    @jax.jit
    def run(state):
        state = jax.lax.scan(lambda s, t: (save(s, True, {"x": t})[0], None), state, jnp.arange(2.0))[0]
        return postprocess_save(state, None)

    with pytest.raises(ArgumentError, match=r"postprocess_save was called inside jax\.jit .* call it outside"):
        run(init_save({"x": jnp.float32(0)}, None, scheduler.static_information(samples_collected=2)))


def test_a_run_refused_for_its_declared_count_is_left_unfinished_and_the_right_call_resumes_it(tmp_path) -> None:
    path = str(tmp_path / "samples.h5")

    def run(declared: int | None) -> Any:
        collector = io.HDF5Collector(path)
        init_save, save, postprocess_save = io.save(collector, checkpoint_every=4)
        information = scheduler.static_information(samples_collected=declared)
        state = init_save({"x": jnp.zeros(3)}, {"x": jnp.zeros(3)}, information)
        x = collector.resume()[0].solver_state["x"] if collector.resume() else jnp.zeros(3)

        def step(carry, t):
            state, x = carry
            x = 0.7 * x + jnp.sin(t + jnp.arange(3.0))
            state, _ = save(state, True, {"x": x}, solver_state={"x": x})
            return (state, x), x

        (state, _), _ = jax.jit(lambda s, x, ts: jax.lax.scan(step, (s, x), ts))(
            state, x, jnp.arange(int(state.step), STEPS, dtype=jnp.float32)
        )
        return postprocess_save(state, None)

    with pytest.raises(io.SampleCountError, match=r"kept 15 samples, .*the run is left unfinished: call it again"):
        run(declared=3)
    assert not run_finished(path)  # its checkpoint kept: not a finished run the next call starts over
    resumed = run(declared=None)
    x, want = np.zeros(3), []
    for t in range(STEPS):
        x = 0.7 * x + np.sin(t + np.arange(3.0))
        want.append(x)
    assert int(resumed["sample_count"]) == STEPS
    np.testing.assert_allclose(np.asarray(resumed["samples"]["x"]), np.stack(want), rtol=1e-5)
    assert run_finished(path)


MEMORY_RUN = """
import sys, time, jax, jax.numpy as jnp
from jaxstow import io, scheduler
init_save, save, postprocess_save = io.save(io.MemoryCollector(save_dir=sys.argv[1]), checkpoint_every=2)
state = init_save({"x": jnp.zeros(())}, 0.0, scheduler.static_information(samples_collected=4))
print("running", flush=True)
if sys.argv[2] == "hold":
    time.sleep(60)
"""


def test_a_memory_collectors_save_dir_is_written_by_one_process_at_a_time(tmp_path) -> None:
    first = forked.Popen(
        [sys.executable, "-c", MEMORY_RUN, str(tmp_path / "run"), "hold"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None and first.stdout.readline() == "running\n"
        second = forked.run(
            [sys.executable, "-c", MEMORY_RUN, str(tmp_path / "run"), "go"], capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 1 and "is being written by another run (process" in second.stderr, second.stderr
    finally:
        first.kill()
        first.wait()
    # In one process, a new collector of the folder takes over from one whose run was dropped unfinished.
    for _ in range(2):
        init_save = io.save(io.MemoryCollector(save_dir=tmp_path / "run"), checkpoint_every=2)[0]
        init_save({"x": jnp.zeros(())}, 0.0, scheduler.static_information(samples_collected=4))


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_one_strategy_serves_runs_of_several_threads_at_once(tmp_path, kind) -> None:
    collector = io.MemoryCollector() if kind == "memory" else io.HDF5Collector(str(tmp_path / "t.h5"))
    init_save, save, postprocess_save = io.save(collector)
    steps, offsets = 2000, (0, 100_000, 200_000, 300_000)

    def compiled(offset: int) -> Any:
        def step(state, i):
            return save(state, i % 2 == 0, {"w": jnp.full(50, i + offset, jnp.float32)})[0], None

        return jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(steps, dtype=jnp.float32))[0])

    runs = {offset: compiled(offset) for offset in offsets}
    got: dict[int, np.ndarray] = {}
    failures: list[BaseException] = []

    def run(offset: int) -> None:
        try:
            state = init_save({"w": jnp.zeros(50)}, None, scheduler.static_information(samples_collected=steps // 2))
            got[offset] = np.asarray(postprocess_save(runs[offset](state), None)["samples"]["w"][:])
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=run, args=(offset,)) for offset in offsets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    for offset in offsets:
        want = np.arange(0, steps, 2, dtype=np.float32) + offset
        np.testing.assert_array_equal(got[offset], np.repeat(want[:, None], 50, axis=1))
