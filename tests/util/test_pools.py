"""Work handed to a pool runs once, on the pool or on the caller where the pool takes no more."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from jaxstow._util.pools import submit


def _busy_pool() -> tuple[ThreadPoolExecutor, threading.Event]:
    """A pool of at most two threads whose one thread waits for the event returned."""
    pool = ThreadPoolExecutor(2)
    release, begun = threading.Event(), threading.Event()

    def wait_for_release() -> None:
        begun.set()
        release.wait(30)

    pool.submit(wait_for_release)
    assert begun.wait(30)
    return pool, release


def test_a_job_the_pool_queued_before_refusing_it_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, release = _busy_pool()
    runs: list[str] = []

    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse)  # the pool queues the job, then fails to start a thread
        future = submit(pool, lambda: runs.append(threading.current_thread().name) or len(runs))
    assert future.result(5) == 1 and runs == [threading.current_thread().name]  # run on the caller, at once
    release.set()  # the pool's thread now takes the job from its queue, and finds it run
    pool.shutdown(wait=True)
    assert runs == [threading.current_thread().name]


def test_a_job_runs_on_the_pool_and_its_error_is_raised() -> None:
    with ThreadPoolExecutor(1) as pool:
        assert submit(pool, threading.current_thread).result(5) is not threading.current_thread()
        with pytest.raises(ZeroDivisionError):
            submit(pool, lambda: 1 / 0).result(5)


def test_a_job_cancelled_before_it_began_never_runs() -> None:
    pool, release = _busy_pool()
    runs: list[int] = []
    pool._max_workers = 1  # type: ignore[attr-defined]  # no second thread: the job waits behind the first
    future = submit(pool, lambda: runs.append(1))
    assert future.cancel()
    release.set()
    pool.shutdown(wait=True)
    assert future.cancelled() and runs == []


def test_a_pool_shut_down_runs_the_job_on_the_caller() -> None:
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    assert submit(pool, threading.current_thread).result(0) is threading.current_thread()
