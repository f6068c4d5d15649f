"""The partner thread: a job handed to it runs once, on its thread or taken back and run by its caller, never both;
its caller never waits for another caller's job, and nothing a job was given is touched once its caller has gone on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from jaxstow._util import partner
from jaxstow._util.partner import hand, two_at_once


@pytest.fixture(autouse=True)
def _idle_partner() -> None:
    _wait_until_idle()


def _wait_until_idle() -> None:
    """The partner idle, no job waiting: one taken back before frees it once the thread wakes."""
    for _ in range(6000):
        handed = hand(lambda: None)
        if handed is not None:
            handed.result()
            return
        time.sleep(0.01)
    raise AssertionError("the partner thread never freed itself")


def _occupied() -> tuple[partner.Handed[object], threading.Event]:
    """The partner running a job until the event returned is set."""
    begun, release = threading.Event(), threading.Event()
    running = hand(lambda: (begun.set(), release.wait(60)))
    assert running is not None and begun.wait(60)
    return running, release


def test_a_job_runs_on_the_partner_thread_blocking_signals_sent_to_the_process():
    handed = hand(lambda: (threading.current_thread().name, signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    assert handed is not None
    name, mask = handed.result()
    assert name == "jaxstow-partner"
    assert {signal.SIGTERM, signal.SIGINT} <= mask and signal.SIGSEGV not in mask


def test_the_error_a_job_raises_is_raised_by_its_result():
    handed = hand(lambda: 1 / 0)
    assert handed is not None
    with pytest.raises(ZeroDivisionError):
        handed.result()
    assert two_at_once(lambda: 1, lambda: 2) == (1, 2)  # the partner serves on


def test_a_job_waiting_behind_another_is_taken_back_never_run_and_a_third_is_refused():
    running, release = _occupied()
    ran = []
    waiting = hand(lambda: ran.append("waiting"))
    assert waiting is not None
    assert hand(lambda: ran.append("third")) is None  # one job waits already: the caller runs its own
    assert waiting.cancel()
    waiting.settle()  # taken back: nothing to wait for
    release.set()
    running.result()
    _wait_until_idle()  # the thread, woken for the job taken back, frees itself
    assert ran == []


def test_two_at_once_runs_theirs_on_the_callers_thread_while_the_partner_is_busy():
    running, release = _occupied()
    try:
        names = two_at_once(lambda: threading.current_thread().name, lambda: threading.current_thread().name)
        assert names == (threading.current_thread().name,) * 2
        with pytest.raises(KeyError, match="theirs"):  # taken back and raising: no wait for a job that never runs
            two_at_once(lambda: None, lambda: {}["theirs"])
    finally:
        release.set()
        running.result()


def test_an_error_of_mine_is_raised_only_once_the_partner_is_done_with_theirs():
    begun, done = threading.Event(), threading.Event()

    def theirs() -> None:
        begun.set()
        time.sleep(0.2)
        done.set()

    def mine() -> None:
        assert begun.wait(60)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        two_at_once(mine, theirs)
    assert done.is_set()


def test_jobs_of_many_callers_each_run_exactly_once_with_their_own_results():
    counts: dict[tuple[int, int], int] = {}
    lock = threading.Lock()

    def job(caller: int, i: int, side: str) -> tuple[int, int, str]:
        with lock:
            counts[(caller, i)] = counts.get((caller, i), 0) + 1
        if i % 7 == 0:
            time.sleep(0.0005)
        return caller, i, side

    def caller(number: int, out: list[bool]) -> None:
        for i in range(1500):
            mine, theirs = two_at_once(lambda i=i: (number, i, "mine"), lambda i=i: job(number, i, "theirs"))
            out.append(mine == (number, i, "mine") and theirs == (number, i, "theirs"))

    results: list[list[bool]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=caller, args=(n, results[n])) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(len(out) == 1500 and all(out) for out in results)
    assert len(counts) == 4 * 1500 and set(counts.values()) == {1}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_the_partner_runs_a_job_has_a_partner_of_its_own():
    script = textwrap.dedent(
        """
        import os, threading
        from jaxstow._util.partner import hand, two_at_once
        begun, release = threading.Event(), threading.Event()
        running = hand(lambda: (begun.set(), release.wait(60)))
        assert begun.wait(60)
        waiting = hand(lambda: None)  # the parent's locks held at the fork
        pid = os.fork()
        if pid == 0:
            handed = hand(lambda: threading.current_thread().name)
            ok = handed is not None and handed.result() == "jaxstow-partner"
            os._exit(0 if ok and two_at_once(lambda: 1, lambda: 2) == (1, 2) else 1)
        release.set()
        running.result()
        assert os.waitpid(pid, 0)[1] == 0
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _interrupt_at(code, line: int) -> None:
    """Raise KeyboardInterrupt in this thread when a frame of ``code`` reaches ``line``, as a signal handler raises
    between two bytecodes."""

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            sys.settrace(None)
            frame.f_trace = None
            raise KeyboardInterrupt(f"line {line}")
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)


@pytest.mark.parametrize("where", ["two_at_once", "settle"])
def test_an_interrupt_at_any_line_leaves_no_job_running_and_the_partner_free(where):
    code = {
        "two_at_once": two_at_once.__code__,
        "settle": partner.Handed.settle.__code__,
    }[where]
    lines = sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})
    running = threading.Event()

    def theirs() -> str:
        running.set()
        time.sleep(0.02)
        running.clear()
        return "theirs"

    def mine() -> str:
        if where == "settle":
            raise ValueError("mine failed")  # then settle() runs, and is interrupted in turn
        return "mine"

    for line in lines:
        _interrupt_at(code, line)
        try:
            two_at_once(mine, theirs)
        except (KeyboardInterrupt, ValueError):
            pass
        finally:
            sys.settrace(None)
        assert not running.is_set(), f"the partner still runs the job after an interrupt at line {line}"
        _wait_until_idle()


def test_a_first_job_at_the_interpreters_teardown_runs_on_its_caller_without_a_hang():
    script = textwrap.dedent(
        """
        import builtins
        from jaxstow._util.partner import two_at_once

        class Late:  # dropped when the interpreter tears its modules down, the partner never started
            def __del__(self):
                print("late", two_at_once(lambda: 1, lambda: 2), flush=True)

        builtins.late = Late()
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "late (1, 2)", done.stderr
