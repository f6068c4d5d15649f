"""A small finished run of ``io.run_chains`` (two chains of ``x``, 40 steps), for tests that change its file."""

from __future__ import annotations

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
