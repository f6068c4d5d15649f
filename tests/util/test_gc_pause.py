"""The garbage collector's pause: off inside every pause, back as it was when the last one ends, however the pauses
nest, overlap across threads or end with an error."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from jaxstow._util.gc_pause import gc_paused, with_gc_paused


@pytest.fixture(autouse=True)
def collector_enabled() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_nested_pauses_end_with_the_outermost():
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_error_in_the_block_ends_the_pause():
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_pauses_of_threads_that_overlap_end_when_the_last_one_does():
    first_in, second_in, first_out, second_may_leave = (threading.Event() for _ in range(4))
    seen = {}

    def first() -> None:
        with gc_paused():
            first_in.set()
            assert second_in.wait(timeout=10)
        first_out.set()

    def second() -> None:
        assert first_in.wait(timeout=10)
        with gc_paused():
            second_in.set()
            assert second_may_leave.wait(timeout=10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_out.wait(timeout=10)
    seen["after the first ended"] = gc.isenabled()
    second_may_leave.set()
    for thread in threads:
        thread.join(timeout=10)
    assert seen == {"after the first ended": False} and gc.isenabled()


def test_a_decorated_function_runs_paused_and_keeps_its_name():
    @with_gc_paused
    def collecting_enabled(value: int) -> tuple[bool, int]:
        """Whether the collector runs."""
        return gc.isenabled(), value

    assert collecting_enabled(3) == (False, 3)
    assert (
        collecting_enabled.__name__ == "collecting_enabled"
        and collecting_enabled.__doc__ == "Whether the collector runs."
    )
    assert gc.isenabled()
