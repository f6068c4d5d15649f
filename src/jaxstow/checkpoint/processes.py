"""The processes of a ``jax.distributed`` run that save one checkpoint together, and the few messages they exchange.

Messages go through the key-value store of jax's coordination service, which every ``jax.distributed`` run has; each
process sends O(1) small messages per save, so the commit path carries O(processes) bytes, never per-leaf traffic.
In a single process there is nothing to exchange.

>>> from jaxstow.checkpoint.processes import Processes
>>> processes = Processes("runs/a", timeout=60)
>>> processes.index, processes.count, processes.many
(0, 1, False)
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import jax

from jaxstow.errors import CheckpointError

__all__ = ["Processes"]

# Saves made so far to each folder by this process, across managers: every process makes the same saves in the same
# order, so the n-th save has the same name everywhere without a message.
_saves: dict[str, itertools.count[int]] = {}


class Processes:
    """This process's index among ``count`` processes, and messages keyed by name within one checkpoint folder."""

    def __init__(self, directory: str, *, timeout: float) -> None:
        self.index = int(jax.process_index())
        self.count = int(jax.process_count())
        self.timeout = timeout
        self._prefix = "jaxstow/" + hashlib.sha256(directory.encode()).hexdigest()[:16]
        self._client: Any = None
        if self.count > 1:
            from jax._src import distributed  # the coordination service's client: jax has no public handle on it

            self._client = distributed.global_state.client
            if self._client is None:
                raise CheckpointError(
                    f"jax sees {self.count} processes but no jax.distributed client: call jax.distributed.initialize()"
                )

    def next_save(self) -> str:
        """A name for the next save to this folder, the same in every process, never used before in this run."""
        return f"save{next(_saves.setdefault(self._prefix, itertools.count(1)))}"

    @property
    def many(self) -> bool:
        """Whether other processes save with this one."""
        return self.count > 1

    def send(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key`` for the other processes."""
        self._client.key_value_set(f"{self._prefix}/{key}", value)

    def receive(self, key: str, *, sender: int, what: str) -> str:
        """The value published under ``key``; waits up to the timeout, then raises naming the process and ``what``."""
        try:
            return str(self._client.blocking_key_value_get(f"{self._prefix}/{key}", int(self.timeout * 1000)))
        except Exception as error:  # jax raises its runtime's own error types here
            raise CheckpointError(
                f"process {sender} did not report {what} within {self.timeout:g} s (it may have failed or died): {error}"
            ) from None
