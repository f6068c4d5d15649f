"""The background writer: jobs run one at a time and in order on a thread of their own, and the error of a job reaches
the caller at the next submit, wait or close, once, with the original error as its cause."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from jaxstow._write.background import BackgroundWriter
from jaxstow.errors import CheckpointError


def test_submit_returns_while_the_job_runs_on_another_thread():
    writer = BackgroundWriter()
    release, threads = threading.Event(), []

    def job() -> None:
        threads.append(threading.current_thread().name)
        assert release.wait(timeout=10)

    writer.submit(job, what="a slow job")
    release.set()  # reached only because submit did not wait for the job
    writer.close()
    assert threads == ["jaxstow-writer"]


def test_jobs_run_one_at_a_time_in_order():
    writer = BackgroundWriter()
    lock, running, most, order = threading.Lock(), [0], [0], []

    def job(index: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)
        order.append(index)
        with lock:
            running[0] -= 1

    for index in range(20):
        writer.submit(lambda index=index: job(index), what=f"job {index}")
    writer.close()
    assert order == list(range(20)) and most[0] == 1


def test_an_error_is_logged_at_once_and_raised_at_the_next_wait_once_with_its_cause(caplog):
    writer = BackgroundWriter()
    failed = ValueError("no space left")

    def job() -> None:
        raise failed

    with caplog.at_level(logging.ERROR, logger="jaxstow._write.background"):
        writer.submit(job, what="saving step 3 to /ckpt")
        writer.idle()  # waits without raising: the error is kept
    assert "saving step 3 to /ckpt failed in the background; the error is raised again by the next" in caplog.text
    with pytest.raises(CheckpointError) as caught:
        writer.wait()
    assert str(caught.value) == "saving step 3 to /ckpt failed in the background: ValueError: no space left"
    assert caught.value.__cause__ is failed
    writer.wait()  # raised once
    writer.close()


def test_the_next_submit_raises_the_error_and_does_not_run_its_job():
    writer = BackgroundWriter()
    ran = []
    writer.submit(lambda: 1 / 0, what="step 1")
    with pytest.raises(CheckpointError, match="step 1 failed in the background: ZeroDivisionError") as caught:
        writer.submit(lambda: ran.append(2), what="step 2")
    assert str(caught.value).endswith("(so step 2 did not start: ask for it again)")
    assert ran == []
    writer.submit(lambda: ran.append(3), what="step 3")
    writer.close()
    assert ran == [3]


def test_close_raises_the_last_error():
    writer = BackgroundWriter()
    writer.submit(lambda: [][0], what="the last save")
    with pytest.raises(CheckpointError, match="the last save failed in the background: IndexError") as caught:
        writer.close()
    assert isinstance(caught.value.__cause__, IndexError)
    writer.close()


def test_without_asynchronous_jobs_run_on_the_callers_thread_and_errors_propagate_unchanged():
    writer = BackgroundWriter(asynchronous=False)
    threads = []
    writer.submit(lambda: threads.append(threading.current_thread()), what="at once")
    assert threads == [threading.current_thread()]
    with pytest.raises(ZeroDivisionError):
        writer.submit(lambda: 1 / 0, what="at once")
    writer.close()


def test_a_wait_interrupted_by_ctrl_c_leaves_the_job_and_its_error_to_the_next_wait():
    # The job was forgotten before it was waited for: after Ctrl-C, the next wait and close returned at once, and the
    # job's error (a full disk) was never raised; a next save ran beside it.
    import signal

    writer = BackgroundWriter()
    release = threading.Event()

    def job() -> None:
        assert release.wait(timeout=10)
        raise OSError(28, "No space left on device")

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        writer.submit(job, what="saving step 2 to /ckpt")
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            writer.wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    release.set()
    with pytest.raises(CheckpointError, match=r"saving step 2 to /ckpt failed in the background: .*No space left"):
        writer.wait()
    writer.close()  # raised once


def test_every_thread_waiting_while_a_job_fails_gets_its_error_and_a_later_wait_none():
    writer = BackgroundWriter()
    release = threading.Event()

    def job() -> None:
        assert release.wait(timeout=10)
        raise OSError("no space left on the device")

    writer.submit(job, what="saving step 7")
    outcomes: list[str] = []

    def wait() -> None:
        try:
            writer.wait()
            outcomes.append("returned")
        except CheckpointError as error:
            outcomes.append(type(error.__cause__).__name__)

    waiters = [threading.Thread(target=wait) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.1)  # every waiter is waiting for the job
    release.set()
    for waiter in waiters:
        waiter.join(timeout=10)
    assert outcomes == ["OSError"] * 3
    writer.wait()  # the failure was raised: a wait after it returns
