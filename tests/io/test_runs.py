"""``io.run_chains`` and ``jaxstow watch``: a run's file read from other processes while it goes on, and bad input.

The sampler is a random walk in plain JAX (quick to compile); the runs that must be interrupted run in processes of
a ``multiprocessing`` fork server that has imported JAX and jaxstow, and are killed with SIGKILL. Every refused call
must leave the run's files byte for byte as they were.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import forked
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io
from jaxstow.cli import main
from jaxstow.errors import ArgumentError, CheckpointError, CollectorError, FormatError, StructureMismatchError
from jaxstow.io.hdf5_layout import RUN_ATTRIBUTE

STEPS = 1000
EVERY = 100
WORK = 20_000


def walk(seed: int = 0, chains: int = 2, velocity: bool = False, wide: bool = False) -> tuple[Any, Any]:
    """``start`` and ``step`` of a random walk per chain (with a velocity in its state, or a second variable drawn)."""

    def start() -> dict[str, jax.Array]:
        state = {"x": jnp.zeros(chains), "key": jax.random.key_data(jax.random.split(jax.random.key(seed), chains))}
        return {**state, "v": jnp.zeros(chains)} if velocity else state

    def step(state: dict[str, jax.Array], t: jax.Array) -> tuple[Any, Any, jax.Array]:
        keys = jax.vmap(jax.random.split)(state["key"])
        x = 0.95 * state["x"] + jax.vmap(jax.random.normal)(keys[:, 1])
        x = jax.lax.fori_loop(0, WORK, lambda i, x: x + 1e-9 * jnp.sin(x + i), x)  # a step's work: ~0.3 ms
        draws = {"x": x, "t": jnp.full(chains, t)}
        if wide:
            draws["x2"] = x**2
        return {**state, "x": x, "key": keys[:, 0]}, draws, jnp.ones(chains, bool)

    return start, step


def run(path: str, seed: int = 0, chains: int = 2, velocity: bool = False, wide: bool = False) -> Any:
    return io.run_chains(
        path, *walk(seed, chains, velocity, wide), num_steps=STEPS, checkpoint_every=EVERY, identity={"seed": seed}
    )


@pytest.fixture(scope="module")
def processes() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["jax", "jax.numpy", "h5py", "jaxstow.io", __name__])
    return context


def _checkpoint_mark(path: str) -> Any:
    """Which checkpoint the file is: its inode and time (a new checkpoint's file may get a freed inode number back)."""
    try:
        status = os.stat(f"{path}.checkpoint.jxs")
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns


def _killed_after_a_checkpoint(processes: Any, path: str) -> None:
    """Start ``run(path)`` in a process and kill it once it has checkpointed past its start."""
    process = processes.Process(target=run, args=(path,))
    process.start()
    seen = []
    while len(seen) < 3:  # the checkpoint of the start, then two more
        assert process.is_alive(), "the run ended before it could be killed"
        mark = _checkpoint_mark(path)
        if mark is not None and mark not in seen:
            seen.append(mark)
        time.sleep(0.002)
    os.kill(process.pid, signal.SIGKILL)
    process.join()


def _fingerprint(folder: Path) -> dict[str, str]:
    return {item.name: hashlib.sha256(item.read_bytes()).hexdigest() for item in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def killed_run(processes, tmp_path_factory) -> Path:
    """The folder of a run killed midway: its file, its checkpoint and the lock file it left."""
    folder = tmp_path_factory.mktemp("killed")
    _killed_after_a_checkpoint(processes, str(folder / "walk.h5"))
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 1}, r"walk.h5 holds a run started with seed=0, but this call gives seed=1"),
        ({"chains": 3}, r"walk.h5 holds a run started with chains=2, but this call gives chains=3"),
        (
            {"velocity": True},
            r"walk.h5.checkpoint.jxs does not fit .*\n  - checkpointed solver state of chain 0 has 2 leaves, the "
            r"run's has 3 \(key, v, x\)",
        ),
        ({"wide": True}, r"walk.h5 does not fit .*\n  - /chain~0/x2: the run samples float32\[\*\], the file does not"),
    ],
)
def test_a_call_that_does_not_continue_the_run_is_refused_and_writes_nothing(killed_run, change, message):
    before = _fingerprint(killed_run)
    error = CheckpointError if set(change) & {"seed", "chains"} else StructureMismatchError
    with pytest.raises(error, match=message) as raised:
        run(str(killed_run / "walk.h5"), **change)
    assert raised.value.file is not None and raised.value.file.startswith(str(killed_run / "walk.h5"))
    assert _fingerprint(killed_run) == before


def test_the_killed_run_continues_to_the_draws_of_an_uninterrupted_run(killed_run, tmp_path):
    continued = shutil.copytree(killed_run, tmp_path / "continued")  # the module's other tests need it killed
    draws = run(str(continued / "walk.h5"))
    expected = run(str(tmp_path / "uninterrupted.h5"))
    for name in expected:
        np.testing.assert_array_equal(draws[name], expected[name])
    np.testing.assert_array_equal(draws["t"][0], np.arange(STEPS))  # every step once: none twice, none lost
    assert sorted(os.listdir(continued)) == ["walk.h5"]


def test_a_killed_run_whose_checkpoint_is_gone_is_refused_and_continues_once_it_is_back(killed_run, tmp_path):
    folder = shutil.copytree(killed_run, tmp_path / "copied")  # the module's other tests need it killed
    (folder / "walk.h5.checkpoint.jxs").rename(tmp_path / "elsewhere.jxs")  # deleted, or left behind by a copy
    before = _fingerprint(folder)
    gone = r"walk\.h5 holds the samples of a run that stopped before it finished \(/chain~0, /chain~1 unfinished\), "
    with pytest.raises(CollectorError, match=gone + r"checkpointed in .*walk\.h5\.checkpoint\.jxs, which is gone"):
        run(str(folder / "walk.h5"))  # h5py's KeyError and RuntimeError, the file left open for write
    assert _fingerprint(folder) == before
    (tmp_path / "elsewhere.jxs").rename(folder / "walk.h5.checkpoint.jxs")
    draws, expected = run(str(folder / "walk.h5")), run(str(tmp_path / "uninterrupted.h5"))
    np.testing.assert_array_equal(draws["x"], expected["x"])


def test_files_that_hold_no_such_run_are_left_alone(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as file:
        file["chain~0/theta"] = np.ones((3, 2))
    before = _fingerprint(tmp_path)
    with pytest.raises(CheckpointError, match=r"other.h5 exists but holds no run of jaxstow.io"):
        run(str(other))
    with h5py.File(tmp_path / "damaged.h5", "w", libver="latest") as file:
        file.attrs[RUN_ATTRIBUTE] = "[" * 100_000  # a run's record that is none
    with pytest.raises(CheckpointError, match=r"damaged.h5's .* attribute is not the record of a run"):
        run(str(tmp_path / "damaged.h5"))
    before = _fingerprint(tmp_path)
    (tmp_path / "not-hdf5.h5").write_bytes(b"just bytes" * 100)
    with pytest.raises(FormatError, match=r"not-hdf5.h5: is not an HDF5 file"):
        run(str(tmp_path / "not-hdf5.h5"))
    assert _fingerprint(tmp_path) == {**before, "not-hdf5.h5": _fingerprint(tmp_path)["not-hdf5.h5"]}

    with (
        h5py.File(tmp_path / "open.h5", "w", libver="latest"),  # another program writes it
        pytest.raises(CheckpointError, match=r"open.h5 is open for writing by a writer not in SWMR mode"),
    ):
        run(str(tmp_path / "open.h5"))


def test_an_hdf5_collector_refuses_a_file_of_other_samples_naming_each_variable(tmp_path):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w") as file:
        init_save, save, postprocess_save = io.save(io.HDF5Collector(file))
        state = init_save({"w": jnp.zeros(3), "b": 0.0}, None, io.scheduler.static_information())
        postprocess_save(save(state, True, {"w": jnp.ones(3), "b": 1.0})[0], None)
    before = _fingerprint(tmp_path)
    with h5py.File(path, "a") as file, pytest.raises(StructureMismatchError) as raised:
        io.HDF5Collector(file).register_chain({"w": jnp.zeros(4), "c": 0}, None, io.scheduler.static_information())
    problems = raised.value.problems
    assert "/chain~0/w: the file holds float32[1, 3], the run samples float32[*, 4]" in problems
    assert "/chain~0/c: the run samples int32[*], the file does not hold it" in problems
    assert "/chain~0/b: the file holds float32[1], the run does not sample it" in problems
    assert raised.value.file == str(path)
    assert _fingerprint(tmp_path) == before


def test_one_writer_at_a_time(processes, tmp_path):
    path = str(tmp_path / "walk.h5")
    process = processes.Process(target=run, args=(path,))
    process.start()
    try:
        while _checkpoint_mark(path) is None:
            assert process.is_alive()
            time.sleep(0.01)
        with pytest.raises(CheckpointError, match=r"walk.h5 is being written by another run \(process \d+\)"):
            run(path)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join()


#: ``jaxstow watch FILE --once --json``, then ``jaxstow watch FILE --once`` where rich is not installed, in one process:
#: their exit statuses and outputs, as JSON.
_WATCH_JSON_THEN_PLAIN = """
import contextlib, importlib.abc, io, json, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "rich":
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Blocker())
from jaxstow.cli import main
ran = []
for options in (["--once", "--json"], ["--once"]):
    with contextlib.redirect_stdout(io.StringIO()) as output:
        status = main(["watch", sys.argv[1], *options])
    ran.append((status, output.getvalue()))
print(json.dumps(ran))
"""


def _watch(path: str, *options: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    script = "import sys; from jaxstow.cli import main; sys.exit(main(sys.argv[1:]))"
    return forked.run(
        [sys.executable, "-c", script, "watch", path, *options], capture_output=True, text=True, timeout=120, **kwargs
    )


def test_other_processes_read_the_draws_so_far_while_the_run_goes_on(processes, tmp_path):
    path = str(tmp_path / "walk.h5")
    process = processes.Process(target=run, args=(path,))
    process.start()
    marks = {None}
    while len(marks) < 3:  # the checkpoint of the start, then another
        assert process.is_alive()
        marks.add(_checkpoint_mark(path))
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGSTOP)  # the run holds still, wherever it is, while it is read
    try:
        idata = io.to_inference_data(path)  # this process reads while the run writes
        watched = forked.run(  # another process reads it, `jaxstow watch --once --json`, then without rich
            [sys.executable, "-c", _WATCH_JSON_THEN_PLAIN, path], capture_output=True, text=True, timeout=120
        )
    finally:
        os.kill(process.pid, signal.SIGCONT)
    process.join()
    assert process.exitcode == 0
    final = run(path)

    draws = idata.posterior.sizes["draw"]
    assert 0 < draws < STEPS
    np.testing.assert_array_equal(idata.posterior["x"].values, final["x"][:, :draws])
    assert watched.returncode == 0, watched.stderr
    (json_status, json_output), (plain_status, plain_output) = json.loads(watched.stdout)
    assert json_status == 0, watched.stderr
    report = json.loads(json_output)
    assert report["state"] == "running" and [chain["draws"] for chain in report["chains"]] == [draws, draws]
    assert [row["variable"] for row in report["variables"]] == ["t", "x"]
    assert report["variables"][0]["mean"] == (draws - 1) / 2  # t = 0, 1, ... over the draws so far
    assert plain_status == 0, watched.stderr
    assert plain_output.startswith(f"{path}: running, 2 chains\nchain  draws  state\n0  ")
    assert "\nvariable  " in plain_output and "r_hat  ess_bulk\n" in plain_output


def test_watch_refreshes_until_ctrl_c_and_says_what_is_missing(processes, killed_run, tmp_path):
    missing = _watch(str(tmp_path / "none.h5"), "--once")
    assert missing.returncode == 2 and "none.h5" in missing.stderr
    path = str(tmp_path / "walk.h5")
    process = processes.Process(target=run, args=(path,))
    process.start()
    while _checkpoint_mark(path) is None:
        assert process.is_alive()
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGSTOP)  # the run holds still, alive, its lock held: it goes on for the watcher
    try:
        watcher = forked.Popen(
            [sys.executable, "-m", "jaxstow", "watch", path, "--interval", "0.1"], stdout=subprocess.PIPE, text=True
        )
        assert watcher.stdout is not None
        headers = 0
        while headers < 2:
            line = watcher.stdout.readline()
            assert line, "watch ended by itself"
            headers += line == f"{path}: running, 2 chains\n"
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=60)
        assert watcher.returncode == 0
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join()
    killed = _watch(str(killed_run / "walk.h5"))  # a run whose writer was killed: watching it ends at once
    assert killed.returncode == 1 and killed.stdout.startswith(f"{killed_run / 'walk.h5'}: died, 2 chains\n")


def test_watch_and_to_inference_data_of_a_finished_run(tmp_path, capsys):
    path = str(tmp_path / "walk.h5")
    final = io.run_chains(path, *walk(), num_steps=60, checkpoint_every=25)
    assert main(["watch", path, "--json"]) == 0  # a finished run: printed once, then watch ends
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "finished" and [chain["draws"] for chain in report["chains"]] == [60, 60]
    x = next(row for row in report["variables"] if row["variable"] == "x")
    assert x["mean"] == pytest.approx(float(np.mean(final["x"])), rel=1e-5)
    assert x["r_hat"] is not None and x["ess_bulk"] is not None
    np.testing.assert_array_equal(io.to_inference_data(path).posterior["x"].values, final["x"])
    assert os.listdir(tmp_path) == ["walk.h5"]


def _counting(keep: Any) -> tuple[Any, Any]:
    """``start`` and ``step`` of two chains that draw the step's number, kept where ``keep(t)`` says."""

    def start() -> dict[str, jax.Array]:
        return {"t": jnp.zeros(2, jnp.int32)}

    def step(state: dict[str, jax.Array], t: jax.Array) -> tuple[Any, Any, Any]:
        return {"t": state["t"] + 1}, {"t": jnp.full(2, t)}, keep(t)

    return start, step


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_])
def test_keep_flags_of_integers_keep_where_they_are_nonzero(tmp_path, dtype):
    start, step = _counting(lambda t: jnp.full(2, (t % 3 == 0) * 2).astype(dtype))
    draws = io.run_chains(str(tmp_path / "every3.h5"), start, step, num_steps=23, checkpoint_every=5)
    np.testing.assert_array_equal(draws["t"], np.tile(np.arange(0, 23, 3), (2, 1)))


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        (lambda t: t % 3 == 0, r"one flag per chain, shape \(2,\), got shape \(\)"),
        (lambda t: jnp.ones(3, bool), r"one flag per chain, shape \(2,\), got shape \(3,\)"),
        (lambda t: jnp.ones(2, jnp.float32), "booleans .* got dtype float32"),
    ],
    ids=["one-flag-for-all-chains", "a-flag-too-many", "floats"],
)
def test_keep_flags_that_are_not_one_boolean_per_chain_are_refused(tmp_path, keep, message):
    path = tmp_path / "refused.h5"
    with pytest.raises(ArgumentError, match=message):
        io.run_chains(str(path), *_counting(keep), num_steps=10, checkpoint_every=5)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    ("answer", "got"),
    [(lambda state, t: (state + 1, {"x": state}), "a tuple of 2"), (lambda state, t: state + 1, "one value")],
    ids=["state-and-draws-without-keep", "state-alone"],
)
def test_a_step_that_does_not_return_state_draws_and_keep_is_refused_by_name(tmp_path, answer, got):
    with pytest.raises(ArgumentError, match=rf"step must return \(state, draws, keep\), got ({got})"):
        io.run_chains(str(tmp_path / "walk.h5"), lambda: jnp.zeros(2), answer, num_steps=4, checkpoint_every=2)
    assert not os.listdir(tmp_path)


def _small_run(path: str) -> Any:
    def step(state: jax.Array, t: jax.Array) -> tuple[Any, Any, jax.Array]:
        return state + 1, {"x": state, "t": jnp.full(2, t)}, jnp.ones(2, bool)

    return io.run_chains(path, lambda: jnp.zeros(2), step, num_steps=8, checkpoint_every=4)


def test_a_finished_runs_file_that_lost_a_chain_or_holds_one_of_another_shape_is_refused(tmp_path):
    path = str(tmp_path / "walk.h5")
    _small_run(path)
    with h5py.File(path, "a") as file:
        del file["chain~1"]  # as a damaged copy, or a hand edit, leaves it
    with pytest.raises(CheckpointError, match=r"walk\.h5 holds the draws of 1 chains, but its run has 2"):
        _small_run(path)
    other = str(tmp_path / "other.h5")
    _small_run(other)
    with h5py.File(other, "a") as file:
        del file["chain~1/x"]
        file["chain~1/x"] = np.zeros((8, 2), np.float32)
    with pytest.raises(FormatError, match=r"chain 1's draws of 'x' are float32\[2\], chain 0's float32\[\]"):
        io.live.read_stacked(other)
    assert main(["watch", "--once", other]) == 2  # one line naming the file, no traceback


def test_a_step_that_keeps_no_arrays_is_refused_before_the_run(tmp_path):
    with pytest.raises(ArgumentError, match=r"step keeps no arrays in its draws"):
        io.run_chains(
            str(tmp_path / "none.h5"),
            lambda: jnp.zeros(2),
            lambda state, t: (state, {}, jnp.ones(2, bool)),
            num_steps=4,
            checkpoint_every=2,
        )
    assert not (tmp_path / "none.h5").exists()
