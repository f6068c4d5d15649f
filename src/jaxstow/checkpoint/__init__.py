"""Checkpoints of training runs: :class:`CheckpointManager` and Objax's :class:`Checkpoint`.

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow.checkpoint import CheckpointManager
>>> with CheckpointManager(tempfile.mkdtemp(), keep_last=3) as manager:
...     manager.save(100, {"w": jnp.ones(2)})
...     print(manager.latest_step(), manager.restore(as_numpy=True))
100 {'w': array([1., 1.], dtype=float32)}
"""

from jaxstow.checkpoint.manager import CheckpointManager
from jaxstow.checkpoint.numbered import Checkpoint
from jaxstow.checkpoint.policy import KeepPolicy

__all__ = ["Checkpoint", "CheckpointManager", "KeepPolicy"]
