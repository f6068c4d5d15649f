"""The end of a worker process of a ``jax.distributed`` run that printed its report: without jax's shutdown barrier,
process 0, which hosts the coordination service, last."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from jaxstow._util import jax_compat

PATIENCE = 200.0  # seconds; below the 240 s the tests give each process to end


def _ended(pid: int) -> bool:
    """Whether the process ``pid`` (on this machine: the tests start every process here) has ended."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in {"Z", "X"}


def leave_once_every_process_reported(process: int, count: int, *, gone: frozenset[int] = frozenset()) -> None:
    """End this process; process 0 first waits (``PATIENCE`` at most) for the others to say they printed their
    reports and then for them to end, as a process that loses the coordination service before it has ended is ended
    by jax with a failure (even while it tells process 0 it is done). Anything that goes wrong here is told on
    stderr: the reports are printed already, and each process's exit status tells the test whether it failed before.
    Process 0 does not wait for the processes in ``gone`` (killed or stopped on purpose)."""
    client = jax_compat.distributed_client()
    if process == 0:
        deadline = time.monotonic() + PATIENCE
        for other in sorted(set(range(1, count)) - gone):
            while (left := deadline - time.monotonic()) > 0:
                try:
                    pid = int(client.blocking_key_value_get(f"reported/{other}", max(1, int(left * 1000))))
                except Exception as error:  # a process that failed: its own exit status tells the test why
                    print(f"waiting for process {other}'s report: {error}", file=sys.stderr, flush=True)
                    time.sleep(0.5)
                    continue
                while not _ended(pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
                break
    else:
        try:
            client.key_value_set(f"reported/{process}", str(os.getpid()))
        except Exception as error:
            print(f"telling process 0 this report is printed: {error}", file=sys.stderr, flush=True)
    os._exit(0)
