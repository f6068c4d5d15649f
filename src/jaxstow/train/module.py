"""What a :class:`~jaxstow.train.Trainer` asks of the thing it trains.

A module interface gives the batches of an epoch, takes one optimisation step on a batch, and hands over its state
for checkpoints. Any object with these four methods will do; :class:`~jaxstow.train.EquinoxOptaxModule` and
:class:`~jaxstow.train.TorchModule` are ready ones.

>>> from jaxstow.train import ModuleInterface
>>> class Mean:
...     '''Learns the mean of the numbers it is shown.'''
...     def __init__(self):
...         self.estimate, self.seen = 0.0, 0
...     def train_data(self, epoch):
...         return [1.0, 2.0, 3.0]
...     def train_step(self, batch):
...         self.seen += 1
...         self.estimate += (batch - self.estimate) / self.seen
...         return abs(batch - self.estimate)
...     def get_state(self):
...         return {"estimate": self.estimate, "seen": self.seen}
...     def update_state(self, state):
...         self.estimate, self.seen = state["estimate"], state["seen"]
>>> isinstance(Mean(), ModuleInterface)
True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from jaxstow.train.state import Stateful

__all__ = ["ModuleInterface"]


@runtime_checkable
class ModuleInterface(Stateful, Protocol):
    """The model, its optimiser and its data, as the trainer sees them.

    ``get_state()`` must hold everything that the next steps depend on (parameters, optimiser state, random keys),
    so that a run resumed from a checkpoint continues exactly as if it had never stopped.
    """

    def train_data(self, epoch: int) -> Iterable[Any]:
        """The batches of epoch ``epoch``, in order; the same epoch must give the same batches in every process."""
        ...

    def train_step(self, batch: Any) -> float:
        """One optimisation step on ``batch``; returns its loss."""
        ...
