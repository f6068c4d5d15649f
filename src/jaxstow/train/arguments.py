"""How long a :class:`~jaxstow.train.Trainer` trains, on how many processes, and in batches of what size.

The global batch (``train_batch_size``) is shared by the ``world_size`` processes; each process's share is split
into step batches no larger than ``gpu_batch_size_limit``, and a global step accumulates the gradients of
``gradient_accumulation`` of them:

>>> from jaxstow.train.arguments import step_batch_size
>>> step_batch_size(6, limit=1000), step_batch_size(6, limit=3), step_batch_size(12, limit=5)
(6, 3, 3)
"""

from __future__ import annotations

import dataclasses

from jaxstow._names.registry import saveable
from jaxstow.errors import ArgumentError
from jaxstow.train.default import DefaultCheckpointerArguments

__all__ = ["DistributedTrainingArguments", "TrainerArguments", "check_trainer_arguments", "step_batch_size"]


@dataclasses.dataclass
class DistributedTrainingArguments:
    """Where this process stands among those training together: ``world_size`` processes in all, this one being
    ``global_rank`` (``local_rank`` on its host). Only the process of global rank 0 writes checkpoints."""

    world_size: int = 1
    global_rank: int = 0
    local_rank: int = 0


@dataclasses.dataclass
class TrainerArguments:
    """How a :class:`~jaxstow.train.Trainer` trains.

    Attributes:
        epochs: the total number of epochs of the run, counting those done before a resume.
        train_batch_size: the global batch of a training step, over all processes.
        gpu_batch_size_limit: the largest batch one step may take on a device.
        val_batch_size: the batch of a validation step.
        checkpointer_args: the arguments of the :class:`~jaxstow.train.DefaultCheckpointer` made when the trainer is
            given no checkpointer.
        distributed_training_args: the processes training together; one by default.
    """

    epochs: int = 1
    train_batch_size: int = 1
    gpu_batch_size_limit: int = 512
    val_batch_size: int = 1
    checkpointer_args: DefaultCheckpointerArguments = dataclasses.field(default_factory=DefaultCheckpointerArguments)
    distributed_training_args: DistributedTrainingArguments = dataclasses.field(
        default_factory=DistributedTrainingArguments
    )


# Stable names, so that a trainer's state may hold its arguments (pymarlin's Trainer.get_state example saves
# self.args) and files keep loading wherever the classes live.
saveable(DistributedTrainingArguments, name="jaxstow.train.DistributedTrainingArguments")
saveable(TrainerArguments, name="jaxstow.train.TrainerArguments")


def step_batch_size(batch_size: int, *, limit: int) -> int:
    """The batch of one train step: ``batch_size`` itself if it fits in ``limit``, else ``limit`` if it divides it,
    else ``batch_size`` halved until it fits."""
    if batch_size < 1 or limit < 1:
        raise ArgumentError(
            f"a process's share of train_batch_size ({batch_size}) and gpu_batch_size_limit ({limit}) must both be "
            "at least 1: raise train_batch_size or use fewer processes"
        )
    if batch_size <= limit:
        return batch_size
    if batch_size % limit == 0:
        return limit
    while batch_size > limit:
        batch_size //= 2
    return batch_size


def check_trainer_arguments(args: TrainerArguments) -> None:
    """Refuse counts that are no integers, or below their least, naming the field, before anything runs.

    >>> check_trainer_arguments(TrainerArguments(epochs="3"))
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: TrainerArguments.epochs must be an integer of at least 0, not '3'
    """
    if not isinstance(args, TrainerArguments):
        raise ArgumentError(
            f"args must be a jaxstow.train.TrainerArguments, not {type(args).__name__}: Trainer takes (module, args, "
            "trainer_backend, checkpointer), as PyMarlin's does; name them to pass them in another order"
        )
    distributed = args.distributed_training_args
    counts = [
        ("TrainerArguments.epochs", args.epochs, 0),
        ("TrainerArguments.train_batch_size", args.train_batch_size, 1),
        ("TrainerArguments.gpu_batch_size_limit", args.gpu_batch_size_limit, 1),
        ("TrainerArguments.val_batch_size", args.val_batch_size, 1),
        ("DistributedTrainingArguments.world_size", distributed.world_size, 1),
        ("DistributedTrainingArguments.global_rank", distributed.global_rank, 0),
        ("DistributedTrainingArguments.local_rank", distributed.local_rank, 0),
    ]
    for name, value, least in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ArgumentError(f"{name} must be an integer of at least {least}, not {value!r}")
