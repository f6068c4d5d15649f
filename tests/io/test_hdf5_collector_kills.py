"""An ``io.save(io.HDF5Collector(file), checkpoint_every=...)`` run in a real process, read by this one while it
writes, killed with SIGKILL before its first checkpoint and after it, and the same code run again; ``file`` an open
``h5py.File``, or a path that the collector opens itself under its writer lock.

The writer samples two chains whose rows are known (chain ``c``'s row ``k`` is ``1000 c + k + 1`` and its negative),
so that every read can be checked row by row. The processes come from a ``multiprocessing`` fork server that has
already imported JAX and jaxstow; a run that is to be killed is slowed by a pause at every step, and the same code
run again goes at full speed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import io
from jaxstow.cli import main
from jaxstow.errors import CheckpointError, CollectorError, FormatError
from jaxstow.io.live import FileDraws, read_draws
from jaxstow.io.swmr import clear_stale_writer, read_superblock

STEPS = 400
CHAINS = 2


def _write(path: str, mode: str, latest: bool, every: int, pause: float, connection: Connection) -> None:
    """The user's code: open the file (mode ``"path"``: give the collector the path), stream every step's sample of
    two chains to it, checkpointing every ``every`` steps; send the step it starts from, then the sample counts."""
    if mode == "path":
        _sample(io.HDF5Collector(path), every, pause, connection)
        return
    with h5py.File(path, mode, **({"libver": "latest"} if latest else {})) as file:
        _sample(io.HDF5Collector(file), every, pause, connection)


def _sample(collector: io.HDF5Collector, every: int, pause: float, connection: Connection) -> None:
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=every, block_size=8)
    information = io.scheduler.static_information(samples_collected=STEPS)
    states = [init_save({"x": jnp.zeros(2)}, jnp.zeros(()), information) for _ in range(CHAINS)]
    resumed = collector.resume()
    start = int(states[0].step)
    x = jnp.array([resumed[c].solver_state if c in resumed else 1000.0 * c for c in range(CHAINS)], jnp.float32)

    def chain(state: Any, x: jax.Array, steps: jax.Array) -> Any:
        def step(carry: Any, _: jax.Array) -> Any:
            state, x = carry
            x = x + 1.0
            if pause:
                jax.debug.callback(lambda: time.sleep(pause))
            state, _ = save(state, True, {"x": jnp.stack([x, -x])}, solver_state=x)
            return (state, x), None

        return jax.lax.scan(step, (state, x), steps)[0]

    connection.send(start)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    state, _ = jax.jit(jax.vmap(chain, in_axes=(0, 0, None)))(stacked, x, jnp.arange(start, STEPS))
    connection.send([int(result["sample_count"]) for result in postprocess_save(state, None)])


def _rows(chain: int, count: int) -> np.ndarray:
    x = 1000.0 * chain + np.arange(1, count + 1, dtype=np.float32)
    return np.stack([x, -x], axis=1)


def _assert_rows(draws: FileDraws) -> None:
    """Every chain's rows are those it sampled, up to the count the file gives."""
    for chain, (variables, done) in enumerate(zip(draws.chains, draws.done, strict=True)):
        np.testing.assert_array_equal(variables["x"], _rows(chain, done), err_msg=f"chain {chain}")


@pytest.fixture(scope="module")
def processes() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["jax", "jax.numpy", "h5py", "jaxstow.io", __name__])
    return context


class Writer:
    """The user's code in a process of its own."""

    def __init__(
        self, context: Any, path: str, mode: str, *, latest: bool, every: int, pause: float, wait: bool = True
    ) -> None:
        receiver, sender = context.Pipe(duplex=False)
        self.process = context.Process(target=_write, args=(path, mode, latest, every, pause, sender))
        self.process.start()
        sender.close()
        self.connection = receiver
        if wait:
            self.start = receiver.recv()  # the step it starts from: the file holds its chains

    def kill(self) -> None:
        assert self.process.is_alive(), "the run ended before it could be killed"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join()
        assert self.process.exitcode == -signal.SIGKILL

    def kill_after(self, delay: float) -> None:
        time.sleep(delay)
        self.kill()

    def finish(self) -> list[int]:
        counts = self.connection.recv()
        self.process.join()
        assert self.process.exitcode == 0
        return counts


def _checkpoint(path: str) -> dict[int, Any]:
    if not os.path.exists(f"{path}.checkpoint.jxs"):
        return {}
    return jaxstow.load(f"{path}.checkpoint.jxs")["chains"]


def _assert_finished_from_scratch_or_continued(path: str, counts: list[int]) -> None:
    assert counts == [STEPS] * CHAINS
    draws = read_draws(path)
    assert draws.finished and draws.done == [STEPS] * CHAINS
    _assert_rows(draws)
    assert not os.path.exists(f"{path}.checkpoint.jxs"), "a finished run leaves no checkpoint behind"


@pytest.mark.timeout(120)
def test_live_reads_while_it_writes_then_a_kill_before_the_first_checkpoint_and_the_same_code_starts_over(
    processes, tmp_path, capsys
):
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "w", latest=True, every=STEPS, pause=0.05)  # its first checkpoint: its end
    reads, failures, seen = 0, [], []
    deadline = time.monotonic() + 30
    while (reads < 50 or not seen or min(seen[-1].done) < 8) and time.monotonic() < deadline:
        try:  # many reads, and some rows written before the kill
            idata = io.to_inference_data(path)
            draws = read_draws(path)
        except Exception as error:  # any failure of a reader counts
            failures.append(repr(error))
        else:
            assert idata.posterior.sizes["chain"] == CHAINS
            seen.append(draws)
        reads += 1
    assert main(["watch", path, "--once", "--json"]) == 0
    watched = json.loads(capsys.readouterr().out)
    assert watched["state"] == "running" and len(watched["chains"]) == CHAINS
    assert not _checkpoint(path), "the run checkpointed before it was killed: slow it down"
    writer.kill()

    assert failures == [], f"{len(failures)} of {reads} reads failed: {failures[:3]}"
    for draws in seen:
        _assert_rows(draws)
    assert [draws.done for draws in seen] == sorted(draws.done for draws in seen), "the counts went back"
    assert read_superblock(path).writer == "a writer in SWMR mode"  # left by the killed writer
    with h5py.File(path, "r", swmr=True) as file:  # h5py opens it as readers of a live file do
        written = [int(count) for count in file["draws_done"][:]]
    after = read_draws(path)
    assert not after.finished and after.done == written and min(written) >= min(seen[-1].done)
    _assert_rows(after)

    writer = Writer(processes, path, "w", latest=True, every=STEPS, pause=0.0)  # the same code, run again
    assert writer.start == 0  # mode "w": it starts over
    _assert_finished_from_scratch_or_continued(path, writer.finish())
    with h5py.File(path, "r") as file:  # closed by its writer: any reader opens it
        assert file["chain~1"].attrs["sample_count"] == STEPS


@pytest.mark.timeout(120)
def test_a_kill_after_a_checkpoint_leaves_the_rows_counted_and_the_same_code_in_mode_a_continues(processes, tmp_path):
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "w", latest=True, every=40, pause=0.01)
    while not _checkpoint(path) or min(read_draws(path).done) < 56:
        time.sleep(0.01)
    writer.kill()
    checkpointed = _checkpoint(path)
    draws = read_draws(path)
    assert min(draws.done) >= min(record["sample_count"] for record in checkpointed.values()) >= 40
    _assert_rows(draws)
    with pytest.raises(OSError, match="already open for write"):  # HDF5's flags of the killed writer
        h5py.File(path, "a", libver="latest")
    assert clear_stale_writer(path)  # what h5clear -s does: no process writes the file
    with h5py.File(path, "r") as file:
        assert list(file["draws_done"][:]) == draws.done

    writer = Writer(processes, path, "a", latest=True, every=40, pause=0.0)  # the same code, opening with "a"
    assert writer.start == checkpointed[0]["step"] > 0  # it continues from the checkpoint
    _assert_finished_from_scratch_or_continued(path, writer.finish())


@pytest.mark.timeout(120)
def test_a_file_opened_without_libver_latest_warns_once_is_refused_to_live_readers_and_survives_kills(
    processes, tmp_path
):
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "w", latest=False, every=STEPS, pause=0.02)
    with pytest.raises(FormatError, match=r"samples\.h5: is locked by its writer.*libver=\"latest\""):
        io.to_inference_data(path)  # not a BlockingIOError: what to do instead
    time.sleep(0.3)
    writer.kill()  # before its first checkpoint
    with h5py.File(path, "r") as file:  # no flags, no lock: opened as any file
        assert list(file["draws_done"][:]) == [0] * CHAINS  # rows are counted at checkpoints only
    assert read_draws(path).done == [0] * CHAINS

    writer = Writer(processes, path, "a", latest=False, every=40, pause=0.01)  # the same code, with "a"
    assert writer.start == 0  # nothing was checkpointed: it starts over
    while not _checkpoint(path):
        time.sleep(0.01)
    time.sleep(0.1)
    writer.kill()  # after a checkpoint
    checkpointed = _checkpoint(path)
    draws = read_draws(path)
    assert min(draws.done) >= min(record["sample_count"] for record in checkpointed.values()) >= 40
    assert all(done % 40 == 0 for done in draws.done)  # the counts of a checkpoint
    _assert_rows(draws)

    writer = Writer(processes, path, "a", latest=False, every=40, pause=0.0)
    assert writer.start == checkpointed[0]["step"] > 0  # it continues
    _assert_finished_from_scratch_or_continued(path, writer.finish())


def _collect(file: h5py.File) -> None:
    collector = io.HDF5Collector(file)
    for _ in range(CHAINS):
        collector.register_chain({"x": np.zeros(2, np.float32)}, np.float32(0), io.scheduler.static_information())
    for first in range(0, 32, 8):
        collector.save_chains({c: (first, [_rows(c, first + 8)[first:]]) for c in range(CHAINS)})
        collector.checkpoint_chains({c: io.ChainCheckpoint(first + 8, first + 8, np.float32(0)) for c in range(CHAINS)})
    for chain in range(CHAINS):
        collector.finalize(chain)


def test_the_warning_comes_once_per_collector_and_only_for_a_file_that_cannot_be_read_live(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with h5py.File(tmp_path / "plain.h5", "w") as file:
            _collect(file)
        with h5py.File(tmp_path / "latest.h5", "w", libver="latest") as file:
            _collect(file)
    live = [warning for warning in caught if issubclass(warning.category, io.LiveReadWarning)]
    assert len(live) == 1, [str(warning.message) for warning in live]
    message = str(live[0].message)
    assert "plain.h5" in message and 'h5py.File(path, "w", libver="latest")' in message
    assert live[0].filename == __file__  # it points at the code that made the collector
    for name in ("plain.h5", "latest.h5"):
        draws = read_draws(tmp_path / name)
        assert draws.finished and draws.done == [32] * CHAINS
        _assert_rows(draws)


def test_a_file_emptied_by_mode_w_drops_the_checkpoint_an_interrupted_run_left(tmp_path):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w", libver="latest") as file:
        collector = io.HDF5Collector(file)
        for _ in range(CHAINS):
            collector.register_chain({"x": np.zeros(2, np.float32)}, np.float32(0), io.scheduler.static_information())
        collector.save_chains({c: (0, [_rows(c, 8)]) for c in range(CHAINS)})
        collector.checkpoint_chains({c: io.ChainCheckpoint(8, 8, np.float32(8)) for c in range(CHAINS)})
        collector.finalize(0)  # the process ends here, killed before the other chain is finalized
    assert _checkpoint(str(path))[1]["sample_count"] == 8
    with h5py.File(path, "w", libver="latest") as file:  # the same code again: mode "w" empties the file
        collector = io.HDF5Collector(file)
        collector.register_chain({"x": np.zeros(2, np.float32)}, np.float32(0), io.scheduler.static_information())
        assert collector.resume() == {} and not os.path.exists(f"{path}.checkpoint.jxs")


@pytest.mark.timeout(120)
def test_a_file_a_killed_run_left_unreadable_before_its_first_checkpoint_is_started_over(processes, tmp_path):
    """Was: refused as damaged ("move it away"), though the run killed while it first wrote the file was ours and
    never checkpointed (h5py: "bad object header version number", as such a kill can leave it)."""
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "path", latest=True, every=STEPS, pause=0.02)
    while min(read_draws(path).done) < 8:
        time.sleep(0.01)
    writer.kill()
    assert not _checkpoint(path) and os.path.exists(f"{path}.lock")
    with open(path, "r+b") as file:  # its object headers, past the superblock, unreadable
        file.seek(64)
        file.write(bytes(range(256)) * 64)
    writer = Writer(processes, path, "path", latest=True, every=STEPS, pause=0.0)  # the same code, run again
    assert writer.start == 0
    _assert_finished_from_scratch_or_continued(path, writer.finish())


@pytest.mark.timeout(120)
def test_the_path_form_killed_at_any_moment_before_its_first_checkpoint_starts_over_when_the_same_code_runs_again(
    processes, tmp_path
):
    path = str(tmp_path / "samples.h5")
    delays = random.Random(7)
    for delay in sorted(delays.uniform(0.0, 1.5) for _ in range(3)):  # while it starts, opens the file, registers
        Writer(processes, path, "path", latest=True, every=STEPS, pause=0.02, wait=False).kill_after(delay)
    writer = Writer(processes, path, "path", latest=True, every=STEPS, pause=0.02)
    assert writer.start == 0
    while min(read_draws(path).done) < 8:
        time.sleep(0.01)
    writer.kill()
    assert read_superblock(path).writer == "a writer in SWMR mode" and os.path.exists(f"{path}.lock")
    assert not _checkpoint(path), "the run checkpointed before it was killed: slow it down"
    _assert_rows(read_draws(path))  # what the killed run left opens, and counts rows it holds

    writer = Writer(processes, path, "path", latest=True, every=STEPS, pause=0.0)  # the same code, run again
    assert writer.start == 0  # no checkpoint: it starts over, clearing the flags the killed run left
    _assert_finished_from_scratch_or_continued(path, writer.finish())
    assert read_superblock(path).writer is None and not os.path.exists(f"{path}.lock")  # closed, lock released


@pytest.mark.timeout(120)
def test_the_path_form_refuses_other_writers_and_clearing_while_it_runs_and_continues_after_a_kill(processes, tmp_path):
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "path", latest=True, every=40, pause=0.01)
    held = rf"samples\.h5 is being written by another run \(process {writer.process.pid}\); one process at a time"
    with pytest.raises(CheckpointError, match=held):
        io.HDF5Collector(path)  # a second writer of the file
    with pytest.raises(CheckpointError, match=held):
        clear_stale_writer(path)  # the flags are a live writer's
    assert read_superblock(path).writer == "a writer in SWMR mode"  # left as they are
    while not _checkpoint(path) or min(read_draws(path).done) < 56:
        time.sleep(0.01)
    writer.kill()
    checkpointed = _checkpoint(path)
    _assert_rows(read_draws(path))
    with pytest.raises(OSError, match="already open for write"):  # the flags the killed writer left
        h5py.File(path, "a", libver="latest")

    writer = Writer(processes, path, "path", latest=True, every=40, pause=0.0)  # the same code; nothing cleared
    assert writer.start == checkpointed[0]["step"] > 0  # it continues from the checkpoint
    _assert_finished_from_scratch_or_continued(path, writer.finish())
    assert not os.path.exists(f"{path}.lock")


def test_the_path_form_refuses_a_file_it_cannot_continue_or_replace_and_changes_nothing(tmp_path):
    other = tmp_path / "notes.h5"
    other.write_bytes(b"not HDF5 at all" * 10)
    with pytest.raises(FormatError, match=r"notes\.h5: is not an HDF5 file"):
        io.HDF5Collector(other)
    assert other.read_bytes() == b"not HDF5 at all" * 10 and sorted(os.listdir(tmp_path)) == ["notes.h5"]

    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w", libver="latest") as file:  # another program writes it, holding no lock
        file["x"] = np.arange(3.0)
        file.flush()
        with pytest.raises(CheckpointError, match=r"foreign\.h5 is open for writing by a writer not in SWMR mode"):
            io.HDF5Collector(foreign)
        assert sorted(os.listdir(tmp_path)) == ["foreign.h5", "notes.h5"]
    with h5py.File(foreign, "r") as file:
        np.testing.assert_array_equal(file["x"][:], np.arange(3.0))

    path = tmp_path / "samples.h5"
    (tmp_path / "samples.h5.checkpoint.jxs").write_bytes(b"of a file that is gone")
    collector = io.HDF5Collector(path)  # a checkpoint without its file: the run starts over
    assert not os.path.exists(tmp_path / "samples.h5.checkpoint.jxs")
    collector.register_chain({"x": np.zeros(2, np.float32)}, np.float32(0), io.scheduler.static_information())
    collector.save(0, 0, [_rows(0, 3)])
    collector.finalize(0)  # the last chain: the file is closed, the lock released
    assert sorted(os.listdir(tmp_path)) == ["foreign.h5", "notes.h5", "samples.h5"]
    np.testing.assert_array_equal(collector.finished(0)["x"], _rows(0, 3))


@pytest.mark.timeout(120)
def test_a_run_whose_checkpoint_is_gone_is_refused_not_started_over_and_continues_once_it_is_back(processes, tmp_path):
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "path", latest=True, every=40, pause=0.01)
    while not _checkpoint(path) or min(read_draws(path).done) < 56:
        time.sleep(0.01)
    writer.kill()
    os.replace(f"{path}.checkpoint.jxs", tmp_path / "elsewhere.jxs")  # deleted, or left behind by a copy of the file
    before = read_draws(path)
    gone = (
        r"samples\.h5 holds the samples of a run that stopped before it finished \(/chain~0, /chain~1 unfinished\), "
        r"checkpointed in .*samples\.h5\.checkpoint\.jxs, which is gone: .*Put the checkpoint back"
    )
    with pytest.raises(CollectorError, match=gone):
        io.HDF5Collector(path)  # the same code run again: it started over, the samples lost
    assert read_superblock(path).writer is None  # it cleared the killed writer's flags, and nothing else
    information = io.scheduler.static_information(samples_collected=STEPS)
    with h5py.File(path, "a", libver="latest") as file, pytest.raises(CollectorError, match=gone):  # jax_sgmc's form
        io.save(io.HDF5Collector(file), checkpoint_every=40)[0]({"x": jnp.zeros(2)}, jnp.zeros(()), information)
    after = read_draws(path)
    assert after.done == before.done and min(after.done) >= 56
    _assert_rows(after)

    os.replace(tmp_path / "elsewhere.jxs", f"{path}.checkpoint.jxs")
    writer = Writer(processes, path, "path", latest=True, every=40, pause=0.0)
    assert writer.start > 0  # it continues from the checkpoint
    _assert_finished_from_scratch_or_continued(path, writer.finish())


@pytest.mark.timeout(120)
def test_a_live_file_killed_before_its_first_checkpoint_is_refused_in_mode_a_and_started_over_in_mode_w(
    processes, tmp_path
):
    path = str(tmp_path / "samples.h5")
    writer = Writer(processes, path, "w", latest=True, every=STEPS, pause=0.02)
    while min(read_draws(path).done) < 8:
        time.sleep(0.01)
    writer.kill()
    assert not _checkpoint(path), "the run checkpointed before it was killed: slow it down"
    assert clear_stale_writer(path)
    before = read_draws(path).done

    # One chain of this run would start over in the killed run's datasets, the other's rows left beside it
    with h5py.File(path, "a", libver="latest") as file:  # h5py's KeyError deleting the chains, before
        init_save, _, _ = io.save(io.HDF5Collector(file), checkpoint_every=40)
        with pytest.raises(CollectorError, match=r"cut short before its first checkpoint.*open the file with mode 'w'"):
            init_save({"x": jnp.zeros(2)}, jnp.zeros(()), io.scheduler.static_information(samples_collected=STEPS))
    assert read_draws(path).done == before  # nothing of the killed run was touched

    writer = Writer(processes, path, "w", latest=True, every=40, pause=0.0)
    assert writer.start == 0
    _assert_finished_from_scratch_or_continued(path, writer.finish())
