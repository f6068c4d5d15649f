"""Lock leases of a fraction of a second for the tests of an object store's lock, and a holder on another host.

``short_leases`` is a fixture: a test module takes it with ``pytestmark = pytest.mark.usefixtures("short_leases")``
after importing it.
"""

from __future__ import annotations

import pytest

from jaxstow._storage import lock_lease
from jaxstow._storage.lock import Holder

LEASE = 0.4


@pytest.fixture
def short_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock_lease, "LEASE_SECONDS", LEASE)
    monkeypatch.setattr(lock_lease, "SHORTEST_LEASE", LEASE / 2)


def elsewhere() -> Holder:
    """A holder on another host, whose process this host cannot see."""
    return Holder(4242, "another-host", "2026-01-01T00:00:00+00:00", "e1" * 8, lease=LEASE)
