"""The lease of an object store's lock: a holder renews its lock object while it runs, so that a writer started
elsewhere (a job restarted on another host after its first was killed) can tell that the holder is gone.

No host's clock is read against another's: a writer that finds a lock it cannot prove dead watches the lock object
for one and a half of the holder's leases, and takes it over only if nothing renewed it meanwhile
(:func:`lease_expired`). The holder renews it every quarter of its lease, on a thread of its own
(:class:`Renewal`), and counts it lost once a whole lease went by since the start of the last renewal that the store
confirmed (stopped, slow, or out of the store's reach), or once it finds it taken over: half a lease before another
writer may take it over, its next save (and the commit and keep policy of a save in flight) says so.

>>> import itertools
>>> from jaxstow._storage.lock_lease import lease_expired
>>> renewals = itertools.count()                     # a holder that renews its lock at every look
>>> lease_expired(lambda: next(renewals), 1.0)
False
>>> lease_expired(lambda: "never renewed", 0.2)
True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from jaxstow._util.signal_free import start_thread

__all__ = ["LEASE_SECONDS", "LONGEST_LEASE", "SHORTEST_LEASE", "Renewal", "lease_expired", "valid_lease"]

#: The lease of the locks this process takes: a writer started elsewhere waits up to one and a half of it.
LEASE_SECONDS = 60.0
#: A lease outside these (or no number) in a lock object is no lease: the lock is refused at once, rather than
#: waited for for ever, or taken over at once.
SHORTEST_LEASE = 1.0
LONGEST_LEASE = 600.0


def valid_lease(lease: Any) -> bool:
    """Whether ``lease``, read from a lock object, is a lease to wait out: a number of seconds from
    :data:`SHORTEST_LEASE` to :data:`LONGEST_LEASE` (a stranger's lock object could else keep a writer waiting)."""
    return isinstance(lease, float | int) and not isinstance(lease, bool) and SHORTEST_LEASE <= lease <= LONGEST_LEASE


def lease_expired(look: Callable[[], Any], lease: float, *, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether the lock object that ``look`` returns (its bytes) stays the same for one and a half of ``lease``
    seconds, looked at every quarter of it (at most every second): its holder renewed it in none of them."""
    first, every = look(), min(lease / 4, 1.0)
    deadline = time.monotonic() + 1.5 * lease
    while time.monotonic() < deadline:
        sleep(every)
        if look() != first:
            return False
    return True


class Renewal:
    """The thread that renews a lock every quarter of ``lease`` by calling ``renew(number)`` (1, 2, ...: the number
    of the renewal, which changes the lock object), which returns ``None`` once the store confirmed it, else why the
    lock is not this holder's (another writer took it over); an exception (the store out of reach) is tried again at
    the next renewal. A renewal that ends after :meth:`stop` (its write may land after the release deleted the lock
    object) calls ``withdraw()``. Neither function may hold the lock, whose collection releases it."""

    def __init__(self, renew: Callable[[int], str | None], lease: float, withdraw: Callable[[], None]) -> None:
        self._renew, self._lease, self._withdraw = renew, lease, withdraw
        self._stop = threading.Event()
        self._taken: str | None = None  # who took the lock over, once a renewal found that
        self._failure: BaseException | None = None
        self._confirmed = time.monotonic()  # the start of the last renewal the store confirmed (or of the taking)

    def start(self) -> bool:
        """Start renewing; ``False`` where no thread can start (at the interpreter's exit, on Python 3.12)."""
        try:
            start_thread(threading.Thread(target=self._run, name="jaxstow-lock-lease", daemon=True))
        except RuntimeError:
            return False
        return True

    @property
    def lost(self) -> str | None:
        """Why the lock is no longer this holder's, or ``None``."""
        if self._taken is not None:
            return self._taken
        if (since := time.monotonic() - self._confirmed) > self._lease:
            why = (
                f"the last attempt failed: {self._failure}" if self._failure is not None else "the store did not answer"
            )
            return f"it was not renewed for {since:.0f} s, longer than its lease ({why})"
        return None

    def _run(self) -> None:
        number = 0
        while not self._stop.wait(self._lease / 4) and self.lost is None:  # a lost lock is never written again
            number += 1
            started = time.monotonic()
            try:
                self._taken = self._renew(number)
            except Exception as error:  # the store out of reach: tried again, and lost once a lease went by
                self._failure = error
            else:
                self._confirmed = started if self._taken is None else self._confirmed
            if self._stop.is_set():  # released during the renewal, whose write may have come after
                self._withdraw()

    def stop(self) -> None:
        """Renew no more: the lock is released."""
        self._stop.set()
