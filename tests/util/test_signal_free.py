"""jaxstow's threads take no signal sent to the process: each is born blocking every asynchronous signal, so that a
preemption notice reaches the program's threads (and Python's handler the main thread, even while it waits in
``join``), never a jaxstow thread whose taking it would leave the main thread asleep."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from jaxstow._util.signal_free import ThreadPool, blocked_signals, start_thread

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks on this platform")

_SENT = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP}
_RAISED_BY_THE_THREAD = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT}


def _mask() -> set[signal.Signals]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_thread_it_starts_blocks_signals_sent_to_the_process_but_not_its_own_faults():
    masks = []
    thread = threading.Thread(target=lambda: masks.append(_mask()))
    before = _mask()
    start_thread(thread)
    thread.join()
    assert masks[0] >= _SENT and not masks[0] & _RAISED_BY_THE_THREAD
    assert _mask() == before  # the starter's own mask is put back


def test_a_pools_threads_are_born_blocking_them_as_an_executors_are_not():
    with ThreadPool(3) as pool:
        masks = [future.result() for future in [pool.submit(_mask) for _ in range(6)]]
    assert all(mask >= _SENT and not mask & _RAISED_BY_THE_THREAD for mask in masks)
    with ThreadPoolExecutor(1) as plain:  # what the test tells apart
        assert not plain.submit(_mask).result() & _SENT


def test_the_starters_mask_is_put_back_when_the_start_fails():
    before = _mask()
    thread = threading.Thread(target=lambda: None)
    start_thread(thread)
    thread.join()
    with pytest.raises(RuntimeError):  # a thread is started once
        start_thread(thread)
    assert _mask() == before
    with blocked_signals():
        assert _mask() >= _SENT
    assert _mask() == before


_EVERY_THREAD = """
import os, signal, sys, threading, time
import jax, numpy as np
import jaxstow
from jaxstow import CheckpointManager, io, scheduler

folder = sys.argv[1]
masks = {}

def sample():  # each jaxstow thread alive now, by name, with the signals it blocks
    for thread in threading.enumerate():
        if thread.name.startswith("jaxstow") and thread.native_id is not None:
            try:
                status = open(f"/proc/self/task/{thread.native_id}/status").read()
            except FileNotFoundError:
                continue
            blocked = int(status.split("SigBlk:")[1].split()[0], 16)
            masks[thread.name.rstrip("_0123456789")] = blocked

tree = {f"w{i}": np.full((1 << 20,), i, np.float32) for i in range(24)}
with CheckpointManager(folder + "/run") as manager:
    manager.save(1, tree)  # in the background: its writer thread
    while any(thread.name == "jaxstow-writer" for thread in threading.enumerate()):
        sample()
        time.sleep(0.001)
sample()
jaxstow.save(folder + "/big.jxs", {"w": np.ones(48 << 20, np.uint8)})
with jaxstow.open(folder + "/big.jxs") as reader:
    reader["w"]  # read in pieces by the reading pool
jaxstow.load(folder + "/big.jxs")
sample()
init_save, save, postprocess_save = io.save(io.HDF5Collector(folder + "/draws.h5"))
state = init_save({"x": jax.numpy.zeros(3)}, {}, scheduler.static_information(samples_collected=4))
for step in range(4):
    state, _ = save(state, True, {"x": jax.numpy.full(3, step)})
sample()
postprocess_save(state, None)
for name, blocked in sorted(masks.items()):
    print(name, all(blocked >> (number - 1) & 1 for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)),
          bool(blocked >> (signal.SIGSEGV - 1) & 1))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_every_thread_a_save_and_a_restore_start_blocks_the_signals_sent_to_the_process(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EVERY_THREAD), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert {"jaxstow-writer", "jaxstow-read", "jaxstow-fsync"} <= seen.keys(), done.stdout  # they ran
    # but the queue that writes the collector's file: the queues of io.save run the program's collectors (a process
    # one starts inherits the thread's mask; tests/io/test_collector_processes.py)
    queues = {name for name in seen if name.startswith("jaxstow-hdf5")}
    assert queues and {seen[name] for name in queues} == {"False False"}, done.stdout
    assert {seen[name] for name in seen.keys() - queues} == {"True False"}, done.stdout
