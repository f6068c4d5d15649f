"""Objax's ``objax.io`` for Objax modules on current JAX: variable collections to files and checkpoints.
A face: it imports the core (``jaxstow._*``) and no other face.

``jaxstow.objax`` stands where ``objax.io`` stood: ``save_var_collection(file, module.vars())``,
``load_var_collection(file, module.vars(), renamer=None)`` and ``checkpoint.Checkpoint`` (also ``Checkpoint``), with
Objax's signatures. :class:`TreeCheckpoint` is the same checkpointing for JAX trees: ``save(tree, idx)``, and
``restore(like=None, idx=None)`` returning ``(tree, idx, path)``. Files are jaxstow files; Objax's own ``.npz`` files load as well. Objax itself is never imported.

>>> from jaxstow import objax as objax_io
>>> objax_io.checkpoint.Checkpoint is objax_io.Checkpoint
True
"""

from jaxstow.objax import checkpoint
from jaxstow.objax.checkpoint import Checkpoint
from jaxstow.objax.tree_checkpoint import TreeCheckpoint
from jaxstow.objax.variables import load_var_collection, save_var_collection

__all__ = ["Checkpoint", "TreeCheckpoint", "checkpoint", "load_var_collection", "save_var_collection"]
