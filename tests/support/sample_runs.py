"""Small runs whose files tests change: a finished run of ``io.run_chains`` (two chains of ``x``, 40 steps), and a
run of ``io.save`` into an ``HDF5Collector`` stopped part way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxstow import io

#: The steps of the run, and the draws of each chain.
STEPS = 40


def start() -> dict[str, jax.Array]:
    """The two chains' first state: ``x`` at 0 and 10."""
    return {"x": jnp.array([0.0, 10.0])}


def step(state: dict[str, Any], t: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """One step: ``x`` goes up by 1, and is drawn."""
    x = state["x"] + 1.0
    return {"x": x}, {"x": x}, jnp.ones(2, bool)


def finished_run(folder: Path) -> Path:
    """The HDF5 file ``run.h5`` in ``folder`` of the run, finished (its checkpoint removed)."""
    path = folder / "run.h5"
    io.run_chains(str(path), start, step, num_steps=STEPS, checkpoint_every=10)
    return path


def stopped_run(folder: Path, offset: float = 0.0) -> Path:
    """The HDF5 file ``run.h5`` in ``folder`` of a run of ``io.save`` stopped at step 14 of 24, checkpointed at step
    12 (its draws ``t + offset``): a collector of the file continues it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.h5"
    collector = io.HDF5Collector(str(path))
    init_save, save, _ = io.save(collector, checkpoint_every=4)

    def step(state: Any, t: Any) -> tuple[Any, None]:
        return save(state, True, {"x": jnp.full(2, t + offset, jnp.float32)}, solver_state={"t": t})[0], None

    state = init_save({"x": jnp.zeros(2)}, {"t": 0}, io.scheduler.static_information(samples_collected=24))
    jax.block_until_ready(jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(14))[0])(state))
    collector.close()  # as a kill leaves it
    assert os.path.exists(f"{path}.checkpoint.jxs")
    return path
