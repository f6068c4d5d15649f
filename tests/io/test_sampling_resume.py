"""Checkpointing and resuming a sampling run, with real processes killed by SIGKILL.

A small sampler (a PRNG key and a state in its solver state, a host-side data loader feeding it one batch per step)
streams its samples into an HDF5 file and checkpoints every few steps. It is killed at random moments, restarted
each time, and finally left to finish; the file must then hold exactly the samples of an uninterrupted run. The
processes come from a ``multiprocessing`` fork server that has already imported JAX and jaxstow.
"""

from __future__ import annotations

import functools
import glob
import multiprocessing
import os
import random
import shutil
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxstow
from jaxstow import io, scheduler
from jaxstow.errors import CollectorError, StructureMismatchError

STEPS = 240
SEGMENT = 4  # steps per jit call
EVERY = 8  # steps between checkpoints
BLOCK = 3  # samples per device buffer
DIM = 4
KILLS = 4
INIT_SAMPLE = {"x": jnp.zeros(DIM), "norm": [jnp.float32(0.0)]}


class Feed:
    """A host-side data loader: batch ``n`` is ``sin(n + arange(DIM))``; its position is checkpointed."""

    def __init__(self) -> None:
        self.position = 0

    def next_batch(self) -> np.ndarray:
        batch = np.sin(self.position + np.arange(DIM, dtype=np.float32))
        self.position += 1
        return batch

    def save_state(self, chain_id: int) -> dict[str, int]:
        return {"position": self.position}

    def load_state(self, chain_id: int, data: dict[str, int]) -> None:
        self.position = int(data["position"])


def _step(save, feed: Feed, carry, _):
    saving_state, (key, x) = carry
    key, noise_key, keep_key = jax.random.split(key, 3)
    batch = io_callback(feed.next_batch, jax.ShapeDtypeStruct((DIM,), jnp.float32), ordered=True)
    x = 0.9 * x + jax.random.normal(noise_key, (DIM,)) + 0.1 * batch
    keep = jax.random.uniform(keep_key) < 0.6
    saving_state, _ = save(saving_state, keep, {"x": x, "norm": [jnp.linalg.norm(x)]}, solver_state=(key, x))
    return (saving_state, (key, x)), None


def _sample(collector: io.DataCollector, *, pause: float = 0.0, started=None, stop: int = STEPS) -> Any:
    """Run (or continue) the sampler up to step ``stop``; the samples if the run is complete."""
    feed = Feed()
    collector.register_data_loader(feed)
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=EVERY, block_size=BLOCK)
    solver = (jax.random.key(0), jnp.zeros(DIM))
    saving_state = init_save(INIT_SAMPLE, solver, scheduler.static_information(samples_collected=None))
    resumed = collector.resume()
    if 0 in resumed:
        solver = resumed[0].solver_state
        assert resumed[0].step == int(saving_state.step) == feed.position
    first = int(saving_state.step)
    segment = jax.jit(lambda carry: jax.lax.scan(functools.partial(_step, save, feed), carry, length=SEGMENT)[0])
    carry = (saving_state, solver)
    for begin in range(first, stop, SEGMENT):
        carry = segment(carry)
        if begin == first and started is not None:
            jax.block_until_ready(carry)
            started(first)
        time.sleep(pause)
    return postprocess_save(*carry) if stop == STEPS else None


def _sample_into(path: str, connection: Connection) -> None:
    with h5py.File(path, "a") as file:
        _sample(io.HDF5Collector(file), pause=0.02, started=connection.send)
    connection.send("finished")


@pytest.fixture(scope="module")
def processes() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["jax", "jax.numpy", "h5py", "jaxstow.io", __name__])
    return context


def _start(context, path) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_sample_into, args=(str(path), sender))
    process.start()
    sender.close()
    return process, receiver


def _assert_samples_equal(got: Any, want: Any) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a[:]), np.asarray(b))


@pytest.mark.timeout(120)
def test_a_run_killed_by_sigkill_resumes_and_ends_with_the_samples_of_an_uninterrupted_run(processes, tmp_path) -> None:
    expected = _sample(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"))
    path = tmp_path / "samples.h5"
    starts = []
    moments = random.Random(0)
    for _ in range(KILLS):
        process, receiver = _start(processes, path)
        starts.append(receiver.recv())
        time.sleep(moments.uniform(0.0, 0.3))
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        assert process.exitcode == -signal.SIGKILL, "the run finished before it could be killed"
    process, receiver = _start(processes, path)
    starts.append(receiver.recv())
    assert receiver.recv() == "finished"
    process.join()

    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] > 0, starts
    with h5py.File(path, "r") as file:
        assert file["/chain~0"].attrs["sample_count"] == int(expected["sample_count"])
        _assert_samples_equal([file["/chain~0/norm/list_element_0"], file["/chain~0/x"]], expected["samples"])
    assert not glob.glob(str(tmp_path / "*.checkpoint.jxs")), "a finished run leaves no checkpoint behind"


def test_memory_collector_resumes_from_its_save_dir(tmp_path) -> None:
    expected = _sample(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"))
    _sample(io.MemoryCollector(save_dir=tmp_path / "resumed"), stop=100)  # abandoned midway, as if killed
    record = jaxstow.load(tmp_path / "resumed" / "chain_0.checkpoint.jxs")["checkpoint"]
    assert record["step"] == 96 and record["data_loader_state"] == {"position": 96}
    result = _sample(io.MemoryCollector(save_dir=tmp_path / "resumed"))
    assert int(result["sample_count"]) == int(expected["sample_count"])
    _assert_samples_equal(result["samples"], expected["samples"])
    with np.load(tmp_path / "resumed" / "chain_0.npz") as npz:
        np.testing.assert_array_equal(npz["x"], expected["samples"]["x"])
    assert not (tmp_path / "resumed" / "chain_0.checkpoint.jxs").exists()


def test_memory_collector_refuses_to_replace_the_samples_of_a_finished_run(tmp_path) -> None:
    _sample(io.MemoryCollector(save_dir=tmp_path), stop=STEPS)
    finished = (tmp_path / "chain_0.npz").read_bytes()
    with pytest.raises(CollectorError, match=r"chain_0.npz holds the samples of chain 0 of a finished run"):
        _sample(io.MemoryCollector(save_dir=tmp_path))  # the same script run again, in another process as here
    assert (tmp_path / "chain_0.npz").read_bytes() == finished


def test_an_older_copy_of_the_hdf5_file_beside_a_newer_checkpoint_is_refused(tmp_path) -> None:
    # A copy of a live run that took the file first and the checkpoint later: the rows between would be zeros.
    path = tmp_path / "samples.h5"
    for stop in (20, 60):
        collector = io.HDF5Collector(path)
        _sample(collector, stop=stop)
        collector.close()
        if stop == 20:
            shutil.copy(path, tmp_path / "copy.h5")
    shutil.copy(tmp_path / "copy.h5", path)
    with pytest.raises(StructureMismatchError, match=r"/draws_done: the file counts \d+ samples of chain 0, the check"):
        _sample(io.HDF5Collector(path))


def test_a_run_continued_with_other_samples_is_refused_with_advice_that_keeps_it_resumable(tmp_path) -> None:
    path = tmp_path / "samples.h5"
    collector = io.HDF5Collector(path)
    _sample(collector, stop=20)  # abandoned midway, as if killed
    collector.close()
    other = io.HDF5Collector(path)
    solver = (jax.random.key(0), jnp.zeros(DIM))
    with pytest.raises(StructureMismatchError) as refused:
        io.save(other, checkpoint_every=EVERY)[0]({"x": jnp.zeros(DIM, jnp.float16), "norm": [0.0]}, solver, None)
    other.close()
    assert "/chain~0/x: the file holds float32" in str(refused.value)
    assert "delete" not in str(refused.value.problems[-1])  # what deleting the checkpoint leads to: a run refused
    assert "move both away to start over" in str(refused.value)
    expected = _sample(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"))
    _assert_samples_equal(_sample(io.HDF5Collector(path))["samples"], expected["samples"])  # still resumable


def test_a_checkpoint_that_does_not_match_the_run_is_refused(tmp_path) -> None:
    _sample(io.MemoryCollector(save_dir=tmp_path), stop=20)
    init_save, _, _ = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=EVERY)
    with pytest.raises(
        ValueError, match=r"checkpointed solver state of chain 0 leaf '1' is float32\[4\], expected float32\[5\]"
    ):
        init_save(INIT_SAMPLE, (jax.random.key(0), jnp.zeros(DIM + 1)), scheduler.static_information())


@pytest.mark.parametrize("differs", ["samples", "solver state"])
def test_a_memory_collectors_run_continued_with_other_samples_or_state_says_how_to_continue_or_start_over(
    differs, tmp_path
) -> None:
    _sample(io.MemoryCollector(save_dir=tmp_path), stop=20)  # abandoned midway, as if killed
    sample = {"x": jnp.zeros(DIM + 1), "norm": [0.0]} if differs == "samples" else INIT_SAMPLE
    solver = (jax.random.key(0), jnp.zeros(DIM + (differs == "solver state")))
    init_save = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=EVERY)[0]
    with pytest.raises(StructureMismatchError) as refused:
        init_save(sample, solver, scheduler.static_information())
    assert "float32[5]" in str(refused.value) or "float32[*, 5]" in str(refused.value)
    assert refused.value.problems[-1].startswith("the stopped run was started with other samples or another solver")
    assert "move its samples and checkpoints away together to start over" in str(refused.value)
    expected = _sample(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"))
    _assert_samples_equal(_sample(io.MemoryCollector(save_dir=tmp_path))["samples"], expected["samples"])


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
def test_resume_called_before_init_save_on_a_stopped_run_is_refused_not_an_empty_answer(kind, tmp_path) -> None:
    def collector() -> io.DataCollector:
        return io.HDF5Collector(tmp_path / "samples.h5") if kind == "hdf5" else io.MemoryCollector(tmp_path / "run")

    stopped = collector()
    _sample(stopped, stop=20)  # abandoned midway, as if killed
    stopped.close()
    early = collector()
    with pytest.raises(
        CollectorError, match=r"collector\.resume\(\) was called before init_save .*call init_save first"
    ):
        early.resume()  # {} would let the caller start its solver anew while the chains go on from step 16
    early.close()
    expected = _sample(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"))
    _assert_samples_equal(_sample(collector())["samples"], expected["samples"])  # init_save, then resume: continued
    assert io.MemoryCollector(tmp_path / "elsewhere").resume() == {}
