"""The end of a worker process of a ``jax.distributed`` run that printed its report: without jax's shutdown barrier,
process 0, which hosts the coordination service, last."""

from __future__ import annotations

import contextlib
import os

from jaxstow._util import jax_compat


def leave_once_every_process_reported(process: int, count: int) -> None:
    """End this process; process 0 first waits (a minute at most) for the others to say they printed their reports,
    as they may still read what it sent until then."""
    client = jax_compat.distributed_client()
    if process == 0:
        for other in range(1, count):
            with contextlib.suppress(Exception):  # a process that failed: its own exit status tells the test why
                client.blocking_key_value_get(f"reported/{other}", 60_000)
    else:
        client.key_value_set(f"reported/{process}", "1")
    os._exit(0)
