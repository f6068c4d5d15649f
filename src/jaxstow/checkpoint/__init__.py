"""Checkpoints of training runs: :class:`CheckpointManager`, its steps kept by a :class:`KeepPolicy`, a first tier on
each process's fast storage given by a :class:`LocalTier`.
A face: it imports the core (``jaxstow._*``) and no other face.

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow.checkpoint import CheckpointManager, KeepPolicy
>>> with CheckpointManager(tempfile.mkdtemp(), keep=KeepPolicy(keep_last=3)) as manager:
...     manager.save(100, {"w": jnp.ones(2)})
...     print(manager.latest_step(), manager.restore(as_numpy=True))
100 {'w': array([1., 1.], dtype=float32)}
"""

from typing import Any

from jaxstow._steps.keep import KeepPolicy
from jaxstow._util.deprecation import moved
from jaxstow.checkpoint.manager import CheckpointManager
from jaxstow.checkpoint.settings import LocalTier, without_shortcuts

__all__ = ["CheckpointManager", "KeepPolicy", "LocalTier"]

#: What users see of the constructor (``inspect.signature``, ``help``): the deprecated shortcuts left out.
CheckpointManager.__signature__ = without_shortcuts(CheckpointManager.__init__)  # type: ignore[attr-defined]


def __getattr__(name: str) -> Any:
    if name == "Checkpoint":
        return moved("jaxstow.checkpoint.Checkpoint", "jaxstow.objax", "TreeCheckpoint")
    raise AttributeError(f"module 'jaxstow.checkpoint' has no attribute {name!r}")
