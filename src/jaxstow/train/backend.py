"""How a :class:`~jaxstow.train.Trainer` runs the steps of an epoch: the trainer's backend.

The trainer calls :meth:`TrainerBackend.init` once, then hands it each epoch's train data loader
(:meth:`~TrainerBackend.train_dl`) and validation data loaders (:meth:`~TrainerBackend.validate_dl`). The backend
calls the module's steps, counts global steps and collates the steps' outputs; its state goes into
``Checkpoint.trainer_backend_state``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from jaxstow.errors import ArgumentError, CheckpointError
from jaxstow.train.module import CallbackInterface, ModuleInterface
from jaxstow.train.state import saved_count

__all__ = ["SingleProcess", "TrainerBackend", "TrainerBackendArguments"]


@dataclasses.dataclass
class TrainerBackendArguments:
    """What the trainer tells its backend in :meth:`TrainerBackend.init`.

    Attributes:
        module: the module interface to train.
        optimizers, schedulers: those of ``module.get_optimizers_schedulers``.
        gradient_accumulation: train steps (batches) per global step.
        device: passed to the module's steps as ``device``; ``None`` lets JAX place arrays.
    """

    module: ModuleInterface
    optimizers: Sequence[Any] = ()
    schedulers: Sequence[Any] = ()
    gradient_accumulation: int = 1
    device: Any = None


class TrainerBackend(abc.ABC):
    """Runs the train and validation steps of a module; its state is saved in ``Checkpoint.trainer_backend_state``."""

    #: The sampler handed to ``get_train_dataloader`` / ``get_val_dataloaders``; ``None`` takes the data in order.
    train_sampler: Any = None
    val_sampler: Any = None

    @abc.abstractmethod
    def init(self, args: TrainerBackendArguments) -> None:
        """Get ready to train ``args.module``; called once, when the trainer is made."""

    @abc.abstractmethod
    def train_dl(self, dataloader: Iterable[Any], callback: CallbackInterface) -> list[list[Any]]:
        """Run a train step on every batch of ``dataloader``; returns the collated outputs of the steps."""

    @abc.abstractmethod
    def validate_dl(self, dataloader: Iterable[Any]) -> list[list[Any]]:
        """Run a validation step on every batch of ``dataloader``; returns the collated outputs of the steps."""

    @abc.abstractmethod
    def get_global_steps_completed(self) -> int:
        """Global steps taken since the start of the run, resumed runs included."""

    @abc.abstractmethod
    def get_state(self) -> Any:
        """The backend's state for checkpoints."""

    @abc.abstractmethod
    def update_state(self, state: Any) -> None:
        """Restore the backend from a tree :meth:`get_state` returned."""


def collate(outputs: Sequence[Any]) -> list[list[Any]]:
    """Step outputs (each a value or a tuple of values) as one list per value: ``[(1, "a"), (2, "b")]`` ->
    ``[[1, 2], ["a", "b"]]``."""
    rows = [output if isinstance(output, tuple) else (output,) for output in outputs]
    return [list(column) for column in zip(*rows, strict=True)]


class SingleProcess(TrainerBackend):
    """Steps through the batches one by one in this process, counting global steps across epochs.

    A global step is ``gradient_accumulation`` train steps (the last one of an epoch may have fewer); the module's
    ``train_step`` applies its own updates, and learns of each global step through ``global_step`` and
    ``on_end_train_step``.

    >>> from jaxstow.train import ModuleInterface, SingleProcess, TrainerBackendArguments
    >>> class Halving(ModuleInterface):
    ...     def __init__(self): self.value = 8.0
    ...     def get_train_dataloader(self, sampler, batch_size): return range(4)
    ...     def train_step(self, global_step, batch, device):
    ...         self.value /= 2
    ...         return self.value, batch
    ...     def get_state(self): return {"value": self.value}
    ...     def update_state(self, state): self.value = state["value"]
    >>> module, backend = Halving(), SingleProcess()
    >>> backend.init(TrainerBackendArguments(module=module, gradient_accumulation=2))
    >>> backend.train_dl(module.get_train_dataloader(None, 1), module)
    [[4.0, 2.0, 1.0, 0.5], [0, 1, 2, 3]]
    >>> backend.get_global_steps_completed(), backend.get_state()
    (2, {'global_step': 2})
    """

    def __init__(self) -> None:
        self.global_step = 0
        self._args: TrainerBackendArguments | None = None

    def init(self, args: TrainerBackendArguments) -> None:
        """Keep the module and the step settings to train with."""
        if not isinstance(args.gradient_accumulation, int) or args.gradient_accumulation < 1:
            raise ArgumentError(f"gradient_accumulation must be a positive integer, not {args.gradient_accumulation!r}")
        self._args = args

    @property
    def args(self) -> TrainerBackendArguments:
        """The arguments of :meth:`init`."""
        if self._args is None:
            raise ArgumentError("SingleProcess.init(args) must be called before it trains or validates")
        return self._args

    def train_dl(self, dataloader: Iterable[Any], callback: CallbackInterface) -> list[list[Any]]:
        """Train on every batch; ``callback.on_end_train_step`` after each global step. An epoch needs a batch."""
        args = self.args
        outputs: list[Any] = []
        pending: list[Any] = []
        for batch in dataloader:
            pending.append(args.module.train_step(global_step=self.global_step, batch=batch, device=args.device))
            if len(pending) == args.gradient_accumulation:
                outputs += self._end_global_step(pending, callback)
                pending = []
        if pending:
            outputs += self._end_global_step(pending, callback)
        if not outputs:
            raise ArgumentError(f"the train data loader of {type(args.module).__name__} gave no batches")
        return collate(outputs)

    def _end_global_step(self, step_outputs: list[Any], callback: CallbackInterface) -> list[Any]:
        self.global_step += 1
        callback.on_end_train_step(self.global_step, *collate(step_outputs))
        return step_outputs

    def validate_dl(self, dataloader: Iterable[Any]) -> list[list[Any]]:
        """Validate on every batch."""
        args = self.args
        return collate(
            [
                args.module.val_step(global_step=self.global_step, batch=batch, device=args.device)
                for batch in dataloader
            ]
        )

    def get_global_steps_completed(self) -> int:
        """Global steps taken so far."""
        return self.global_step

    def get_state(self) -> dict[str, Any]:
        """``{"global_step": global steps taken so far}``."""
        return {"global_step": self.global_step}

    def update_state(self, state: dict[str, Any]) -> None:
        """Continue counting from a saved ``global_step``."""
        if not isinstance(state, dict) or "global_step" not in state:
            raise CheckpointError(
                "the checkpoint resumed from has no trainer_backend_state['global_step']: it was not written by this "
                "backend; resume from a Trainer's checkpoint, or start a new run in another save_dir"
            )
        self.global_step = saved_count(state, "global_step", part="trainer_backend_state")
