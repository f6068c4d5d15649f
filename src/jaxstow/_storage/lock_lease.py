"""The lease of an object store's lock: a holder renews its lock object while it runs, so that a writer started
elsewhere (a job restarted on another host after its first was killed) can tell that the holder is gone.

No host's clock is read against another's: a writer that finds a lock it cannot prove dead watches the lock object
for one and a half of the holder's leases, and takes it over only if nothing renewed it meanwhile
(:func:`lease_expired`). The holder renews it every quarter of its lease, on a thread of its own
(:class:`Renewal`); a holder that finds its lock taken over, or cannot renew it for a whole lease (stopped, or out of
the store's reach), has lost it, and its next save says so.

>>> import itertools
>>> from jaxstow._storage.lock_lease import lease_expired
>>> renewals = itertools.count()                     # a holder that renews its lock at every look
>>> lease_expired(lambda: next(renewals), 0.2)
False
>>> lease_expired(lambda: "never renewed", 0.2)
True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LEASE_SECONDS", "LONGEST_LEASE", "Renewal", "lease_expired", "valid_lease"]

#: The lease of the locks this process takes: a writer started elsewhere waits up to one and a half of it.
LEASE_SECONDS = 60.0
#: A lease longer than this (or not a positive number) in a lock object is no lease: the lock is refused at once.
LONGEST_LEASE = 600.0
#: The most seconds a release waits for a renewal in flight (a store that does not answer).
_STOP_WAIT = 30.0


def valid_lease(lease: Any) -> bool:
    """Whether ``lease``, read from a lock object, is a lease to wait out: a number of seconds, positive, finite,
    at most :data:`LONGEST_LEASE` (a stranger's lock object could else keep a writer waiting for ever)."""
    return isinstance(lease, float | int) and not isinstance(lease, bool) and 0 < lease <= LONGEST_LEASE


def lease_expired(look: Callable[[], Any], lease: float, *, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether the lock object that ``look`` returns (its bytes, or its ETag) stays the same for one and a half of
    ``lease`` seconds, looked at every quarter of it (at most every second): its holder renewed it in none of them."""
    first, waited, every = look(), 0.0, min(lease / 4, 1.0)
    while waited < 1.5 * lease:
        sleep(every)
        waited += every
        if look() != first:
            return False
    return True


class Renewal:
    """The thread that renews a lock every quarter of ``lease`` by calling ``renew(number)`` (1, 2, ...: the number
    of the renewal, which changes the lock object), which returns ``None`` while the lock is still this holder's,
    else why it is not (another writer took it over); an exception (the store out of reach) is tried again at the
    next renewal. :attr:`lost` says why the lock is lost, once it is. ``renew`` must not hold the lock, whose release
    (:meth:`stop` first) its collection must be able to start."""

    def __init__(self, renew: Callable[[int], str | None], lease: float) -> None:
        self.lost: str | None = None
        self._stop = threading.Event()
        self._renewing = threading.Lock()  # held during a renewal: the lock is released after it, never under it
        self._renew, self._lease = renew, lease
        self._renewed = time.monotonic()
        threading.Thread(target=self._run, name="jaxstow-lock-lease", daemon=True).start()

    def _run(self) -> None:
        number = 0
        while not self._stop.wait(self._lease / 4):
            number += 1
            with self._renewing:
                if self._stop.is_set():
                    return
                try:
                    self.lost = self._renew(number)
                except Exception as error:  # the store out of reach: tried again, and lost once a lease went by
                    if time.monotonic() - self._renewed > self._lease:
                        self.lost = f"it could not be renewed for {self._lease:g} s ({error})"
                else:
                    self._renewed = time.monotonic()
            if self.lost is not None:
                return

    def stop(self) -> None:
        """Renew no more, once the renewal in flight (if any) is over: the lock is released next, and a renewal after
        that would write the lock object again."""
        self._stop.set()
        if self._renewing.acquire(timeout=_STOP_WAIT):
            self._renewing.release()
