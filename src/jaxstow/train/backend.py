"""How a :class:`~jaxstow.train.Trainer` runs one epoch of a module: the trainer's backend.

>>> from jaxstow.train import SingleProcess
>>> class Halving:
...     def __init__(self):
...         self.value = 8.0
...     def train_data(self, epoch):
...         return range(3)
...     def train_step(self, batch):
...         self.value /= 2
...         return self.value
>>> backend = SingleProcess()
>>> backend.train_epoch(Halving(), epoch=0), backend.get_state()
(2.333..., {'global_step': 3})
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from jaxstow.train.module import ModuleInterface
from jaxstow.train.state import Stateful

__all__ = ["SingleProcess", "TrainerBackend"]


@runtime_checkable
class TrainerBackend(Stateful, Protocol):
    """Runs the train steps of one epoch; its state is saved in ``Checkpoint.trainer_backend_state``."""

    def train_epoch(self, module: ModuleInterface, epoch: int) -> float:
        """Train ``module`` on the batches of ``epoch``; returns the epoch's mean loss."""
        ...


class SingleProcess:
    """Steps through an epoch's batches one by one in this process, counting steps across epochs."""

    def __init__(self) -> None:
        self.global_step = 0

    def train_epoch(self, module: ModuleInterface, epoch: int) -> float:
        """Train ``module`` on every batch of ``epoch``; returns the mean of the losses."""
        total, steps = 0.0, 0
        for batch in module.train_data(epoch):
            total += float(module.train_step(batch))
            steps += 1
        if steps == 0:
            raise ValueError(
                f"{type(module).__name__}.train_data({epoch}) gave no batches; an epoch needs at least one"
            )
        self.global_step += steps
        return total / steps

    def get_state(self) -> dict[str, Any]:
        """``{"global_step": steps taken so far}``."""
        return {"global_step": self.global_step}

    def update_state(self, state: dict[str, Any]) -> None:
        """Continue counting from a saved ``global_step``."""
        self.global_step = int(state["global_step"])
