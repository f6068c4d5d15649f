"""jaxstow: save, checkpoint and stream JAX state.

>>> import io, jax.numpy as jnp, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.ones(3)})
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer)
{'w': Array([1., 1., 1.], dtype=float32)}
"""

import importlib
from typing import Any

from jaxstow import errors, registry
from jaxstow.read.reader import LeafInfo, Reader, open
from jaxstow.registry import saveable
from jaxstow.serialization import load, load_metadata, save

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "LeafInfo",
    "Reader",
    "errors",
    "io",
    "load",
    "load_metadata",
    "open",
    "registry",
    "save",
    "saveable",
    "scheduler",
    "train",
]
__version__ = "0.1.0"

# Faces with heavier dependencies are imported on first use.
_LAZY = {
    "Checkpoint": ("jaxstow.checkpoint", "Checkpoint"),
    "CheckpointManager": ("jaxstow.checkpoint", "CheckpointManager"),
    "io": ("jaxstow.io", None),
    "scheduler": ("jaxstow.scheduler", None),
    "train": ("jaxstow.train", None),
}


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'jaxstow' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attribute is None else getattr(module, attribute)
