"""jaxstow: save, checkpoint and stream JAX state, safely and fast.

A jaxstow file is a safetensors file whose header also holds the tree's structure, so a whole model comes back from
the file alone, without pickle and without a template; nothing in a file can run code. The entry points are
:func:`save`, :func:`load` and :func:`load_metadata`; :func:`open` (a :class:`Reader`, lazy); :class:`LoadOptions`;
:class:`Transfer` (object stores); :func:`saveable` (names for code); :class:`CheckpointManager`, with its
:class:`KeepPolicy` and :class:`LocalTier`; and the faces
:mod:`jaxstow.huggingface` (Hugging Face folders in and out), :mod:`jaxstow.io`, :mod:`jaxstow.train`,
:mod:`jaxstow.objax` and :mod:`jaxstow.flarejax`. Every error is a
:class:`jaxstow.errors.JaxstowError`.

The guides: docs/saving-and-loading.md, docs/restoring.md, docs/checkpointing.md, docs/sampling.md,
docs/object-storage.md, docs/safety.md and docs/format.md.

>>> import io, jax.numpy as jnp, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.ones(3)})
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer)
{'w': Array([1., 1., 1.], dtype=float32)}
"""

import importlib
from typing import TYPE_CHECKING, Any

from jaxstow import errors, flarejax  # flarejax registers FlareJax's names, which a FlareJax model's file holds
from jaxstow._format.per_process import per_process
from jaxstow._names.registry import saveable
from jaxstow._read.options import LoadOptions
from jaxstow._read.reader import LeafInfo, Reader, open
from jaxstow._save_load import load, load_metadata, save
from jaxstow._steps.keep import KeepPolicy
from jaxstow._storage.transfer import Transfer
from jaxstow._util.deprecation import moved
from jaxstow._version import __version__

if TYPE_CHECKING:
    from jaxstow import checkpoint, huggingface, io, objax, scheduler, train
    from jaxstow.checkpoint import CheckpointManager, LocalTier
    from jaxstow.checkpoint.hf_export import export_safetensors

__all__ = [
    "CheckpointManager",
    "KeepPolicy",
    "LeafInfo",
    "LoadOptions",
    "LocalTier",
    "Reader",
    "Transfer",
    "__version__",
    "checkpoint",
    "errors",
    "export_safetensors",
    "flarejax",
    "huggingface",
    "io",
    "load",
    "load_metadata",
    "objax",
    "open",
    "per_process",
    "save",
    "saveable",
    "scheduler",
    "train",
]

# The faces with more to import load on first use.
_FACES = {
    "CheckpointManager": ("jaxstow.checkpoint", "CheckpointManager"),
    "LocalTier": ("jaxstow.checkpoint", "LocalTier"),
    "checkpoint": ("jaxstow.checkpoint", None),
    "export_safetensors": ("jaxstow.checkpoint.hf_export", "export_safetensors"),
    "huggingface": ("jaxstow.huggingface", None),
    "io": ("jaxstow.io", None),
    "objax": ("jaxstow.objax", None),
    "scheduler": ("jaxstow.scheduler", None),  # jax_sgmc's ``from jax_sgmc import io, scheduler``
    "train": ("jaxstow.train", None),
}


def __dir__() -> list[str]:
    return sorted([*__all__, "Checkpoint"])  # Checkpoint: still there, deprecated (jaxstow.objax.TreeCheckpoint)


def __getattr__(name: str) -> Any:
    if name in _FACES:
        module_name, attribute = _FACES[name]
        module = importlib.import_module(module_name)
        return module if attribute is None else getattr(module, attribute)
    if name == "Checkpoint":
        return moved("jaxstow.Checkpoint", "jaxstow.objax", "TreeCheckpoint")
    if name == "registry":
        return moved("jaxstow.registry", "jaxstow._names.registry", use="jaxstow.saveable to register an object")
    raise AttributeError(f"module 'jaxstow' has no attribute {name!r}")
