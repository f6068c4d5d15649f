"""The garbage collector's pause: taken only while every other thread is one of jaxstow's own, off inside every pause,
back as it was when the last one ends, however the pauses nest, overlap across threads or end with an error; taken
while a save builds and writes a local file and while a file's or a folder's headers are parsed, never around the
reads of a load, a foreign library's load, a caller's function, an upload or a commit.

Whether a pause is taken depends on every thread of the process, so the cases that take one run in a process of
their own, forked from a server that runs no thread (``tests/support/forked.py``), with no thread left over from other
tests."""

from __future__ import annotations

import gc
import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import forked
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
    """Run ``program`` in a process of its own, where the only thread is the one that runs it."""
    process = forked.run(
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


_WATCH = """
import gc, json, os, sys

seen = {}


def watch(watched):
    "Record whether the collector runs at each call of ``watched``: {(module, function) or builtin: what it is}."

    def profile(frame, event, argument):
        if event == "call":
            key = (frame.f_globals.get("__name__"), frame.f_code.co_name)
        elif event == "c_call":
            key = argument
        else:
            return
        if key in watched:
            seen.setdefault(f"{where}: {watched[key]}", set()).add(gc.isenabled())

    sys.setprofile(profile)
"""


def test_a_save_pauses_while_it_builds_and_writes_a_local_file_never_while_it_commits_or_uploads(
    tmp_path: Path,
) -> None:
    pytest.importorskip("fsspec")
    program = _WATCH + textwrap.dedent(
        """
    import numpy as np, jaxstow
    tree = {f"leaf{i}": np.full(4, i, np.float32) for i in range(100)}
    jaxstow.save(sys.argv[1], tree)  # the first save imports what it needs
    jaxstow.save("memory://first/tree.jxs", tree)
    watch({
        ("jaxstow._write.encoded", "encode_tree"): "encoding",
        ("jaxstow._format.native", "write_native"): "writing",
        os.fsync: "fsync",
        os.replace: "rename",
        ("fsspec.implementations.memory", "_initiate_upload"): "upload",
        ("fsspec.implementations.memory", "commit"): "upload",
        ("fsspec.spec", "write"): "upload",
    })
    where = "local"
    jaxstow.save(sys.argv[1], tree)
    where = "memory://"
    jaxstow.save("memory://run/tree.jxs", tree)
    sys.setprofile(None)
    print(json.dumps({what: sorted(states) for what, states in seen.items()}))
    """
    )
    seen = json.loads(_run(program, str(tmp_path / "tree.jxs")))
    assert seen == {
        "local: encoding": [False],
        "local: writing": [False],
        "local: fsync": [True],
        "local: rename": [True],
        "memory://: encoding": [False],
        "memory://: writing": [True],
        "memory://: upload": [True],
    }


def test_a_folder_pauses_while_it_parses_headers_never_while_it_lists_reads_or_calls_the_callers_names(
    tmp_path: Path,
) -> None:
    safetensors = pytest.importorskip("safetensors.numpy")
    for shard in range(2):
        tensors = {f"layer{shard}.t{i}": np.full(2, i, np.float32) for i in range(1500)}  # headers of 64 KiB+
        safetensors.save_file(tensors, str(tmp_path / f"model-0000{shard + 1}-of-00002.safetensors"))
    program = _WATCH + textwrap.dedent(
        """
    import jaxstow

    def names(tensor):
        seen.setdefault("the caller's names=", set()).add(gc.isenabled())
        return tensor.replace(".", "/")

    watch({
        ("jaxstow._read.sharded_folder", "folder_listing"): "listing",
        ("jaxstow._read.folder_members", "open_local_member"): "opening",
        ("jaxstow._format.header", "raw_header"): "reading a header",
        ("jaxstow._format.header", "_read_header"): "parsing a header",
        ("jaxstow._read.sharded_folder", "_leaves"): "building the leaves",
    })
    where = "folder"
    tree = jaxstow.huggingface.load(sys.argv[1], names=names, as_numpy=True)
    sys.setprofile(None)
    print(len(jax.tree_util.tree_leaves(tree)), json.dumps({what: sorted(states) for what, states in seen.items()}))
    """
    )
    count, seen = _run(program, str(tmp_path)).split(" ", 1)
    assert count == "3000"
    assert json.loads(seen) == {
        "folder: listing": [True],
        "folder: opening": [True],
        "folder: reading a header": [True],
        "folder: parsing a header": [False],
        "folder: building the leaves": [False],
        "the caller's names=": [True],
    }


def test_a_load_pauses_only_while_it_parses_a_header_never_while_it_reads_or_a_foreign_library_loads(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    program = _WATCH + textwrap.dedent(
        """
    import torch, numpy as np, jaxstow
    torch.save({f"layer{i}.weight": torch.ones(2, 2) for i in range(50)}, sys.argv[1] + ".pt")
    jaxstow.save(sys.argv[1] + ".jxs", {f"layer{i}": np.ones(2) for i in range(1500)})  # a header of 64 KiB+
    watch({
        ("torch.serialization", "load"): "torch's load",
        ("jaxstow._format.header", "raw_header"): "reading the header",
        ("jaxstow._format.header", "_read_header"): "parsing the header",
        os.preadv: "reading",
        ("jaxstow._read.restore", "restore"): "restoring",
    })
    where = "torch"
    jaxstow.load(sys.argv[1] + ".pt", from_format="torch")
    where = "jaxstow"
    jaxstow.load(sys.argv[1] + ".jxs")
    sys.setprofile(None)
    print(json.dumps({what: sorted(states) for what, states in seen.items()}))
    """
    )
    seen = json.loads(_run(program, str(tmp_path / "model")))
    assert seen["torch: torch's load"] == seen["torch: restoring"] == [True]
    assert {what: states for what, states in seen.items() if what.startswith("jaxstow: ")} == {
        "jaxstow: reading the header": [True],
        "jaxstow: parsing the header": [False],
        "jaxstow: reading": [True],
        "jaxstow: restoring": [True],
    }
