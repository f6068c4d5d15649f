"""What a training checkpoint holds, and the protocol of everything whose state goes into one.

A :class:`Checkpoint` is a pytree, saved through the core like any other tree: no pickle, and it comes back as a
``Checkpoint`` with every state in it rebuilt (arrays, equinox modules, optax states, torch tensors, Python scalars).
A file holding the plain dict of its fields (``checkpoint.__dict__``, as PyMarlin writes them) is a checkpoint too:
:func:`as_checkpoint` turns what such a file loads back into into a ``Checkpoint``.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow.train import Checkpoint
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, Checkpoint(module_interface_state={"w": jnp.ones(2)}, trainer_state={"last_epoch": 4}))
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer)
Checkpoint(module_interface_state={'w': Array([1., 1.], dtype=float32)}, trainer_state={'last_epoch': 4},
           trainer_backend_state=None)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax

from jaxstow._names.registry import saveable
from jaxstow._steps.names import check_step
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["Checkpoint", "Stateful", "as_checkpoint", "described_state", "is_checkpoint", "saved_count", "saved_list"]


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint keeps: the module, the trainer and the trainer's backend.

    ``get_state()`` returns a pytree of arrays, tensors and scalars (anything :func:`jaxstow.save` takes);
    ``update_state(state)`` receives that same tree, as loaded back from a checkpoint, and restores the object.
    """

    def get_state(self) -> Any: ...

    def update_state(self, state: Any) -> None: ...


@dataclasses.dataclass
class Checkpoint:
    """The states a :class:`~jaxstow.train.Trainer` saves and restores; ``None`` marks a state not kept.

    ``Checkpoint()`` is the empty checkpoint: a checkpointer returns it when there is nothing to resume from.
    """

    module_interface_state: Any = None
    trainer_state: Any = None
    trainer_backend_state: Any = None


jax.tree_util.register_dataclass(
    Checkpoint,
    data_fields=[field.name for field in dataclasses.fields(Checkpoint)],
    meta_fields=[],
)
# A stable name, so that files keep loading wherever the class lives.
saveable(Checkpoint, name="jaxstow.train.Checkpoint")


_FIELDS = tuple(field.name for field in dataclasses.fields(Checkpoint))


def is_checkpoint(state: Any) -> bool:
    """Whether ``state`` is a :class:`Checkpoint` or the dict of some of its fields, which :func:`as_checkpoint`
    takes."""
    return isinstance(state, Checkpoint) or (isinstance(state, dict) and bool(state) and set(state) <= set(_FIELDS))


def described_state(state: Any) -> str:
    """What ``state``, which is no checkpoint, is, for a message: a dict's keys or a type's name."""
    return f"a dict with the keys {sorted(map(str, state))}" if isinstance(state, dict) else type(state).__name__


def as_checkpoint(loaded: Any, *, file: str) -> Checkpoint:
    """``loaded`` as a :class:`Checkpoint`: itself, or one made from a dict of its fields; ``file`` names it in errors.

    >>> as_checkpoint({"trainer_state": {"last_epoch": 2}}, file="run_2.pt")
    Checkpoint(module_interface_state=None, trainer_state={'last_epoch': 2}, trainer_backend_state=None)
    """
    if isinstance(loaded, Checkpoint):
        return loaded
    if is_checkpoint(loaded):
        return Checkpoint(**loaded)
    raise CheckpointError(
        f"{file} holds {described_state(loaded)}, not a jaxstow.train.Checkpoint or a dict of its fields "
        f"{list(_FIELDS)}; resume from a file written by save(), not by save_model()",
        file=file,
    )


def saved_count(state: dict[str, Any], key: str, *, part: str) -> int:
    """The integer ``state[key]`` of a checkpoint's ``part`` (``"trainer_state"``, ...), or a
    :class:`~jaxstow.errors.CheckpointError` naming it: a count is never rounded or guessed.

    >>> saved_count({"last_epoch": 3}, "last_epoch", part="trainer_state")
    3
    >>> saved_count({"last_epoch": 2.7}, "last_epoch", part="trainer_state")
    Traceback (most recent call last):
    ...
    jaxstow.errors.CheckpointError: the checkpoint resumed from has trainer_state['last_epoch'] = 2.7, not an integer: resume from a file a Trainer wrote
    """
    try:
        return check_step(state[key], what=f"{part}[{key!r}]", negative=True)
    except ArgumentError:
        raise CheckpointError(
            f"the checkpoint resumed from has {part}[{key!r}] = {state[key]!r}, not an integer: resume from a file a "
            "Trainer wrote"
        ) from None


def saved_list(state: dict[str, Any], key: str, *, part: str) -> list[Any]:
    """The list ``state[key]`` of a checkpoint's ``part`` (empty when absent), or a
    :class:`~jaxstow.errors.CheckpointError` naming it."""
    found = state.get(key, [])
    if not isinstance(found, (list, tuple)):
        raise CheckpointError(
            f"the checkpoint resumed from has {part}[{key!r}] = {found!r}, not a list of states: resume from a file "
            "a Trainer wrote"
        )
    return list(found)
