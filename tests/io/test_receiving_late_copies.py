"""A chain whose saving state is replicated over several devices gets each block from every device, and one device's
copy may come after the others' later blocks: an identical late copy is the same run's, and is stored once; a copy
that differs is refused, as is another run from the same state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError
from jaxstow.io.receiving import Receiver

RING = 4
INFORMATION = scheduler.static_information(samples_collected=None)


def _receiver() -> tuple[Receiver, int]:
    collector = io.MemoryCollector()
    host = Receiver(collector, 0)
    chain_id = collector.register_chain({"x": np.zeros(2)}, None, INFORMATION)
    host.live[chain_id] = None
    return host, chain_id


def _send(host: Receiver, chain_id: int, first: int, rows: np.ndarray, device: int) -> None:
    """Hand ``rows`` (the block from sample ``first``) to ``host`` as the callback of ``device`` does, in a ring
    holding them where the run's buffer would."""
    ring = np.zeros((1, RING, 2), np.float32)
    ring[0, first % RING : first % RING + len(rows)] = rows
    numbers = np.array([[host.number], [chain_id], [first], [len(rows)], [(first + len(rows)) % RING]])
    host.receive(0, numbers, ({"x": ring},), device=(0, device))


def _blocks() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(4, dtype=np.float32).reshape(2, 2), np.arange(4, 8, dtype=np.float32).reshape(2, 2)


def test_an_identical_copy_of_a_block_that_comes_late_from_another_device_is_stored_once() -> None:
    host, chain_id = _receiver()
    first, second = _blocks()
    _send(host, chain_id, 0, first, device=0)
    _send(host, chain_id, 2, second, device=0)
    rest = np.full((1, 2), 8, np.float32)
    host.deliver(chain_id, 4, [rest])  # postprocess_save's, once the state of device 0 is done
    _send(host, chain_id, 0, first, device=1)  # device 1, whose copy of the state is not done yet
    _send(host, chain_id, 2, second, device=1)
    host.raise_failures([chain_id])
    samples = np.concatenate([first, second, rest])
    host.check_rows_kept(chain_id, (4, 1, 1), [np.concatenate([rest, first[1:], second])], {"x": samples})
    assert np.array_equal(host.collector.finished(chain_id)["x"][:5], samples)


def test_a_late_copy_of_a_block_that_differs_from_the_first_is_refused() -> None:
    host, chain_id = _receiver()
    first, second = _blocks()
    _send(host, chain_id, 0, first, device=0)
    _send(host, chain_id, 2, second, device=0)
    _send(host, chain_id, 0, first + 1, device=1)
    with pytest.raises(CollectorError, match=r"chain 0 went to several devices .*\(rows 0\.\.1\)"):
        host.raise_failures([chain_id])


def test_the_first_rows_again_from_the_same_device_are_another_run() -> None:
    host, chain_id = _receiver()
    first, second = _blocks()
    _send(host, chain_id, 0, first, device=0)
    _send(host, chain_id, 2, second, device=0)
    _send(host, chain_id, 0, first + 1, device=0)  # another run from the same state, after this one
    host.raise_failures([chain_id])
    with pytest.raises(CollectorError, match="holds samples of chain 0 from two runs"):
        host.check_rows_kept(chain_id, (4, 0, 0), [np.concatenate([first, second])], None)


@pytest.mark.parametrize("checkpoint_every", [0, 3])
def test_a_chain_replicated_over_four_devices_of_a_mesh_gives_its_draws_once(tmp_path, checkpoint_every) -> None:
    collector = io.HDF5Collector(tmp_path / "samples.h5")
    init_save, save, postprocess_save = io.save(collector, checkpoint_every, block_size=2)
    sample = {"x": jnp.zeros(2)}
    states = jax.vmap(lambda _: init_save(sample, sample, scheduler.static_information(samples_collected=9)))(
        jnp.arange(1)
    )
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("chains", "replicas"))

    def walk(state, key):
        def step(carry, _):
            state, key, x = carry
            key, noise = jax.random.split(key)
            x = x + jax.random.normal(noise, (2,))
            return (save(state, True, {"x": x}, solver_state={"x": x})[0], key, x), x

        (state, _, _), xs = jax.lax.scan(step, (state, key, jnp.zeros(2)), None, length=9)
        return state, xs

    run = jax.shard_map(jax.vmap(walk), mesh=mesh, in_specs=P("chains"), out_specs=P("chains"), check_vma=False)
    final, draws = jax.jit(run)(states, jax.random.split(jax.random.key(3), 1))
    (result,) = postprocess_save(final)
    np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), np.asarray(draws[0]))


def test_a_block_that_comes_again_after_another_devices_next_block_is_a_late_copy_not_a_second_run():
    # A device sent a block again (or a checkpoint's start of it) after another device had sent the next: taken as new
    # rows, it made the chain's rows look written by two runs, and a replicated chain's postprocess_save failed now
    # and then (under load) with "samples of chain 0 from two runs".
    host = Receiver(io.MemoryCollector(), checkpoint_every=3)
    block = [np.arange(4.0).reshape(2, 2)]
    assert host._first_copy((0, 0), 0, 2, block)  # the whole block, from the first device
    assert not host._first_copy((0, 1), 0, 2, [block[0][:1]])  # its start, from a device that lagged
    assert not host._first_copy((0, 1), 0, 2, block)  # the whole block again
    assert host._first_copy((0, 1), 0, 4, block)  # the next block, first from this device
    assert not host._first_copy((0, 0), 0, 2, block)  # the first device's block again, after the next: the same bytes
    assert host._first_copy((0, 0), 0, 2, [block[0] + 1])  # other bytes from it: another run's, new rows
    assert "chain 0" not in str(host.failures)
