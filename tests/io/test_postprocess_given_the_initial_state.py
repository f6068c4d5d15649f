"""``postprocess_save`` given the saving state that ``init_save`` returned rather than the one the run returned (the
run's result dropped): a mistake that returned no samples, trimmed an HDF5Collector's file to none and deleted the
checkpoint, the samples it held lost. It is refused, and the run's own state then gets every sample."""

from __future__ import annotations

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

STEPS = 8
INFORMATION = scheduler.static_information(samples_collected=STEPS)
STEPS_OF = jnp.arange(float(STEPS))


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_the_initial_state_is_refused_and_the_runs_state_gets_every_sample(tmp_path, kind) -> None:
    path = tmp_path / "samples.h5"
    collector = io.MemoryCollector(save_dir=tmp_path) if kind == "memory" else io.HDF5Collector(path)
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=4, block_size=2)
    run = jax.jit(lambda state: jax.lax.scan(lambda s, t: save(s, True, {"w": t}, solver_state=t), state, STEPS_OF)[0])
    state = init_save({"w": 0.0}, 0.0, INFORMATION)
    final = jax.block_until_ready(run(state))
    with pytest.raises(CollectorError, match=r"counts none of the samples .* got from the run \(chain 0: 8 of them\)"):
        postprocess_save(state, None)
    samples = postprocess_save(final, None)["samples"]["w"]
    np.testing.assert_array_equal(samples, np.arange(STEPS, dtype=np.float32))
    if kind == "hdf5":
        with h5py.File(path, "r") as file:
            np.testing.assert_array_equal(file["chain~0/w"][:], np.arange(STEPS, dtype=np.float32))
    else:
        np.testing.assert_array_equal(np.load(tmp_path / "chain_0.npz")["w"], np.arange(STEPS, dtype=np.float32))
