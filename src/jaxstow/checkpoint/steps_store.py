"""The store of a checkpoint manager's directory, refused where the folder holds an orbax ``CheckpointManager``'s steps.

A jaxstow manager neither lists nor restores orbax's steps, so a run resumed there would start again from scratch
(``latest_step()`` is ``None``) and then write its steps among orbax's: the manager says how to convert them instead.

>>> import os, tempfile
>>> from jaxstow._storage.settings import storage_settings
>>> from jaxstow.checkpoint.steps_store import open_steps
>>> run = tempfile.mkdtemp()
>>> os.makedirs(os.path.join(run, "7"))
>>> open(os.path.join(run, "7", "_CHECKPOINT_METADATA"), "w").close()
>>> open_steps(run, storage_settings(None, None, None))
Traceback (most recent call last):
jaxstow.errors.CheckpointError: ... holds the steps of an orbax CheckpointManager ([7]), ...
"""

from __future__ import annotations

import os

from jaxstow._format.kinds import KINDS
from jaxstow._read.foreign import advice
from jaxstow._read.orbax_steps import manager_steps
from jaxstow._steps.record import RECORD_NAME
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.store import Store, open_store
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["open_steps"]


def open_steps(directory: str | os.PathLike[str], settings: StorageSettings) -> Store:
    """The store of the steps in ``directory`` (a path or a URL); a local folder holding steps of an orbax
    ``CheckpointManager`` (a step folder with its ``_CHECKPOINT_METADATA``) is a :class:`CheckpointError` that names
    them and says how to convert them. An empty string (a setting left unset) is an :class:`ArgumentError`: it would
    be the working directory, the steps saved among its files."""
    if isinstance(directory, str) and not directory:
        raise ArgumentError(
            "a checkpoint manager's directory is a folder's path or a URL, not an empty string: give the folder of the "
            "run, such as 'runs/exp1' (or '.' for the working directory)"
        )
    store = open_store(directory, marker=RECORD_NAME, settings=settings)
    if not isinstance(store, LocalStore):
        return store
    try:
        orbax = [step for step, name in manager_steps(store.root) if not os.path.exists(store.path(name, RECORD_NAME))]
    except OSError:  # no folder yet, or one that cannot be listed: the manager's own calls say so
        return store
    if orbax:
        shown = ", ".join(map(str, orbax[:5])) + ", ..." * (len(orbax) > 5)
        raise CheckpointError(
            f"{store.location} holds the steps of an orbax CheckpointManager ([{shown}]), which a jaxstow "
            "CheckpointManager neither lists nor restores: a run resumed here would start again from scratch. "
            f"{advice(KINDS['orbax-manager'], store.location)}; then give the manager the converted folder",
            file=store.location,
        )
    return store
