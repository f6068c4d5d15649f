"""The HDF5 collector's checkpoints of several chains, its count of written draws, and the superblock of a killed
writer; and the blackjax adapter with a stochastic-gradient sampler (step arguments, thinning)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import io
from jaxstow.errors import CheckpointError, FormatError, JaxstowError, PathNotFoundError
from jaxstow.io.live import read_draws
from jaxstow.io.swmr import clear_stale_writer, open_for_reading, read_superblock

SAMPLE = {"x": np.zeros(2, np.float32)}
STATE = {"position": np.zeros(2, np.float32), "key": np.zeros(2, np.uint32)}


def _collector(file: h5py.File, chains: int = 2) -> io.HDF5Collector:
    collector = io.HDF5Collector(file)
    for _ in range(chains):
        collector.register_chain(SAMPLE, STATE, io.scheduler.static_information(samples_collected=8))
    return collector


def _block(chain: int, first: int, rows: int) -> list[np.ndarray]:
    return [np.full((rows, 2), 10 * chain + first, np.float32) + np.arange(rows, dtype=np.float32)[:, None]]


def test_the_chains_of_one_step_are_checkpointed_together_and_resume_after_a_partial_finalize(tmp_path):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w", libver="latest") as file:
        collector = _collector(file)
        assert file.swmr_mode  # the collector put the file in SWMR mode
        collector.save_chains({0: (0, _block(0, 0, 4)), 1: (0, _block(1, 0, 4))})
        state = {**STATE, "position": np.ones(2, np.float32)}
        collector.checkpoint_chains({0: io.ChainCheckpoint(4, 4, state), 1: io.ChainCheckpoint(4, 4, state)})
        collector.finalize(0)  # the process ends here, before the other chain is finalized
        assert read_draws(str(path)).done == [4, 4]
    stored = jaxstow.load(f"{path}.checkpoint.jxs")["chains"]
    assert sorted(stored) == [0, 1] and stored[1]["step"] == 4 and stored[1]["sample_count"] == 4

    with h5py.File(path, "a", libver="latest") as file:  # the same run, started again
        collector = _collector(file)
        resumed = collector.resume()
        assert [resumed[chain].step for chain in (0, 1)] == [4, 4]
        np.testing.assert_array_equal(resumed[1].solver_state["position"], np.ones(2))
        assert "sample_count" not in file["chain~0"].attrs  # finished, but the run was not: it goes on
        collector.save_chains({0: (4, _block(0, 4, 2)), 1: (4, _block(1, 4, 2))})
        collector.finalize(0)
        assert os.path.exists(f"{path}.checkpoint.jxs"), "removed before every chain was finalized"
        collector.finalize(1)
    assert not os.path.exists(f"{path}.checkpoint.jxs")
    draws = read_draws(str(path))
    assert draws.finished and draws.done == [6, 6]
    np.testing.assert_array_equal(draws.chains[1]["x"][:, 0], [10, 11, 12, 13, 14, 15])


def test_a_damaged_object_header_is_a_format_error_in_a_moment_not_a_hang_nor_an_h5py_error(tmp_path):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w", libver="latest") as file:
        collector = _collector(file)
        collector.save_chains({0: (0, _block(0, 0, 3)), 1: (0, _block(1, 0, 3))})
        collector.finalize(0)
        collector.finalize(1)
    whole = path.read_bytes()
    headers = [at for at in range(len(whole)) if whole[at : at + 4] == b"OHDR"]
    assert len(headers) >= 4  # the root, two chains, their datasets
    outcomes = set()
    for header in headers:
        for offset in (5, 8, 12):  # the header's flags, and bytes its checksum covers
            damaged = bytearray(whole)
            damaged[header + offset] ^= 0xFF
            path.write_bytes(bytes(damaged))
            started = time.monotonic()
            try:
                draws = read_draws(str(path))
            except FormatError as error:
                assert str(path) in str(error)
                outcomes.add("refused")
            else:  # a byte of an object this read does not open: what it reads is still right
                np.testing.assert_array_equal(draws.chains[1]["x"][:, 0], [10, 11, 12])
                outcomes.add("read")
            assert time.monotonic() - started < 30  # HDF5's own retries in SWMR mode waited for ever before
    assert "refused" in outcomes


def test_a_missing_file_or_a_folder_is_a_jaxstow_error_naming_it(tmp_path):
    missing = tmp_path / "samples.h5"
    with pytest.raises(PathNotFoundError, match="no such file") as caught:
        read_draws(str(missing))
    assert str(missing) in str(caught.value) and isinstance(caught.value, FileNotFoundError)
    with pytest.raises(JaxstowError, match=str(tmp_path)):
        read_draws(str(tmp_path))


def test_a_killed_writers_flags_are_cleared_and_what_it_wrote_is_read(tmp_path):
    path = tmp_path / "killed.h5"
    writer = textwrap.dedent(
        f"""
        import os, signal, h5py, numpy as np
        file = h5py.File({str(path)!r}, "w", libver="latest")
        file.create_dataset("x", data=np.arange(10.0), maxshape=(None,), chunks=(4,))
        file.swmr_mode = True
        file["x"].resize(12, axis=0)
        file["x"][10:] = 7.0
        file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert subprocess.run([sys.executable, "-c", writer]).returncode == -signal.SIGKILL
    assert read_superblock(path).writer == "a writer in SWMR mode"
    with open_for_reading(path) as file:  # a reader needs no clearing
        np.testing.assert_array_equal(file["x"][:], [*range(10), 7, 7])
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(path, "a")
    assert clear_stale_writer(path) and read_superblock(path).writer is None
    with h5py.File(path, "a") as file:  # what h5clear -s makes possible
        file["x"][0] = -1.0
    assert not clear_stale_writer(path)
    (tmp_path / "short.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    with pytest.raises(FormatError, match=r"short\.h5: is not an HDF5 file"):
        read_superblock(tmp_path / "short.h5")


def test_blackjax_sgld_with_minibatches_and_thinning(tmp_path):
    blackjax = pytest.importorskip("blackjax")
    x = jax.random.normal(jax.random.key(1), (200, 3))
    y = x @ jnp.array([1.0, -2.0, 0.5]) + 0.1 * jax.random.normal(jax.random.key(2), (200,))

    def loglikelihood(w, batch):
        xs, ys = batch
        return -0.5 * jnp.sum((ys - xs @ w) ** 2)

    gradient = blackjax.sgmcmc.gradients.grad_estimator(lambda w: -0.5 * jnp.sum(w**2), loglikelihood, 200)

    def step_args(key, t, step_size=1e-3):
        rows = jax.random.randint(key, (20,), 0, 200)
        return (x[rows], y[rows]), step_size

    sample = functools.partial(
        io.blackjax.sample,
        algorithm=blackjax.sgld(gradient),
        positions=jnp.zeros((3, 3)),
        key=jax.random.key(0),
        num_samples=3000,
        thin=10,
        checkpoint_every=500,
        step_args=step_args,
    )
    draws = sample(str(tmp_path / "sgld.h5"))  # 3 chains, every 10th of 3000 steps
    assert list(draws) == ["position"] and draws["position"].shape == (3, 300, 3)
    np.testing.assert_allclose(draws["position"][:, 150:].mean(axis=(0, 1)), [1.0, -2.0, 0.5], atol=0.05)
    again = sample(str(tmp_path / "sgld.h5"))  # finished: read from the file
    np.testing.assert_array_equal(again["position"], draws["position"])
    for other in (functools.partial(step_args, step_size=2e-2), lambda key, t: step_args(key, t, 2e-2)):
        with pytest.raises(CheckpointError, match=r"with step_args or draw functions holding other values") as caught:
            sample(str(tmp_path / "sgld.h5"), step_args=other)  # another step size: draws of two runs mixed
        assert caught.value.path == "step_settings"


def test_a_collector_leaves_an_hdf5_file_it_did_not_write_as_it_is(tmp_path):
    from jaxstow.errors import CollectorError

    data = tmp_path / "data.h5"
    with h5py.File(data, "w") as file:
        file["measurements"] = np.arange(5.0)
    with pytest.raises(CollectorError, match=r"data\.h5 holds HDF5 data that no jaxstow collector wrote"):
        io.HDF5Collector(str(data))
    with h5py.File(data, "r") as file:
        np.testing.assert_array_equal(file["measurements"][:], np.arange(5.0))

    run = str(tmp_path / "run.h5")
    _counting_run(run)
    with pytest.raises(CollectorError, match=r"holds a run of io\.run_chains"):
        io.HDF5Collector(run)
    assert _counting_run(run)["x"].shape == (2, 4)  # the run, left as it was, is read back


def _counting_run(path: str) -> dict:
    """A run of two chains counting four steps, each kept, checkpointed every two."""
    return io.run_chains(
        path,
        lambda: jnp.zeros(2),
        lambda state, t: (state + 1, {"x": state}, jnp.ones(2, bool)),
        num_steps=4,
        checkpoint_every=2,
    )


def test_a_live_reader_of_a_file_cut_in_its_first_bytes_gets_a_format_error(tmp_path):
    _counting_run(str(tmp_path / "run.h5"))
    data = (tmp_path / "run.h5").read_bytes()
    cut = tmp_path / "cut.h5"
    for length in (14, 28, 42):
        cut.write_bytes(data[:length])
        with pytest.raises(FormatError, match=r"cannot be read .*no writer has it open: the file is damaged"):
            read_draws(str(cut))
