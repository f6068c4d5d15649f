"""The processes of a ``jax.distributed`` run that save or restore one checkpoint together, and their messages.

Messages go through the key-value store of jax's coordination service: O(1) small ones per process per save or
restore, none in a single process. A message not there within ``timeout`` seconds is a
:class:`~jaxstow.errors.CheckpointError` naming every process that did not send it. See docs/scaling.md.

>>> from jaxstow.checkpoint.processes import Processes
>>> processes = Processes("runs/a", timeout=60)
>>> processes.index, processes.count, processes.many, processes.grace
(0, 1, False, 6.0)
"""

from __future__ import annotations

import hashlib
import itertools
import time
from typing import Any

import jax

from jaxstow._util import jax_compat
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["Processes"]

# Exchanges made so far about each folder by this process, across managers: every process makes the same saves and
# restores in the same order, so the n-th has the same name everywhere without a message.
_exchanges: dict[str, itertools.count[int]] = {}


class Processes:
    """This process's index among ``count`` processes, and messages keyed by name within one checkpoint folder."""

    def __init__(self, directory: str, *, timeout: float) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ArgumentError(f"process_timeout must be a positive number of seconds, not {timeout!r}")
        self.index = int(jax.process_index())
        self.count = int(jax.process_count())
        self.timeout = float(timeout)
        self._prefix = "jaxstow/" + hashlib.sha256(directory.encode()).hexdigest()[:16]
        self._client: Any = None
        if self.count > 1:
            self._client = jax_compat.distributed_client()
            if self._client is None:
                raise CheckpointError(
                    f"jax sees {self.count} processes but no jax.distributed client: call jax.distributed.initialize()"
                )

    @property
    def grace(self) -> float:
        """How much longer than ``timeout`` a process waits for process 0's outcome, so that process 0's own verdict
        (which names the process it waited for) arrives first: 5 s or a tenth of the timeout, whichever is more."""
        return max(5.0, self.timeout / 10)

    def next_exchange(self, kind: str) -> str:
        """A name for the next save or restore (``kind``) of this folder, the same in every process, never used
        before in this run."""
        return f"{kind}{next(_exchanges.setdefault(f'{self._prefix}/{kind}', itertools.count(1)))}"

    @property
    def many(self) -> bool:
        """Whether other processes save with this one."""
        return self.count > 1

    @property
    def others(self) -> list[int]:
        """The indices of the other processes."""
        return [index for index in range(self.count) if index != self.index]

    def send(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key`` for the other processes."""
        self._client.key_value_set(f"{self._prefix}/{key}", value)

    def receive(self, key: str, *, sender: int, what: str, timeout: float | None = None) -> str:
        """The value ``sender`` published under ``key``; waits up to ``timeout`` (the processes' own by default),
        then raises naming the process and ``what``."""
        return self.gather({sender: key}, what=what, timeout=timeout)[sender]

    def gather(self, keys: dict[int, str], *, what: str, timeout: float | None = None) -> dict[int, str]:
        """The value each process of ``keys`` published under its key, all within one deadline; a process missing
        then is named, with every other one missing too."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        got: dict[int, str] = {}
        for sender, key in keys.items():
            try:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                got[sender] = str(self._client.blocking_key_value_get(f"{self._prefix}/{key}", left_ms))
            except Exception as error:  # jax raises its runtime's own error types here
                missing = [other for other, later in keys.items() if other not in got and not self._there(later)]
                raise CheckpointError(_missing(missing or [sender], what, limit, error)) from None
        return got

    def _there(self, key: str) -> bool:
        try:
            self._client.key_value_try_get(f"{self._prefix}/{key}")
        except Exception:  # not set
            return False
        return True


def _missing(processes: list[int], what: str, timeout: float, error: BaseException) -> str:
    names = ", ".join(str(index) for index in processes)
    plural = "es" if len(processes) > 1 else ""
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"process{plural} {names} did not report {what} within {timeout:g} s (stalled, failed or died; "
        f"jax.distributed: {detail})"
    )
