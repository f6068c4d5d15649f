"""A resumed chain continues from its own state only: the solver state's leaves are matched by their paths, not by
their order (a field renamed between a kill and the restart gave its values to another), and a chain's checkpoint
names its chain (a chain's file copied or moved over another's resumed as that chain). ``MemoryCollector(save_dir)``
writes ``chain_{id}.npz`` as ``numpy.savez`` does, a member per leaf and nothing else."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow import io, scheduler
from jaxstow.errors import StructureMismatchError

SAMPLE = {"x": jnp.zeros(3)}


def _checkpointed(save_dir: Path, solver: dict, chains: int = 1) -> None:
    """A run of ``chains`` chains stopped after its checkpoints, before its end (as a kill leaves it)."""
    init_save, save, _ = io.save(io.MemoryCollector(save_dir=save_dir), checkpoint_every=5)
    info = scheduler.static_information(samples_collected=None)

    def run(chain: int) -> None:
        state = init_save(SAMPLE, solver, info)

        def step(carry, _):
            state, solver = carry
            state, _ = save(state, True, {"x": solver["theta"] + chain}, solver_state=solver)
            return (state, solver), None

        (state, _), _ = jax.lax.scan(step, (state, solver), jnp.arange(10))
        jax.block_until_ready(state)

    for chain in range(chains):
        run(chain)


def _resume(save_dir: Path, solver: dict) -> None:
    init_save, _, _ = io.save(io.MemoryCollector(save_dir=save_dir), checkpoint_every=5)
    init_save(SAMPLE, solver, scheduler.static_information(samples_collected=None))


def test_a_solver_state_field_renamed_since_the_checkpoint_is_refused_not_given_another_fields_values(tmp_path):
    _checkpointed(tmp_path, {"momentum": jnp.full(3, 100.0), "theta": jnp.ones(3)})
    with pytest.raises(StructureMismatchError, match=r"\['momentum', 'theta'\], the run's are \['theta', 'velocity'\]"):
        _resume(tmp_path, {"theta": jnp.zeros(3), "velocity": jnp.zeros(3)})  # was theta=100s, velocity=1s


def test_a_chains_checkpoint_moved_over_anothers_is_refused(tmp_path):
    solver = {"theta": jnp.ones(3)}
    _checkpointed(tmp_path, solver, chains=2)
    first, second = tmp_path / "chain_0.checkpoint.jxs", tmp_path / "chain_1.checkpoint.jxs"
    shutil.copyfile(first, second)
    with pytest.raises(StructureMismatchError, match="the checkpoint of chain 1 holds the state of chain 0"):
        init_save, _, _ = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=5)
        for _ in range(2):
            init_save(SAMPLE, solver, scheduler.static_information(samples_collected=None))


def _finished(save_dir: Path, sample: dict) -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector(save_dir=save_dir))
    state = init_save(sample, None, scheduler.static_information(samples_collected=4))
    for _ in range(4):
        state, _ = save(state, True, sample)
    postprocess_save(state, None)


def test_a_chains_npz_holds_a_member_per_leaf_and_nothing_else(tmp_path):
    _finished(tmp_path, {"a": {"b": jnp.ones(2)}, "c": jnp.int32(3)})
    with np.load(tmp_path / "chain_0.npz") as npz:
        assert sorted(npz.files) == ["a/b", "c"]  # was also "__jaxstow__"
        assert npz["a/b"].shape == (4, 2) and npz["c"].tolist() == [3] * 4


def test_a_dtype_numpy_lacks_keeps_its_dtype_in_the_chains_npz(tmp_path):
    _finished(tmp_path, {"w": jnp.ones(2, jnp.bfloat16)})
    loaded = jaxstow.load(tmp_path / "chain_0.npz", as_numpy=True)
    assert loaded["w"].dtype == ml_dtypes.bfloat16 and loaded["w"].shape == (4, 2)
