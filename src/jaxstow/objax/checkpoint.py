"""``Checkpoint``: Objax's checkpoints of variable collections, with Objax's signatures."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jaxstow.errors import ArgumentError
from jaxstow.objax.tree_checkpoint import TreeCheckpoint
from jaxstow.objax.variables import load_var_collection, save_var_collection

__all__ = ["Checkpoint"]


class Checkpoint(TreeCheckpoint):
    """Keeps the ``keep_ckpts`` latest checkpoints of a variable collection in ``logdir/DIR_NAME``, as Objax's does.

    ``save(vc, idx)`` writes ``logdir/ckpt/0000000042.npz`` (for ``idx=42``); ``restore(vc)`` assigns the variables.
    The class constants are Objax's (``DIR_NAME``, ``FILE_MATCH``, ``FILE_FORMAT``, ``SAVE_FN(file, vc)``,
    ``LOAD_FN(file, vc)``); files, lock and cleanup are those of :class:`~jaxstow.objax.TreeCheckpoint`.

    >>> import tempfile, jax.numpy as jnp
    >>> from jaxstow.objax import Checkpoint
    >>> class Var:                                       # an Objax variable, as far as this goes
    ...     def __init__(self, value): self.value = value
    ...     def assign(self, value, check=True): self.value = value
    >>> ckpt = Checkpoint(tempfile.mkdtemp(), keep_ckpts=2, verbose=False)
    >>> for idx in (1, 2, 3):
    ...     ckpt.save({"(Linear).w": Var(jnp.full(2, idx))}, idx)
    >>> model = {"(Linear).w": Var(jnp.zeros(2, jnp.int32))}
    >>> ckpt.restore(model)[0], model["(Linear).w"].value, ckpt.indices()
    (3, Array([3, 3], dtype=int32), [2, 3])
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
        """Make the checkpoints' folder, ``logdir/DIR_NAME``.

        Args:
            logdir: A path or an fsspec URL.
            keep_ckpts: How many of the latest checkpoints to keep.
            makedir: Create the folder now.
            verbose: Print which checkpoint is restored, as Objax does.
            storage_options: Passed to fsspec for a URL ``logdir``.
        """
        super().__init__(logdir, keep_ckpts, makedir, storage_options=storage_options)
        self.verbose = verbose

    def restore(self, vc: Any = None, idx: int | None = None) -> tuple[int, str]:  # type: ignore[override]
        """Assign the variables of ``vc`` from checkpoint ``idx`` (the latest by default).

        Returns:
            ``(idx, path)``; ``(0, "")``, with nothing assigned, when the folder holds no checkpoint.

        Raises:
            FileNotFoundError: There is no checkpoint ``idx``.
            VariableMismatchError: The checkpoint does not fit ``vc`` (see :func:`load_var_collection`).
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
