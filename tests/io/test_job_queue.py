"""The background writer of the HDF5 collector and of io.save's deliveries: order, back pressure, failures, idle threads."""

from __future__ import annotations

import threading
import time

import pytest

from jaxstow.io.job_queue import JobQueue


def _writer_threads(name: str) -> int:
    return sum(thread.name == name for thread in threading.enumerate())


@pytest.mark.timeout(20)
def test_jobs_run_in_order_on_one_thread_that_waits_for_more() -> None:
    writer = JobQueue("test-writer-order", max_pending=2, linger=600)
    done: list[int] = []
    threads: set[int] = set()
    for index in range(40):
        writer.submit(lambda index=index: (threads.add(threading.get_ident()), time.sleep(0.001), done.append(index)))
    writer.wait()
    assert done == list(range(40))
    assert len(threads) == 1
    assert _writer_threads("test-writer-order") == 1  # idle, lingering for the next job


@pytest.mark.timeout(20)
def test_an_idle_thread_ends_and_a_new_job_starts_another() -> None:
    writer = JobQueue("test-writer-idle", linger=0.01)
    threads: list[int] = []
    writer.submit(lambda: threads.append(threading.get_ident()))
    writer.wait()
    deadline = time.monotonic() + 10
    while _writer_threads("test-writer-idle") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _writer_threads("test-writer-idle") == 0
    writer.submit(lambda: threads.append(threading.get_ident()))  # runs only if a new thread starts
    writer.wait()
    assert len(threads) == 2


@pytest.mark.timeout(20)
def test_a_failure_drops_later_jobs_and_comes_back_without_a_hang() -> None:
    writer = JobQueue("test-writer-failure", max_pending=1)
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
