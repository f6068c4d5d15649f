"""The background writer of the HDF5 collector and of io.save's deliveries: order, back pressure, failures, idle threads."""

from __future__ import annotations

import threading
import time

import pytest

from jaxstow.io.writer import BackgroundWriter


def _writer_threads(name: str) -> int:
    return sum(thread.name == name for thread in threading.enumerate())


@pytest.mark.timeout(20)
def test_jobs_run_in_order_with_few_pending_and_the_idle_thread_ends() -> None:
    writer = BackgroundWriter("test-writer-order", max_pending=2, linger=0.2)
    done: list[int] = []
    for index in range(40):
        writer.submit(lambda index=index: (time.sleep(0.001), done.append(index)))
    writer.wait()
    assert done == list(range(40))
    assert _writer_threads("test-writer-order") == 1
    deadline = time.monotonic() + 5
    while _writer_threads("test-writer-order") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _writer_threads("test-writer-order") == 0
    writer.submit(lambda: done.append(40))  # a new job starts a new thread
    writer.wait()
    assert done[-1] == 40


@pytest.mark.timeout(20)
def test_a_failure_drops_later_jobs_and_comes_back_without_a_hang() -> None:
    writer = BackgroundWriter("test-writer-failure", max_pending=1)
    done: list[int] = []
    writer.submit(lambda: time.sleep(0.05))
    writer.submit(lambda: done.append(1 // 0))
    raised = 0
    for index in range(20):  # more jobs than may wait: submit must neither block for ever nor run them
        try:
            writer.submit(lambda index=index: done.append(index))
        except ZeroDivisionError:
            raised += 1
    with pytest.raises(ZeroDivisionError):
        writer.wait()
    assert done == [] and raised > 0
