"""The garbage collector's pause: taken only while every other thread is one of jaxstow's own, off inside every pause,
back as it was when the last one ends, however the pauses nest, overlap across threads or end with an error; taken by
a save, never by a load.

Whether a pause is taken depends on every thread of the process, so the cases that take one run in a fresh process,
which has no thread left over from other tests."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import jaxstow
from jaxstow._util.gc_pause import gc_paused


@pytest.fixture(autouse=True)
def collector_enabled() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


_ALONE = """
import threading, jax
jax.devices()  # jax starts, and cancels, a timer thread of its own while its backend starts
for thread in threading.enumerate():
    if thread is not threading.current_thread():
        thread.join()
"""


def _run(program: str, *arguments: str) -> str:
    """Run ``program`` in a fresh process, where the only thread is the one that runs it."""
    process = subprocess.run(
        [sys.executable, "-c", _ALONE + textwrap.dedent(program), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    return process.stdout


def test_pauses_nest_and_end_as_the_collector_was() -> None:
    program = """
    import gc
    from jaxstow._util.gc_pause import gc_paused, with_gc_paused

    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()

    try:
        with gc_paused():
            raise KeyError("x")
    except KeyError:
        assert gc.isenabled()

    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()
    gc.enable()

    @with_gc_paused
    def collecting(value):
        "Whether the collector runs."
        return gc.isenabled(), value

    print(collecting(3), collecting.__doc__, gc.isenabled())
    """
    assert _run(program) == "(False, 3) Whether the collector runs. True\n"


def test_a_pause_of_the_users_thread_ends_with_it_whatever_jaxstows_threads_do() -> None:
    program = """
    import gc, threading
    from jaxstow._util.gc_pause import gc_paused

    entered, may_leave = threading.Event(), threading.Event()

    def writer():  # a thread of jaxstow's, which takes no pause of its own while the user's thread runs
        with gc_paused():
            entered.set()
            assert may_leave.wait(timeout=10)

    with gc_paused():
        thread = threading.Thread(target=writer, name="jaxstow-writer")
        thread.start()
        assert entered.wait(timeout=10)
        paused = not gc.isenabled()
    after = gc.isenabled()
    may_leave.set()
    thread.join(timeout=10)
    print(paused, after, gc.isenabled())
    """
    assert _run(program).split() == ["True", "True", "True"]


def test_no_pause_while_a_thread_of_the_user_runs() -> None:
    stop = threading.Event()
    user = threading.Thread(target=stop.wait, name="data-loader")
    user.start()
    try:
        with gc_paused():
            assert gc.isenabled()
    finally:
        stop.set()
        user.join()


def test_a_save_and_a_load_leave_the_collector_on_for_the_users_other_thread(tmp_path: Path) -> None:
    tree = {f"block{b}": {f"leaf{i}": np.full(4, i, np.float32) for i in range(100)} for b in range(30)}
    saving, seen = threading.Event(), set()

    def watch() -> None:
        while saving.is_set():
            seen.add(gc.isenabled())

    saving.set()
    watcher = threading.Thread(target=watch, name="metrics")
    watcher.start()
    try:
        for _ in range(3):
            jaxstow.save(tmp_path / "tree.jxs", tree)
            jaxstow.load(tmp_path / "tree.jxs", as_numpy=True)
    finally:
        saving.clear()
        watcher.join()
    assert seen == {True}


def test_a_process_with_one_thread_saves_with_fewer_collections(tmp_path: Path) -> None:
    program = """
    import gc, json, sys, threading, numpy as np, jaxstow
    tree = {f"block{b}": {f"leaf{i}": np.full(4, i, np.float32) for i in range(100)} for b in range(100)}
    path = sys.argv[1]
    jaxstow.save(path, tree)  # the first save imports what it needs
    counts = {}

    def count(phase, info):
        if phase == "start":
            counts[where] = counts.get(where, 0) + 1

    gc.callbacks.append(count)
    where = "alone"
    jaxstow.save(path, tree)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    where = "beside another thread"
    jaxstow.save(path, tree)
    stop.set()
    print(json.dumps(counts))
    """
    counts = json.loads(_run(program, str(tmp_path / "tree.jxs")))
    assert counts.get("alone", 0) <= 2, counts  # those due before the pause began
    assert counts["beside another thread"] > 10, counts  # the collector ran: no pause was taken


def test_loads_of_jaxstows_files_and_of_foreign_ones_run_with_the_collector_on(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    program = """
    import gc, json, sys, torch, numpy as np, jaxstow
    torch.save({f"layer{i}.weight": torch.ones(2, 2) for i in range(50)}, sys.argv[1] + ".pt")
    jaxstow.save(sys.argv[1] + ".jxs", {f"layer{i}": np.ones(2) for i in range(50)})
    seen = {}

    def profile(frame, event, argument):
        module, name = frame.f_globals.get("__name__"), frame.f_code.co_name
        if event == "call" and (module, name) in {("torch.serialization", "load"), ("jaxstow._read.restore", "restore")}:
            seen.setdefault(f"{where}: {module}.{name}", []).append(gc.isenabled())

    sys.setprofile(profile)
    where = "torch"
    jaxstow.load(sys.argv[1] + ".pt", from_format="torch")
    where = "jaxstow"
    jaxstow.load(sys.argv[1] + ".jxs")
    sys.setprofile(None)
    print(json.dumps(seen))
    """
    seen = json.loads(_run(program, str(tmp_path / "model")))
    assert seen == {
        "torch: torch.serialization.load": [True],
        "torch: jaxstow._read.restore.restore": [True],
        "jaxstow: jaxstow._read.restore.restore": [True],
    }
