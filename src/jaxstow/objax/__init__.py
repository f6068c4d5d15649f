"""Objax's ``objax.io`` for Objax modules on current JAX: variable collections to files and checkpoints.

``jaxstow.objax`` stands where ``objax.io`` stood: ``save_var_collection(file, module.vars())``,
``load_var_collection(file, module.vars(), renamer=None)`` and ``checkpoint.Checkpoint`` (also ``Checkpoint``), with
Objax's signatures. Files are jaxstow files; Objax's own ``.npz`` files load as well. Objax itself is never imported.

>>> from jaxstow import objax as objax_io
>>> objax_io.checkpoint.Checkpoint is objax_io.Checkpoint
True
"""

from jaxstow.objax import checkpoint
from jaxstow.objax.checkpoint import Checkpoint
from jaxstow.objax.variables import load_var_collection, save_var_collection

__all__ = ["Checkpoint", "checkpoint", "load_var_collection", "save_var_collection"]
