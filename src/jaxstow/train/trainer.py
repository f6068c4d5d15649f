"""A resumable training loop with PyMarlin's contract: epochs of a module, a checkpoint after each, a restart."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from jaxstow.errors import ArgumentError, CheckpointError, StructureMismatchError
from jaxstow.train.arguments import TrainerArguments, check_trainer_arguments, step_batch_size
from jaxstow.train.backend import SingleProcess, TrainerBackend, TrainerBackendArguments
from jaxstow.train.checkpointer import AbstractCheckpointer
from jaxstow.train.default import DefaultCheckpointer
from jaxstow.train.module import ModuleInterface
from jaxstow.train.state import Checkpoint, saved_count, saved_list

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


class Trainer:
    """Trains a module for ``args.epochs`` epochs, resuming from its checkpointer's checkpoint, as PyMarlin's does.

    Making a trainer restores the module, the trainer (``last_epoch``, its optimisers' states) and the backend from
    the checkpoint; :meth:`train` then runs the epochs after ``last_epoch``. See docs/trainer-contract.md.

    >>> import tempfile
    >>> from jaxstow.train import DefaultCheckpointerArguments, ModuleInterface, Trainer, TrainerArguments
    >>> class Counter(ModuleInterface):
    ...     def __init__(self): self.count = 0
    ...     def get_train_dataloader(self, sampler, batch_size): return range(2)
    ...     def train_step(self, global_step, batch, device):
    ...         self.count += 1
    ...         return float(self.count)
    ...     def get_state(self): return {"count": self.count}
    ...     def update_state(self, state): self.count = state["count"]
    >>> folder = tempfile.mkdtemp()
    >>> checkpoints = DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
    >>> Trainer(Counter(), TrainerArguments(epochs=2, checkpointer_args=checkpoints)).train()   # the loss: the count
    {0: [[1.0, 2.0]], 1: [[3.0, 4.0]]}
    >>> resumed = Trainer(Counter(), TrainerArguments(epochs=4, checkpointer_args=checkpoints))
    >>> resumed.last_epoch, resumed.module.count, resumed.global_steps_finished
    (1, 4, 4)
    >>> resumed.train()
    {2: [[5.0, 6.0]], 3: [[7.0, 8.0]]}
    """

    def __init__(
        self,
        module: ModuleInterface,
        args: TrainerArguments | None = None,
        trainer_backend: TrainerBackend | None = None,
        checkpointer: AbstractCheckpointer | None = None,
    ) -> None:
        """Load the checkpoint to resume from, restore every state it holds and make the backend ready.

        Args:
            module: The module to train.
            args: How to train (``TrainerArguments()`` by default).
            trainer_backend: Runs the steps of an epoch (:class:`~jaxstow.train.SingleProcess` by default).
            checkpointer: Keeps the checkpoints (a :class:`~jaxstow.train.DefaultCheckpointer` of
                ``args.checkpointer_args`` by default).

        Raises:
            ArgumentError: The checkpointer's ``load()`` returned no :class:`~jaxstow.train.Checkpoint`.
        """
        self.module = module
        self.args = args if args is not None else TrainerArguments()
        check_trainer_arguments(self.args)
        self.trainer_backend: TrainerBackend = trainer_backend if trainer_backend is not None else SingleProcess()
        self.checkpointer = (
            checkpointer if checkpointer is not None else DefaultCheckpointer(self.args.checkpointer_args)
        )
        checkpoint = self.checkpointer.load()
        if not isinstance(checkpoint, Checkpoint):
            raise ArgumentError(
                f"{type(self.checkpointer).__name__}.load() returned a {type(checkpoint).__name__}; it must return a "
                "jaxstow.train.Checkpoint (Checkpoint() when there is nothing to resume from)"
            )
        if checkpoint.module_interface_state is not None:
            with _resuming(self.checkpointer):
                self.module.update_state(checkpoint.module_interface_state)
        self.optimizers, self.schedulers = self.module.get_optimizers_schedulers(
            self.estimated_global_steps_per_epoch, self.args.epochs
        )
        self.last_epoch = -1
        if checkpoint.trainer_state is not None:
            self.update_state(checkpoint.trainer_state)
        self.trainer_backend.init(
            TrainerBackendArguments(
                module=self.module,
                optimizers=self.optimizers,
                schedulers=self.schedulers,
                gradient_accumulation=self.gradient_accumulation,
            )
        )
        if checkpoint.trainer_backend_state is not None:
            with _resuming(self.checkpointer):
                self.trainer_backend.update_state(checkpoint.trainer_backend_state)
        logger.info(
            "train steps of %s samples (gradient accumulation %s), validation steps of %s, about %s global steps "
            "per epoch",
            self.train_step_batch_size,
            self.gradient_accumulation,
            self.val_step_batch_size,
            self.estimated_global_steps_per_epoch,
        )

    # -- the loop ------------------------------------------------------------------------------------------------

    def train(self) -> dict[int, list[list[Any]]]:
        """Train and validate the epochs from ``last_epoch + 1`` to ``args.epochs - 1``.

        After every epoch the checkpointer is asked to ``save(state, index=epoch)``; after the last one, to save with
        ``force=True`` and to ``save_model`` the module's state, then ``module.on_end_train`` is called. A run with
        no epoch left trains and saves nothing.

        Returns:
            Each epoch's collated train outputs, by epoch (``outputs[0]`` holds the losses of its steps).
        """
        first = self.last_epoch + 1
        if first >= self.args.epochs:
            logger.info("no epoch left to train: %d of %d are done", first, self.args.epochs)
            return {}
        logger.info(
            "training epochs %d to %d, about %s global steps each",
            first,
            self.args.epochs - 1,
            self.estimated_global_steps_per_epoch,
        )
        outputs: dict[int, list[list[Any]]] = {}
        for epoch in range(first, self.args.epochs):
            self.module.on_begin_train_epoch(self.global_steps_finished, epoch)
            outputs[epoch] = self.train_epoch()
            self.validate()
            self.module.on_end_train_epoch(self.global_steps_finished, *outputs[epoch])
            self.last_epoch = epoch
            logger.info("epoch %d done, %s global steps so far", epoch, self.global_steps_finished)
            self.save_checkpoint()
        self.save_checkpoint(force=True)
        self.save_model_checkpoint()
        self.module.on_end_train(self.global_steps_finished)
        return outputs

    def train_epoch(self) -> list[list[Any]]:
        """Train on the module's train data loader; the collated outputs of its steps."""
        dataloader = self.module.get_train_dataloader(
            sampler=self.trainer_backend.train_sampler, batch_size=self.train_step_batch_size
        )
        return self.trainer_backend.train_dl(dataloader, self.module)

    def validate(self) -> list[list[Any]] | None:
        """Validate on each of the module's validation data loaders, calling ``on_end_val_epoch`` after each; the
        collated outputs of the last one, or ``None`` when the module has no validation data."""
        dataloaders = self.module.get_val_dataloaders(
            sampler=self.trainer_backend.val_sampler, batch_size=self.val_step_batch_size
        )
        if dataloaders is None:
            return None
        named = dataloaders if isinstance(dataloaders, Mapping) else {"default": dataloaders}
        outputs = None
        for key, dataloader in named.items():
            outputs = self.trainer_backend.validate_dl(dataloader)
            self.module.on_end_val_epoch(self.global_steps_finished, *outputs, key=key)
        return outputs

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, force: bool = False) -> None:
        """Hand the checkpointer the states of the module, the trainer and the backend (on the main process only)."""
        if self.is_main_process:
            self.checkpointer.save(self.checkpoint_state(), index=self.last_epoch, force=force)

    def save_model_checkpoint(self) -> None:
        """Hand the checkpointer the module's state alone (on the main process only)."""
        if self.is_main_process:
            self.checkpointer.save_model(self.module.get_state(), self.last_epoch)

    def checkpoint_state(self) -> Checkpoint:
        """The states of the module, the trainer and the backend, as they are now."""
        return Checkpoint(
            module_interface_state=self.module.get_state(),
            trainer_state=self.get_state(),
            trainer_backend_state=self.trainer_backend.get_state(),
        )

    def get_state(self) -> dict[str, Any]:
        """The trainer's own state: the last epoch finished and the ``state_dict()`` of each optimiser and scheduler."""
        return {
            "last_epoch": self.last_epoch,
            "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
            "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
        }

    def update_state(self, state: dict[str, Any]) -> None:
        """Restore the trainer's own state from :meth:`get_state`'s tree (optimisers and schedulers in order)."""
        if not isinstance(state, dict) or "last_epoch" not in state:
            raise CheckpointError(
                "the checkpoint resumed from has no trainer_state['last_epoch']: it was not written by a Trainer; "
                "resume from a Trainer's checkpoint, or start a new run in another save_dir"
            )
        saved_states = {kind: saved_list(state, kind, part="trainer_state") for kind in ("optimizers", "schedulers")}
        for kind, objects in (("optimizers", self.optimizers), ("schedulers", self.schedulers)):
            saved = saved_states[kind]
            if len(saved) != len(objects):
                raise CheckpointError(
                    f"the checkpoint resumed from holds the states of {len(saved)} {kind} but the module's "
                    f"get_optimizers_schedulers gave {len(objects)}: resuming would restore some and start the "
                    "others afresh; resume with the same optimisers and schedulers, or start a new run in another "
                    "save_dir"
                )
        self.last_epoch = saved_count(state, "last_epoch", part="trainer_state")
        for kind, objects in (("optimizers", self.optimizers), ("schedulers", self.schedulers)):
            for obj, saved in zip(objects, saved_states[kind], strict=True):
                obj.load_state_dict(saved)

    # -- sizes ---------------------------------------------------------------------------------------------------

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes checkpoints: global rank 0."""
        return bool(self.args.distributed_training_args.global_rank == 0)

    @property
    def pergpu_global_batch_size(self) -> int:
        """This process's share of the global batch ``train_batch_size``."""
        return self.args.train_batch_size // self.args.distributed_training_args.world_size

    @property
    def train_step_batch_size(self) -> int:
        """The batch of one train step: this process's share, split to fit ``gpu_batch_size_limit``."""
        return step_batch_size(self.pergpu_global_batch_size, limit=self.args.gpu_batch_size_limit)

    @property
    def gradient_accumulation(self) -> int:
        """Train steps per global step, so that a global step covers ``train_batch_size`` samples."""
        return self.pergpu_global_batch_size // self.train_step_batch_size

    @property
    def val_step_batch_size(self) -> int:
        """The batch of one validation step: ``val_batch_size``."""
        return self.args.val_batch_size

    @property
    def global_steps_finished(self) -> Any:
        """Global steps taken so far, resumed runs included, as the backend counts them."""
        return self.trainer_backend.get_global_steps_completed()

    @property
    def estimated_global_steps_per_epoch(self) -> int:
        """At most how many global steps an epoch takes: the train data loader's length over the processes and the
        gradient accumulation, plus one; ``0`` when the module gives no train data loader or one without a length.
        """
        dataloader = self.module.get_train_dataloader(sampler=None, batch_size=self.train_step_batch_size)
        try:
            batches = len(dataloader)  # type: ignore[arg-type]
        except TypeError:
            return 0
        world_size = self.args.distributed_training_args.world_size
        return batches // (world_size * self.gradient_accumulation) + 1


@contextlib.contextmanager
def _resuming(checkpointer: AbstractCheckpointer) -> Iterator[None]:
    """A state of the checkpoint that does not fit the module or backend, raised again naming the file it came from
    (a :class:`~jaxstow.train.DefaultCheckpointer`'s ``resumed_from``) and how to resume."""
    try:
        yield
    except StructureMismatchError as error:
        if error.file is not None:
            raise
        where = getattr(checkpointer, "resumed_from", None)
        raise type(error)(
            error.problems,
            file=where if isinstance(where, str) else f"the checkpoint {type(checkpointer).__name__}.load() returned",
            fix="Resume with the model and optimiser it was saved with, or start afresh: load_dir=None or another "
            "folder.",
        ) from None
