"""A resumable training loop: epochs of a module, a checkpoint after each, and a restart where the last one left off.

>>> import os, tempfile
>>> from jaxstow.train import DefaultCheckpointerArguments, Trainer, TrainerArguments
>>> class Counter:
...     '''Counts its steps; its loss is the count.'''
...     def __init__(self):
...         self.count = 0
...     def train_data(self, epoch):
...         return range(2)
...     def train_step(self, batch):
...         self.count += 1
...         return float(self.count)
...     def get_state(self):
...         return {"count": self.count}
...     def update_state(self, state):
...         self.count = state["count"]
>>> folder = tempfile.mkdtemp()
>>> def arguments(epochs):
...     checkpoints = DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
...     return TrainerArguments(epochs=epochs, checkpointer_args=checkpoints)
>>> Trainer(Counter(), arguments(epochs=2)).train()
{0: 1.5, 1: 3.5}
>>> resumed = Trainer(Counter(), arguments(epochs=4))
>>> resumed.last_epoch, resumed.module.count
(1, 4)
>>> resumed.train()
{2: 5.5, 3: 7.5}
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from jaxstow.train.backend import SingleProcess, TrainerBackend
from jaxstow.train.checkpointer import AbstractCheckpointer
from jaxstow.train.default import DefaultCheckpointer, DefaultCheckpointerArguments
from jaxstow.train.module import ModuleInterface
from jaxstow.train.state import Checkpoint

__all__ = ["Trainer", "TrainerArguments"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainerArguments:
    """How long a :class:`Trainer` trains, and how its default checkpointer keeps checkpoints.

    Attributes:
        epochs: the total number of epochs of the run, counting those done before a resume.
        checkpointer_args: the arguments of the :class:`~jaxstow.train.DefaultCheckpointer` made when the trainer is
            given no checkpointer.
    """

    epochs: int = 1
    checkpointer_args: DefaultCheckpointerArguments = dataclasses.field(default_factory=DefaultCheckpointerArguments)


class Trainer:
    """Trains ``module`` for ``args.epochs`` epochs, resuming from the checkpoint its checkpointer loads.

    Making a trainer calls ``checkpointer.load()`` and restores the module, the trainer (its ``last_epoch``) and the
    backend from each state the checkpoint holds. :meth:`train` then runs the epochs after ``last_epoch``. Subclasses
    that keep more state override :meth:`get_state` and :meth:`update_state`.
    """

    def __init__(
        self,
        module: ModuleInterface,
        args: TrainerArguments | None = None,
        trainer_backend: TrainerBackend | None = None,
        checkpointer: AbstractCheckpointer | None = None,
    ) -> None:
        self.module = module
        self.args = args if args is not None else TrainerArguments()
        self.trainer_backend: TrainerBackend = trainer_backend if trainer_backend is not None else SingleProcess()
        self.checkpointer = (
            checkpointer if checkpointer is not None else DefaultCheckpointer(self.args.checkpointer_args)
        )
        self.last_epoch = -1
        self._restore(self.checkpointer.load())

    def train(self) -> dict[int, float]:
        """Run the epochs from ``last_epoch + 1`` to ``args.epochs - 1``; returns each one's mean loss.

        After every epoch the checkpointer is asked to ``save(state, index=epoch)``; after the last one, to save with
        ``force=True`` and to ``save_model`` the module's state. A run with no epoch left trains and saves nothing.
        """
        losses: dict[int, float] = {}
        for epoch in range(self.last_epoch + 1, self.args.epochs):
            losses[epoch] = self.trainer_backend.train_epoch(self.module, epoch)
            self.last_epoch = epoch
            logger.info("epoch %d: mean loss %.6g", epoch, losses[epoch])
            self.checkpointer.save(self.checkpoint_state(), epoch)
        if not losses:
            logger.info("no epoch left to train: %d of %d are done", self.last_epoch + 1, self.args.epochs)
            return losses
        self.checkpointer.save(self.checkpoint_state(), self.last_epoch, force=True)
        self.checkpointer.save_model(self.module.get_state(), self.last_epoch)
        return losses

    def checkpoint_state(self) -> Checkpoint:
        """The states of the module, the trainer and the backend, as they are now."""
        return Checkpoint(
            module_interface_state=self.module.get_state(),
            trainer_state=self.get_state(),
            trainer_backend_state=self.trainer_backend.get_state(),
        )

    def get_state(self) -> dict[str, Any]:
        """The trainer's own state: ``{"last_epoch": the last epoch finished}``."""
        return {"last_epoch": self.last_epoch}

    def update_state(self, state: dict[str, Any]) -> None:
        """Restore the trainer's own state from :meth:`get_state`'s tree."""
        self.last_epoch = int(state["last_epoch"])

    def _restore(self, checkpoint: Checkpoint) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"{type(self.checkpointer).__name__}.load() returned a {type(checkpoint).__name__}; it must return a "
                "jaxstow.train.Checkpoint (Checkpoint() when there is nothing to resume from)"
            )
        if checkpoint.module_interface_state is not None:
            self.module.update_state(checkpoint.module_interface_state)
        if checkpoint.trainer_state is not None:
            self.update_state(checkpoint.trainer_state)
        if checkpoint.trainer_backend_state is not None:
            self.trainer_backend.update_state(checkpoint.trainer_backend_state)
