"""Two ``MemoryCollector``s of one ``save_dir`` in one process, the second made while the first one's run goes on (a
notebook cell run again while a run of the first is pending): the newest writes the folder, and the first one's run
writes nothing there, where it would replace the second one's ``chain_0.npz``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

INFORMATION = scheduler.static_information(samples_collected=4)


def _start(save_dir, offset: float, checkpoint_every: int):
    """A run of one chain (its samples ``offset + t``) with a collector of ``save_dir``, registered: its initial state,
    the compiled run and ``postprocess_save``."""
    init_save, save, postprocess_save = io.save(io.MemoryCollector(save_dir=save_dir), checkpoint_every)

    def step(state, t):
        return save(state, True, {"w": t + offset}, solver_state=t)[0], None

    run = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(4.0))[0])
    return init_save({"w": 0.0}, 0.0, INFORMATION), run, postprocess_save


@pytest.mark.parametrize("checkpoint_every", [0, 2])
def test_a_run_whose_save_dir_a_newer_collector_took_over_writes_nothing_there(tmp_path, checkpoint_every) -> None:
    first, first_run, first_postprocess = _start(tmp_path, 100.0, checkpoint_every)
    second, second_run, second_postprocess = _start(tmp_path, 200.0, checkpoint_every)  # takes the folder over
    first = jax.block_until_ready(first_run(first))
    samples = second_postprocess(second_run(second), None)["samples"]["w"]
    np.testing.assert_array_equal(samples, [200.0, 201.0, 202.0, 203.0])
    with pytest.raises(CollectorError, match=r"was taken over by another MemoryCollector of the folder.*save_dir of"):
        first_postprocess(first, None)
    np.testing.assert_array_equal(np.load(tmp_path / "chain_0.npz")["w"], [200.0, 201.0, 202.0, 203.0])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chain_0.npz"]
