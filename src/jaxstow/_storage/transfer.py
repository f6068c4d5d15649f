"""How bytes move to and from object stores: requests in flight, the size of each, an optional bandwidth cap, and
how often a request that fails for a reason that passes is sent again.

A :class:`Transfer` is a value; the threads, the count of requests in flight and the pace that carry it out belong
to the process and are shared by every file moved with equal settings (:func:`lanes`), so that a step of many files
still has ``requests`` requests in flight, and a cap holds for all of them together.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from jaxstow._format.source import Parallel
from jaxstow._storage.retrying import DEFAULT_ATTEMPTS, Retries
from jaxstow._util.pools import submit
from jaxstow._util.signal_free import ThreadPool
from jaxstow.errors import ArgumentError

T = TypeVar("T")

__all__ = ["MIN_PART_SIZE", "Lanes", "Pace", "Transfer", "lanes"]

#: The smallest part of a multipart upload that S3 takes (all parts but the last).
MIN_PART_SIZE = 5 << 20


@dataclass(frozen=True)
class Transfer:
    """How jaxstow moves bytes to and from an object store (``s3://`` and other fsspec URLs).

    Pass one as ``transfer=`` to any entry point. The defaults read at a local SeaweedFS server's limit with the least
    CPU of the sizes and counts tried (``bench/bench_object_store.py``). See docs/object-storage.md.

    Args:
        requests: requests in flight at once, reads and uploads each, across all the files of a save or a restore.
        part_size: the bytes of one ranged read or one upload part, at least 5 MiB (S3's smallest); a file of more
            than 1,000 parts gets parts twice as large after each thousand, so none needs over S3's 10,000.
        max_bytes_per_second: a cap on the bytes per second this process reads, and writes, with these settings.
        attempts: the most times one request (a read or a write) is sent when it fails for a reason that passes
            (throttling, a 5xx answer, a reset, a timeout, a body cut short); ``None``: for ``s3://``, what the
            storage options' botocore ``retries`` config or ``AWS_MAX_ATTEMPTS`` says, else 5.
        backoff: seconds: before the k-th retry, a random wait of up to ``backoff * 2 ** (k - 1)`` (at most 20).

    Raises:
        ArgumentError: a value out of range.

    >>> from jaxstow import Transfer
    >>> Transfer(requests=32, part_size=64 << 20, attempts=10)
    Transfer(requests=32, part_size=67108864, max_bytes_per_second=None, attempts=10, backoff=1.0)
    >>> Transfer(requests=0)
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: Transfer(requests=0, ...): requests must be an integer of at least 1
    """

    requests: int = 16
    part_size: int = 16 << 20
    max_bytes_per_second: float | None = None
    attempts: int | None = None
    backoff: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.requests, int) or isinstance(self.requests, bool) or self.requests < 1:
            raise ArgumentError(f"{self}: requests must be an integer of at least 1")
        if not isinstance(self.part_size, int) or isinstance(self.part_size, bool) or self.part_size < MIN_PART_SIZE:
            raise ArgumentError(f"{self}: part_size must be an integer of at least {MIN_PART_SIZE} bytes (5 MiB)")
        rate = self.max_bytes_per_second
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0):
            raise ArgumentError(f"{self}: max_bytes_per_second must be a positive number of bytes, or None")
        attempts = self.attempts
        if attempts is not None and (not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1):
            raise ArgumentError(f"{self}: attempts must be an integer of at least 1 (1: never again), or None")
        backoff = self.backoff
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff < float("inf"):
            raise ArgumentError(f"{self}: backoff must be a number of seconds, 0 or more")

    def retries(self, configured: int | None = None) -> Retries:
        """The policy of every request: ``attempts``, else ``configured`` (the storage's own setting), else 5."""
        return Retries(self.attempts or configured or DEFAULT_ATTEMPTS, float(self.backoff))


class Pace:
    """Requests spaced so that their bytes flow at no more than ``rate`` bytes per second.

    A request goes once the time its own bytes and those of every request before it take at ``rate`` has passed since
    the pace began (or since the last request, after a pause: unused time is not saved up), so there is no burst.

    >>> pace = Pace(1000.0)
    >>> start = time.monotonic()
    >>> for _ in range(3):
    ...     pace.wait(100)
    >>> 0.29 < time.monotonic() - start < 0.9           # 0.3 s at least; longer on a busy machine
    True
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def wait(self, nbytes: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._next = max(now, self._next) + nbytes / self.rate
            until = self._next
        time.sleep(until - now)


class Lanes:
    """What carries out one :class:`Transfer` in this process.

    The read plan (``requests`` readers of ``part_size`` pieces on one pool), a count of each direction's requests in
    flight, the pool of uploads and the paces.
    """

    def __init__(self, transfer: Transfer) -> None:
        self.transfer = transfer
        self.reads = Parallel(readers=transfer.requests, piece=transfer.part_size, threshold=transfer.part_size + 1)
        self.reading = threading.BoundedSemaphore(transfer.requests)
        #: Parts queued or being uploaded, across uploads: a writer waits for a free slot before it hands one over.
        self.uploading = threading.BoundedSemaphore(transfer.requests)
        rate = transfer.max_bytes_per_second
        self.read_pace = Pace(rate) if rate is not None else None
        self.write_pace = Pace(rate) if rate is not None else None
        self._uploads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def upload(self, job: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``job(*args)`` on the pool that uploads parts (``requests`` threads, made on first use).

        Once the interpreter has begun to exit, the job runs on the caller's thread (:func:`~jaxstow._util.pools.submit`),
        so that a save still in flight at exit completes (its future is already done).
        """
        with self._lock:
            if self._uploads is None:
                self._uploads = ThreadPool(self.transfer.requests, thread_name_prefix="jaxstow-upload")
            pool = self._uploads
        return submit(pool, job, *args)


_lanes: dict[Transfer, Lanes] = {}
_lanes_pid = 0
_lanes_lock = threading.Lock()


def lanes(transfer: Transfer) -> Lanes:
    """The process's :class:`Lanes` of ``transfer``, shared by every file moved with these settings.

    Made again in a forked child, which has none of its parent's threads.
    """
    global _lanes_pid
    with _lanes_lock:
        if _lanes_pid != os.getpid():
            _lanes.clear()
            _lanes_pid = os.getpid()
        found = _lanes.get(transfer)
        if found is None:
            found = _lanes[transfer] = Lanes(transfer)
        return found
