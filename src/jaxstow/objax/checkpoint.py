"""``Checkpoint``: Objax's checkpoints of variable collections, with Objax's signatures.

``save(vc, idx)`` writes the collection's values to ``logdir/ckpt/0000000042.npz`` (for ``idx=42``) and keeps the
``keep_ckpts`` latest; ``restore(vc, idx=None)`` assigns the variables from the latest checkpoint (or ``idx``) and
returns ``(idx, path)``, ``(0, "")`` when there is none. Files, folder lock and cleanup are those of
:class:`jaxstow.objax.TreeCheckpoint`, its counterpart for JAX trees.

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow.objax import Checkpoint
>>> class Var:
...     def __init__(self, value):
...         self.value = value
...     def assign(self, value, check=True):
...         self.value = value
>>> ckpt = Checkpoint(tempfile.mkdtemp(), keep_ckpts=2, verbose=False)
>>> for idx in (1, 2, 3):
...     ckpt.save({"(Linear).w": Var(jnp.full(2, idx))}, idx)
>>> model = {"(Linear).w": Var(jnp.zeros(2, jnp.int32))}
>>> ckpt.restore(model)[0], model["(Linear).w"].value, ckpt.indices()
(3, Array([3, 3], dtype=int32), [2, 3])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jaxstow.errors import ArgumentError
from jaxstow.objax.tree_checkpoint import TreeCheckpoint
from jaxstow.objax.variables import load_var_collection, save_var_collection

__all__ = ["Checkpoint"]


class Checkpoint(TreeCheckpoint):
    """Keeps the ``keep_ckpts`` latest checkpoints of a variable collection in ``logdir/DIR_NAME``.

    ``verbose`` prints which checkpoint is restored, as Objax does. The class constants are Objax's:
    ``DIR_NAME``, ``FILE_MATCH``, ``FILE_FORMAT``, ``SAVE_FN(file, vc)`` and ``LOAD_FN(file, vc)``. ``logdir`` may
    be an fsspec URL, reached with ``storage_options``, as for :class:`~jaxstow.objax.TreeCheckpoint`.
    """

    LOAD_FN: ClassVar[Callable[[str, Any], Any]] = staticmethod(load_var_collection)
    SAVE_FN: ClassVar[Callable[[str, Any], None]] = staticmethod(save_var_collection)

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        keep_ckpts: int,
        makedir: bool = True,
        verbose: bool = True,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(logdir, keep_ckpts, makedir, storage_options=storage_options)
        self.verbose = verbose

    def restore(self, vc: Any = None, idx: int | None = None) -> tuple[int, str]:  # type: ignore[override]
        """Assign the variables of ``vc`` from checkpoint ``idx`` (the latest by default): returns ``(idx, path)``.

        With no checkpoint in the folder nothing is assigned and ``(0, "")`` is returned.
        """
        _check_collection(vc)
        idx, path = self.find(idx)
        if self.verbose:
            print(f"Resuming from {path}" if path else "No checkpoints found. Skipping restoring variables.")
        if path:
            self._function(type(self).LOAD_FN)(path, vc)
        return idx, path

    def save(self, vc: Any, idx: int) -> None:
        """Save the values of ``vc`` as checkpoint ``idx`` (atomically), then delete all but the latest."""
        _check_collection(vc)
        super().save(vc, idx)


def _check_collection(vc: Any) -> None:
    if not isinstance(vc, Mapping):
        raise ArgumentError(f"a Checkpoint saves and restores a variable collection (module.vars()), not {type(vc)}")
