"""``jaxstow watch`` on real runs: one that finished, one that runs, one whose writer was killed (SIGKILL) and one
stopped by Ctrl-C (SIGINT), each run by ``io.run_chains`` in a process of its own and watched by the real command."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import forked
import jax
import jax.numpy as jnp
import pytest

from jaxstow import io
from jaxstow.cli import main
from jaxstow.io.live import read_draws

if importlib.util.find_spec("arviz") is None:
    pytest.skip("jaxstow watch needs ArviZ (the arviz extra)", allow_module_level=True)

_RUN = """
import sys, jax, jax.numpy as jnp
from jaxstow import io

def start():
    return {"x": jnp.zeros(2), "key": jax.random.key_data(jax.random.split(jax.random.key(0), 2))}

def step(state, t):
    keys = jax.vmap(jax.random.split)(state["key"])
    x = 0.9 * state["x"] + jax.vmap(jax.random.normal)(keys[:, 1])
    x = jax.lax.fori_loop(0, 20_000, lambda i, x: x + 1e-9 * jnp.sin(x + i), x)  # a step's work
    return {"x": x, "key": keys[:, 0]}, {"x": x}, jnp.ones(2, bool)

io.run_chains(sys.argv[1], start, step, num_steps=int(sys.argv[2]), checkpoint_every=50)
"""


def _start_run(path: Path) -> subprocess.Popen[str]:
    """A long run (a million steps) in a process of its own, once it has written and checkpointed some draws."""
    process = forked.Popen([sys.executable, "-c", textwrap.dedent(_RUN), str(path), "1000000"], text=True)
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, "the run ended before it was watched"
        assert time.monotonic() < deadline, "the run wrote no draws in 120 s"
        try:
            if Path(f"{path}.checkpoint.jxs").exists() and min(read_draws(str(path)).done) >= 100:
                return process
        except Exception:  # the file is still being created
            pass
        time.sleep(0.05)


def _watch(*args: object) -> subprocess.CompletedProcess[str]:
    return forked.run(
        [sys.executable, "-m", "jaxstow", "watch", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def _watch_here(capsys: pytest.CaptureFixture[str], *args: object) -> subprocess.CompletedProcess[str]:
    """``jaxstow watch ARGS`` run by the command's entry point in this process, which has ArviZ imported once, where
    each process forked from the server imports it anew: what it prints and its exit status, as from ``_watch``."""
    status = main(["watch", *map(str, args)])
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(["jaxstow", "watch", *map(str, args)], status, printed.out, printed.err)


def _watching(path: Path, *, interval: float) -> subprocess.Popen[str]:
    """``jaxstow watch --json`` started on ``path``, its output and errors piped."""
    command = [sys.executable, "-m", "jaxstow", "watch", str(path), "--json", "--interval", str(interval)]
    return forked.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_watched_run_whose_writer_is_killed_is_told_dead_and_the_watch_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "walk.h5"
    run = _start_run(path)
    watcher = _watching(path, interval=0.2)
    try:
        assert watcher.stdout is not None
        first = json.loads(watcher.stdout.readline())
        assert first["state"] == "running" and first["why"] is None and min(c["draws"] for c in first["chains"]) > 0
        once = _watch_here(capsys, path, "--once")
        assert once.returncode == 0, once.stderr
        assert once.stdout.startswith(f"{path}: running, 2 chains\nchain  draws  state\n")
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        output, errors = watcher.communicate(timeout=60)  # it ends: it used to say "running" for ever
    finally:
        for process in (run, watcher):
            process.kill()
            process.wait()
    assert watcher.returncode == 1, errors
    last = json.loads(output.splitlines()[-1])
    assert last["state"] == "died"
    assert (
        last["why"].startswith(f"its writer, process {run.pid} on host ")
        and "ended before the run finished" in (last["why"])
    )
    assert [chain["draws"] for chain in last["chains"]] == read_draws(str(path)).done

    shown = _watch_here(capsys, path, "--once")
    assert shown.returncode == 1, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{path}: died, 2 chains"
    assert lines[1].startswith(f"  its writer, process {run.pid} on host ") and "run it again to continue" in lines[1]
    assert lines[2].split() == ["chain", "draws", "state"] and lines[3].split()[-1] == "died"

    lock = Path(f"{path}.lock")  # the lock file a writer on another host (a shared file system) would have left
    lock.write_text(json.dumps({**json.loads(lock.read_text()), "host": "another-host"}))
    elsewhere = json.loads(_watch_here(capsys, path, "--once", "--json").stdout)
    assert elsewhere["state"] == "running"  # no telling from here


def test_a_killed_run_whose_writer_s_process_id_now_names_another_process_is_told_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "walk.h5"
    run = _start_run(path)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    unrelated = subprocess.Popen(["sleep", "600"])  # the process id the lock names, given to another program
    try:
        lock = Path(f"{path}.lock")
        lock.write_text(json.dumps({**json.loads(lock.read_text()), "pid": unrelated.pid}))
        shown = _watch_here(capsys, path, "--once", "--json")
    finally:
        unrelated.kill()
        unrelated.wait()
    assert shown.returncode == 1, shown.stderr
    report = json.loads(shown.stdout)
    assert report["state"] == "died" and report["why"].startswith(f"its writer, process {unrelated.pid} on host ")


def test_a_copy_of_a_run_in_progress_is_told_stopped_as_a_copy_not_its_writer_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, copy = tmp_path / "walk.h5", tmp_path / "copy" / "walk.h5"
    run = _start_run(path)
    try:
        copy.parent.mkdir()
        for suffix in ("", ".lock"):  # cp -r of the run's folder, its writer still writing
            shutil.copy(f"{path}{suffix}", f"{copy}{suffix}")
        shown = _watch_here(capsys, copy, "--once", "--json")
        original = json.loads(_watch_here(capsys, path, "--once", "--json").stdout)
    finally:
        run.kill()
        run.wait()
    assert shown.returncode == 1, shown.stderr
    report = json.loads(shown.stdout)  # it said "died": "its writer ... ended before the run finished"
    assert report["state"] == "stopped", report
    assert report["why"].startswith(f"a copy of a run in progress when it was copied: its writer, process {run.pid}")
    assert original["state"] == "running"


def test_a_run_stopped_by_ctrl_c_is_told_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "walk.h5"
    run = _start_run(path)
    run.send_signal(signal.SIGINT)
    run.wait(timeout=60)
    assert not Path(f"{path}.lock").exists()  # released: the writer ended on its own terms
    shown = _watch_here(capsys, path, "--once", "--json")
    assert shown.returncode == 1, shown.stderr
    report = json.loads(shown.stdout)
    assert report["state"] == "stopped" and "its writer closed it before every chain finished" in report["why"]
    assert [chain["draws"] for chain in report["chains"]] == read_draws(str(path)).done


def test_a_finished_run_is_told_finished(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def start() -> dict[str, jax.Array]:
        return {"x": jnp.array([0.0, 1.0])}

    def step(state: dict[str, jax.Array], t: jax.Array) -> tuple[dict[str, jax.Array], dict[str, jax.Array], jax.Array]:
        return {"x": state["x"] + 1}, {"x": state["x"]}, jnp.ones(2, bool)

    path = str(tmp_path / "walk.h5")
    io.run_chains(path, start, step, num_steps=20, checkpoint_every=5)
    assert main(["watch", path, "--once", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "finished" and report["why"] is None
    assert [chain["draws"] for chain in report["chains"]] == [20, 20]
    assert main(["watch", path]) == 0  # without --once: it ends at once
    assert capsys.readouterr().out.startswith(f"{path}: finished, 2 chains\n")


def test_draws_of_bfloat16_complex_and_nan_are_summarized_in_valid_json(tmp_path: Path, capsys) -> None:
    # bfloat16 made ArviZ's diagnostics fail; a complex mean lost its imaginary part; a NaN mean was not JSON.
    def start() -> dict[str, jax.Array]:
        return {"t": jnp.zeros(2)}

    def step(state: dict[str, jax.Array], t: jax.Array) -> tuple[dict[str, jax.Array], dict[str, jax.Array], jax.Array]:
        x = state["t"] + jnp.array([0.0, 0.5])
        draws = {"b": x.astype(jnp.bfloat16), "z": x + 2j * x, "n": jnp.where(t == 3, jnp.nan, x)}
        return {"t": state["t"] + 1}, draws, jnp.ones(2, bool)

    path = str(tmp_path / "kinds.h5")
    io.run_chains(path, start, step, num_steps=8, checkpoint_every=4)
    assert main(["watch", path, "--once", "--json"]) == 0
    rows = {
        row["variable"]: row for row in json.loads(capsys.readouterr().out, parse_constant=pytest.fail)["variables"]
    }
    assert sorted(rows) == ["b", "n", "z.imag", "z.real"]
    assert rows["b"]["mean"] == pytest.approx(3.75) and rows["b"]["ess_bulk"] is not None
    assert (rows["z.real"]["mean"], rows["z.imag"]["mean"]) == (pytest.approx(3.75), pytest.approx(7.5))
    assert rows["n"]["mean"] is None
    assert main(["watch", path, "--once"]) == 0
    assert any(line.split()[:2] == ["n", "-"] for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize(
    "kind", ["a jaxstow file", "a text file", "an HDF5 file of something else", "a FIFO", "a folder"]
)
def test_watching_a_file_that_never_becomes_a_run_ends_at_once(tmp_path: Path, kind: str) -> None:
    import h5py
    import numpy as np

    import jaxstow

    path = tmp_path / "wrong"
    if kind == "a jaxstow file":
        jaxstow.save(path, {"x": np.ones(3)})
    elif kind == "a text file":
        path.write_text("draws\n")
    elif kind == "a FIFO":
        os.mkfifo(path)  # opened to be read, it would wait for a writer: never
    elif kind == "a folder":
        path.mkdir()
    else:
        with h5py.File(path, "w") as file:
            file["x"] = np.ones(3)
    shown = _watch(path, "--interval", "0.1")  # it used to wait for ever, saying "waiting"
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr.startswith(f"jaxstow watch: {path}: ") and "Traceback" not in shown.stderr
    expected = {"an HDF5 file of something else": "holds no /chain~{id} group", "a FIFO": "is a FIFO (a named pipe)"}
    assert {**expected, "a folder": "is a folder"}.get(kind, "is not an HDF5 file") in shown.stderr
    once = _watch(path, "--once")
    assert once.returncode == 2 and once.stderr == shown.stderr


def test_watching_waits_for_a_file_not_there_yet_or_held_by_its_writer(tmp_path: Path) -> None:
    import h5py
    import numpy as np

    path = tmp_path / "walk.h5"
    watcher = _watching(path, interval=0.1)
    try:
        assert watcher.stdout is not None
        assert json.loads(watcher.stdout.readline())["state"].startswith("waiting: ")  # no file yet
        with h5py.File(path, "w") as file:  # a writer that holds HDF5's lock on it: no one else may read it yet
            file["x"] = np.ones(3)
            file.flush()
            states = [json.loads(watcher.stdout.readline())["state"] for _ in range(50)]  # 5 s of refreshes
            assert all(state.startswith("waiting: ") for state in states)
            assert "is locked by its writer" in states[-1]
        with h5py.File(path, "w"):
            pass  # no writer, and no run: it never becomes one
        _, errors = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
        watcher.wait()
    assert watcher.returncode == 2 and "holds no /chain~{id} group" in errors


@pytest.mark.parametrize("interval", ["-1", "nan", "inf", "0", "two"])
def test_an_interval_that_is_no_time_between_refreshes_is_refused_at_once(tmp_path, interval, capsys) -> None:
    # It was taken, and the watch ended after its first refresh with "sleep length must be non-negative".
    with pytest.raises(SystemExit) as exited:
        main(["watch", str(tmp_path / "samples.h5"), "--interval", interval])
    assert exited.value.code == 2
    assert "is no number of seconds from 0.01 to 86400" in capsys.readouterr().err


def test_a_killed_run_in_a_file_the_program_opened_itself_is_not_told_plainly_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Such a file holds no writer lock of jaxstow's: whether its writer lives cannot be told, and watch says so."""
    path = tmp_path / "own.h5"
    program = """
    import os, signal, sys, h5py, jax, jax.numpy as jnp
    from jaxstow import io, scheduler
    collector = io.HDF5Collector(h5py.File(sys.argv[1], "w", libver="latest"))
    init_save, save, _ = io.save(collector, checkpoint_every=10)
    state = init_save({"x": jnp.zeros(2)}, None, scheduler.static_information(samples_collected=1000))
    step = lambda state, t: (save(state, True, {"x": jnp.full(2, t, jnp.float32)})[0], None)
    jax.block_until_ready(jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(50))[0])(state))
    os.kill(os.getpid(), signal.SIGKILL)
    """
    killed = forked.run([sys.executable, "-c", textwrap.dedent(program), str(path)], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    report = json.loads(_watch_here(capsys, path, "--once", "--json").stdout)
    assert report["state"] == "running"
    assert "a writer has it open, or had it and was killed" in report["why"]
    assert "HDF5Collector(path) takes one" in report["why"]


def test_a_run_whose_writer_ends_just_after_its_draws_were_read_is_shown_with_all_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draws are read, the writer writes more and is killed, then its death is found: the report of the ended run
    shows every draw it wrote, not the count read before."""
    from jaxstow.cli import watch

    def start() -> dict[str, jax.Array]:
        return {"x": jnp.array([0.0, 1.0])}

    def step(state: dict[str, jax.Array], t: jax.Array) -> tuple[dict[str, jax.Array], dict[str, jax.Array], jax.Array]:
        return {"x": state["x"] + 1}, {"x": state["x"]}, jnp.ones(2, bool)

    path = str(tmp_path / "walk.h5")
    io.run_chains(path, start, step, num_steps=20, checkpoint_every=5)
    written = read_draws(path)
    read_early = dataclasses.replace(
        written,
        chains=[{name: rows[:10] for name, rows in chain.items()} for chain in written.chains],
        done=[10, 10],
        finished=False,
    )
    reads = iter([read_early])
    monkeypatch.setattr(watch, "read_draws", lambda source: next(reads, None) or read_draws(source))
    monkeypatch.setattr(watch, "_writer_state", lambda source: ("died", "its writer was killed"))
    report = watch.report(path)
    assert [chain["draws"] for chain in report["chains"]] == [20, 20]
