"""The contract between a training loop and whatever keeps its checkpoints: PyMarlin's ``AbstractCheckpointer``."""

from __future__ import annotations

import abc
import logging
from typing import Any

from jaxstow.train.state import Checkpoint

__all__ = ["AbstractCheckpointer"]


class AbstractCheckpointer(abc.ABC):
    """Saves and loads the :class:`~jaxstow.train.Checkpoint` of a training run.

    A :class:`~jaxstow.train.Trainer` calls :meth:`load` once when it is made, ``save(state, index=epoch)`` after
    every epoch and, after the last one, ``save(state, index, force=True)`` then :meth:`save_model`. Where, when and
    how files are written is the checkpointer's business. ``self.logger`` is ready in every subclass.

    >>> import jaxstow, os, tempfile
    >>> from jaxstow.train import AbstractCheckpointer, Checkpoint
    >>> class EveryOther(AbstractCheckpointer):
    ...     def __init__(self, folder):
    ...         self.folder = folder
    ...     def save(self, checkpoint_state, index, force=False):
    ...         if index % 2 == 0 or force:
    ...             jaxstow.save(os.path.join(self.folder, f"{index}.ckpt"), checkpoint_state)
    ...     def load(self):
    ...         return Checkpoint()
    >>> folder = tempfile.mkdtemp()
    >>> checkpointer = EveryOther(folder)
    >>> for epoch in range(4):
    ...     checkpointer.save(Checkpoint(trainer_state={"last_epoch": epoch}), epoch)
    >>> sorted(os.listdir(folder))
    ['0.ckpt', '2.ckpt']
    """

    logger: logging.Logger = logging.getLogger(__name__)

    @abc.abstractmethod
    def save(self, checkpoint_state: Checkpoint, index: int, force: bool = False) -> str | None:
        """Decide whether to keep ``checkpoint_state`` under ``index``, keep it if so, and say where.

        Args:
            checkpoint_state: The whole state of the run after the epoch.
            index: The epoch.
            force: Save whatever the checkpointer's own conditions say; asked after the last epoch, so that the end
                of training is always kept.

        Returns:
            The path written, or ``None``.
        """

    def save_model(self, model_state: Any, index: int) -> str | None:
        """Keep the module's state alone (no trainer state) under ``index``; called once, after the last epoch.

        Returns:
            The path written; ``None`` (nothing is written) unless a subclass overrides it.
        """
        return None

    @abc.abstractmethod
    def load(self) -> Checkpoint:
        """The checkpoint to resume from, or the empty ``Checkpoint()`` to start from scratch.

        Called once, when the :class:`~jaxstow.train.Trainer` is made.
        """
