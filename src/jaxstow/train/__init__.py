"""``jaxstow.train``: the checkpointer contract of a training loop, a default checkpointer, and a resumable trainer.
A face: it imports the core (``jaxstow._*``) and no other face.

A :class:`Trainer` trains a :class:`ModuleInterface` for a number of epochs with PyMarlin's contract, resuming from
the checkpoint its checkpointer (an :class:`AbstractCheckpointer`, by default a :class:`DefaultCheckpointer`) loads.
Checkpoints are saved without pickle, for JAX models (:class:`EquinoxOptaxModule`) and PyTorch ones
(:class:`TorchModule`) alike; neither equinox, optax nor torch is imported until used. See docs/trainer-contract.md.

>>> import tempfile
>>> import equinox as eqx, jax, jax.numpy as jnp, optax
>>> from jaxstow import train
>>> def loss_fn(model, batch):
...     return jnp.mean((jax.vmap(model)(batch) - 1.0) ** 2)
>>> def data(epoch):
...     return [jax.random.normal(jax.random.key(epoch), (4, 3))]
>>> def module():
...     return train.EquinoxOptaxModule(eqx.nn.Linear(3, 1, key=jax.random.key(0)), optax.adam(0.1), loss_fn, data)
>>> folder = tempfile.mkdtemp()
>>> def arguments(epochs):
...     checkpoints = train.DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
...     return train.TrainerArguments(epochs=epochs, checkpointer_args=checkpoints)
>>> sorted(train.Trainer(module(), arguments(epochs=2)).train())
[0, 1]
>>> sorted(train.Trainer(module(), arguments(epochs=3)).train())
[2]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jaxstow.train.arguments import DistributedTrainingArguments, TrainerArguments
from jaxstow.train.backend import SingleProcess, TrainerBackend, TrainerBackendArguments
from jaxstow.train.checkpointer import AbstractCheckpointer
from jaxstow.train.default import DefaultCheckpointer, DefaultCheckpointerArguments
from jaxstow.train.module import CallbackInterface, ModuleInterface
from jaxstow.train.pytorch import TorchModule
from jaxstow.train.state import Checkpoint, Stateful
from jaxstow.train.trainer import Trainer

if TYPE_CHECKING:
    from jaxstow.train.equinox_optax import EquinoxOptaxModule

__all__ = [
    "AbstractCheckpointer",
    "CallbackInterface",
    "Checkpoint",
    "DefaultCheckpointer",
    "DefaultCheckpointerArguments",
    "DistributedTrainingArguments",
    "EquinoxOptaxModule",
    "ModuleInterface",
    "SingleProcess",
    "Stateful",
    "TorchModule",
    "Trainer",
    "TrainerArguments",
    "TrainerBackend",
    "TrainerBackendArguments",
]


def __getattr__(name: str) -> Any:
    # equinox and optax are optional: the adapter that needs them is imported on first use.
    if name == "EquinoxOptaxModule":
        return importlib.import_module("jaxstow.train.equinox_optax").EquinoxOptaxModule
    raise AttributeError(f"module 'jaxstow.train' has no attribute {name!r}")
