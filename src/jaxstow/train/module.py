"""What a :class:`~jaxstow.train.Trainer` asks of the thing it trains: PyMarlin's module interface and callbacks."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["CallbackInterface", "ModuleInterface"]

DataLoader = Iterable[Any]


class CallbackInterface:
    """Hooks the trainer and its backend call as training goes on; each does nothing unless overridden.

    ``*outputs`` are the collated outputs of the steps: one list per value a step returns (the first is the loss),
    holding that value of every step, in order.
    """

    def on_begin_train_epoch(self, global_step: Any, epoch: int) -> None:
        """Before the training steps of ``epoch`` (and before its train data loader is asked for)."""

    def on_end_train_step(self, global_step: Any, *train_step_outputs: Any) -> None:
        """After each global step, with the outputs of its train steps (several with gradient accumulation)."""

    def on_end_train_epoch(self, global_step: Any, *train_step_collated_outputs: Any) -> None:
        """After the training steps and the validation of an epoch, with the epoch's collated train outputs."""

    def on_end_val_epoch(self, global_step: Any, *val_step_collated_outputs: Any, key: str = "default") -> None:
        """After validating on the data loader ``key``, with its collated validation outputs."""

    def on_end_train(self, global_step: Any) -> None:
        """After the last epoch, once the final checkpoint and model are saved."""


class ModuleInterface(CallbackInterface, abc.ABC):
    """The model, its optimisation and its data, as the trainer sees them: PyMarlin's ``ModuleInterface``.

    Implement :meth:`get_train_dataloader`, :meth:`train_step`, :meth:`get_state` and :meth:`update_state`; the
    rest is optional. ``get_state()`` must hold everything the next steps depend on (parameters, optimiser state,
    random keys), unless the optimisers of :meth:`get_optimizers_schedulers` keep it, so that a resumed run goes on
    exactly as if it had never stopped (its arrays come back as jax arrays, float64 as float32 unless jax's 64-bit
    mode is on). :class:`~jaxstow.train.EquinoxOptaxModule` and
    :class:`~jaxstow.train.TorchModule` are ready ones.

    >>> from jaxstow.train import ModuleInterface
    >>> class Mean(ModuleInterface):
    ...     '''Learns the mean of the numbers it is shown.'''
    ...     def __init__(self): self.estimate, self.seen = 0.0, 0
    ...     def get_train_dataloader(self, sampler, batch_size): return [1.0, 2.0, 3.0]
    ...     def train_step(self, global_step, batch, device):
    ...         self.seen += 1
    ...         self.estimate += (batch - self.estimate) / self.seen
    ...         return abs(batch - self.estimate)
    ...     def get_state(self): return {"estimate": self.estimate, "seen": self.seen}
    ...     def update_state(self, state): self.estimate, self.seen = state["estimate"], state["seen"]
    >>> module = Mean()
    >>> [module.train_step(step, batch, None) for step, batch in enumerate(module.get_train_dataloader(None, 1))]
    [0.0, 0.5, 1.0]
    >>> module.get_optimizers_schedulers(estimated_global_steps_per_epoch=3, epochs=1)
    ([], [])
    """

    def get_optimizers_schedulers(
        self, estimated_global_steps_per_epoch: int, epochs: int
    ) -> tuple[Sequence[Any], Sequence[Any]]:
        """The optimisers and learning-rate schedulers whose ``state_dict()`` the trainer checkpoints in its own state.

        Called once, when the trainer is made. JAX modules keep their optimiser state in :meth:`get_state` and return
        ``([], [])``, the default.
        """
        return [], []

    @abc.abstractmethod
    def get_train_dataloader(self, sampler: Any, batch_size: int) -> DataLoader:
        """The batches of the coming epoch, in order; called at the start of every epoch.

        ``batch_size`` is the trainer's ``train_step_batch_size``; ``sampler`` is the backend's ``train_sampler``
        (``None``: take the data in order). Its length, when it has one, gives the trainer's
        ``estimated_global_steps_per_epoch``.
        """

    def get_val_dataloaders(self, sampler: Any, batch_size: int) -> DataLoader | Mapping[str, DataLoader] | None:
        """The validation data: one data loader, a dict of them by name, or ``None`` (the default) for none."""
        return None

    @abc.abstractmethod
    def train_step(self, global_step: int, batch: Any, device: Any) -> Any:
        """One optimisation step on ``batch``; returns its loss, or a tuple whose first value is the loss."""

    def val_step(self, global_step: int, batch: Any, device: Any) -> Any:
        """One validation step on ``batch``; returns a value or a tuple of values to collate."""
        raise NotImplementedError(f"{type(self).__name__} gives validation data but does not implement val_step")

    @abc.abstractmethod
    def get_state(self) -> Any:
        """The module's state: a pytree :func:`jaxstow.save` takes (arrays, tensors, models, scalars)."""

    @abc.abstractmethod
    def update_state(self, state: Any) -> None:
        """Restore the module from a tree :meth:`get_state` returned, as loaded back from a checkpoint."""
